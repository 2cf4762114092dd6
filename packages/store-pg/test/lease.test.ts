// Leadership with a lease and fencing (SPEC §13) on PGlite, on the TestClock: a holder stops
// acting by itself once it cannot renew within its renew deadline; another replica takes over
// only after seeing the lease unchanged for a whole lease duration, at the next epoch; writes
// made under the old epoch are refused in their own transaction; a lease given up is taken at once.
import { it } from "@effect/vitest"
import postgres from "@engram/postgres"
import { CurrentFence, Leadership } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Logger, Scope } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect } from "vitest"
import * as Lease from "../src/Lease.js"
import * as Pglite from "../src/Pglite.js"
import * as PostgresJs from "../src/PostgresJs.js"
import * as StorePg from "../src/StorePg.js"

const times = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000 }

describe("a lease on PostgreSQL (PGlite, TestClock)", () => {
  it.effect("the holder's advertised address is what the others read as the leader's; it moves with the lease", () =>
    Effect.gen(function* () {
      const db = yield* Pglite.open()
      let aUrl: string | null = null
      const a = yield* Lease.make(db, { ...times, holder: "a", advertise: () => aUrl })
      const b = yield* Lease.make(db, { ...times, holder: "b", advertise: () => "http://b:7070" })
      expect(yield* a.tick).toBe(true)
      expect(yield* b.tick).toBe(false)
      // A took the lease before it knew its address: none yet.
      expect(b.leaderUrl()).toBeNull()
      aUrl = "http://a:7070"
      expect(a.leaderUrl()).toBe("http://a:7070")
      yield* TestClock.adjust(5_000)
      expect(yield* a.tick).toBe(true)
      expect(yield* b.tick).toBe(false)
      expect(b.leaderUrl()).toBe("http://a:7070")
      // A freezes; B takes over after a whole unchanged lease and answers its own address; A, not leading, none.
      yield* TestClock.adjust(14_999)
      expect(yield* b.tick).toBe(false)
      expect(b.leaderUrl()).toBe("http://a:7070")
      yield* TestClock.adjust(1)
      expect(yield* b.tick).toBe(true)
      expect(b.leaderUrl()).toBe("http://b:7070")
      expect(a.leaderUrl()).toBeNull()
      expect(yield* a.tick).toBe(false)
      expect(a.leaderUrl()).toBe("http://b:7070")
    }),
  )

  it.effect("unrenewedMs: how long each replica has seen no renewal; it grows on all of them while no replica leads, and drops at the takeover", () =>
    Effect.gen(function* () {
      const db = yield* Pglite.open()
      const a = yield* Lease.make(db, { ...times, holder: "a" })
      const b = yield* Lease.make(db, { ...times, holder: "b" })
      const c = yield* Lease.make(db, { ...times, holder: "c" })
      expect(yield* a.tick).toBe(true)
      expect(yield* b.tick).toBe(false)
      expect(yield* c.tick).toBe(false)
      // A renews every 5 s and the others look as often: nobody goes long without a renewal.
      for (let i = 0; i < 3; i++) {
        yield* TestClock.adjust(5_000)
        for (const r of [a, b, c]) yield* r.tick
        expect([a.unrenewedMs(), b.unrenewedMs(), c.unrenewedMs()]).toStrictEqual([0, 0, 0])
      }
      // A freezes: its own figure and the others' grow with the clock (the others' from the last renewal they saw).
      yield* TestClock.adjust(7_000)
      expect(yield* b.tick).toBe(false)
      expect([a.unrenewedMs(), b.unrenewedMs(), c.unrenewedMs()]).toStrictEqual([7_000, 7_000, 7_000])
      yield* TestClock.adjust(8_000)
      // B takes over (15 s unchanged): 0 on B at once; C sees the new row at its next look.
      expect(yield* b.tick).toBe(true)
      expect(b.unrenewedMs()).toBe(0)
      expect(c.unrenewedMs()).toBe(15_000)
      yield* TestClock.adjust(1_000)
      expect(yield* c.tick).toBe(false)
      expect([b.unrenewedMs(), c.unrenewedMs()]).toStrictEqual([1_000, 0])
      // A, still frozen, counts from its own last renewal.
      expect(a.unrenewedMs()).toBe(16_000)
    }).pipe(Effect.scoped),
  )

  it.effect(
    "a frozen holder stops acting at its renew deadline; another takes over after a whole unchanged lease, at the next epoch; the old epoch's writes are refused",
    () =>
      Effect.gen(function* () {
        const db = yield* Pglite.open()
        const { store } = StorePg.make(db)
        const a = yield* Lease.make(db, { ...times, holder: "a" })
        const b = yield* Lease.make(db, { ...times, holder: "b" })
        expect(yield* a.tick).toBe(true)
        expect(a.fence()).toStrictEqual({ name: "reaper", epoch: 1 })
        expect(yield* b.tick).toBe(false)
        // A renews every 5 s: B sees the row change and never takes over.
        for (let i = 0; i < 6; i++) {
          yield* TestClock.adjust(5_000)
          expect(yield* a.tick).toBe(true)
          expect(yield* b.tick).toBe(false)
        }
        // A freezes (ticks no more). It stops acting by itself at its renew deadline…
        yield* TestClock.adjust(9_999)
        expect(a.isLeader()).toBe(true)
        yield* TestClock.adjust(1)
        expect(a.isLeader()).toBe(false)
        expect(a.fence()).toBeNull()
        // …before B may take over: B's wait runs from the last change it saw (a renewal 10 s ago, seen then).
        expect(yield* b.tick).toBe(false)
        yield* TestClock.adjust(4_999)
        expect(yield* b.tick).toBe(false)
        yield* TestClock.adjust(1)
        expect(yield* b.tick).toBe(true)
        expect(b.fence()).toStrictEqual({ name: "reaper", epoch: 2 })

        // A write made under epoch 1 (a frozen leader's pass, waking up) is refused whole, in its transaction.
        yield* store.registerHost({ id: "h1", tokenHash: "x" })
        yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })
        yield* store.reserve({ id: "r1", hostId: "h1", ownerKind: "external", ownerId: "x", memMib: 512, vcpus: 1 })
        yield* TestClock.adjust(3 * 60_000)
        const refused = yield* Effect.exit(store.reclaim().pipe(Effect.provideService(CurrentFence, { name: "reaper", epoch: 1 })))
        expect(Exit.isFailure(refused)).toBe(true)
        expect(String(refused)).toMatch(/fenced: lease reaper is at epoch 2, this write was made under epoch 1/)
        expect((yield* store.getReservation("r1")).id).toBe("r1")
        // h1's agent reports on schedule: the host is not silent (`Placement.isSilent`) when s-now is placed.
        yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })
        // So is a prune of history (the reaper's retention): nothing deleted under epoch 1, the chunk under epoch 2.
        yield* store.createSession({ id: "s-old", budget: { memMib: 256, vcpus: 1 } })
        yield* store.endSession("s-old")
        yield* TestClock.adjust(1)
        const request = { endedBefore: yield* Clock.currentTimeMillis, limit: 10 }
        const stalePrune = yield* Effect.exit(store.pruneHistory(request).pipe(Effect.provideService(CurrentFence, { name: "reaper", epoch: 1 })))
        expect(String(stalePrune)).toMatch(/fenced: lease reaper is at epoch 2, this write was made under epoch 1/)
        expect((yield* store.getSession("s-old")).state).toBe("ended")
        expect((yield* store.pruneHistory(request).pipe(Effect.provideService(CurrentFence, b.fence()))).sessions).toBe(1)
        // A write on the pool (a create: one statement, no transaction) under epoch 1 is refused
        // and stores nothing: the statement itself checks the lease.
        const stale = yield* Effect.exit(store.createSession({ id: "s-stale", budget: { memMib: 256, vcpus: 1 } }).pipe(Effect.provideService(CurrentFence, { name: "reaper", epoch: 1 })))
        expect(String(stale)).toMatch(/fenced: lease reaper is at epoch 2, this write was made under epoch 1/)
        expect(Exit.isFailure(yield* Effect.exit(store.getSession("s-stale")))).toBe(true)
        expect((yield* store.createSession({ id: "s-now", budget: { memMib: 256, vcpus: 1 } }).pipe(Effect.provideService(CurrentFence, b.fence())))._tag).toBe("Placed")
        // The woken holder finds the lease gone at its next tick: it does not lead.
        expect(yield* a.tick).toBe(false)
        expect(a.isLeader()).toBe(false)
        // The current epoch's write goes through.
        expect(yield* b.tick).toBe(true)
        const done = yield* store.reclaim().pipe(Effect.provideService(CurrentFence, b.fence()))
        expect(done.reclaimed.map((r) => r.id)).toStrictEqual(["r1"])
      }).pipe(Effect.scoped),
    300_000,
  )

  it.effect(
    "a holder that gives the lease up (its scope closes) is replaced at the next look; lease times are checked",
    () =>
      Effect.gen(function* () {
        const db = yield* Pglite.open()
        const scopeA = yield* Scope.make()
        const a = yield* Lease.make(db, { ...times, holder: "a" }).pipe(Scope.provide(scopeA))
        const b = yield* Lease.make(db, { ...times, holder: "b" })
        expect(yield* a.tick).toBe(true)
        expect(yield* b.tick).toBe(false)
        yield* Scope.close(scopeA, Exit.void)
        expect(yield* b.tick).toBe(true)
        expect(b.fence()).toStrictEqual({ name: "reaper", epoch: 2 })
        // Refused times are a defect at construction, naming the rule.
        const bad = yield* Effect.exit(Lease.make(db, { leaseDurationMs: 10_000, renewDeadlineMs: 10_000 }))
        expect(String(bad)).toMatch(/renewDeadlineMs must be an integer > 0 and < leaseDurationMs/)
      }).pipe(Effect.scoped),
    300_000,
  )
})

