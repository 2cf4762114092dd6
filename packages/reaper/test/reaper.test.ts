// The shared reaper pass and the immediate reaction, on the in-memory store under a TestClock.
import { assert, describe, it } from "@effect/vitest"
import { Limits, MakeRoom, ParkGate, ParkPolicy } from "@engram/core"
import { CurrentFence, Store, Unavailable } from "@engram/store"
import type { Fence, MoveFilter, StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Clock, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Reaper, ReaperEvents, ReaperState, Trigger, defaultTriggerWindowMs } from "../src/index.js"
import type { Event } from "../src/index.js"

// Heartbeats are not the point here: a day-long stale window keeps reservations alive.
const longLived = (() => {
  const r = Limits.make({ heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 })
  if (r._tag === "Invalid") throw new Error("bad test limits")
  return r.limits
})()

const storeLayer = () => StoreSim.layer({ limits: longLived })

/** A measured host with `capacityMib` of room after policy, whose agent advertises a peer URL (it takes moves). */
const host = (hostId: string, capacityMib: number) =>
  Effect.gen(function* () {
    const store = yield* Store
    yield* store.registerHost({ id: hostId })
    yield* store.reportHost(hostId, { totalMib: capacityMib + 2048, allocatableMib: capacityMib + 1024, totalVcpus: 64, peerUrl: `http://${hostId}.agents.test:7100` })
  })

/** A session parked on `hostId`. */
const parked = (hostId: string, sessionId: string, memMib: number) =>
  Effect.gen(function* () {
    const store = yield* Store
    yield* store.createSession({ id: sessionId, budget: { memMib, vcpus: 1 }, affinity: [hostId] })
    yield* store.markRunning(sessionId)
    yield* store.idle(sessionId)
  })

/** Records every event the reaper tells. */
const recorder = () => {
  const events: Event[] = []
  return { events, layer: ReaperEvents.layer((e) => void events.push(e)) }
}

const stateOf = (sessionId: string) =>
  Effect.gen(function* () {
    return (yield* (yield* Store).getSession(sessionId)).state
  })

