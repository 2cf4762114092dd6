// The maintained per-host sums (hosts.reserved_mem_mib, reserved_vcpus, entries) must equal
// the ledger (the view host_reserved_sums) after any mix of operations. A seeded random run of
// every operation that writes reservations, from concurrent clients on three stores sharing one
// PostgreSQL database (fresh reads, a reused read, the locking path), then on PGlite; and a migration
// backfill of sums for a database that held reservations before the sums existed.
import { Headroom, Limits } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"
import { Harness } from "@engram/store-conformance"

const limits: Limits.Limits = { ...Limits.defaults, heartbeatStaleWindowMs: 30 }

/** A small seeded PRNG (mulberry32): the same run every time. */
const prng = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

const HOSTS = ["h0", "h1", "h2", "h3", "h4", "h5"]

const reportOf = (id: string) => {
  const i = HOSTS.indexOf(id)
  return { totalMib: 65536, allocatableMib: 4096 + 2048 * i, totalVcpus: 4 + i, peerUrl: Harness.peerUrlOf(id) }
}

const setup = (s: StoreShape) => Effect.forEach(HOSTS, (id) => Effect.andThen(s.registerHost({ id }), s.reportHost(id, reportOf(id))))

/** One client: `steps` random operations; every failure is expected somewhere and ignored. */
const client = (s: StoreShape, seed: number, steps: number) =>
  Effect.gen(function* () {
    const rnd = prng(seed)
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)] as T
    const sessions: string[] = []
    const moves: string[] = []
    const externals: string[] = []
    for (let i = 0; i < steps; i++) {
      const r = rnd()
      const sid = sessions.length > 0 ? pick(sessions) : "none"
      const op: Effect.Effect<unknown, unknown> =
        r < 0.25
          ? Effect.sync(() => sessions.push(`c${seed}-${i}`)).pipe(
              Effect.andThen(
                s.createSession({
                  id: `c${seed}-${i}`,
                  budget: { memMib: 256 * (1 + Math.floor(rnd() * 8)), vcpus: 1 + Math.floor(rnd() * 2) },
                  ...(rnd() < 0.2 ? { affinity: [pick(HOSTS)] } : {}),
                }),
              ),
            )
          : r < 0.35
            ? s.markRunning(sid)
            : r < 0.42
              ? s.idle(sid)
              : r < 0.46
                ? s.beginDescent(sid)
                : r < 0.5
                  ? s.finishDescent(sid)
                  : r < 0.54
                    ? s.resume(sid)
                    : r < 0.6
                      ? s.endSession(sid)
                      : r < 0.66
                        ? Effect.map(s.beginMove({ sessionId: sid, maxDowntimeMs: 600 }), (m) => moves.push(m.id))
                        : r < 0.7
                          ? s.commitMove(pick(moves.length > 0 ? moves : ["none"]), { downtimeMs: 1, captureMs: 1, sendMs: 1, commitMs: 1 })
                          : r < 0.74
                            ? s.abortMove(pick(moves.length > 0 ? moves : ["none"]), "test", { onlyBeforeFinalRound: rnd() < 0.5 })
                            : r < 0.8
                              ? Effect.map(
                                  s.reserve({
                                    id: `x${seed}-${i}`,
                                    hostId: pick(HOSTS),
                                    ownerKind: rnd() < 0.5 ? "external" : "capture",
                                    ownerId: `o${seed}`,
                                    memMib: 100.1 + Math.floor(rnd() * 500) / 10,
                                    vcpus: Math.floor(rnd() * 2) / 4,
                                  }),
                                  (e) => externals.push(e.id),
                                )
                              : r < 0.85
                                ? s.release(pick(externals.length > 0 ? externals : ["none"]))
                                : r < 0.9
                                  ? s.drainQueue({ limit: 1 + Math.floor(rnd() * 5) })
                                  : r < 0.93
                                    ? s.reclaim()
                                    : r < 0.945
                                      ? s.heartbeatHost(pick(HOSTS))
                                      : r < 0.96
                                        ? // Agents report as they do on a timer: with a 30 ms window a host is silent (takes no placements) between its reports.
                                          Effect.suspend(() => {
                                            const h = pick(HOSTS)
                                            return s.reportHost(h, reportOf(h))
                                          })
                                      : s.setHostState(pick(HOSTS), pick(["ready", "ready", "cordoned", "draining"] as const))
      yield* Effect.ignore(op)
      if (rnd() < 0.05) yield* Effect.promise(() => new Promise((res) => setTimeout(res, 10)))
    }
  })

const checkStore = (s: StoreShape) =>
  Effect.gen(function* () {
    for (const h of yield* Harness.hostsNow(s)) {
      expect(Headroom.isOverReserved(h.headroom)).toBe(false)
      expect(h.entries).toBeLessThanOrEqual(limits.maxEntriesPerNode)
    }
    // Views read the maintained sums: they agree with the entries the ledger lists.
    const entries = yield* Harness.reservationsNow(s)
    for (const h of yield* Harness.hostsNow(s)) {
      const mine = entries.filter((e) => e.hostId === h.id)
      expect(h.entries).toBe(mine.length)
      expect(h.headroom.reserved.memMib).toBeCloseTo(mine.reduce((a, e) => a + e.memMib, 0), 6)
    }
  })

