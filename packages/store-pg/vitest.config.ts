import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    // One PostgreSQL server per run (or $ENGRAM_TEST_DATABASE_URL); each file makes its own database.
    globalSetup: ["@engram/test-pg/global-setup"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
})