describe("Reaper.pass", () => {
  it.effect("a park yields to a queued session with no room; the session places in the pass after the descent finishes", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* TestClock.adjust("1 minute")
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      const state = ReaperState.make()
      const first = yield* Reaper.pass({ policy: "demand", state })
      assert.strictEqual(first._tag, "Done")
      if (first._tag !== "Done") return
      assert.deepStrictEqual(first.descents, [{ hostId: "h1", sessionId: "p1", reason: "demand" }])
      assert.strictEqual(first.withoutRoom, 1)
      const second = yield* Reaper.pass({ policy: "demand", state })
      assert.deepStrictEqual(second._tag === "Done" ? second.descents : null, [])
      yield* store.finishDescent("p1")
      const third = yield* Reaper.pass({ policy: "demand", state })
      assert.deepStrictEqual(third._tag === "Done" ? third.placed : null, [{ sessionId: "q1", hostId: "h1" }])
    }).pipe(Effect.provide(storeLayer())))

  it.effect("the gate decides on the fleet after the reclaim: room a reclaim frees makes no park yield, and the queued session places there", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      // An external reservation fills the rest of h1 until it expires in a minute.
      yield* store.reserve({ id: "x1", hostId: "h1", ownerKind: "external", ownerId: "job", memMib: 512, vcpus: 1, expiresAt: 60_000 })
      yield* store.createSession({ id: "q1", budget: { memMib: 512, vcpus: 1 } })
      assert.strictEqual(yield* stateOf("q1"), "queued")
      yield* TestClock.adjust("2 minutes")
      const pass = yield* Reaper.pass({ policy: "demand", state: ReaperState.make() })
      assert.strictEqual(pass._tag, "Done")
      if (pass._tag !== "Done") return
      assert.strictEqual(pass.reclaimed, 1)
      // Read before the reclaim, q1 had no room and p1 would have yielded for it.
      assert.deepStrictEqual([pass.yields, pass.descents, pass.withoutRoom], [[], [], 0])
      assert.deepStrictEqual(pass.placed, [{ sessionId: "q1", hostId: "h1" }])
      assert.strictEqual(yield* stateOf("p1"), "parked")
      assert.deepStrictEqual(
        rec.events.map((e) => e._tag),
        ["FleetRead", "Reclaimed", "FleetRead", "Decided", "Drained"],
      )
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a failed read after a reclaim holds every park this pass; the queue still drains", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.reserve({ id: "x1", hostId: "h1", ownerKind: "external", ownerId: "job", memMib: 256, vcpus: 1, expiresAt: 60_000 })
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* TestClock.adjust("2 minutes")
      let reads = 0
      const flaky = Store.of({
        ...store,
        fleetView: () => (++reads === 1 ? store.fleetView() : Effect.fail(new Unavailable({ reason: "down (test)", retryAfterMs: 1000 }))),
      })
      const pass = yield* Reaper.pass({ policy: "demand" }).pipe(Effect.provideService(Store, flaky))
      assert.strictEqual(pass._tag, "Done")
      if (pass._tag !== "Done") return
      assert.deepStrictEqual([pass.reclaimed, pass.descents.length], [1, 0])
      assert.strictEqual(yield* stateOf("p1"), "parked")
    }).pipe(Effect.provide(storeLayer())))

  it.effect("tells each step to the listener, in order", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* Reaper.pass({ policy: "demand" })
      assert.deepStrictEqual(
        rec.events.map((e) => e._tag),
        ["FleetRead", "Reclaimed", "Decided", "DescentStarted", "Drained"],
      )
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a failed fleet read ends the pass and holds every park, even past the hard TTL", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* TestClock.adjust("9 hours")
      const failing = Store.of({ ...store, fleetView: () => Effect.fail(new Unavailable({ reason: "down (test)", retryAfterMs: 1000 })) })
      const held = yield* Reaper.pass({ policy: "demand" }).pipe(Effect.provideService(Store, failing))
      assert.deepStrictEqual(held, { _tag: "Held", reason: "down (test)" })
      assert.strictEqual(yield* stateOf("p1"), "parked")
      const next = yield* Reaper.pass({ policy: "demand" })
      assert.strictEqual(next._tag === "Done" ? next.descents.length : -1, 1)
    }).pipe(Effect.provide(storeLayer())))

  it.effect("leadership is asked between steps: lost before the descents, nothing descends and nothing drains", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      // Leads for the reclaim and the gate, then loses the lock.
      let asked = 0
      const pass = yield* Reaper.pass({ policy: "demand", leading: () => ++asked <= 2 })
      assert.deepStrictEqual(pass, { _tag: "Held", reason: "lost the leader lock mid-pass" })
      assert.strictEqual(yield* stateOf("p1"), "parked")
      assert.strictEqual(yield* stateOf("q1"), "queued")
      assert.deepStrictEqual(rec.events.at(-1), { _tag: "LeadershipLost", source: "pass", step: "descents" })
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a TTL moved and activity reported after the pass read the due sessions keep them: the pass's end and idle act only on a session still due", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 8192)
      yield* store.createSession({ id: "ttl", budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], ttlMs: 1000 })
      yield* store.createSession({ id: "busy", budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], idleTimeoutMs: 1000 })
      yield* store.markRunning("ttl")
      yield* store.markRunning("busy")
      yield* TestClock.adjust(1001)
      // Between the pass's read of the due sessions and its writes: a client moves the TTL (told
      // 200) and the agent reports the guest active.
      const racing = Store.of({
        ...store,
        endSession: (id, options) => Effect.andThen(Effect.orDie(store.setTtl(id, 3_600_000)), store.endSession(id, options)),
        idle: (id, options) => Effect.andThen(Effect.orDie(store.recordActivity("h1", [id])), store.idle(id, options)),
      })
      const pass = yield* Reaper.pass({ policy: "demand" }).pipe(Effect.provideService(Store, racing))
      assert.strictEqual(pass._tag, "Done")
      assert.deepStrictEqual([yield* stateOf("ttl"), yield* stateOf("busy")], ["running", "running"])
      // Nothing is told as ended or idled.
      const applied = rec.events.filter((e) => e._tag === "LifetimesApplied")
      assert.deepStrictEqual(applied, [])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a failed read of the due lifetimes is told with its kind (contention is not an unhealthy store); nothing idled or ended", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 8192)
      yield* store.createSession({ id: "ttl", budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], ttlMs: 1000 })
      yield* store.markRunning("ttl")
      yield* TestClock.adjust(1001)
      const busy = Store.of({ ...store, lifetimesDue: () => Effect.fail(new Unavailable({ reason: "lock wait (test)", retryAfterMs: 1000, kind: "contended" })) })
      const pass = yield* Reaper.pass({ policy: "demand" }).pipe(Effect.provideService(Store, busy))
      assert.strictEqual(pass._tag, "Done")
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "LifetimesFailed"),
        [{ _tag: "LifetimesFailed", reason: "lock wait (test)", kind: "contended" }],
      )
      assert.strictEqual(yield* stateOf("ttl"), "running")
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("leadership lost midway through the lifetimes: the ends already written are still told", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 8192)
      for (const [id, ttlMs] of [["s1", 1000], ["s2", 1001]] as const) {
        yield* store.createSession({ id, budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], ttlMs })
        yield* store.markRunning(id)
      }
      yield* TestClock.adjust(1001)
      // Leads until its first end is written, then loses the lock (however often it is asked before).
      let ends = 0
      const counting = Store.of({ ...store, endSession: (id, options) => Effect.tap(store.endSession(id, options), () => Effect.sync(() => void ends++)) })
      const pass = yield* Reaper.pass({ policy: "demand", leading: () => ends === 0 }).pipe(Effect.provideService(Store, counting))
      assert.deepStrictEqual(pass, { _tag: "Held", reason: "lost the leader lock mid-pass" })
      assert.deepStrictEqual([yield* stateOf("s1"), yield* stateOf("s2")], ["ended", "running"])
      // The end that was written is heard (its host's agent stops the guest), before the loss is.
      const applied = rec.events.filter((e) => e._tag === "LifetimesApplied")
      assert.deepStrictEqual(
        applied.map((e) => e.expired.map((x) => [x.sessionId, x.hostId])),
        [[["s1", "h1"]]],
      )
      assert.deepStrictEqual(rec.events.at(-1), { _tag: "LeadershipLost", source: "pass", step: "lifetimes" })
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a pass that began without its fence (past the renew deadline) writes nothing, though a renewal under the same epoch lets the replica lead again mid-pass", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      // The lease's view: no fence at the pass's start, epoch 1 from the next look on; leading throughout.
      let looks = 0
      const fence = (): Fence | null => (looks++ === 0 ? null : { name: "reaper", epoch: 1 })
      const pass = yield* Reaper.pass({ policy: "demand", leading: () => true, fence })
      assert.deepStrictEqual(pass, { _tag: "Held", reason: "lost the leader lock mid-pass" })
      assert.strictEqual(yield* stateOf("p1"), "parked")
      assert.strictEqual(yield* stateOf("q1"), "queued")
    }).pipe(Effect.provide(storeLayer())))

  it.effect("every write of a pass carries the fence the pass began with, whatever CurrentFence was around it", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      const seen: (Fence | null)[] = []
      const spied = Store.of({ ...store, beginDescent: (id) => Effect.flatMap(Effect.service(CurrentFence), (f) => Effect.andThen(Effect.sync(() => seen.push(f)), store.beginDescent(id))) })
      const epoch7 = { name: "reaper", epoch: 7 }
      const pass = yield* Reaper.pass({ policy: "demand", fence: () => epoch7 }).pipe(Effect.provideService(Store, spied), Effect.provideService(CurrentFence, null))
      assert.deepStrictEqual(pass._tag === "Done" ? pass.descents.map((d) => d.sessionId) : pass, ["p1"])
      assert.deepStrictEqual(seen, [epoch7])
    }).pipe(Effect.provide(storeLayer())))

  it.effect("a lost race is skipped: a park that resumed between the read and the CAS does not descend", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      const fleet = yield* store.fleetView()
      yield* store.unpark("p1")
      const racing = Store.of({ ...store, fleetView: () => Effect.succeed(fleet) })
      const pass = yield* Reaper.pass({ policy: "demand" }).pipe(Effect.provideService(Store, racing))
      assert.deepStrictEqual(pass._tag === "Done" ? pass.descents : null, [])
      assert.strictEqual(rec.events.filter((e) => e._tag === "DescentLostRace").length, 1)
      assert.strictEqual(yield* stateOf("p1"), "running")
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("the policy is a parameter: floor30 yields a park with nothing waiting, demand does not", () =>
    Effect.gen(function* () {
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      const demand = yield* Reaper.pass({ policy: "demand" })
      assert.deepStrictEqual(demand._tag === "Done" ? demand.descents : null, [])
      const floor = yield* Reaper.pass({ policy: ParkPolicy.policy("floor30") })
      assert.deepStrictEqual(floor._tag === "Done" ? floor.descents : null, [{ hostId: "h1", sessionId: "p1", reason: "floor" }])
    }).pipe(Effect.provide(storeLayer())))

  it.effect("an unplaceable session makes no park yield and is counted apart", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 4096)
      yield* parked("h1", "p1", 4096)
      yield* store.createSession({ id: "huge", budget: { memMib: 64 * 1024, vcpus: 1 } })
      yield* TestClock.adjust("1 hour")
      const pass = yield* Reaper.pass({ policy: "demand" })
      assert.strictEqual(pass._tag, "Done")
      if (pass._tag !== "Done") return
      assert.deepStrictEqual([pass.withoutRoom, pass.unplaceable, pass.descents.length], [0, 1, 0])
      assert.strictEqual(yield* stateOf("p1"), "parked")
    }).pipe(Effect.provide(storeLayer())))

  it.effect("the starvation bound: past the limit every park the session needs yields on one held host, and it places when they finish", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 8192)
      yield* host("h2", 8192)
      for (const [h, ids] of [["h1", ["a1", "a2", "a3", "a4"]], ["h2", ["b1", "b2", "b3", "b4"]]] as const)
        for (const id of ids) yield* parked(h, id, 2048)
      yield* store.createSession({ id: "big", budget: { memMib: 6144, vcpus: 1 } })
      const state = ReaperState.make()
      const limit = ParkGate.defaultOptions.starvationLimitMs
      // Before the limit: one demand yield per pass (the park finishes, a small session takes the room).
      const early = yield* Reaper.pass({ policy: "demand", state })
      assert.strictEqual(early._tag === "Done" ? early.descents.length : -1, 1)
      const first = early._tag === "Done" ? (early.descents[0] as ParkPolicy.PolicyYield) : null
      yield* store.finishDescent(first?.sessionId as string)
      yield* store.createSession({ id: "small", budget: { memMib: 2048, vcpus: 1 } })
      yield* TestClock.adjust(limit)
      const late = yield* Reaper.pass({ policy: "demand", state })
      assert.strictEqual(late._tag, "Done")
      if (late._tag !== "Done") return
      assert.strictEqual(late.holds.length, 1)
      const held = (late.holds[0] as ParkGate.Hold).hostId
      assert.deepStrictEqual(late.descents.map((y) => y.reason), ["starving", "starving", "starving"])
      assert.isTrue(late.descents.every((y) => y.hostId === held))
      for (const y of late.descents) yield* store.finishDescent(y.sessionId)
      const after = yield* Reaper.pass({ policy: "demand", state })
      assert.deepStrictEqual(after._tag === "Done" ? after.placed : null, [{ sessionId: "big", hostId: held }])
      assert.deepStrictEqual(state.memory.holds, [])
    }).pipe(Effect.provide(storeLayer())))
})