describe("maintained host sums", () => {
  it("equal the ledger after a random run of every operation from concurrent clients on three PostgreSQL stores (fresh, reused and locking placement)", async () => {
    const db = await freshDatabase()
    try {
      const program = Effect.gen(function* () {
        const a = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 8 })
        const b = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 8, placementReadMaxAgeMs: 200 })
        const c = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 4, optimisticPlacementAttempts: 0 })
        yield* setup(a.store)
        yield* Effect.forEach(
          Array.from({ length: 9 }, (_, i) => i),
          (i) => client([a, b, c][i % 3]!.store, 1000 + i, 180),
          { concurrency: "unbounded" },
        )
        yield* checkStore(a.store)
        const ended = yield* Harness.reservationsNow(a.store)
        expect(ended.length).toBeGreaterThan(0)
        expect(yield* a.sumsDrift).toStrictEqual([])
        // And back to zero when everything goes.
        for (const sx of yield* a.store.listSessions()) yield* Effect.ignore(a.store.endSession(sx.id))
        for (const e of yield* Harness.reservationsNow(a.store)) yield* Effect.ignore(a.store.release(e.id))
        expect(yield* Harness.reservationsNow(a.store)).toStrictEqual([])
        expect(yield* a.sumsDrift).toStrictEqual([])
        for (const h of yield* Harness.hostsNow(a.store)) expect([h.entries, h.headroom.reserved.memMib, h.headroom.reserved.vcpus]).toStrictEqual([0, 0, 0])
      })
      await Effect.runPromise(Effect.scoped(program))
    } finally {
      await db.drop()
    }
  }, 500_000)

  it("hold when two stores create the same sessions at once (batched placements that hit a duplicate)", async () => {
    const db = await freshDatabase()
    try {
      const program = Effect.gen(function* () {
        const a = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 8 })
        const b = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 8, placementReadMaxAgeMs: 100 })
        yield* setup(a.store)
        const ids = Array.from({ length: 300 }, (_, i) => `d${i}`)
        const create = (st: StoreShape, id: string, i: number) =>
          st.createSession({ id, budget: { memMib: 256 * (1 + (i % 3)), vcpus: 1 } })
        // Both stores create every id, concurrently, so their statements carry the same ids.
        const [fromA, fromB] = yield* Effect.all(
          [
            Effect.forEach(ids, (id, i) => create(a.store, id, i), { concurrency: 16 }),
            Effect.forEach(ids, (id, i) => create(b.store, id, i), { concurrency: 16 }),
          ],
          { concurrency: 2 },
        )
        const sessions = yield* a.store.listSessions()
        expect(sessions.map((x) => x.id).sort()).toStrictEqual([...ids].sort())
        const byId = new Map(sessions.map((x) => [x.id, x]))
        for (const [i, id] of ids.entries()) {
          const now = byId.get(id)
          // Each answer is the session's one placement (or its place in the queue).
          for (const o of [fromA[i], fromB[i]]) {
            expect(o?.session.id).toBe(id)
            if (o?._tag === "Placed") expect(o.session.hostId).toBe(now?.hostId)
          }
        }
        const entries = yield* Harness.reservationsNow(a.store)
        expect(entries).toHaveLength(sessions.filter((x) => x.hostId !== null).length)
        yield* checkStore(a.store)
        expect(yield* a.sumsDrift).toStrictEqual([])
      })
      await Effect.runPromise(Effect.scoped(program))
    } finally {
      await db.drop()
    }
  }, 300_000)

  it("equal the ledger after a random run on PGlite", async () => {
    const program = Effect.gen(function* () {
      const p = yield* StorePg.openPglite({ limits })
      yield* setup(p.store)
      yield* Effect.forEach([1, 2, 3], (i) => client(p.store, 2000 + i, 100), { concurrency: "unbounded" })
      yield* checkStore(p.store)
      expect(yield* p.sumsDrift).toStrictEqual([])
    })
    await Effect.runPromise(Effect.scoped(program))
  }, 500_000)

  it("are backfilled from the ledger by the migration for a database that held reservations before them", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      // The schema as of the migrations before the sums, applied by hand, with data in it.
      const { readFileSync } = await import("node:fs")
      const { migrationsFolder } = await import("../src/index.js")
      const journal = JSON.parse(readFileSync(`${migrationsFolder}/meta/_journal.json`, "utf8")) as {
        entries: { tag: string; when: number; idx: number }[]
      }
      const before = journal.entries.filter((e) => e.idx < 2)
      await sql`create schema if not exists drizzle`
      await sql`create table drizzle.__drizzle_migrations (id serial primary key, hash text not null, created_at bigint)`
      const { createHash } = await import("node:crypto")
      for (const e of before) {
        const text = readFileSync(`${migrationsFolder}/${e.tag}.sql`, "utf8")
        for (const stmt of text.split("--> statement-breakpoint")) if (stmt.trim() !== "") await sql.unsafe(stmt)
        await sql`insert into drizzle.__drizzle_migrations (hash, created_at) values (${createHash("sha256").update(text).digest("hex")}, ${e.when})`
      }
      await sql`insert into hosts (id, created_at) values ('a', 0), ('b', 0), ('c', 0)`
      await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
        values ('r1', 'a', 'external', 'o', 100.1, 0.25, 0, 0), ('r2', 'a', 'external', 'o', 200.2, 1, 0, 0), ('r3', 'b', 'external', 'o', 512, 2, 0, 0)`
      // Now the store's migrator applies the rest, including the backfill.
      const p = await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const pair = yield* StorePg.openUrl({ url: db.url })
            return { drift: yield* pair.sumsDrift, hosts: yield* Harness.hostsNow(pair.store) }
          }),
        ),
      )
      expect(p.drift).toStrictEqual([])
      expect(p.hosts.map((h) => [h.id, h.entries, h.headroom.reserved.memMib, h.headroom.reserved.vcpus])).toStrictEqual([
        ["a", 2, 300.3, 1.25],
        ["b", 1, 512, 2],
        ["c", 0, 0, 0],
      ])
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 60_000)
})
