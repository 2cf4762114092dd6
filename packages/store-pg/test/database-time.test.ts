// The store's time on the database's clock (`PgOptions.databaseTime`, `DatabaseTime.ts`): two
// replicas on one real PostgreSQL, one of them with its wall clock a minute behind. On their own
// clocks, the one behind stamps a live host's heartbeats and report a minute old, and the other
// (the leader) reclaims the host's session as lost; on the database's clock nothing is reclaimed.
import { Limits } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import { Clock, Effect } from "effect"
import { describe, expect, it } from "vitest"
import * as DatabaseTime from "../src/DatabaseTime.js"
import * as StorePg from "../src/StorePg.js"

describe("DatabaseTime.nextOffset", () => {
  const reading = { sentMs: 1_000, dbMs: 61_010, answeredMs: 1_020 }
  it("the first reading: the middle of its bracket (the database's clock less this one's at the round trip's middle)", () => {
    expect(DatabaseTime.nextOffset(null, reading)).toBe(60_000)
  })
  it("an offset within a reading's bracket (plus the slack) is kept: a round trip's jitter does not move it", () => {
    for (const kept of [59_990, 60_000, 60_010, 59_990 - DatabaseTime.slackMs, 60_010 + DatabaseTime.slackMs]) expect(DatabaseTime.nextOffset(kept, reading)).toBe(kept)
  })
  it("an offset outside it (the database's clock stepped) moves to the bracket's nearer edge: as little as the reading allows", () => {
    const low = 59_990 - DatabaseTime.slackMs
    const high = 60_010 + DatabaseTime.slackMs
    expect(DatabaseTime.nextOffset(low - 1, reading)).toBe(low)
    expect(DatabaseTime.nextOffset(0, reading)).toBe(low)
    expect(DatabaseTime.nextOffset(120_000, reading)).toBe(high)
    // Whole ms, as every time the store writes.
    expect(DatabaseTime.nextOffset(null, { sentMs: 1_000, dbMs: 61_010.913, answeredMs: 1_021 })).toBe(60_000)
  })
})