/** Passes every 5 s for 200 s, past the grace, both hosts beating every 40 s (the last at 200 s). */
const beatingPasses = <R>(store: StoreShape, pass: () => Effect.Effect<unknown, never, R>) =>
  Effect.gen(function* () {
    for (let t = 5000; t <= 200_000; t += 5000) {
      yield* TestClock.adjust(5000)
      if (t % 40_000 === 0) for (const h of ["h1", "h2"]) yield* store.heartbeatHost(h)
      yield* pass()
    }
  })

describe("Reaper.pass failover grace (reclaimGraceMs)", () => {
  // The default two-minute stale window: heartbeats are the point here.
  const grace = Limits.defaults.heartbeatStaleWindowMs
  // These passes come minutes apart, not every few seconds as the loop runs them: a gap of a whole
  // grace between reads is not one here (the gap rule has its own tests, in core and the coordinator).
  const down = Store.of
  const unavailable = () => Effect.fail(new Unavailable({ reason: "down (test)", retryAfterMs: 1000 }))

  /** Two hosts, each running two sessions, that heartbeat now. */
  const fleet = Effect.gen(function* () {
    const store = yield* Store
    for (const h of ["h1", "h2"]) {
      yield* host(h, 4096)
      for (const k of [1, 2]) {
        yield* store.createSession({ id: `${h}-s${k}`, budget: { memMib: 512, vcpus: 1 }, affinity: [h] })
        yield* store.markRunning(`${h}-s${k}`)
      }
    }
  })
  const states = (ids: readonly string[]) => Effect.forEach(ids, stateOf)
  const all = ["h1-s1", "h1-s2", "h2-s1", "h2-s2"]

  it.effect("after a 3-minute outage the first pass reclaims nothing; hosts that heartbeat within the grace keep every session, one that does not is reclaimed once it ends", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      // The coordinator side was down for 3 minutes: no heartbeat landed, every reservation is stale.
      yield* TestClock.adjust("3 minutes")
      const t0 = yield* Clock.currentTimeMillis
      const state = ReaperState.make()
      const first = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(first._tag === "Done" ? [first.reclaimed, first.reclaimHeldUntil] : null, [0, t0 + grace])
      assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
      assert.deepStrictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld"), [{ _tag: "ReclaimHeld", until: t0 + grace }])
      // Only expired reservations were asked for: none here.
      assert.isFalse(rec.events.some((e) => e._tag === "Reclaimed" && e.result.reclaimed.length > 0))
      // h1's agent is back within the grace (agents beat at a third of the window); h2 stays silent.
      yield* TestClock.adjust("40 seconds")
      yield* store.heartbeatHost("h1")
      const during = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(during._tag === "Done" ? [during.reclaimed, during.reclaimHeldUntil] : null, [0, t0 + grace])
      yield* TestClock.adjust("40 seconds")
      yield* store.heartbeatHost("h1")
      // The grace ends: h2's reservations are reclaimed, h1's kept.
      yield* TestClock.adjust(grace - 80_000)
      const after = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(after._tag === "Done" ? [after.reclaimed, after.reclaimHeldUntil, [...after.lostSessions].sort()] : null, [2, null, ["h2-s1", "h2-s2"]])
      assert.deepStrictEqual(yield* states(all), ["running", "running", "lost", "lost"])
      // Told once per grace.
      assert.strictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").length, 1)
    }).pipe(Effect.provide(Layer.merge(StoreSim.layer(), rec.layer)))
  })

  it.effect("failed fleet reads for longer than the gap (the store unreachable) start the grace again at the next read", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      const state = ReaperState.make()
      const first = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.strictEqual(first._tag === "Done" ? first.reclaimed : -1, 0)
      // The store goes away for 3 minutes: no heartbeat lands, and the passes' reads fail.
      yield* TestClock.adjust("90 seconds")
      const failing = down({ ...store, fleetView: unavailable })
      const held = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace }).pipe(Effect.provideService(Store, failing))
      assert.deepStrictEqual(held, { _tag: "Held", reason: "down (test)" })
      yield* TestClock.adjust("90 seconds")
      // Back: the first grace would have ended, but the 180 s without a read started a new one.
      const t1 = yield* Clock.currentTimeMillis
      const back = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(back._tag === "Done" ? [back.reclaimed, back.reclaimHeldUntil] : null, [0, t1 + grace])
      assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
      // Nobody heartbeats within it: everything stale is reclaimed once it ends.
      yield* TestClock.adjust(grace)
      const after = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.strictEqual(after._tag === "Done" ? after.reclaimed : -1, 4)
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("while the grace holds an expired reservation is reclaimed at once; the stale ones wait for the grace's end", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      yield* store.reserve({ id: "x-exp", hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 256, vcpus: 1, expiresAt: 60_000 })
      // A 3-minute outage: every reservation is stale, and x-exp is also past its own expiresAt.
      yield* TestClock.adjust("3 minutes")
      const t0 = yield* Clock.currentTimeMillis
      const state = ReaperState.make()
      const first = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(first._tag === "Done" ? [first.reclaimed, first.lostSessions, first.reclaimHeldUntil] : null, [1, [], t0 + grace])
      assert.deepStrictEqual((yield* store.pageReservations()).items.map((r) => r.ownerId).sort(), ["h1-s1", "h1-s2", "h2-s1", "h2-s2"])
      assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
      // Nobody beats: the grace's end takes the stale ones.
      yield* TestClock.adjust(grace)
      const after = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.deepStrictEqual(after._tag === "Done" ? [after.reclaimed, after.reclaimHeldUntil] : null, [4, null])
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("a freeze mid-pass (after the fleet read, before the reclaim) is a gap: the grace starts again and no stale reservation goes", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const inner = yield* Store
      yield* fleet
      const state = ReaperState.make()
      const pass = () => Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: 40_000 })
      yield* beatingPasses(inner, pass)
      assert.strictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").length, 1)
      // The process freezes for 3 minutes in the pass's demand sample, between its read and its
      // reclaim: no heartbeat lands meanwhile, and every reservation is stale when it thaws.
      const freezing = Store.of({ ...inner, metrics: () => Effect.andThen(TestClock.adjust("3 minutes"), inner.metrics()) })
      yield* TestClock.adjust(5000)
      const thawed = yield* pass().pipe(Effect.provideService(Store, freezing))
      const t1 = 205_000 + 180_000
      assert.deepStrictEqual(thawed._tag === "Done" ? [thawed.reclaimed, thawed.reclaimHeldUntil] : null, [0, t1 + grace])
      assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
      assert.deepStrictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").at(-1), { _tag: "ReclaimHeld", until: t1 + grace })
      // The next pass's read is no second gap; the hosts beat within the new grace and keep everything.
      yield* TestClock.adjust(5000)
      for (const h of ["h1", "h2"]) yield* inner.heartbeatHost(h)
      yield* pass()
      assert.strictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").length, 2)
    }).pipe(Effect.provide(Layer.merge(StoreSim.layer(), rec.layer)))
  })

  for (const step of ["lifetimesDue", "drainQueue"] as const)
    it.effect(`a freeze later in the pass (in its ${step}, after the reclaim) is a gap too: the next pass reclaims nothing, and idles nothing`, () => {
      const rec = recorder()
      return Effect.gen(function* () {
        const inner = yield* Store
        yield* fleet
        const state = ReaperState.make()
        const pass = () => Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: 40_000 })
        yield* beatingPasses(inner, pass)
        // The hosts beat last at 200 s; the process freezes 3 minutes inside `step`, after the
        // pass's reclaim: no heartbeat lands meanwhile.
        const call = inner[step] as () => Effect.Effect<unknown, unknown>
        const freezing = Store.of({ ...inner, [step]: () => Effect.andThen(TestClock.adjust("3 minutes"), call()) })
        yield* TestClock.adjust(5000)
        const thawed = yield* pass().pipe(Effect.provideService(Store, freezing))
        assert.deepStrictEqual(thawed._tag === "Done" ? thawed.reclaimed : null, 0)
        assert.deepStrictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").at(-1), { _tag: "ReclaimHeld", until: 205_000 + 180_000 + grace })
        // 5 s after the thaw, before any host's next heartbeat: nothing goes.
        yield* TestClock.adjust(5000)
        const next = yield* pass()
        assert.deepStrictEqual(next._tag === "Done" ? [next.reclaimed, next.reclaimHeldUntil] : null, [0, 205_000 + 180_000 + grace])
        assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
      }).pipe(Effect.provide(Layer.merge(StoreSim.layer(), rec.layer)))
    })

  it.effect("a replica that leads again (relead) starts the grace again", () =>
    Effect.gen(function* () {
      yield* fleet
      const state = ReaperState.make()
      yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      // Passes less than a gap apart: the grace runs on (the fleet still fresh).
      yield* TestClock.adjust("100 seconds")
      yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      // Past the grace and the stale window: without the relead this pass would reclaim all four.
      yield* TestClock.adjust("30 seconds")
      ReaperState.relead(state)
      const again = yield* Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: grace })
      assert.strictEqual(again._tag === "Done" ? again.reclaimed : -1, 0)
      assert.deepStrictEqual(yield* states(all), ["running", "running", "running", "running"])
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("without a grace (missing or 0) the first pass after the outage reclaims every stale reservation: the seed's rule", () =>
    Effect.gen(function* () {
      yield* fleet
      yield* TestClock.adjust("3 minutes")
      const none = yield* Reaper.pass({ policy: "demand", state: ReaperState.make() })
      assert.deepStrictEqual(none._tag === "Done" ? [none.reclaimed, none.reclaimHeldUntil] : null, [4, null])
      assert.deepStrictEqual(yield* states(all), ["lost", "lost", "lost", "lost"])
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("reclaimGraceMs 0 is no grace", () =>
    Effect.gen(function* () {
      yield* fleet
      yield* TestClock.adjust("3 minutes")
      const zero = yield* Reaper.pass({ policy: "demand", state: ReaperState.make(), reclaimGraceMs: 0 })
      assert.strictEqual(zero._tag === "Done" ? zero.reclaimed : -1, 4)
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("the grace runs on the store's time (`nowOf`): a step of the store's clock (the database's, or a failover to a server whose clock differs) is a gap that starts it again; this process's clock standing still does not hide it", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const inner = yield* Store
      yield* fleet
      // A store that keeps a time of its own (as store-pg's `databaseTime` does): the Clock's plus a step.
      const clock = yield* Clock.Clock
      let stepMs = 0
      const own: StoreShape = { ...inner, now: () => clock.currentTimeMillisUnsafe() + stepMs }
      const state = ReaperState.make()
      const pass = () => Reaper.pass({ policy: "demand", state, reclaimGraceMs: grace, reclaimGapMs: 40_000 }).pipe(Effect.provideService(Store, own))
      yield* beatingPasses(inner, pass)
      // The first pass's grace has ended: reclaims run in full.
      const steady = yield* pass()
      assert.strictEqual(steady._tag === "Done" ? steady.reclaimHeldUntil : -1, null)
      assert.strictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").length, 1)
      // The store's clock steps 3 minutes ahead; this process's does not move.
      stepMs = 3 * 60_000
      const stepped = yield* pass()
      const until = (yield* Clock.currentTimeMillis) + stepMs + grace
      assert.strictEqual(stepped._tag === "Done" ? stepped.reclaimHeldUntil : -1, until)
      assert.deepStrictEqual(rec.events.filter((e) => e._tag === "ReclaimHeld").at(-1), { _tag: "ReclaimHeld", until })
    }).pipe(Effect.provide(Layer.merge(StoreSim.layer(), rec.layer)))
  })
})

describe("Reaper.pass moves for starving sessions", () => {
  const GiB = 1024
  /** h1 (held for a starving 24 GiB session) runs two 8 GiB sessions beside 8 GiB free; h2 has 16 GiB, empty. */
  const fleet = Effect.gen(function* () {
    const store = yield* Store
    yield* host("h1", 24 * GiB)
    yield* host("h2", 16 * GiB)
    for (const id of ["a", "b"]) {
      yield* store.createSession({ id, budget: { memMib: 8 * GiB, vcpus: 1 }, affinity: ["h1"] })
      yield* store.markRunning(id)
    }
    yield* store.createSession({ id: "big", budget: { memMib: 24 * GiB, vcpus: 1 } })
    yield* TestClock.adjust(ParkPolicy.defaultOptions.starvationLimitMs + 1000)
  })
  const moves: Reaper.MoveOptions = { costs: MakeRoom.defaultCosts, maxPerPass: 8 }

  it.effect("the pass begins core's moves after the drain and tells each; without the option it begins none", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* fleet
      const off = yield* Reaper.pass({ state: ReaperState.make() })
      assert.deepStrictEqual(off._tag === "Done" ? off.moves : null, [])
      const pass = yield* Reaper.pass({ state: ReaperState.make(), moves })
      assert.deepStrictEqual(pass._tag === "Done" ? pass.moves.map((m) => [m.planned.sessionId, m.planned.toHostId]) : null, [
        ["b", "h2"],
        ["a", "h2"],
      ])
      const begun = rec.events.filter((e) => e._tag === "MoveBegun")
      assert.deepStrictEqual(begun.map((e) => (e._tag === "MoveBegun" ? [e.move.sessionId, e.move.sourceHostId, e.move.targetHostId] : null)), [
        ["b", "h1", "h2"],
        ["a", "h1", "h2"],
      ])
      assert.strictEqual(yield* stateOf("b"), "moving")
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a failed read of the open moves skips the step: told with its kind, nothing begun, the pass done", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* fleet
      const store = yield* Store
      const flaky = Store.of({ ...store, listMoves: () => Effect.fail(new Unavailable({ reason: "down (test)", retryAfterMs: 1000, kind: "contended" })) })
      const pass = yield* Reaper.pass({ state: ReaperState.make(), moves }).pipe(Effect.provideService(Store, flaky))
      assert.deepStrictEqual(pass._tag === "Done" ? pass.moves : null, [])
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "MovesFailed"),
        [{ _tag: "MovesFailed", reason: "down (test)", kind: "contended" }],
      )
      assert.strictEqual(yield* stateOf("b"), "running")
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a replica that loses the lock before the moves begins none: the pass is held", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* fleet
      let asked = 0
      // Leading for every step up to the drain (reclaim, gate, drain), then no longer.
      const pass = yield* Reaper.pass({ state: ReaperState.make(), moves, leading: () => ++asked <= 3 })
      assert.strictEqual(pass._tag, "Held")
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "LeadershipLost"),
        [{ _tag: "LeadershipLost", source: "pass", step: "moves" }],
      )
      assert.deepStrictEqual(yield* (yield* Store).listMoves({ state: "pending" }), [])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })
  /** The store's abort of every open move as the source's downtime guard aborts one it refuses. */
  const refuseAll = Effect.gen(function* () {
    const store = yield* Store
    for (const m of yield* store.listMoves({ state: "pending" })) yield* store.abortMove(m.id, "ErrMoveDowntime: estimate 1400 ms > 1000 ms", { estimateMs: 1400 })
  })
  const begunOf = (report: Reaper.PassReport) => (report._tag === "Done" ? report.moves.map((m) => `${m.planned.sessionId}->${m.planned.toHostId}`) : null)

  it.effect("a move the guard refused is not begun again within the cooldown, and is after it", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* fleet
      const state = ReaperState.make()
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), ["b->h2", "a->h2"])
      yield* refuseAll
      // The next passes, up to the cooldown's end, leave the refused pairs out.
      for (let k = 0; k < 4; k++) {
        assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), [], `pass ${k + 2} within the cooldown`)
        yield* TestClock.adjust((MakeRoom.defaultCooldownMs - 1000) / 4)
      }
      yield* TestClock.adjust(1000)
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), ["b->h2", "a->h2"])
      // Their ends were counted as they left pending: two aborted.
      assert.deepStrictEqual(
        rec.events.flatMap((e) => (e._tag === "MoveEnded" ? [[e.move.sessionId, e.move.state]] : [])),
        [
          ["b", "aborted"],
          ["a", "aborted"],
        ],
      )
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("the memory of aborted moves is pruned every pass, starving or not: a leader that rarely starves keeps none past the cooldown", () =>
    Effect.gen(function* () {
      const state = ReaperState.make()
      state.aborted.push({ sessionId: "z", targetHostId: "h9", endedAt: 0 })
      // Nothing starves in this fleet (none at all); with timeouts on, the step runs every pass.
      const timed = { ...moves, timeoutMs: 120_000 }
      yield* Reaper.pass({ state, moves: timed })
      assert.deepStrictEqual(state.aborted.map((a) => a.sessionId), ["z"])
      yield* TestClock.adjust(MakeRoom.defaultCooldownMs)
      yield* Reaper.pass({ state, moves: timed })
      assert.deepStrictEqual(state.aborted, [])
    }).pipe(Effect.provide(storeLayer())),
  )

  it.effect("a new leader (a fresh memory) does not begin again the moves aborted within the cooldown", () =>
    Effect.gen(function* () {
      yield* fleet
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state: ReaperState.make(), moves })), ["b->h2", "a->h2"])
      yield* refuseAll
      const state = ReaperState.make()
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), [])
      yield* TestClock.adjust(MakeRoom.defaultCooldownMs)
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), ["b->h2", "a->h2"])
    }).pipe(Effect.provide(storeLayer())),
  )

  it.effect("a new leader reads only the moves aborted within the cooldown, not every abort the store keeps", () =>
    Effect.gen(function* () {
      yield* fleet
      const store = yield* Store
      // An abort long ago (two cooldowns back), then the refusals of a leader that died.
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state: ReaperState.make(), moves })), ["b->h2", "a->h2"])
      yield* refuseAll
      yield* TestClock.adjust(2 * MakeRoom.defaultCooldownMs)
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state: ReaperState.make(), moves })), ["b->h2", "a->h2"])
      yield* refuseAll
      yield* TestClock.adjust(1000)
      const now = yield* Clock.currentTimeMillis
      const asked: MoveFilter[] = []
      const counting = Store.of({ ...store, listMoves: (filter = {}) => Effect.andThen(Effect.sync(() => asked.push(filter)), store.listMoves(filter)) })
      const state = ReaperState.make()
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves }).pipe(Effect.provideService(Store, counting))), [])
      // The read of the aborts is bounded by the window; it answered the last two, not the four kept.
      assert.deepStrictEqual(
        asked.filter((f) => f.state === "aborted"),
        [{ state: "aborted", endedSince: now - MakeRoom.defaultCooldownMs }],
      )
      assert.strictEqual((yield* store.listMoves({ state: "aborted" })).length, 4)
      assert.deepStrictEqual(state.aborted.map((a) => a.sessionId).sort(), ["a", "b"])
      assert.isTrue(state.aborted.every((a) => a.endedAt === now - 1000))
    }).pipe(Effect.provide(storeLayer())),
  )

  it.effect("a replica that leads again (relead) reads the moves aborted under another leader before it plans", () =>
    Effect.gen(function* () {
      yield* fleet
      const store = yield* Store
      const state = ReaperState.make()
      // This replica led once (its memory has read the store), then another began the moves, and their guard refused them.
      state.abortedRead = true
      for (const id of ["b", "a"]) yield* store.beginMove({ sessionId: id, targetHostId: "h2", maxDowntimeMs: 1000 })
      yield* refuseAll
      ReaperState.relead(state)
      assert.deepStrictEqual(begunOf(yield* Reaper.pass({ state, moves })), [])
      assert.deepStrictEqual(state.aborted.map((a) => a.sessionId).sort(), ["a", "b"])
    }).pipe(Effect.provide(storeLayer())),
  )

  it.effect("the leader aborts a pending move older than twice the timeout whoever began it, unless past its point of no return", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* fleet
      const store = yield* Store
      // Begun by another replica (or the API) that died: this leader's memory does not know them.
      const first = yield* Reaper.pass({ state: ReaperState.make(), moves })
      const ids = first._tag === "Done" ? first.moves.map((m) => m.moveId) : []
      yield* store.recordRound(ids[0] as string, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
      const timed = { ...moves, timeoutMs: 60_000 }
      const state = ReaperState.make()
      yield* TestClock.adjust(2 * 60_000 - 1000)
      yield* Reaper.pass({ state, moves: timed })
      assert.deepStrictEqual((yield* store.listMoves({ state: "pending" })).length, 2)
      yield* TestClock.adjust(2000)
      yield* Reaper.pass({ state, moves: timed })
      const states = yield* Effect.forEach(ids, (id) => Effect.map(store.getMove(id), (m) => [m.state, m.abortReason]))
      assert.deepStrictEqual(states, [
        ["pending", null],
        ["aborted", "timeout"],
      ])
      assert.deepStrictEqual(rec.events.flatMap((e) => (e._tag === "MoveTimedOut" ? [e.move.id] : [])), [ids[1]])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })
})

