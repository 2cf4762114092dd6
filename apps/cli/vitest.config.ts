import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    // The tests run the built `engram` as a real process (built once, before the files run).
    test: { globalSetup: ["test/support/build.ts"], testTimeout: 300_000, hookTimeout: 300_000 },
  }),
)
