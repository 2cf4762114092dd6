import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  // Each case simulates a day or more; on a loaded 2-core machine one can take longer than 5 s.
  test: { testTimeout: 60_000 },
}))
