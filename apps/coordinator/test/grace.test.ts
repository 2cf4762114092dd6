// The failover grace (ENGRAM_RECLAIM_GRACE_MS, as Nomad's failover_heartbeat_ttl) in the
// coordinator's reaper pass and start-up reconcile, on the in-memory store and on PostgreSQL,
// under a TestClock: a fleet whose hosts could not heartbeat while the coordinator side was down
// is not reclaimed whole by the first pass after it.
import { assert, describe, it } from "@effect/vitest"
import { Config, Metrics, Notifier, reaperPass, reconcile, Settings } from "@engram/coordinator"
import type { PassReport } from "@engram/coordinator"
import { Changes, Store } from "@engram/store"
import type { StoreShape, Unavailable } from "@engram/store"
import { StorePg } from "@engram/store-pg"
import { StoreSim } from "@engram/store-sim"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Clock, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { failingFleetLayer, freezingLayer } from "./support/failing.js"
import type { FleetSwitch, FreezeSwitch } from "./support/failing.js"
import { afterAll } from "vitest"

const databases: Promise<TestDatabase>[] = []
afterAll(async () => {
  for (const d of databases) await (await d).drop()
})

/** Each backend, a fresh store per test, with the default limits (a two-minute stale window). */
const backends: readonly (readonly [string, () => Layer.Layer<Store, Unavailable>])[] = [
  ["in-memory", () => StoreSim.layer()],
  [
    "PostgreSQL",
    () =>
      Layer.unwrap(
        Effect.promise(() => {
          const db = freshDatabase()
          databases.push(db)
          return db
        }).pipe(Effect.map((db) => StorePg.layer({ url: db.url }))),
      ),
  ],
]

/** The coordinator's settings from these variables over the defaults. */
const settings = (variables: Record<string, string> = {}) => {
  const parsed = Config.parse(variables)
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Layer.succeed(Settings, Settings.of({ config: parsed.config, backend: "custom" }))
}

/** Whether the wrapped store's fleet reads fail (the store unreachable): `support/failing.ts`. */
const outage: FleetSwitch = { failFleet: false }
const flaky = (inner: Layer.Layer<Store, Unavailable>) => failingFleetLayer(inner, outage)
/** How long the wrapped store's next demand sample freezes the process (`support/failing.ts`). */
const freeze: FreezeSwitch = { freezeMs: 0 }

const services = (store: Layer.Layer<Store, Unavailable>) => Layer.mergeAll(Metrics.layer, Notifier.layer.pipe(Layer.provide(Changes.local))).pipe(Layer.provideMerge(store))

const grace = Config.defaults().reclaimGraceMs
const all = ["h1-s1", "h1-s2", "h2-s1", "h2-s2"]

/** Two hosts, each running two sessions, that heartbeat now. */
const fleet = Effect.gen(function* () {
  const store = yield* Store
  for (const h of ["h1", "h2"]) {
    yield* store.registerHost({ id: h })
    yield* store.reportHost(h, { totalMib: 8192, allocatableMib: 6144, totalVcpus: 16 })
    for (const k of [1, 2]) {
      const placed = yield* store.createSession({ id: `${h}-s${k}`, budget: { memMib: 512, vcpus: 1 }, affinity: [h] })
      assert.strictEqual(placed._tag, "Placed")
      yield* store.markRunning(`${h}-s${k}`)
    }
  }
})
const states = Effect.gen(function* () {
  const store = yield* Store
  return yield* Effect.forEach(all, (id) => Effect.map(store.getSession(id), (s) => s.state))
})
const reclaimedOf = (r: PassReport) => (r._tag === "Done" ? [r.reclaimed, r.reclaimHeldUntil] : null)
const intervalMs = Config.defaults().limits.reaperIntervalMs

/** The reaper loop for `ms`: a pass every interval (the clock moved first); the passes' reports. */
const loopFor = (ms: number) =>
  Effect.gen(function* () {
    const reports: PassReport[] = []
    for (let t = 0; t < ms; t += intervalMs) {
      yield* TestClock.adjust(intervalMs)
      reports.push(yield* reaperPass)
    }
    return reports
  })
