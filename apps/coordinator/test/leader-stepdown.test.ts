// Leadership follows the leader's store health: a leader whose store calls keep failing (its
// pool wedged: a dead socket, or saturated) while its lease's own connection still renews gives
// the lease up after ENGRAM_LEADER_STEP_DOWN_PASSES passes in a row (3 by default), and a replica
// that reaches the store takes over; before, it stayed leader and placer while nothing was
// reclaimed, drained or gated fleet-wide. A pass that fails now and then does not step it down.
// The replica that stepped down takes no lease until a store read of its own succeeds. Two
// replicas' reaper loops (their two steps run by hand) on one in-memory store, A's behind a
// switch that fails every call, their leases on a real PostgreSQL, under a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Auth, Config, Leader, Metrics, Notifier, Settings } from "@engram/coordinator"
import { Changes, Leadership, Store, Unavailable } from "@engram/store"
import type { LeadershipShape, StoreShape } from "@engram/store"
import { Lease, StorePg } from "@engram/store-pg"
import { StoreSim } from "@engram/store-sim"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import { Context, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { vi } from "vitest"
import { reaperLoopSteps } from "../src/Reaper.js"
import * as Stalls from "../src/Stalls.js"
import { boundStore } from "../src/StoreBound.js"

const times = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000 }

const settingsOf = (env: Record<string, string> = {}) => {
  const parsed = Config.parse({ ENGRAM_ADMIN_TOKEN: "leader-stepdown-admin-token-0123456789", ...env })
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Settings.of({ config: parsed.config, backend: "custom" })
}
const settings = settingsOf()
const passes = settings.config.leaderStepDownPasses
const intervalMs = settings.config.limits.reaperIntervalMs

interface Switch {
  fail: boolean
}

/** A wedged pool's failure: past the store's bound. */
const timedOut = (k: string) => new Unavailable({ reason: `the database did not answer ${k} within 15000 ms (ENGRAM_STORE_TIMEOUT_MS) (test)`, retryAfterMs: 1000, kind: "timed_out" })
/** A full disk's, as store-pg classifies a write the database refused for it. */
const diskFull = (k: string) => new Unavailable({ reason: `disk full: 53100: could not extend file (${k}, test)`, retryAfterMs: 1000, kind: "disk_full" })
/** A lost connection's, as store-pg classifies it (no kind). */
const connectionLost = (k: string) => new Unavailable({ reason: `ECONNRESET: read ECONNRESET (${k}, test)`, retryAfterMs: 1000 })

/** `store` with every call failing with `failure` while `sw.fail` (default: as a wedged pool's do). */
const failing = (store: StoreShape, sw: Switch, failure: (k: string) => Unavailable = timedOut): StoreShape => {
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(store)) {
    out[k] =
      k === "limits" || typeof v !== "function"
        ? v
        : (...args: unknown[]) =>
            Effect.suspend(() =>
              sw.fail
                ? Effect.fail(failure(k))
                : (v as (...a: unknown[]) => Effect.Effect<unknown, unknown>)(...args),
            )
  }
  return out as unknown as StoreShape
}

/** One replica's reaper loop steps on `store`, leading through `leader`; its metrics. */
const replica = (store: StoreShape, leader: LeadershipShape, set = settings, stalls?: Stalls.StallsShape) =>
  Effect.gen(function* () {
    const services = Layer.mergeAll(
      stalls === undefined ? Layer.empty : Layer.succeed(Stalls.Stalls, stalls),
      Metrics.layer,
      Notifier.layer.pipe(Layer.provide(Changes.local)),
      Layer.succeed(Leader, leader),
      Layer.succeed(Store, store),
      Layer.succeed(Settings, set),
      Layer.succeed(Auth.AdminToken, Auth.AdminToken.of({ tokenHash: "", token: "", file: null, fingerprint: "", metricsTokenHash: null })),
    )
    const context = yield* Layer.build(services)
    const steps = yield* reaperLoopSteps.pipe(Effect.provideContext(context))
    return { ...steps, metrics: Context.get(context, Metrics) }
  })

