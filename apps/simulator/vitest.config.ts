import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  // Each case simulates a day or more. Under the whole `pnpm test` on a 2-core machine with one core
  // kept busy, a case that takes 2 s alone took 26 s: the bound is three times that and more.
  test: { testTimeout: 120_000 },
}))
