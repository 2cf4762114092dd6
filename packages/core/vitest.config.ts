import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  // The property tests run thousands of cases: 18 s of the base 30 s seen in a CI run beside
  // every other package's tests on two cores. Each has 2 minutes.
  test: { testTimeout: 120_000 },
}))
