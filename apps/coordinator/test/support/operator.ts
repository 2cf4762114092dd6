// A coordinator on a fresh PostgreSQL with one host reported, and an operator's own session
// (`psql-operator`) to hold locks on its rows and tables: the set-up of the tests of what the
// coordinator says while its database stalls (`lockwait`, `abandoned`).
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import type { LogLevel } from "effect"
import { expect } from "vitest"
import { client } from "./http.js"
import type { Client } from "./http.js"

/** The host every such test reports, as big as a host gets: room is never what a request waits on. */
export const report = { totalMib: 1 << 20, allocatableMib: 1 << 20, totalVcpus: 1024 }

export interface OperatorFixture {
  readonly db: TestDatabase
  readonly c: RunningCoordinator
  readonly admin: Client
  /** The operator's connections (`application_name` `psql-operator`). */
  readonly operator: postgres.Sql
  readonly stop: () => Promise<void>
}

/** The coordinator (no reaper; its store bound `storeTimeoutMs`), host `h1` reported, and the operator's `connections`. */
export const withOperator = async (options: {
  readonly adminToken: string
  readonly storeTimeoutMs: number
  readonly logLevel: LogLevel.LogLevel
  readonly connections: number
}): Promise<OperatorFixture> => {
  const db = await freshDatabase()
  const c = await startCoordinator({
    reaper: false,
    logLevel: options.logLevel,
    config: { port: 0, databaseUrl: db.url, adminToken: options.adminToken, storeTimeoutMs: options.storeTimeoutMs },
  })
  const admin = client(c.url, c.adminToken)
  expect((await admin.post("/v1/hosts", { id: "h1" })).status).toBe(201)
  expect((await admin.put("/v1/hosts/h1/report", report)).status).toBe(200)
  const operator = postgres(db.url, { max: options.connections, onnotice: () => undefined, connection: { application_name: "psql-operator" } })
  return {
    db,
    c,
    admin,
    operator,
    stop: async () => {
      await c.stop()
      await operator.end({ timeout: 1 })
      await db.drop()
    },
  }
}

/** Polls `done` on the event loop, bounded by 20 s or more: a hang detector, not a timing check. */
export const until = async (done: () => boolean | Promise<boolean>): Promise<boolean> => {
  for (let k = 0; k < 2000 && !(await done()); k++) await new Promise((r) => setTimeout(r, 10))
  return done()
}

/** What the process wrote to stdout so far, while `logged` (./http.js) captures it. */
export const written = (): string => (process.stdout.write as unknown as { mock: { calls: unknown[][] } }).mock.calls.map((call) => String(call[0])).join("")
