// What a report changed, judged inside its write (what the shared suite cannot race): two
// stores (two coordinator replicas) report one host at once on a real PostgreSQL. The report
// written second waits for the first's row lock and judges against the first's write, so
// exactly one of them (the first) sees a new peer URL: a replica's read of the host before its
// write would make both see it, and one read after would make neither.
import type { ReportedHost } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { StorePair } from "../src/StorePg.js"
import { openUrl } from "./open.js"

const figures = { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }
const u = "http://10.0.0.1:7100"
const v = "http://10.0.0.2:7100"

describe("concurrent reports of one host through two stores (PostgreSQL)", () => {
  let db: TestDatabase
  let a: { pair: StorePair; close: () => Promise<void> }
  let b: { pair: StorePair; close: () => Promise<void> }
  beforeAll(async () => {
    db = await freshDatabase()
    a = await openUrl(db.url, { poolSize: 4 })
    b = await openUrl(db.url, { poolSize: 4 })
  })
  afterAll(async () => {
    await a?.close()
    await b?.close()
    await db?.drop()
  })

  /**
   * Runs both reports while a third transaction holds the host's row, so both wait on it (each
   * has read nothing of the row yet), then lets them go: they are written one after the other.
   */
  const raced = async (id: string, reportA: Parameters<StorePair["store"]["reportHost"]>[1], reportB: typeof reportA) => {
    const sql = postgres(db.url, { max: 2, onnotice: () => undefined })
    try {
      let release = () => {}
      const gate = new Promise<void>((resolve) => (release = resolve))
      let taken = () => {}
      const isTaken = new Promise<void>((resolve) => (taken = resolve))
      const holder = sql.begin(async (tx) => {
        await tx`select id from hosts where id = ${id} for update`
        taken()
        await gate
      })
      await isTaken
      const both = Effect.runPromise(Effect.all([a.pair.store.reportHost(id, reportA), b.pair.store.reportHost(id, reportB)], { concurrency: 2 }))
      // Both reports' statements wait on the held row before it is let go (polled every 10 ms,
      // for 60 s at most: a statement that never waits fails here, clearly, not at the test's timeout).
      for (let i = 0; ; i++) {
        const [row] = await sql<{ n: number }[]>`select count(*)::int as n from pg_stat_activity
          where datname = current_database() and wait_event_type = 'Lock' and query like '%update%hosts%'`
        if ((row?.n ?? 0) >= 2) break
        if (i >= 6000) throw new Error(`the two reports never both waited on the held row (${row?.n ?? 0} waiting after 60 s)`)
        await new Promise((r) => setTimeout(r, 10))
      }
      release()
      await holder
      return await both
    } finally {
      await sql.end()
    }
  }

  const changes = (r: ReportedHost) => [r.peerUrlChanged, r.figuresChanged]

  it("a host at u reported at v by both: exactly the one written first sees the new URL; the second judges against it", async () => {
    await Effect.runPromise(Effect.andThen(a.pair.store.registerHost({ id: "h1" }), a.pair.store.reportHost("h1", { ...figures, peerUrl: u })))
    for (const [round, [from, to]] of [[u, v], [v, u], [u, v]].entries()) {
      // Different figures, so the stored row tells which report was written last.
      const [ra, rb] = await raced("h1", { ...figures, allocatableMib: 4096, peerUrl: to }, { ...figures, allocatableMib: 2048, peerUrl: to })
      const stored = await Effect.runPromise(a.pair.store.getHost("h1"))
      expect(stored.peerUrl, `round ${round}: ${from} → ${to}`).toBe(to)
      const [first, second] = stored.report?.allocatableMib === 2048 ? [ra, rb] : [rb, ra]
      expect([changes(first), changes(second)], `round ${round}: ${from} → ${to}`).toStrictEqual([
        [true, true],
        [false, true],
      ])
    }
  })

  it("the same new figures from both: exactly one sees them change; the same figures again, neither", async () => {
    await Effect.runPromise(Effect.andThen(a.pair.store.registerHost({ id: "h2" }), a.pair.store.reportHost("h2", { ...figures, peerUrl: u })))
    const next = { ...figures, allocatableMib: 6144, peerUrl: u }
    const [ra, rb] = await raced("h2", next, next)
    expect([changes(ra), changes(rb)].sort()).toStrictEqual([
      [false, false],
      [false, true],
    ])
    const [again1, again2] = await raced("h2", next, next)
    expect([changes(again1), changes(again2)]).toStrictEqual([
      [false, false],
      [false, false],
    ])
  })

  it("a host's first report, from both at once: the first written is its first report, the second a repeat", async () => {
    await Effect.runPromise(a.pair.store.registerHost({ id: "h3" }))
    const [ra, rb] = await raced("h3", { ...figures, peerUrl: u }, { ...figures, peerUrl: u })
    expect([changes(ra), changes(rb)].sort()).toStrictEqual([
      [false, false],
      [true, true],
    ])
  })
})