describe("replicas whose clocks disagree, on one PostgreSQL", () => {
  /**
   * The real clock with `wallMs()` added to its wall time and `monoMs()` to its monotonic time
   * (read at each call, so a test can move them), sleeps untouched.
   */
  const shifted = (live: Clock.Clock, wallMs: () => number, monoMs: () => number): Clock.Clock => {
    const wall = () => live.currentTimeMillisUnsafe() + wallMs()
    const mono = () => live.monotonicTimeNanosUnsafe() + BigInt(monoMs()) * 1_000_000n
    return {
      sleep: (d) => live.sleep(d),
      currentTimeMillisUnsafe: wall,
      currentTimeMillis: Effect.sync(wall),
      currentTimeNanosUnsafe: () => BigInt(wall()) * 1_000_000n,
      currentTimeNanos: Effect.sync(() => BigInt(wall()) * 1_000_000n),
      monotonicTimeNanosUnsafe: mono,
      monotonicTimeNanos: Effect.sync(mono),
    }
  }
  /** Wall time `offsetMs` off, monotonic time counted from another origin (as another process's is: each starts its own). */
  const offBy = (live: Clock.Clock, offsetMs: number): Clock.Clock => shifted(live, () => offsetMs, () => 987_654_321_000)
  const behindMs = 60_000
  const limits = { ...Limits.defaults, heartbeatStaleWindowMs: 30_000 }
  /** A fresh database of its own, dropped with the scope. */
  const scopedDatabase = Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
  /** The store on `url` (its time the database's unless told otherwise), opened under `clock`. */
  const openOn = (url: string, clock: Clock.Clock, options: Partial<StorePg.PgOptions> = {}) =>
    StorePg.openUrl({ url, poolSize: 2, limits, databaseTime: true, ...options }).pipe(Effect.provideService(Clock.Clock, clock))

  /** Replica A (a minute behind) places a session and heartbeats its host; B, on time, reclaims: the sessions B made lost. */
  const run = (databaseTime: boolean) =>
    Effect.gen(function* () {
      const database = yield* scopedDatabase
      const live = yield* Clock.Clock
      const behind = offBy(live, -behindMs)
      const a = yield* openOn(database.url, behind, { databaseTime })
      const b = yield* StorePg.openUrl({ url: database.url, poolSize: 2, limits, databaseTime, migrate: false })
      const onA = <A, E>(e: Effect.Effect<A, E>) => Effect.provideService(e, Clock.Clock, behind)
      yield* onA(a.store.registerHost({ id: "h1", tokenHash: "x" }))
      yield* onA(a.store.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }))
      const created = yield* onA(a.store.createSession({ id: "s1", budget: { memMib: 512, vcpus: 1 } }))
      expect(created._tag).toBe("Placed")
      // The host's agent heartbeats and reports through A, on time.
      yield* onA(a.store.heartbeatHost("h1"))
      yield* onA(a.store.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }))
      // B leads and judges at once.
      const reclaimed = yield* b.store.reclaim()
      const host = yield* b.store.getHost("h1")
      return { lost: reclaimed.lostSessions, created: created.session.state, session: (yield* b.store.getSession("s1")).state, reportAgeMs: (b.store.now?.() ?? Date.now()) - (host.reportedAt ?? 0), offsets: [a.store.now, b.store.now] }
    }).pipe(Effect.scoped, Effect.runPromise)

  it("on their own clocks (without databaseTime), the leader reclaims a live host's session as lost: the failure databaseTime is for", async () => {
    const own = await run(false)
    expect(own.lost).toStrictEqual(["s1"])
    expect(own.session).toBe("lost")
    expect(own.offsets).toStrictEqual([undefined, undefined])
  }, 120_000)

  it("on the database's clock (databaseTime), the same heartbeats are fresh: nothing is reclaimed, and the report's age is the real one", async () => {
    const shared = await run(true)
    expect(shared.lost).toStrictEqual([])
    expect(shared.session).toBe(shared.created)
    // Stamped by A and read on B's clock, both the database's: seconds old at most, not a minute.
    expect(shared.reportAgeMs).toBeGreaterThanOrEqual(-5_000)
    expect(shared.reportAgeMs).toBeLessThan(behindMs / 2)
    expect(typeof shared.offsets[0]).toBe("function")
  }, 120_000)

  it("a step of a replica's wall clock (NTP, an operator) does not move the store's time: it follows the monotonic clock and the database's", async () => {
    const seen = await Effect.gen(function* () {
      const database = yield* scopedDatabase
      const live = yield* Clock.Clock
      let stepMs = 0
      const stepped = shifted(live, () => stepMs, () => 0)
      const a = yield* openOn(database.url, stepped)
      const before = a.store.now!() - Date.now()
      stepMs = 10 * 60_000
      const ahead = a.store.now!() - Date.now()
      stepMs = -10 * 60_000
      const behind = a.store.now!() - Date.now()
      return { before, ahead, behind }
    }).pipe(Effect.scoped, Effect.runPromise)
    // The database runs on this machine: its clock and this one agree within the round trip.
    for (const offMs of [seen.before, seen.ahead, seen.behind]) expect(Math.abs(offMs)).toBeLessThan(5_000)
  }, 120_000)

  it("a suspended machine (its monotonic clock stood still while the wall clock ran): the store's time catches up at once, not at the next periodic measurement", async () => {
    const seen = await Effect.gen(function* () {
      const database = yield* scopedDatabase
      const live = yield* Clock.Clock
      let stoodStillMs = 0
      const suspending = shifted(live, () => 0, () => -stoodStillMs)
      // Periodic measurements an hour apart: only the wake can correct the store's time here.
      const a = yield* openOn(database.url, suspending, { databaseTimeEveryMs: 3_600_000 })
      const before = a.store.now!() - Date.now()
      // Resumed after a 30 s suspend: the monotonic clock lost 30 s that the wall clock did not.
      stoodStillMs = 30_000
      const resumed = a.store.now!() - Date.now()
      let caughtUp = resumed
      for (let i = 0; i < 600 && Math.abs(caughtUp) >= 5_000; i++) {
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 50)))
        caughtUp = a.store.now!() - Date.now()
      }
      // A second suspend, and the first thing after it a create: its stamps wait for the
      // measurement the resume asked for, so its reservation is not born 30 s stale.
      const s = a.store
      yield* s.registerHost({ id: "h1", tokenHash: "x" })
      yield* s.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })
      stoodStillMs = 60_000
      const created = yield* s.createSession({ id: "s1", budget: { memMib: 512, vcpus: 1 } })
      const stampAgeMs = Date.now() - (yield* s.getReservation(created.session.reservationId!)).lastHeartbeatAt
      return { before, resumed, caughtUp, stampAgeMs }
    }).pipe(Effect.scoped, Effect.runPromise)
    expect(Math.abs(seen.before)).toBeLessThan(5_000)
    // Read at once (`now()`, which does not wait) at the resume, before the measurement it asked for: 30 s behind.
    expect(seen.resumed).toBeLessThan(-25_000)
    expect(Math.abs(seen.caughtUp)).toBeLessThan(5_000)
    expect(Math.abs(seen.stampAgeMs)).toBeLessThan(5_000)
  }, 120_000)
})
