import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  test: {
    // One PostgreSQL server per run (or $ENGRAM_TEST_DATABASE_URL); each file makes its own database.
    globalSetup: ["@engram/test-pg/global-setup"],
    testTimeout: 180_000,
    // Two files at once (each on its own database): this package's tests are the longest of
    // `pnpm test` (17 of its 18 minutes in CI, one file at a time: vitest's default on two
    // cores), and the other packages end minutes before it, leaving a core idle.
    maxWorkers: 2,
    hookTimeout: 120_000,
  },
}))
