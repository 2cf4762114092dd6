/**
 * An agent with two replicas whose database stalls: a real PostgreSQL, two coordinators on it
 * (store bound 15 s, the default), and an operator's psql holding the host's row (`SELECT … FOR
 * UPDATE`, idle in its transaction). The agent's report (its bound 6 s here, its heartbeat
 * interval in production) is answered 503 `StoreStalled` within that bound, naming the lock's
 * holder, and the agent says the database is not answering and stays on its replica. Before,
 * the report hung past the agent's bound on each replica in turn: "coordinator replica
 * unreachable; the agent moves to the next".
 */
import { spawn } from "node:child_process"
import type { ChildProcessWithoutNullStreams } from "node:child_process"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { createDatabase, pgBinDir, startEmbeddedPostgres } from "@engram/test-pg"
import type { EmbeddedPostgresServer, TestDatabase } from "@engram/test-pg"
import { Effect, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { makeHttp } from "../src/Coordinator.js"
import { adminCall } from "./support/Admin.js"
import { capture as captureLogs } from "./support/Logs.js"

const adminToken = "stalled-admin-token-0123456789"
const report = { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 }
let pg: EmbeddedPostgresServer
let db: TestDatabase
let replicas: RunningCoordinator[] = []
let hostToken = ""

beforeAll(async () => {
  pg = await startEmbeddedPostgres()
  db = await createDatabase(pg.url)
  for (let i = 0; i < 2; i++) replicas.push(await startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, databaseUrl: db.url, adminToken } }))
  const admin = adminCall(() => replicas[0]!.url, adminToken)
  hostToken = (await admin("POST", "/v1/hosts", { id: "a" })).body["token"] as string
  expect((await admin("PUT", "/v1/hosts/a/report", report)).status).toBe(200)
})
afterAll(async () => {
  await Promise.all(replicas.map((r) => r.stop()))
  replicas = []
  await db?.drop()
  await pg?.stop()
})

/** An operator's psql: `sql` sent, and its output so far. */
const psql = (url: string): { readonly send: (sql: string) => void; readonly output: () => string; readonly proc: ChildProcessWithoutNullStreams } => {
  const proc = spawn(join(pgBinDir({ needs: ["psql"] }), "psql"), ["-X", "-q", "-A", "-t", url], { env: { ...process.env, PGAPPNAME: "psql-operator" } })
  let out = ""
  proc.stdout.on("data", (d: Buffer) => (out += d.toString()))
  proc.stderr.on("data", (d: Buffer) => (out += d.toString()))
  return { send: (sql) => proc.stdin.write(sql), output: () => out, proc }
}

/** Polls `done`, bounded by 20 s or more: a hang detector, not a timing check. */
const until = async (done: () => boolean): Promise<boolean> => {
  for (let k = 0; k < 2000 && !done(); k++) await new Promise((r) => setTimeout(r, 10))
  return done()
}

/**
 * The agent (bound `callTimeoutMs`) on `urls` reports while an operator's psql holds its host's
 * row; the report's failure, the lock holder's pid and the agent's warnings, then the lock is
 * let go and the next report's outcome.
 */
const reportWhileLocked = async (urls: readonly string[], callTimeoutMs: number) => {
  const { layer: capture, lines: warnings } = captureLogs("Warn")
  const client = await Effect.runPromise(makeHttp({ url: [...urls], hostId: "a", hostToken: Redacted.make(hostToken), callTimeoutMs }).pipe(Effect.provide(FetchHttpClient.layer)))
  const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(Effect.result(eff).pipe(Effect.provide(capture)))
  const operator = psql(db.url)
  try {
    operator.send("begin;\nselect id from hosts where id = 'a' for update;\nselect 'pid=' || pg_backend_pid();\n")
    expect(await until(() => /pid=\d+/.test(operator.output())), operator.output()).toBe(true)
    const pid = /pid=(\d+)/.exec(operator.output())![1]
    const stalled = await run(client.report(report))
    expect(stalled._tag).toBe("Failure")
    const error = stalled._tag === "Failure" ? (stalled.failure as { status?: unknown; message?: string }) : {}
    const warnedWhileLocked = [...warnings]
    operator.send("rollback;\n")
    const after = await run(client.report(report))
    return { error, pid, warnedWhileLocked, warnings, after }
  } finally {
    operator.send("rollback;\n\\q\n")
    operator.proc.stdin.end()
  }
}

const staysWarning = "the coordinator's database is not answering (the same on every replica); the agent stays on this one and retries"

describe("a database that stalls for every replica", () => {
  it("answers the agent's report 503 StoreStalled within its bound, naming the lock's holder; the agent says so and stays on its replica", async () => {
    const urls = replicas.map((r) => r.url)
    const { error, pid, warnedWhileLocked, warnings, after } = await reportWhileLocked(urls, 6000)
    expect(error.status).toBe(503)
    expect(error.message).toContain("the coordinator's database answers but did not complete reportHost")
    expect(error.message).toContain(`held by pid ${pid} (application "psql-operator"`)
    expect(warnedWhileLocked.map((w) => w.message)).toEqual([staysWarning])
    expect(warnedWhileLocked[0]!.fields["op"]).toBe("report")
    // Still there: the next report, once the lock is gone, lands on the same replica without a move.
    expect(after._tag).toBe("Success")
    expect(warnings.filter((w) => w.message.includes("moves to the next"))).toEqual([])
    expect(urls).toContain(warnedWhileLocked[0]!.fields["replica"])
  })

  it("answers StoreStalled at the store's own bound too, when the agent waits longer than it (the defaults: the agent 30 s, the store 15 s)", async () => {
    // Replicas whose store bound (3 s) comes before the agent's (8 s less the margin: 5.5 s), as
    // at the defaults; the agent states its bound, which here bounds nothing.
    const short: RunningCoordinator[] = []
    try {
      for (let i = 0; i < 2; i++)
        short.push(await startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, databaseUrl: db.url, adminToken, storeTimeoutMs: 3000 } }))
      const { error, pid, warnedWhileLocked, warnings, after } = await reportWhileLocked(short.map((r) => r.url), 8000)
      // Before: 503 Unavailable ("the database did not answer reportHost within 3000 ms"), and the agent moved to the next replica.
      expect(error.status).toBe(503)
      expect(error.message).toContain("the coordinator's database answers but is stalled: the database did not answer reportHost within 3000 ms (ENGRAM_STORE_TIMEOUT_MS)")
      expect(error.message).toContain(`held by pid ${pid} (application "psql-operator"`)
      expect(warnedWhileLocked.map((w) => w.message)).toEqual([staysWarning])
      expect(after._tag).toBe("Success")
      expect(warnings.filter((w) => w.message.includes("moves to the next"))).toEqual([])
    } finally {
      await Promise.all(short.map((r) => r.stop()))
    }
  })
})
