// Change notices across processes on one PostgreSQL (ChangesPg): a publish reaches the other
// process's subscribers; a listener that vanishes without a clean leave (a process killed
// between its write and its notice) makes the others say notices may have been missed, and a
// clean leave does not; a process whose own listener is cut listens again and says so.
import type { Listener } from "@engram/store"
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ChangesPg } from "../src/index.js"

let db: TestDatabase
beforeAll(async () => {
  db = await freshDatabase()
})
afterAll(async () => {
  await db.drop()
})

const checkMs = 100

/** A process's notices: what its one subscriber heard, and how to close it. */
const open = async (url = db.url) => {
  const scope = Effect.runSync(Scope.make())
  const made = await Effect.runPromise(Scope.provide(ChangesPg.make({ url, checkMs }), scope))
  const heard: string[] = []
  let missed = 0
  const listener: Listener = { changed: (ts) => heard.push(...ts), missed: () => missed++ }
  await Effect.runPromise(Scope.provide(made.changes.subscribe(listener), scope))
  return { ...made, heard, missed: () => missed, close: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

/** Waits until `holds` (checked every 10 ms, up to 10 s): a condition, not a timing. */
const until = async (holds: () => boolean): Promise<void> => {
  for (let i = 0; i < 1000 && !holds(); i++) await new Promise((r) => setTimeout(r, 10))
  expect(holds()).toBe(true)
}

describe("ChangesPg", () => {
  it("a publish reaches this process at once and the other process through NOTIFY", async () => {
    const a = await open()
    const b = await open()
    try {
      await Effect.runPromise(a.changes.publish(["host:x1", "session:y1", "host:x1"]))
      expect(a.heard).toEqual(["host:x1", "session:y1"])
      await until(() => b.heard.length === 2)
      expect(b.heard).toEqual(["host:x1", "session:y1"])
      expect(a.changes.live() && b.changes.live()).toBe(true)
    } finally {
      await a.close()
      await b.close()
    }
  })

  it("a listener that vanishes without a clean leave makes the others say notices may be lost; a clean leave does not", async () => {
    const a = await open()
    const b = await open()
    const c = await open()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      // Every process has seen the others listen.
      await until(() => b.stats().checks >= 2 && c.stats().checks >= 2)
      await c.close()
      const checks = b.stats().checks
      await until(() => b.stats().checks >= checks + 3)
      expect(b.missed()).toBe(0)
      // A killed process: its listening backend ends without a word.
      const pids = (await sql<{ pid: number }[]>`select pid from pg_stat_activity where application_name = ${ChangesPg.applicationName} and datname = current_database()`).map((r) => r.pid)
      const [ofA] = await sql<{ pid: number }[]>`select pid from pg_stat_activity where application_name = ${ChangesPg.applicationName} and datname = current_database() order by backend_start limit 1`
      expect(pids).toHaveLength(2)
      await sql`select pg_terminate_backend(${ofA?.pid ?? -1})`
      await until(() => b.missed() >= 1)
      // A listens again, says its own notices may have been lost, and its notices reach B again.
      await until(() => a.missed() >= 1 && a.changes.live())
      await Effect.runPromise(a.changes.publish(["host:after"]))
      await until(() => b.heard.includes("host:after"))
    } finally {
      await sql.end()
      await a.close()
      await b.close()
    }
  })

  it("notices published while its listener is down still go out when the process stops before the listener is back", async () => {
    // A reaches PostgreSQL through a proxy the test cuts; B directly.
    const { proxy, url } = await startProxyFor(db.url)
    const a = await open(url)
    const b = await open()
    try {
      await until(() => b.stats().checks >= 2)
      // A's listener is cut and cannot come back: B says notices may be lost (A vanished).
      proxy.refuse(true)
      proxy.cut()
      await until(() => !a.changes.live() && b.missed() >= 1)
      // A writes meanwhile: its notice waits for a listener. Several refused reconnects put A's
      // supervisor in a back-off of seconds, so it is not back before A stops.
      await Effect.runPromise(a.changes.publish(["session:written-while-down"]))
      await until(() => proxy.refused() >= 4)
      expect(b.heard).not.toContain("session:written-while-down")
      proxy.refuse(false)
      await a.close()
      // The notice reached B (before: dropped with A, and B was told of nothing missed after A vanished).
      await until(() => b.heard.includes("session:written-while-down"))
      expect(a.stats().sent).toBeGreaterThanOrEqual(1)
    } finally {
      await a.close()
      await b.close()
      await proxy.close()
    }
  })
})