type Replica = Effect.Success<ReturnType<typeof replica>>

/**
 * The warnings A and B log, and one reaper interval of theirs: both renew or look (twice, as
 * their lease loops would), then A's pass and B's.
 */
const intervalsOf = (a: Replica, b: Replica) => {
  const warnings: string[] = []
  const capture = Logger.layer([
    Logger.make(({ logLevel, message }) => {
      if (logLevel === "Warn") warnings.push(JSON.stringify(message))
    }),
  ])
  const interval = Effect.gen(function* () {
    for (let i = 0; i < 2; i++) {
      yield* TestClock.adjust(intervalMs / 2)
      yield* a.lease
      yield* b.lease
    }
    yield* a.pass
    yield* b.pass
  }).pipe(Effect.provide(capture))
  return { warnings, interval }
}

/**
 * A session on host h1, which never heartbeats, its row held by an operator's open transaction
 * (`FOR UPDATE`: each reclaim of it waits on the lock); `rollback` gives the lock back.
 */
const heldSession = (store: StoreShape, operator: postgres.Sql) =>
  Effect.gen(function* () {
    yield* store.registerHost({ id: "h1" })
    yield* store.reportHost("h1", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 8 })
    assert.strictEqual((yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 } }))._tag, "Placed")
    const held = yield* Effect.promise(() => operator.reserve())
    yield* Effect.addFinalizer(() => Effect.promise(async () => held.release()))
    yield* Effect.promise(() => held.unsafe("begin"))
    yield* Effect.promise(() => held.unsafe("select id from sessions where id = 's1' for update"))
    return { rollback: Effect.promise(() => held.unsafe("rollback")) }
  })

/** Intervals until the session's reservation is stale, then twice the step-down threshold's passes (each reclaiming it). */
const passesPastStale = (store: StoreShape, interval: Effect.Effect<void>) =>
  Effect.gen(function* () {
    const staleAfter = Math.ceil(store.limits().heartbeatStaleWindowMs / intervalMs) + 1
    for (let i = 0; i < staleAfter + 2 * passes; i++) yield* interval
  })

/** With A's calls failing (`sw`): it leads through one pass short of the threshold and steps down at the threshold's. */
const stepsDownAtThreshold = (sw: Switch, interval: Effect.Effect<void>, leaseA: LeadershipShape, a: Replica) =>
  Effect.gen(function* () {
    sw.fail = true
    for (let i = 0; i < passes - 1; i++) yield* interval
    assert.isTrue(leaseA.isLeader())
    yield* interval
    assert.isFalse(leaseA.isLeader(), "the leader stepped down")
    assert.strictEqual(a.metrics.reaperStepDowns.get(), 1)
  })

