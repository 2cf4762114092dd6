import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // A real PostgreSQL for the fresh project's outage test (or $ENGRAM_TEST_DATABASE_URL).
      globalSetup: ["@engram/test-pg/global-setup"],
      // Versioning, publishing and two installs from the npm registry through Verdaccio take
      // minutes on a busy 2-core machine; each step has a bound three times what it took there.
      testTimeout: 900_000,
      hookTimeout: 900_000,
    },
  }),
)