describe("Reaper.pass retention", () => {
  const hour = 3_600_000
  const retention: Reaper.RetentionOptions = { retentionMs: hour, limit: 2 }
  /** Three sessions ended at the start (s1…s3), one running (live), on h1. */
  const history = Effect.gen(function* () {
    const store = yield* Store
    yield* host("h1", 8192)
    for (const id of ["s1", "s2", "s3", "live"]) yield* store.createSession({ id, budget: { memMib: 512, vcpus: 1 } })
    yield* store.markRunning("live")
    for (const id of ["s1", "s2", "s3"]) yield* store.endSession(id)
  })
  const sessionsNow = Effect.gen(function* () {
    return (yield* (yield* Store).listSessions()).map((x) => x.id).sort()
  })
  const prunedOf = (report: Reaper.PassReport) => (report._tag === "Done" ? report.pruned : null)

  it.effect("each pass deletes one chunk of the history that ended before the Clock's now less the retention; a live session stays", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* history
      const state = ReaperState.make()
      // Within the retention: nothing goes.
      yield* TestClock.adjust(hour)
      assert.deepStrictEqual(prunedOf(yield* Reaper.pass({ state, retention })), { sessions: 0, events: 0, moves: 0, pairs: 0 })
      // (Past the wait that follows a prune that deleted nothing.)
      yield* TestClock.adjust(Reaper.idleRetentionIntervalMs)
      // A chunk of 2 a pass (each ended session's history: created, placed, ended).
      assert.deepStrictEqual(prunedOf(yield* Reaper.pass({ state, retention })), { sessions: 2, events: 6, moves: 0, pairs: 0 })
      assert.deepStrictEqual(yield* sessionsNow, ["live", "s3"])
      assert.deepStrictEqual(prunedOf(yield* Reaper.pass({ state, retention })), { sessions: 1, events: 3, moves: 0, pairs: 0 })
      assert.deepStrictEqual(yield* sessionsNow, ["live"])
      // Told every pass, counts and all; without the option no pass prunes.
      assert.deepStrictEqual(
        rec.events.flatMap((e) => (e._tag === "Pruned" ? [e.result.sessions] : [])),
        [0, 2, 1],
      )
      yield* (yield* Store).endSession("live")
      yield* TestClock.adjust(2 * hour)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state })), null)
      assert.deepStrictEqual(yield* sessionsNow, ["live"])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("after a prune that deleted nothing the step waits a minute on the Clock; after one that deleted anything, the next pass prunes", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* history
      const state = ReaperState.make()
      const told = () => rec.events.flatMap((e) => (e._tag === "Pruned" ? [e.result.sessions] : []))
      yield* TestClock.adjust(hour)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention }))?.sessions, 0)
      // s1…s3 are due from here, but the step waits out the minute: no store call, nothing told.
      yield* TestClock.adjust(1)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention })), null)
      yield* TestClock.adjust(Reaper.idleRetentionIntervalMs - 2)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention })), null)
      assert.deepStrictEqual(yield* sessionsNow, ["live", "s1", "s2", "s3"])
      assert.deepStrictEqual(told(), [0])
      yield* TestClock.adjust(1)
      // A minute after the empty prune: a chunk, then at once the rest, then nothing and a wait again.
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention }))?.sessions, 2)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention }))?.sessions, 1)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention }))?.sessions, 0)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention })), null)
      assert.deepStrictEqual(told(), [0, 2, 1, 0])
      assert.deepStrictEqual(yield* sessionsNow, ["live"])
      // Leading again: the step runs at once. With a wait of 0: every pass.
      ReaperState.relead(state)
      const everyPass = { ...retention, idleIntervalMs: 0 }
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention: everyPass }))?.sessions, 0)
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state, retention: everyPass }))?.sessions, 0)
      assert.deepStrictEqual(told(), [0, 2, 1, 0, 0, 0])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a replica that loses the lock before the retention step deletes nothing: the pass is held", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* history
      yield* TestClock.adjust(2 * hour)
      let asked = 0
      // Leading for every step up to the drain (reclaim, gate, drain), then no longer.
      const pass = yield* Reaper.pass({ state: ReaperState.make(), retention, leading: () => ++asked <= 3 })
      assert.strictEqual(pass._tag, "Held")
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "LeadershipLost"),
        [{ _tag: "LeadershipLost", source: "pass", step: "prune" }],
      )
      assert.deepStrictEqual(yield* sessionsNow, ["live", "s1", "s2", "s3"])
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })

  it.effect("a failed prune is told (with its kind) and the pass is done; the next pass deletes the chunk", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      yield* history
      yield* TestClock.adjust(2 * hour)
      const store = yield* Store
      const down = Store.of({ ...store, pruneHistory: () => Effect.fail(new Unavailable({ reason: "down (test)", retryAfterMs: 1000, kind: "disk_full" })) })
      const failed = yield* Reaper.pass({ state: ReaperState.make(), retention }).pipe(Effect.provideService(Store, down))
      assert.strictEqual(failed._tag, "Done")
      assert.strictEqual(prunedOf(failed), null)
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "PruneFailed"),
        [{ _tag: "PruneFailed", reason: "down (test)", kind: "disk_full" }],
      )
      assert.strictEqual(prunedOf(yield* Reaper.pass({ state: ReaperState.make(), retention }))?.sessions, 2)
    }).pipe(Effect.provide(Layer.merge(storeLayer(), rec.layer)))
  })
})

