import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // One real PostgreSQL for the run (embedded, or $ENGRAM_TEST_DATABASE_URL).
      globalSetup: ["@engram/test-pg/global-setup"],
      // Real processes (coordinators, agents, PostgreSQL) start in seconds on a loaded machine;
      // the bounds are generous, the scenarios finish on events, never on a timer.
      testTimeout: 240_000,
      hookTimeout: 180_000,
      // Each scenario spawns processes of its own: one file at a time keeps the 2-core machine
      // (shared with the rest of `pnpm test`) from starving them.
      fileParallelism: false,
    },
  }),
)
