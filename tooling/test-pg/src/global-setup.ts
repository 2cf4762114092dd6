// vitest globalSetup: one PostgreSQL server per test run, its URL provided to
// the test files (inject("engramTestPgUrl"), which freshDatabase() reads) and
// put in $ENGRAM_TEST_PG_URL. With $ENGRAM_TEST_DATABASE_URL set, that server
// is used and nothing is started.
//
//   // vitest.config.ts
//   test: { globalSetup: ["@engram/test-pg/global-setup"] }
import type { TestProject } from "vitest/node"
import { startEmbeddedPostgres } from "./embedded.js"
import type { EmbeddedPostgresServer } from "./embedded.js"
import { EXTERNAL_URL_ENV, PROVIDE_KEY, SERVER_URL_ENV } from "./provided.js"

interface SharedState {
  server: Promise<EmbeddedPostgresServer> | undefined
  users: number
}

// Several projects of one vitest run may each load this file (possibly as
// separate module instances): they share one server through globalThis.
const STATE_KEY = Symbol.for("@engram/test-pg/global-setup")

function sharedState(): SharedState {
  const holder = globalThis as { [STATE_KEY]?: SharedState }
  return (holder[STATE_KEY] ??= { server: undefined, users: 0 })
}

export default async function globalSetup(project: TestProject): Promise<() => Promise<void>> {
  const external = process.env[EXTERNAL_URL_ENV]
  if (external !== undefined && external !== "") {
    project.provide(PROVIDE_KEY, external)
    process.env[SERVER_URL_ENV] = external
    return async () => undefined
  }

  const state = sharedState()
  state.users += 1
  state.server ??= startEmbeddedPostgres()
  let server: EmbeddedPostgresServer
  try {
    server = await state.server
  } catch (error) {
    state.users -= 1
    if (state.users === 0) state.server = undefined
    throw error
  }
  project.provide(PROVIDE_KEY, server.url)
  process.env[SERVER_URL_ENV] = server.url

  let released = false
  return async () => {
    if (released) return
    released = true
    state.users -= 1
    if (state.users > 0) return
    state.server = undefined
    if (process.env[SERVER_URL_ENV] === server.url) delete process.env[SERVER_URL_ENV]
    await server.stop()
  }
}