describe("Trigger", () => {
  const triggered = (leading: () => boolean, rec: ReturnType<typeof recorder>) =>
    Trigger.layer({ policy: "demand", leading }).pipe(Layer.provideMerge(Layer.merge(storeLayer(), rec.layer)))

  it.effect("a queued session without room starts a descent within one coalescing window, without a pass", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      const trigger = yield* Trigger
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      const outcome = yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      assert.strictEqual(outcome._tag, "Queued")
      yield* trigger.poke
      // A burst of pokes in the same window shares the one reaction.
      yield* TestClock.adjust(defaultTriggerWindowMs / 2)
      yield* trigger.poke
      assert.strictEqual(yield* stateOf("p1"), "parked")
      yield* TestClock.adjust(defaultTriggerWindowMs / 2)
      assert.strictEqual(yield* stateOf("p1"), "descending")
      assert.strictEqual(rec.events.filter((e) => e._tag === "FleetRead").length, 1)
      assert.deepStrictEqual(
        rec.events.filter((e) => e._tag === "DescentStarted"),
        [{ _tag: "DescentStarted", source: "react", yield: { hostId: "h1", sessionId: "p1", reason: "demand" } }],
      )
      // A poke after the window opens a new one.
      yield* trigger.poke
      yield* TestClock.adjust(defaultTriggerWindowMs)
      assert.strictEqual(rec.events.filter((e) => e._tag === "FleetRead").length, 2)
    }).pipe(Effect.provide(triggered(() => true, rec)))
  })

  it.effect("a reaction carries the fence it began with, and starts no descent once the fence moved (a leader that thawed after a takeover)", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      let fence: Fence | null = { name: "reaper", epoch: 1 }
      const seen: (Fence | null)[] = []
      const spied = Store.of({
        ...store,
        beginDescent: (id) => Effect.flatMap(Effect.service(CurrentFence), (f) => Effect.andThen(Effect.sync(() => seen.push(f)), store.beginDescent(id))),
      })
      // While the fence stays, the descent carries it.
      const first = yield* Reaper.react({ policy: "demand", fence: () => fence }).pipe(Effect.provideService(Store, spied))
      assert.deepStrictEqual(first._tag === "Done" ? first.descents.map((d) => d.sessionId) : first, ["p1"])
      assert.deepStrictEqual(seen, [{ name: "reaper", epoch: 1 }])
      // q1 takes the room p1 gave back; p2 parks beside it; q2 queues for p2's room.
      yield* store.finishDescent("p1")
      yield* store.drainQueue()
      assert.strictEqual(yield* stateOf("q1"), "pending")
      yield* parked("h1", "p2", 1024)
      assert.strictEqual(yield* stateOf("p2"), "parked")
      yield* store.createSession({ id: "q2", budget: { memMib: 1024, vcpus: 1 } })
      // The lease moves to epoch 2 during the reaction's fleet read: it began under epoch 1, so it starts nothing.
      const moving = Store.of({ ...spied, fleetView: () => Effect.tap(store.fleetView(), () => Effect.sync(() => void (fence = { name: "reaper", epoch: 2 }))) })
      const second = yield* Reaper.react({ policy: "demand", fence: () => fence }).pipe(Effect.provideService(Store, moving))
      assert.deepStrictEqual(second, { _tag: "Held", reason: "lost the leader lock mid-pass" })
      assert.strictEqual(yield* stateOf("p2"), "parked")
      assert.strictEqual(seen.length, 1)
    }).pipe(Effect.provide(storeLayer())))

  it.effect("a replica that does not lead does not react", () => {
    const rec = recorder()
    return Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 2048)
      yield* parked("h1", "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* (yield* Trigger).poke
      yield* TestClock.adjust(defaultTriggerWindowMs * 4)
      assert.strictEqual(yield* stateOf("p1"), "parked")
      assert.deepStrictEqual(rec.events, [])
    }).pipe(Effect.provide(triggered(() => false, rec)))
  })
})

