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
import { freshDatabase } from "@engram/test-pg"
import { Context, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { reaperLoopSteps } from "../src/Reaper.js"

const times = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000 }

const settings = (() => {
  const parsed = Config.parse({ ENGRAM_ADMIN_TOKEN: "leader-stepdown-admin-token-0123456789" })
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Settings.of({ config: parsed.config, backend: "custom" })
})()
const passes = settings.config.leaderStepDownPasses
const intervalMs = settings.config.limits.reaperIntervalMs

interface Switch {
  fail: boolean
}

/** `store` with every call failing as a wedged pool's do (past the store's bound) while `sw.fail`. */
const failing = (store: StoreShape, sw: Switch): StoreShape => {
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(store)) {
    out[k] =
      k === "limits" || typeof v !== "function"
        ? v
        : (...args: unknown[]) =>
            Effect.suspend(() =>
              sw.fail
                ? Effect.fail(new Unavailable({ reason: `the database did not answer ${k} within 15000 ms (ENGRAM_STORE_TIMEOUT_MS) (test)`, retryAfterMs: 1000, kind: "timed_out" }))
                : (v as (...a: unknown[]) => Effect.Effect<unknown, unknown>)(...args),
            )
  }
  return out as unknown as StoreShape
}

/** One replica's reaper loop steps on `store`, leading through `leader`; its metrics. */
const replica = (store: StoreShape, leader: LeadershipShape) =>
  Effect.gen(function* () {
    const services = Layer.mergeAll(
      Metrics.layer,
      Notifier.layer.pipe(Layer.provide(Changes.local)),
      Layer.succeed(Leader, leader),
      Layer.succeed(Store, store),
      Layer.succeed(Settings, settings),
      Layer.succeed(Auth.AdminToken, Auth.AdminToken.of({ tokenHash: "", token: "", file: null, fingerprint: "", metricsTokenHash: null })),
    )
    const context = yield* Layer.build(services)
    const steps = yield* reaperLoopSteps.pipe(Effect.provideContext(context))
    return { ...steps, metrics: Context.get(context, Metrics) }
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
      const warnings: string[] = []
      const capture = Logger.layer([
        Logger.make(({ logLevel, message }) => {
          if (logLevel === "Warn") warnings.push(JSON.stringify(message))
        }),
      ])
      /** One reaper interval: both replicas renew or look (twice, as their lease loops would), then A's pass and B's. */
      const interval = Effect.gen(function* () {
        for (let i = 0; i < 2; i++) {
          yield* TestClock.adjust(intervalMs / 2)
          yield* a.lease
          yield* b.lease
        }
        yield* a.pass.pipe(Effect.provide(capture))
        yield* b.pass
      })
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
})