describe("the reaper's leader steps down when its store keeps failing (PostgreSQL lease, TestClock)", () => {
  it.effect("after ENGRAM_LEADER_STEP_DOWN_PASSES failed passes in a row, not after fewer; another replica takes over; it stands again once its store answers", () =>
    Effect.gen(function* () {
      assert.strictEqual(passes, 3, "the default")
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      // Its start applies the migrations (the leases table).
      yield* StorePg.openUrl({ url: database.url, poolSize: 1 })
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const shared = StoreSim.make().store
      const sw: Switch = { fail: false }
      const leaseA = yield* lease("a")
      const leaseB = yield* lease("b")
      const a = yield* replica(failing(shared, sw), leaseA)
      const b = yield* replica(shared, leaseB)
      const { warnings, interval } = intervalsOf(a, b)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseA.isLeader())
      assert.isFalse(leaseB.isLeader())

      // Failed passes one short of the threshold, then one that works, then again one short: A leads throughout.
      sw.fail = true
      for (let i = 0; i < passes - 1; i++) yield* interval
      sw.fail = false
      yield* interval
      sw.fail = true
      for (let i = 0; i < passes - 1; i++) yield* interval
      assert.isTrue(leaseA.isLeader(), "fewer failed passes in a row than the threshold keep the leader")
      assert.isFalse(leaseB.isLeader())
      assert.strictEqual(a.metrics.reaperStepDowns.get(), 0)

      // The threshold's pass: A gives the lease up, and B takes it at its next look.
      yield* interval
      assert.isFalse(leaseA.isLeader(), "the leader stepped down")
      assert.strictEqual(a.metrics.reaperStepDowns.get(), 1)
      assert.match(warnings.join("\n"), /giving the reaper's lease up: 3 passes in a row found this replica's store failing/)
      yield* TestClock.adjust(2_000)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseB.isLeader(), "a replica that reaches the store took over")
      assert.deepStrictEqual(leaseB.fence(), { name: "reaper", epoch: 2 })

      // B goes away (it gives the lease up): A, its store still failing, does not take the lease.
      yield* leaseB.giveUp ?? Effect.void
      yield* interval
      yield* interval
      assert.isFalse(leaseA.isLeader(), "a replica whose store fails takes no lease after stepping down")
      // Its store answers again: at its next pass it stands again and takes the free lease at its next look.
      sw.fail = false
      yield* interval
      assert.isFalse(leaseA.isLeader())
      yield* TestClock.adjust(2_000)
      yield* a.lease
      assert.isTrue(leaseA.isLeader(), "A stood again once its own store read succeeded")
      assert.deepStrictEqual(leaseA.fence(), { name: "reaper", epoch: 3 })
    }).pipe(Effect.scoped),
  )

  it.effect("a pass that fails only from contention on a healthy database (a lock wait past lock_timeout) does not count; one that fails with the connection lost does", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      // An operator's connection: the database's lock_timeout (a DBA's setting, taken by every new
      // connection), then a row lock held while the reaper's reclaim needs it.
      const operator = yield* Effect.acquireRelease(Effect.sync(() => postgres(database.url, { max: 1, onnotice: () => undefined })), (sql) => Effect.promise(() => sql.end()))
      yield* Effect.promise(() => operator.unsafe(`alter database "${database.name}" set lock_timeout = '300ms'`))
      const { store } = yield* StorePg.openUrl({ url: database.url, poolSize: 2 })
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const sw: Switch = { fail: false }
      const leaseA = yield* lease("a")
      const leaseB = yield* lease("b")
      // Without the failover grace: the first pass past the stale window reclaims.
      const noGrace = settingsOf({ ENGRAM_RECLAIM_GRACE_MS: "0" })
      const a = yield* replica(failing(store, sw, connectionLost), leaseA, noGrace)
      const b = yield* replica(store, leaseB, noGrace)
      const { warnings, interval } = intervalsOf(a, b)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseA.isLeader())

      // A session on a host that never heartbeats: stale after the window, its reservation reclaimed by the leader's pass.
      const held = yield* heldSession(store, operator)
      yield* passesPastStale(store, interval)
      assert.match(warnings.join("\n"), /reclaim failed.*55P03/, "the reclaims waited on the lock past lock_timeout")
      assert.isTrue(leaseA.isLeader(), "passes that lost to contention keep the leader")
      assert.strictEqual(a.metrics.reaperStepDowns.get(), 0)
      assert.notMatch(warnings.join("\n"), /giving the reaper's lease up/)

      // The lock given back: the next pass reclaims (the store was healthy all along).
      yield* held.rollback
      yield* interval
      assert.strictEqual((yield* store.getSession("s1")).state, "lost")

      // A's connection lost: ENGRAM_LEADER_STEP_DOWN_PASSES passes in a row step it down.
      yield* stepsDownAtThreshold(sw, interval, leaseA, a)
    }).pipe(Effect.scoped),
  )

  it.effect("passes whose calls time out behind a lock every replica meets (the database answers; this replica's statements wait on it) do not count; timeouts with no such stall do", () =>
    Effect.gen(function* () {
      // As the coordinator runs on PostgreSQL: the server's statement bound is the store bound, the
      // calls are bounded by it, and a call that waits most of it has what it waits on read.
      const boundMs = 1000
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const operator = yield* Effect.acquireRelease(Effect.sync(() => postgres(database.url, { max: 1, onnotice: () => undefined })), (sql) => Effect.promise(() => sql.end()))
      const pair = yield* StorePg.openUrl({ url: database.url, poolSize: 2, statementTimeoutMs: boundMs })
      const stalls = Stalls.make(pair.diagnose!)
      const { store } = boundStore(pair.store, boundMs, undefined, stalls)
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const sw: Switch = { fail: false }
      const leaseA = yield* lease("a")
      const leaseB = yield* lease("b")
      const noGrace = settingsOf({ ENGRAM_RECLAIM_GRACE_MS: "0" })
      // A's calls can also fail as a wedged pool's do (timed out, the database idle): its own trouble.
      const a = yield* replica(failing(store, sw, timedOut), leaseA, noGrace, stalls)
      const b = yield* replica(store, leaseB, noGrace, stalls)
      const { warnings, interval } = intervalsOf(a, b)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseA.isLeader())

      // A session on a host that never heartbeats; an operator holds its row (no lock_timeout):
      // each reclaim of it waits out the store bound, on every replica alike.
      const held = yield* heldSession(store, operator)
      yield* passesPastStale(store, interval)
      assert.match(warnings.join("\n"), /reclaim failed.*timed_out/, "the reclaims timed out behind the lock")
      // The warning is logged by a fiber of its own once the diagnosis's read answers (real time):
      // waited for, not read at once (a loaded machine's read may still be under way; c124).
      yield* Effect.promise(() => vi.waitFor(() => assert.match(warnings.join("\n"), /did not answer reclaim in time.*lock held by pid/, "what they waited on was read"), { timeout: 30_000, interval: 50 }))
      assert.isTrue(leaseA.isLeader(), "passes that timed out behind a lock every replica meets keep the leader")
      assert.strictEqual(a.metrics.reaperStepDowns.get(), 0)
      assert.notMatch(warnings.join("\n"), /giving the reaper's lease up/)

      // The lock given back: the next pass reclaims.
      yield* held.rollback
      yield* interval
      assert.strictEqual((yield* store.getSession("s1")).state, "lost")

      // A's calls time out with nothing of it waiting on the database (its pool wedged): they count.
      yield* stepsDownAtThreshold(sw, interval, leaseA, a)
    }).pipe(Effect.scoped),
  )

  it.effect("writes refused for the database's full disk (every replica's database) step no leader down", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      yield* StorePg.openUrl({ url: database.url, poolSize: 1 })
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const shared = StoreSim.make().store
      const sw: Switch = { fail: false }
      const leaseA = yield* lease("a")
      const leaseB = yield* lease("b")
      const a = yield* replica(failing(shared, sw, diskFull), leaseA)
      const b = yield* replica(failing(shared, sw, diskFull), leaseB)
      const { warnings, interval } = intervalsOf(a, b)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseA.isLeader())
      sw.fail = true
      for (let i = 0; i < 3 * passes; i++) yield* interval
      assert.isTrue(leaseA.isLeader(), "a full disk is every replica's: the leader keeps the lease")
      assert.strictEqual(a.metrics.reaperStepDowns.get(), 0)
      assert.match(warnings.join("\n"), /disk_full/, "the passes failed, and said why")
      assert.notMatch(warnings.join("\n"), /giving the reaper's lease up/)
      // Room again: the passes work.
      sw.fail = false
      yield* interval
      assert.isTrue(leaseA.isLeader())
    }).pipe(Effect.scoped),
  )

  it.effect("while every replica's store fails, the replica that stepped down hands the lease to nobody; the first whose store answers takes it", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      yield* StorePg.openUrl({ url: database.url, poolSize: 1 })
      const operator = yield* Effect.acquireRelease(Effect.sync(() => postgres(database.url, { max: 1, onnotice: () => undefined })), (sql) => Effect.promise(() => sql.end()))
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const shared = StoreSim.make().store
      const swA: Switch = { fail: false }
      const swB: Switch = { fail: false }
      const leaseA = yield* lease("a")
      const leaseB = yield* lease("b")
      const a = yield* replica(failing(shared, swA, connectionLost), leaseA)
      const b = yield* replica(failing(shared, swB, connectionLost), leaseB)
      const { warnings, interval } = intervalsOf(a, b)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseA.isLeader())

      // Both stores fail: A steps down after its passes; B, whose own reads fail, does not take the lease.
      swA.fail = true
      swB.fail = true
      for (let i = 0; i < passes; i++) yield* interval
      assert.isFalse(leaseA.isLeader(), "the leader stepped down")
      for (let i = 0; i < 3 * passes; i++) yield* interval
      assert.isFalse(leaseA.isLeader())
      assert.isFalse(leaseB.isLeader(), "a replica whose own store fails takes no lease")
      assert.strictEqual(b.metrics.reaperStepDowns.get(), 0, "B led never, so never stepped down")
      const epochs = yield* Effect.promise(() => operator`select epoch from leases where name = 'reaper'`)
      assert.deepStrictEqual(epochs.map((r) => Number(r["epoch"])), [1], "the lease changed hands never while every store failed")
      assert.match(warnings.join("\n"), /store read failed; it takes no reaper's lease until a store read of its own succeeds/)

      // B's store answers again: it stands again at its next pass and takes the free lease at its next look.
      swB.fail = false
      yield* interval
      yield* TestClock.adjust(2_000)
      yield* a.lease
      yield* b.lease
      assert.isTrue(leaseB.isLeader(), "the first replica whose store answers took the lease")
      assert.deepStrictEqual(leaseB.fence(), { name: "reaper", epoch: 2 }, "the one change of holder")
      assert.isFalse(leaseA.isLeader())
    }).pipe(Effect.scoped),
  )

  /** A leadership this replica never acts under (`holds`: whether it keeps an epoch past its renew deadline); its step-downs counted. */
  const watching = (holds: boolean) => {
    const counts = { stepDowns: 0 }
    const shape: LeadershipShape = {
      tick: Effect.succeed(false),
      isLeader: () => false,
      holds: () => holds,
      fence: () => null,
      stepDown: Effect.sync(() => void counts.stepDowns++),
      standAgain: () => undefined,
    }
    return { shape, counts }
  }

  it.effect("a replica that does not lead stands aside only after ENGRAM_LEADER_STEP_DOWN_PASSES failed reads in a row; never with 0, never while it holds the lease's epoch", () =>
    Effect.gen(function* () {
      const shared = StoreSim.make().store
      const sw: Switch = { fail: true }
      const passesOf = (r: Replica, n: number) =>
        Effect.gen(function* () {
          for (let i = 0; i < n; i++) {
            yield* TestClock.adjust(intervalMs)
            yield* r.pass
          }
        })
      // A candidate: a read that fails now and then does not make it stand aside.
      const candidate = watching(false)
      const c = yield* replica(failing(shared, sw, connectionLost), candidate.shape)
      yield* passesOf(c, passes - 1)
      sw.fail = false
      yield* passesOf(c, 1)
      sw.fail = true
      yield* passesOf(c, passes - 1)
      assert.strictEqual(candidate.counts.stepDowns, 0, "fewer failed reads in a row than the setting")
      yield* passesOf(c, 1)
      assert.strictEqual(candidate.counts.stepDowns, 1, "stood aside at the setting's count")
      // The setting 0: never.
      const never = watching(false)
      const n = yield* replica(failing(shared, sw, connectionLost), never.shape, settingsOf({ ENGRAM_LEADER_STEP_DOWN_PASSES: "0" }))
      yield* passesOf(n, 3 * passes)
      assert.strictEqual(never.counts.stepDowns, 0, "ENGRAM_LEADER_STEP_DOWN_PASSES=0 never stands aside")
      // A holder past its renew deadline (a database blip): it keeps its epoch and renews once the database answers.
      const holder = watching(true)
      const h = yield* replica(failing(shared, sw, connectionLost), holder.shape)
      yield* passesOf(h, 3 * passes)
      assert.strictEqual(holder.counts.stepDowns, 0, "a replica that holds the lease's epoch does not give it up as a candidate")
    }),
  )
})
