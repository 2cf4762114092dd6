import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // The end-to-end file starts a coordinator (PGlite) and three agent processes.
      testTimeout: 60_000,
      hookTimeout: 240_000,
    },
  }),
)
