import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    test: {
      // Some tests start servers of their own (~1.3 s each idle; tens of seconds on a starved machine).
      testTimeout: 120_000,
      // The same specifier other packages use; the second setup checks, at the
      // end of the run, that the test files shared that one server.
      globalSetup: ["@engram/test-pg/global-setup", "./test/support/check-shared-server.ts"],
    },
  }),
)
