// Many coordinators at once against one real PostgreSQL: 32 connections place 5,000 sessions
// onto 50 hosts. No host may end over its capacity (RAM, CPU, entries), and every session must
// be placed or queued exactly once, with exactly one reservation when placed.
import { Headroom, Limits } from "@engram/core"
import { Store } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { PgDialect } from "drizzle-orm/pg-core"
import { StorePg } from "../src/index.js"
import { sumsDriftSql } from "../src/HostRows.js"
import { Harness } from "@engram/store-conformance"

const HOSTS = 50
const SESSIONS = 5000
const CLIENTS = 32

let database: TestDatabase
beforeAll(async () => {
  database = await freshDatabase()
})
afterAll(async () => {
  await database.drop()
})

describe("stress", () => {
  it("32 concurrent connections placing 5,000 sessions onto 50 hosts never over-commit and place or queue each once", async () => {
    const started = Date.now()
    const program = Effect.gen(function* () {
      const store = yield* Store
      for (let i = 0; i < HOSTS; i++) {
        const id = `h${String(i).padStart(2, "0")}`
        yield* store.registerHost({ id })
        // Hosts of different sizes, some CPU-bound: RAM 24-88 GiB after the reserve, 4-16 cores.
        yield* store.reportHost(id, {
          totalMib: 131072,
          allocatableMib: 1024 + 24576 + (i % 5) * 16384,
          totalVcpus: 4 + (i % 4) * 4,
        })
      }
      const outcomes = yield* Effect.forEach(
        Array.from({ length: SESSIONS }, (_, i) => i),
        (i) =>
          store.createSession({
            id: `s${i}`,
            budget: { memMib: 512 * (1 + (i % 8)), vcpus: 1 + (i % 3) },
            // Some sessions prefer a host, so placements also collide on named hosts.
            ...(i % 7 === 0 ? { affinity: [`h${String(i % HOSTS).padStart(2, "0")}`] } : {}),
          }),
        { concurrency: CLIENTS },
      )
      const views = yield* Harness.hostsNow(store)
      const sessions = yield* store.listSessions()
      const entries = yield* Harness.reservationsNow(store)
      return { outcomes, views, sessions, entries }
    })
    const { outcomes, views, sessions, entries } = await Effect.runPromise(
      Effect.scoped(
        Effect.provide(program, StorePg.layer({ url: database.url, poolSize: CLIENTS })),
      ),
    )
    const elapsedMs = Date.now() - started
    const placed = outcomes.filter((o) => o._tag === "Placed").length
    const queued = outcomes.filter((o) => o._tag === "Queued").length
    console.log(`stress: ${placed} placed, ${queued} queued in ${elapsedMs} ms (${Math.round((SESSIONS * 1000) / elapsedMs)} creates/s)`)

    // No host over capacity, by core's own definition of room.
    const limits = Limits.defaults
    for (const h of views) {
      expect(h.entries).toBeLessThanOrEqual(limits.maxEntriesPerNode)
      expect(Headroom.isOverReserved(h.headroom)).toBe(false)
      expect(Headroom.freeMib(h.headroom) ?? 0).toBeGreaterThanOrEqual(0)
      expect(Headroom.freeVcpus(h.headroom) ?? 0).toBeGreaterThanOrEqual(0)
    }
    // Every session exactly once, placed (with exactly one reservation) or queued.
    expect(sessions).toHaveLength(SESSIONS)
    expect(new Set(sessions.map((s) => s.id)).size).toBe(SESSIONS)
    expect(placed + queued).toBe(SESSIONS)
    const pending = sessions.filter((s) => s.state === "pending")
    expect(pending.length + sessions.filter((s) => s.state === "queued").length).toBe(SESSIONS)
    expect(pending).toHaveLength(placed)
    expect(entries).toHaveLength(placed)
    const owners = new Map(entries.map((e) => [e.ownerId, e]))
    expect(owners.size).toBe(placed)
    for (const s of pending) {
      const e = owners.get(s.id)
      expect(e?.id).toBe(s.reservationId)
      expect(e?.hostId).toBe(s.hostId)
    }
    // The ledger's sums straight from SQL agree with the views, and the maintained sums on
    // the host rows equal the ledger (host_reserved_sums) on every host.
    const sql = postgres(database.url, { max: 1 })
    try {
      expect([...(await sql.unsafe(new PgDialect().sqlToQuery(sumsDriftSql()).sql))]).toStrictEqual([])
      const rows = await sql<{ host_id: string; mem: number; n: number }[]>`
        select host_id, sum(mem_mib)::float8 as mem, count(*)::int as n from reservations group by host_id`
      for (const r of rows) {
        const v = views.find((h) => h.id === r.host_id)
        expect(v?.headroom.reserved.memMib).toBe(r.mem)
        expect(v?.entries).toBe(r.n)
      }
    } finally {
      await sql.end()
    }
    expect(placed).toBeGreaterThan(0)
    expect(queued).toBeGreaterThan(0)
  }, 300_000)
})
