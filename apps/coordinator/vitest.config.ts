import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // One real PostgreSQL for the run (embedded, or $ENGRAM_TEST_DATABASE_URL).
      globalSetup: ["@engram/test-pg/global-setup"],
      // PGlite's first start (initdb in WASM) and child coordinators take seconds; under a CI
      // run of every package on two cores, tens of them (45 s of a start-up test seen).
      testTimeout: 300_000,
      hookTimeout: 300_000,
    },
  }),
)