describe("a watcher's read that answers late", () => {
  it.effect("counts the lease as seen renewed from its answer, not its send: a holder that renewed meanwhile and then froze is never taken over within its renew deadline", () =>
    Effect.gen(function* () {
      // A renew deadline 1 s short of the lease, a read that waits 1.9 s (within the 2 s query timeout).
      const tight = { leaseDurationMs: 15_000, renewDeadlineMs: 14_000 }
      const db = yield* Pglite.open()
      const gate: { held: Deferred.Deferred<void> | null; waiting: Deferred.Deferred<void> | null } = { held: null, waiting: null }
      // B's pool: a query waits at the gate (when one is set) before it runs.
      const slowPool: typeof db.pool = {
        ...db.pool,
        query: <R = Record<string, unknown>>(statement: Parameters<typeof db.pool.query>[0]) =>
          Effect.suspend(() => {
            const held = gate.held
            const waiting = gate.waiting
            gate.held = null
            return held === null ? db.pool.query<R>(statement) : Deferred.succeed(waiting!, undefined).pipe(Effect.andThen(Deferred.await(held)), Effect.andThen(db.pool.query<R>(statement)))
          }),
      }
      const a = yield* Lease.make(db, { ...tight, holder: "a" })
      const b = yield* Lease.make({ ...db, pool: slowPool }, { ...tight, holder: "b" })
      expect(yield* a.tick).toBe(true)
      expect(yield* b.tick).toBe(false)
      yield* TestClock.adjust(1_000)
      // B's look is sent at 1 s and reaches the database only after A's renewal at 2.9 s.
      gate.held = yield* Deferred.make<void>()
      gate.waiting = yield* Deferred.make<void>()
      const waiting = gate.waiting
      const held = gate.held
      const look = yield* Effect.forkChild(b.tick)
      yield* Deferred.await(waiting)
      yield* TestClock.adjust(1_900)
      expect(yield* a.tick).toBe(true)
      yield* Deferred.succeed(held, undefined)
      expect(yield* Fiber.join(look)).toBe(false)
      // A freezes after that renewal: it acts until 2.9 s + 14 s = 16.9 s. B looks at 16 s.
      yield* TestClock.adjust(16_000 - 2_900)
      expect(a.isLeader()).toBe(true)
      expect(yield* b.tick).toBe(false)
      expect([a.isLeader(), b.isLeader()]).toStrictEqual([true, false])
      // Past A's deadline and a whole lease after B saw the renewal (2.9 s + 15 s): B takes over.
      yield* TestClock.adjust(17_900 - 16_000)
      expect(a.isLeader()).toBe(false)
      expect(yield* b.tick).toBe(true)
    }).pipe(Effect.scoped),
  )
})

