// Holds for starving sessions across replicas (what the shared suite, one store at a time,
// cannot see), on PostgreSQL and the TestClock: a replica that never saw a session queue keeps
// its creates off the host claimed for it once it starves; and the claim costs a read of the
// queue only when the queue's head may have waited the starvation limit.
import { it } from "@effect/vitest"
import postgres from "@engram/postgres"
import { Limits, ParkPolicy } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { Harness } from "@engram/store-conformance"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, describe, expect } from "vitest"
import type { Conn } from "../src/Db.js"
import * as HostCache from "../src/HostCache.js"
import * as PostgresJs from "../src/PostgresJs.js"
import * as StorePg from "../src/StorePg.js"
import type { Unavailable } from "@engram/store"

const LIMIT = ParkPolicy.defaultOptions.starvationLimitMs
const mib = (memMib: number) => ({ memMib, vcpus: 1 })

let database: Promise<TestDatabase> | undefined
const url = Effect.promise(() => (database ??= freshDatabase())).pipe(Effect.map((db) => db.url))
afterAll(async () => {
  if (database !== undefined) await (await database).drop()
})

/** A store (a replica) on the test database. */
const replica = Effect.gen(function* () {
  const db = yield* PostgresJs.open({ url: yield* url, poolSize: 4 })
  return { db, ...StorePg.make(db, Limits.defaults) }
})

const addHost = (s: StoreShape, id: string, capacityMib: number) =>
  Effect.andThen(s.registerHost({ id }), s.reportHost(id, Harness.reportFor(capacityMib, 8)))

const placedOn = (s: StoreShape, id: string, budget: { memMib: number; vcpus: number }, affinity: readonly string[] = []) =>
  Effect.map(s.createSession({ id, budget, affinity }), (o) => (o._tag === "Placed" ? o.session.hostId : `queued, not placed`))