describe("ReaperState.QueuePeaks", () => {
  const GiB = 1024
  const q = (sessionId: string, memMib: number, vcpus = 1, queuedAt = -1_000) => ({ sessionId, budget: { memMib, vcpus }, queuedAt })
  const hostOf = (id: string, allocatableMib: number) =>
    ({ id, headroom: { allocatableMib, cpuBudget: 64, reserved: { memMib: 0, vcpus: 0 } }, descentsRunning: 0, parks: [] }) satisfies ParkGate.FleetHost

  it("keeps the most sessions of each size class that queued between two samples within the hold, sizes no host could take aside; a queue that stays is not counted again", () => {
    const peaks = new ReaperState.QueuePeaks()
    const hosts = [hostOf("h1", 64 * GiB)]
    const hold = 60_000
    // The first sample only marks where arrivals begin: a queue found then may be an old backlog.
    peaks.sample(-5_000, { hosts, queue: [q("old", 8 * GiB, 1, -60_000)] }, hold)
    assert.deepStrictEqual(peaks.peaks(), [])
    peaks.sample(0, { hosts, queue: [q("a", 8 * GiB), q("b", 8 * GiB), q("c", 8 * GiB, 4), q("d", 2 * GiB)] }, hold)
    // a-d still queued (seen at 0), e new.
    peaks.sample(5_000, { hosts, queue: [q("a", 8 * GiB), q("b", 8 * GiB), q("c", 8 * GiB, 4), q("d", 2 * GiB), q("e", 8 * GiB, 1, 4_000)] }, hold)
    // A 128 GiB session fits no host: never a reason to keep room.
    peaks.sample(10_000, { hosts, queue: [q("huge", 128 * GiB, 1, 9_000), q("f", 2 * GiB, 1, 9_000), q("g", 2 * GiB, 1, 9_500)] }, hold)
    const byClass = (xs: readonly { sizeClass: number; count: number; vcpus: number }[]) =>
      Object.fromEntries([...xs].sort((x, y) => x.sizeClass - y.sizeClass).map((p) => [p.sizeClass, [p.count, p.vcpus]]))
    assert.deepStrictEqual(byClass(peaks.peaks()), { 11: [2, 1], 13: [3, 4] })
    // The 8 GiB group of 0 s leaves the hold: its class falls to the one of 5 s; the 2 GiB pair of 10 s stays.
    peaks.sample(60_001, { hosts, queue: [] }, hold)
    assert.deepStrictEqual(byClass(peaks.peaks()), { 11: [2, 1], 13: [1, 1] })
    peaks.sample(70_001, { hosts, queue: [] }, hold)
    assert.deepStrictEqual(peaks.peaks(), [])
    // A hold of 0 keeps nothing.
    peaks.sample(80_000, { hosts, queue: [q("h", 8 * GiB, 1, 79_000)] }, 0)
    assert.deepStrictEqual(peaks.peaks(), [])
    // Passes closer than 5 s apart add to one sample: a group spread over them is one group.
    const fast = new ReaperState.QueuePeaks()
    fast.sample(99_000, { hosts, queue: [] }, hold)
    for (let t = 100_000; t < 104_000; t += 1_000) fast.sample(t, { hosts, queue: [q(`s${t}`, 8 * GiB, 1, t - 500)] }, hold)
    assert.deepStrictEqual(byClass(fast.peaks()), { 13: [4, 1] })
  })
})