describe("a lease on a real PostgreSQL (TestClock)", () => {
  it.effect("a holder that finds its lease taken logs who holds it now (the new holder and epoch), not itself", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const db = yield* PostgresJs.open({ url: database.url, poolSize: 2 })
      const warnings: unknown[][] = []
      const capture = Logger.layer([Logger.make(({ logLevel, message }) => void (logLevel === "Warn" && warnings.push(Array.isArray(message) ? message : [message])))])
      const a = yield* Lease.make(db, { ...times, holder: "a" })
      const b = yield* Lease.make(db, { ...times, holder: "b" })
      expect(yield* a.tick).toBe(true)
      expect(yield* b.tick).toBe(false)
      // A freezes past the whole lease; B takes over at epoch 2; A wakes and its renewal fails.
      yield* TestClock.adjust(times.leaseDurationMs)
      expect(yield* b.tick).toBe(true)
      expect(b.fence()).toStrictEqual({ name: "reaper", epoch: 2 })
      expect(yield* a.tick.pipe(Effect.provide(capture))).toBe(false)
      expect(warnings).toStrictEqual([["lease lost: another replica holds it", { lease: "reaper", holder: "b", epoch: 2, replica: "a", lostEpoch: 1 }]])
    }),
  )
})

describe("the lease keeps its times on the monotonic clock", () => {
  it.live("a step of the wall clock neither ends a leadership (forward) nor extends it past the renew deadline (back)", () =>
    Effect.gen(function* () {
      // A clock whose wall time and monotonic time move apart, as a stepped wall clock does.
      let wall = Date.now()
      let mono = 1_000_000
      const live = yield* Clock.Clock
      const stepped: Clock.Clock = {
        sleep: (d) => live.sleep(d),
        currentTimeMillisUnsafe: () => wall,
        currentTimeMillis: Effect.sync(() => wall),
        currentTimeNanosUnsafe: () => BigInt(wall) * 1_000_000n,
        currentTimeNanos: Effect.sync(() => BigInt(wall) * 1_000_000n),
        monotonicTimeNanosUnsafe: () => BigInt(mono) * 1_000_000n,
        monotonicTimeNanos: Effect.sync(() => BigInt(mono) * 1_000_000n),
      }
      const db = yield* Pglite.open()
      const a = yield* Lease.make(db, { ...times, holder: "a" }).pipe(Effect.provideService(Clock.Clock, stepped))
      expect(yield* a.tick.pipe(Effect.provideService(Clock.Clock, stepped))).toBe(true)
      // The wall clock jumps a minute ahead: still the leader, its renew deadline untouched.
      wall += 60_000
      expect(a.isLeader()).toBe(true)
      // Then two minutes back, and 11 s pass without a renewal (a holder cut off): past its deadline.
      wall -= 120_000
      expect(a.isLeader()).toBe(true)
      wall += times.renewDeadlineMs + 1_000
      mono += times.renewDeadlineMs + 1_000
      expect(a.isLeader()).toBe(false)
      expect(a.fence()).toBeNull()
      expect(a.unrenewedMs()).toBe(times.renewDeadlineMs + 1_000)
    }).pipe(Effect.scoped),
  )
})

