import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // A real PostgreSQL for the fresh project's outage test (or $ENGRAM_TEST_DATABASE_URL).
      globalSetup: ["@engram/test-pg/global-setup"],
      // Versioning, publishing and two installs from the npm registry through Verdaccio take
      // minutes on a busy 2-core machine (the longest step took 264 s there, the whole file
      // 509 s); each step's bound is more than three times that.
      testTimeout: 1_200_000,
      hookTimeout: 1_200_000,
    },
  }),
)