describe("the queue's peaks in the pass", () => {
  it.effect("the pass samples the sessions that queued since its last sample and hands the peaks to the policy with the recent demand; a queue that stays is not counted again", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* host("h1", 4096)
      yield* parked("h1", "p1", 4096)
      const seen: (ParkPolicy.Recent | undefined)[] = []
      const policy: ParkPolicy.Policy = (fleet, ctx) => {
        seen.push(ctx.recent)
        return ParkPolicy.decide("demand-reserve", fleet, ctx)
      }
      const held = { ...ParkPolicy.defaultOptions, reserveBurstHoldMs: 30 * 60_000 }
      const state = ReaperState.make()
      // The meter answers once its samples span 30 s: a pass every 5 s.
      for (let i = 0; i < 7; i++) {
        yield* TestClock.adjust("5 seconds")
        yield* Reaper.pass({ policy, policyOptions: held, state })
      }
      assert.deepStrictEqual(seen.at(-1)?.queuedPeaks, [])
      // A group of three 1 GiB sessions finds no room: the next pass samples it.
      for (const id of ["q1", "q2", "q3"]) yield* store.createSession({ id, budget: { memMib: 1024, vcpus: 1 } })
      yield* TestClock.adjust("5 seconds")
      yield* Reaper.pass({ policy, policyOptions: held, state })
      const peaksOf = (r: ParkPolicy.Recent | undefined) => r?.queuedPeaks?.map((p) => [p.sizeClass, p.count])
      assert.deepStrictEqual(state.queuePeaks.peaks().map((p) => [p.sizeClass, p.count]), [[10, 3]])
      // Still queued a pass 2 s later (merged into the same sample): the same three, not three more; the policy gets the peak.
      yield* TestClock.adjust("2 seconds")
      yield* Reaper.pass({ policy, policyOptions: held, state })
      assert.deepStrictEqual(peaksOf(seen.at(-1)), [[10, 3]])
      // With the hold off no peak is kept.
      const off = ReaperState.make()
      yield* Reaper.pass({ policy: "demand-reserve", policyOptions: { ...ParkPolicy.defaultOptions, reserveBurstHoldMs: 0 }, state: off })
      assert.deepStrictEqual(off.queuePeaks.peaks(), [])
    }).pipe(Effect.provide(storeLayer())))
})