describe("the lease measures this replica's clock against the database's", () => {
  it.effect("clockSkewMs: none before a check; after one, the database's clock less this replica's (here a minute behind)", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const db = yield* PostgresJs.open({ url: database.url, poolSize: 2 })
      const a = yield* Lease.make(db, { ...times, holder: "a" })
      expect(a.clockSkewMs()).toBeNull()
      // This replica's clock a minute behind the real one (the database's).
      yield* TestClock.setTime(Date.now() - 60_000)
      expect(yield* a.tick).toBe(true)
      const first = a.clockSkewMs() ?? Number.NaN
      expect(first).toBeGreaterThan(55_000)
      expect(first).toBeLessThan(65_000)
      // A minute ahead: the renewal measures it again.
      yield* TestClock.setTime(Date.now() + 60_000)
      expect(yield* a.tick).toBe(true)
      const second = a.clockSkewMs() ?? Number.NaN
      expect(second).toBeLessThan(-55_000)
      expect(second).toBeGreaterThan(-65_000)
    }),
  )
})

describe("the lease's connection is named for the operator", () => {
  it.effect("pg_stat_activity shows it as engram-lease <holder>, not postgres.js", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      // The store's start applies the migrations (the leases table).
      yield* PostgresJs.open({ url: database.url, poolSize: 1 })
      const leadership = Context.get(yield* Layer.build(Lease.layer({ url: database.url, ...times, holder: "host-1:4242:ab12cd34" })), Leadership)
      expect(yield* leadership.tick).toBe(true)
      const sql = yield* Effect.acquireRelease(
        Effect.sync(() => postgres(database.url, { max: 1, onnotice: () => undefined })),
        (c) => Effect.promise(() => c.end({ timeout: 1 })),
      )
      const names = yield* Effect.promise(() => sql<{ name: string }[]>`select application_name as name from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() order by 1`)
      expect(names.map((r) => r.name)).toContain(`${Lease.applicationNamePrefix}host-1:4242:ab12cd34`)
      expect(names.map((r) => r.name)).not.toContain("postgres.js")
    }),
  )
})
