import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    // One real PostgreSQL for the run (embedded, or $ENGRAM_TEST_DATABASE_URL).
    globalSetup: ["@engram/test-pg/global-setup"],
    // PGlite's first start (initdb in WASM) and child coordinators take seconds.
    testTimeout: 120_000,
    hookTimeout: 180_000,
  },
})