describe("ReaperState.DemandMeter", () => {
  it("answers MiB reserved per second over its window, nothing before its minimum span, and restarts on a counter reset", () => {
    const meter = new ReaperState.DemandMeter({ windowMs: 60_000, minSpanMs: 10_000 })
    meter.sample(0, 0)
    meter.sample(5_000, 5_000)
    assert.isUndefined(meter.rate())
    meter.sample(10_000, 10_240)
    assert.deepStrictEqual(meter.rate(), { reservedMibPerSec: 1024 })
    // Old samples leave the window: the rate follows the last minute only.
    for (let t = 15_000; t <= 120_000; t += 5_000) meter.sample(t, 10_240)
    assert.deepStrictEqual(meter.rate(), { reservedMibPerSec: 0 })
    meter.sample(125_000, 100)
    assert.isUndefined(meter.rate())
  })

  // Samples every `stepMs` from t = 0 of a counter that rises by each of `mib` in turn per 5 s.
  const fed = (mib: readonly number[], stepMs = 5_000): ReaperState.DemandMeter => {
    const meter = new ReaperState.DemandMeter({ windowMs: 10 * 60_000, minSpanMs: 10_000 })
    let total = 0
    meter.sample(0, 0)
    mib.forEach((m, i) => {
      // Within an interval the counter rises at its end (the passes in between see nothing new).
      for (let t = i * 5_000 + stepMs; t < (i + 1) * 5_000; t += stepMs) meter.sample(t, total)
      total += m
      meter.sample((i + 1) * 5_000, total)
    })
    return meter
  }

  it("the dispersion of the MiB reserved: single 8 GiB arrivals disperse 8 GiB, groups of four 8 GiB sessions four times that", () => {
    const GiB = 1024
    // One 8 GiB session every other interval: rates 0 and 8 GiB ÷ 5 s in turn, (b − a)² ÷ (a + b) = 8 GiB.
    const singles = Array.from({ length: 24 }, (_, i) => (i % 2 === 0 ? 0 : 8 * GiB))
    assert.closeTo(fed(singles).dispersion() as number, 8 * GiB, 1e-6)
    // Four of them at once every other interval: 32 GiB.
    const groups = singles.map((m) => 4 * m)
    assert.closeTo(fed(groups).dispersion() as number, 32 * GiB, 1e-6)
    // The policy gets it with the rate.
    const rate = fed(singles).rate()
    assert.closeTo(rate?.reservedMibPerSec as number, (8 * GiB) / 10, 1e-9)
    assert.closeTo(rate?.reservedMibDispersion as number, 8 * GiB, 1e-6)
  })

  it("the dispersion: passes closer than 5 s merge, a steady rate over unequal intervals has none, too few intervals give none", () => {
    const singles = Array.from({ length: 24 }, (_, i) => (i % 2 === 0 ? 0 : 8192))
    // A pass every second: the same 5 s intervals, the same figure.
    assert.strictEqual(fed(singles, 1_000).dispersion(), fed(singles).dispersion())
    // 100 MiB/s over intervals of 5 s and 10 s in turn: no variance, whatever the lengths.
    const steady = new ReaperState.DemandMeter({ windowMs: 10 * 60_000, minSpanMs: 10_000 })
    let t = 0
    steady.sample(0, 0)
    for (let i = 0; i < 20; i++) {
      t += i % 2 === 0 ? 5_000 : 10_000
      steady.sample(t, t / 10)
    }
    assert.strictEqual(steady.dispersion(), 0)
    // Eleven intervals: not measured, and the rate comes alone.
    const short = fed(singles.slice(0, 11))
    assert.isUndefined(short.dispersion())
    assert.deepStrictEqual(Object.keys(short.rate() ?? {}), ["reservedMibPerSec"])
    // No demand: no figure.
    assert.isUndefined(fed(Array.from({ length: 24 }, () => 0)).dispersion())
  })

  it("the dispersion: a rate that steps up within the window (a flash crowd) counts once, not as variance in every interval", () => {
    // 1 GiB/s for two and a half minutes, then 5 GiB/s, no noise: one pair of intervals differs.
    const step = Array.from({ length: 60 }, (_, i) => (i < 30 ? 5 * 1024 : 25 * 1024))
    const d = fed(step).dispersion() as number
    // (4 GiB/s)² ÷ (2 ÷ 5 s) over 59 pairs, over the mean 3 GiB/s: 236 MiB, less than one session of 1 GiB.
    assert.closeTo(d, (4096 * 4096 * 2.5) / 59 / 3072, 1e-6)
    assert.isBelow(d, 1024)
  })

  it.effect("the pass feeds the meter from the store's cumulative reserved MiB, so demand-reserve keeps room before anyone waits", () =>
    Effect.gen(function* () {
      yield* host("h1", 8192)
      yield* host("h2", 8192)
      const state = ReaperState.make()
      // Fill both hosts with parks over ten minutes, a pass every 5 s: the meter sees the demand.
      let n = 0
      for (let t = 0; t < 120; t++) {
        if (t % 15 === 0 && n < 8) yield* parked(n < 4 ? "h1" : "h2", `p${n++}`, 2048)
        yield* TestClock.adjust("5 seconds")
        const pass = yield* Reaper.pass({ policy: "demand-reserve", state })
        if (pass._tag === "Done" && pass.descents.length > 0) {
          // Nothing ever waited: the reserve made the room, from a park old enough to yield.
          assert.strictEqual(pass.withoutRoom, 0)
          assert.deepStrictEqual(pass.descents.map((y) => y.reason), pass.descents.map(() => "reserve"))
          return
        }
      }
      assert.fail("demand-reserve never made room on a fleet filled by steady demand")
    }).pipe(Effect.provide(storeLayer())))
})