describe("holds for starving sessions on PostgreSQL", () => {
  it.effect(
    "a replica that never saw the session queue keeps its creates off the host claimed for it once it starves",
    () =>
      Effect.gen(function* () {
        const a = yield* replica
        const b = yield* replica
        yield* a.testing.reset(Limits.defaults)
        yield* addHost(a.store, "h1", 8192)
        expect(yield* placedOn(a.store, "h1-big", mib(5120))).toBe("h1")
        expect(yield* placedOn(a.store, "h1-small", mib(1024))).toBe("h1")
        yield* addHost(a.store, "h2", 8192)
        expect(yield* placedOn(a.store, "h2-big", mib(6144))).toBe("h2")
        // B places while nothing is queued (it learns the queue is quiet), then A queues "big".
        expect(yield* placedOn(b.store, "early", mib(512), ["h2"])).toBe("h2")
        const big = yield* a.store.createSession({ id: "big", budget: mib(4096) })
        expect(big._tag).toBe("Queued")
        yield* TestClock.adjust(LIMIT)
        // The agents report on schedule meanwhile: no host is silent (`Placement.isSilent`).
        for (const id of ["h1", "h2"]) yield* a.store.reportHost(id, Harness.reportFor(8192, 8))
        // h1 has 3 GiB free, h2 1.5 GiB: h1 is held for "big". B's create preferring h1 goes to h2.
        yield* a.store.endSession("h1-small")
        expect(yield* placedOn(b.store, "near", mib(1024), ["h1"])).toBe("h2")
        // One that fits only on h1 queues behind "big", on either replica.
        expect(yield* placedOn(b.store, "only-b", mib(2048))).toBe("queued, not placed")
        expect(yield* placedOn(a.store, "only-a", mib(2048))).toBe("queued, not placed")
        yield* a.store.endSession("h1-big")
        expect((yield* b.store.drainQueue()).placed[0]).toStrictEqual({ sessionId: "big", hostId: "h1" })
        expect(yield* a.sumsDrift).toStrictEqual([])
      }),
    60_000,
  )

  it.effect(
    "a drain that skips a starving session another drain holds locked leaves the host claimed for it alone",
    () =>
      Effect.gen(function* () {
        const a = yield* replica
        const b = yield* replica
        yield* a.testing.reset(Limits.defaults)
        yield* addHost(a.store, "h1", 4096)
        expect(yield* placedOn(a.store, "resident", mib(2048))).toBe("h1")
        expect((yield* a.store.createSession({ id: "big", budget: mib(4096) }))._tag).toBe("Queued")
        yield* TestClock.adjust(LIMIT)
        yield* a.store.reportHost("h1", Harness.reportFor(4096, 8))
        // h1 is held for "big" (it fits there once emptied): "small" queues behind it.
        expect(yield* placedOn(b.store, "small", mib(1024))).toBe("queued, not placed")
        // Another replica's drain holds "big" locked (its transaction open): B's drain skips that row.
        const raw = postgres(yield* url, { max: 1, onnotice: () => undefined })
        let release = () => {}
        const held = new Promise<void>((r) => (release = r))
        let locked = () => {}
        const isLocked = new Promise<void>((r) => (locked = r))
        const other = raw.begin(async (sql) => {
          await sql`select id from sessions where id = 'big' for update`
          locked()
          await held
        })
        const drained = yield* Effect.ensuring(
          Effect.andThen(Effect.promise(() => isLocked), b.store.drainQueue()),
          Effect.promise(async () => {
            release()
            await other
            await raw.end()
          }),
        )
        // Before, B's walk saw only "small" (not starving: no claim) and placed it in the room "big" waits for.
        expect(drained.placed).toStrictEqual([])
        expect((yield* a.store.getSession("small")).state).toBe("queued")
        expect(yield* a.sumsDrift).toStrictEqual([])
      }),
    60_000,
  )

  it.effect(
    "a placement reads the queue for claims only when its head may have waited the starvation limit",
    () =>
      Effect.gen(function* () {
        const { db, store, testing } = yield* replica
        // A stale window longer than the times judged here: h1 reports once and is never silent (`Placement.isSilent`).
        const limits = { ...Limits.defaults, heartbeatStaleWindowMs: 10 * LIMIT }
        yield* testing.reset(limits)
        yield* addHost(store, "h1", 8192)
        let reads = 0
        const counted = { ...db.pool, query: (s: Parameters<typeof db.pool.query>[0]) => Effect.suspend(() => (reads++, db.pool.query(s))) }
        const cache = HostCache.make({ limits, maxReadAgeMs: 0, pool: counted as unknown as Conn<Unavailable> })
        yield* cache.refresh(performance.now())
        /** The claims at `t` and the statements they took. */
        const claimsAt = (t: number) =>
          Effect.gen(function* () {
            const before = reads
            const claimed = yield* cache.claims(t, LIMIT)
            return { claimed: [...claimed.keys()], reads: reads - before }
          })
        // An empty queue: nobody can starve for a whole limit after the read.
        expect(yield* claimsAt(0)).toStrictEqual({ claimed: [], reads: 1 })
        expect(yield* claimsAt(LIMIT - 1)).toStrictEqual({ claimed: [], reads: 0 })
        yield* TestClock.setTime(10)
        expect((yield* store.createSession({ id: "big", budget: mib(16384) }))._tag).toBe("Queued")
        // Read again once the limit has passed since the last read; the head queued at 10 starves at 10 + LIMIT.
        expect(yield* claimsAt(LIMIT)).toStrictEqual({ claimed: [], reads: 1 })
        expect(yield* claimsAt(LIMIT + 9)).toStrictEqual({ claimed: [], reads: 0 })
        // Too big for every host: starving, but no host can be held for it.
        expect(yield* claimsAt(LIMIT + 10)).toStrictEqual({ claimed: [], reads: 1 })
        yield* store.endSession("big")
        yield* TestClock.setTime(LIMIT + 20)
        expect((yield* store.createSession({ id: "mid", budget: mib(4096) }))._tag).toBe("Placed")
        expect((yield* store.createSession({ id: "starver", budget: mib(6144) }))._tag).toBe("Queued")
        yield* cache.refresh(performance.now())
        // Starving: every placement reads the starving part of the queue and core claims h1.
        expect(yield* claimsAt(2 * LIMIT + 20)).toStrictEqual({ claimed: ["h1"], reads: 1 })
        expect(yield* claimsAt(2 * LIMIT + 21)).toStrictEqual({ claimed: ["h1"], reads: 1 })
        // A clock that went back reads again rather than trust a quiet window from the future.
        yield* store.endSession("starver")
        expect(yield* claimsAt(3 * LIMIT)).toStrictEqual({ claimed: [], reads: 1 })
        expect(yield* claimsAt(3 * LIMIT + 1)).toStrictEqual({ claimed: [], reads: 0 })
        expect(yield* claimsAt(LIMIT)).toStrictEqual({ claimed: [], reads: 1 })
      }),
    60_000,
  )
})