const reclaimedIn = (reports: readonly PassReport[]) => reports.reduce((n, r) => n + (r._tag === "Done" ? r.reclaimed : 0), 0)

/** Five minutes of reaper passes, both hosts beating every 40 s (the last at 280 s): the grace long over. */
const beatingFiveMinutes = (store: StoreShape) =>
  Effect.gen(function* () {
    for (let t = intervalMs; t <= 5 * 60_000; t += intervalMs) {
      yield* TestClock.adjust(intervalMs)
      if (t % 40_000 === 0) for (const h of ["h1", "h2"]) yield* store.heartbeatHost(h)
      yield* reaperPass
    }
  })

for (const [name, store] of backends) {
  describe(`the failover grace: ${name}`, { timeout: 300_000 }, () => {
    it("defaults to the heartbeat stale window", () => {
      assert.strictEqual(grace, Config.defaults().limits.heartbeatStaleWindowMs)
    })

    it.effect("after a 3-minute outage the first pass reclaims nothing; hosts that heartbeat within the grace keep every session, one that does not is reclaimed once it ends", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        // The coordinator side was down for 3 minutes: no heartbeat landed, every reservation is stale.
        yield* TestClock.adjust("3 minutes")
        const t0 = yield* Clock.currentTimeMillis
        assert.deepStrictEqual(reclaimedOf(yield* reaperPass), [0, t0 + grace])
        assert.deepStrictEqual(yield* states, ["running", "running", "running", "running"])
        // The loop runs on; h1's agent beats within the grace (at a third of the window), h2's does not.
        assert.strictEqual(reclaimedIn(yield* loopFor(40_000)), 0)
        yield* store.heartbeatHost("h1")
        assert.strictEqual(reclaimedIn(yield* loopFor(40_000)), 0)
        yield* store.heartbeatHost("h1")
        assert.strictEqual(reclaimedIn(yield* loopFor(grace - 80_000 - intervalMs)), 0)
        // The pass at the grace's end reclaims h2's.
        const after = (yield* loopFor(intervalMs))[0]!
        assert.deepStrictEqual(reclaimedOf(after), [2, null])
        assert.deepStrictEqual(after._tag === "Done" ? [...after.lostSessions].sort() : null, ["h2-s1", "h2-s2"])
        assert.deepStrictEqual(yield* states, ["running", "running", "lost", "lost"])
        assert.strictEqual((yield* Metrics).reaperReclaimed.get(), 2)
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 1)
      }).pipe(Effect.provide(Layer.merge(services(store()), settings()))),
    )

    it.effect("an outage of failed fleet reads longer than a third of the grace starts it again at the next read", () =>
      Effect.gen(function* () {
        outage.failFleet = false
        yield* fleet
        assert.deepStrictEqual(reclaimedOf(yield* reaperPass)?.[0], 0)
        yield* loopFor(90_000)
        // The store goes away for 90 s: every pass's read fails, and no heartbeat could land.
        outage.failFleet = true
        assert.isTrue((yield* loopFor(90_000)).every((r) => r._tag === "Held"))
        outage.failFleet = false
        // Back: the first grace had ended; the gap started a new one.
        const t1 = (yield* Clock.currentTimeMillis) + intervalMs
        assert.deepStrictEqual(reclaimedOf((yield* loopFor(intervalMs))[0]!), [0, t1 + grace])
        assert.deepStrictEqual(yield* states, ["running", "running", "running", "running"])
        // Nobody beats within it: everything stale goes once it ends.
        assert.strictEqual(reclaimedIn(yield* loopFor(grace)), 4)
      }).pipe(
        Effect.ensuring(Effect.sync(() => (outage.failFleet = false))),
        Effect.provide(Layer.merge(services(flaky(store())), settings())),
      ),
    )

    it.effect("a failed read now and then (one a minute) restarts nothing: a host that died is reclaimed after one grace", () =>
      Effect.gen(function* () {
        const store = yield* Store
        outage.failFleet = false
        yield* fleet
        let reclaimed = 0
        // Ten minutes of passes, h1 beating every 40 s, h2 dead; one pass a minute fails its read.
        for (let t = intervalMs; t <= 10 * 60_000; t += intervalMs) {
          yield* TestClock.adjust(intervalMs)
          if (t % 40_000 === 0) yield* store.heartbeatHost("h1")
          outage.failFleet = t % 60_000 === 0
          const r = yield* reaperPass
          reclaimed += r._tag === "Done" ? r.reclaimed : 0
        }
        outage.failFleet = false
        assert.strictEqual(reclaimed, 2)
        assert.deepStrictEqual(yield* states, ["running", "running", "lost", "lost"])
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 1)
      }).pipe(
        Effect.ensuring(Effect.sync(() => (outage.failFleet = false))),
        Effect.provide(Layer.merge(services(flaky(store())), settings())),
      ),
    )

    it.effect("a process frozen (suspended, SIGSTOP) past the stale window: its first pass after the thaw reclaims nothing, nor idles a session", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        yield* store.createSession({ id: "busy", budget: { memMib: 512, vcpus: 1 }, affinity: ["h1"], idleTimeoutMs: 120_000 })
        yield* store.markRunning("busy")
        // Long past the grace, the hosts beating and the busy session active.
        for (let t = intervalMs; t <= 5 * 60_000; t += intervalMs) {
          yield* TestClock.adjust(intervalMs)
          if (t % 40_000 === 0) {
            yield* store.heartbeatHost("h1")
            yield* store.heartbeatHost("h2")
            yield* store.recordActivity("h1", ["busy"])
          }
          yield* reaperPass
        }
        // Frozen for 3 minutes: no pass, no heartbeat, no activity landed.
        yield* TestClock.adjust("3 minutes")
        const thawed = yield* reaperPass
        assert.deepStrictEqual(thawed._tag === "Done" ? [thawed.reclaimed, thawed.idled.length] : null, [0, 0])
        assert.deepStrictEqual([...(yield* states), (yield* store.getSession("busy")).state], ["running", "running", "running", "running", "running"])
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 2)
      }).pipe(Effect.provide(Layer.merge(services(store()), settings()))),
    )

    it.effect("a longer grace (5 min, Nomad's default) does not let a longer freeze pass unseen: a 90 s freeze reclaims nothing", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        // Ten minutes and more of passes, both hosts beating every 40 s (the last at 600 s): the grace long over.
        for (let t = intervalMs; t <= 635_000; t += intervalMs) {
          yield* TestClock.adjust(intervalMs)
          if (t % 40_000 === 0) for (const h of ["h1", "h2"]) yield* store.heartbeatHost(h)
          yield* reaperPass
        }
        // Frozen 90 s (as its API: no heartbeat lands): the last beats are 125 s old, past the window.
        yield* TestClock.adjust("90 seconds")
        const thawed = yield* reaperPass
        assert.deepStrictEqual(reclaimedOf(thawed)?.[0], 0)
        assert.deepStrictEqual(yield* states, ["running", "running", "running", "running"])
      }).pipe(Effect.provide(Layer.merge(services(store()), settings({ ENGRAM_RECLAIM_GRACE_MS: "300000" })))),
    )

    it.effect("a long pass whose store calls keep succeeding is no gap: the grace is not started again", () =>
      Effect.gen(function* () {
        const inner = yield* Store
        yield* fleet
        // Every pass takes over 60 s of the clock (a slow store, a backlog): its demand sample and
        // its drain 30 s each, each call reaching the store within the gap (40 s) of the last.
        const slow = Store.of({
          ...inner,
          metrics: () => Effect.andThen(TestClock.adjust("30 seconds"), inner.metrics()),
          drainQueue: (o) => Effect.andThen(TestClock.adjust("30 seconds"), inner.drainQueue(o)),
        })
        for (let k = 0; k < 6; k++) {
          yield* TestClock.adjust(intervalMs)
          yield* reaperPass.pipe(Effect.provideService(Store, slow))
        }
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 1)
      }).pipe(Effect.provide(Layer.merge(services(store()), settings()))),
    )

    it.effect("ENGRAM_RECLAIM_GRACE_MS=0: the first pass after the outage reclaims every stale reservation (the seed's rule)", () =>
      Effect.gen(function* () {
        yield* fleet
        yield* TestClock.adjust("3 minutes")
        assert.deepStrictEqual(reclaimedOf(yield* reaperPass), [4, null])
        assert.deepStrictEqual(yield* states, ["lost", "lost", "lost", "lost"])
      }).pipe(Effect.provide(Layer.merge(services(store()), settings({ ENGRAM_RECLAIM_GRACE_MS: "0" })))),
    )

    it.effect("a freeze mid-pass (after the fleet read, before the reclaim) is a gap: the grace starts again, no stale reservation goes", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        yield* beatingFiveMinutes(store)
        // The process freezes for 3 minutes inside the pass's demand sample, after its fleet read:
        // no heartbeat lands meanwhile, so every reservation is stale when the reclaim comes.
        freeze.freezeMs = 180_000
        yield* TestClock.adjust(intervalMs)
        const thawed = yield* reaperPass
        const t1 = yield* Clock.currentTimeMillis
        assert.deepStrictEqual(reclaimedOf(thawed), [0, t1 + grace])
        assert.deepStrictEqual(yield* states, ["running", "running", "running", "running"])
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 2)
        // The hosts beat within the new grace (every 40 s): nothing is reclaimed past its end, and the next read is no second gap.
        let reclaimed = 0
        for (let k = 0; k < 4; k++) {
          for (const h of ["h1", "h2"]) yield* store.heartbeatHost(h)
          reclaimed += reclaimedIn(yield* loopFor(40_000))
        }
        assert.strictEqual(reclaimed, 0)
        assert.strictEqual((yield* Metrics).reaperReclaimGraces.get(), 2)
      }).pipe(
        Effect.ensuring(Effect.sync(() => (freeze.freezeMs = 0))),
        Effect.provide(Layer.merge(services(freezingLayer(store(), freeze)), settings())),
      ),
    )

    it.effect("a freeze later in the pass (in its drain, after the reclaim) is a gap too: the next pass, before the hosts' next heartbeat, reclaims nothing", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        yield* beatingFiveMinutes(store)
        freeze.freezeMs = 180_000
        yield* TestClock.adjust(intervalMs)
        const thawed = yield* reaperPass
        // One interval after the thaw, before the agents' next heartbeat (every 40 s):
        const next = reclaimedIn(yield* loopFor(intervalMs))
        assert.deepStrictEqual([reclaimedOf(thawed)?.[0], next, yield* states, (yield* Metrics).reaperReclaimGraces.get()], [0, 0, ["running", "running", "running", "running"], 2])
      }).pipe(
        Effect.ensuring(Effect.sync(() => (freeze.freezeMs = 0))),
        Effect.provide(Layer.merge(services(freezingLayer(store(), freeze, "drainQueue")), settings())),
      ),
    )

    it.effect("the start-up reconcile reclaims only expired reservations while the grace is on, and everything stale with ENGRAM_RECLAIM_GRACE_MS=0", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* fleet
        yield* store.reserve({ id: "x-exp", hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 256, vcpus: 1, expiresAt: 60_000 })
        yield* TestClock.adjust("3 minutes")
        // x-exp is past its own expiresAt: over, whatever the outage did; the stale sessions wait.
        const on = yield* reconcile.pipe(Effect.provide(settings()))
        assert.deepStrictEqual([on.reclaimed, on.lostSessions], [1, []])
        assert.deepStrictEqual(yield* states, ["running", "running", "running", "running"])
        const off = yield* reconcile.pipe(Effect.provide(settings({ ENGRAM_RECLAIM_GRACE_MS: "0" })))
        assert.strictEqual(off.reclaimed, 4)
        assert.deepStrictEqual(yield* states, ["lost", "lost", "lost", "lost"])
      }).pipe(Effect.provide(services(store()))),
    )
  })
}
