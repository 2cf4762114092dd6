import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  test: {
    // One PostgreSQL server per run (or $ENGRAM_TEST_DATABASE_URL); each file makes its own database.
    globalSetup: ["@engram/test-pg/global-setup"],
    testTimeout: 180_000,
    hookTimeout: 120_000,
  },
}))
