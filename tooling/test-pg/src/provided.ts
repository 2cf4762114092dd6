// How the server URL travels from the vitest globalSetup (main process) to the
// test files (worker processes): vitest's provide/inject, with an environment
// variable as a second channel for child processes the tests spawn.

/** The key under which globalSetup provides the server URL (`inject(PROVIDE_KEY)`). */
export const PROVIDE_KEY = "engramTestPgUrl"

/**
 * The environment variable globalSetup sets to the server URL in the vitest
 * main process; workers and processes spawned from them inherit it.
 */
export const SERVER_URL_ENV = "ENGRAM_TEST_PG_URL"

/** Set it to use an existing PostgreSQL server instead of starting one. */
export const EXTERNAL_URL_ENV = "ENGRAM_TEST_DATABASE_URL"

declare module "vitest" {
  export interface ProvidedContext {
    /** URL of the PostgreSQL server of this test run (maintenance database). */
    engramTestPgUrl: string
  }
}
