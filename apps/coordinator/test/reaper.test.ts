// The reaper pass on the in-memory store under a TestClock: no sleeps, time moved by hand.
import { assert, describe, it } from "@effect/vitest"
import { Limits } from "@engram/core"
import { Config, Leader, Metrics, Notifier, reaperPass, Settings } from "@engram/coordinator"
import { defaultTriggerWindowMs, Trigger } from "@engram/reaper"
import { clockSkewCheck, ReactAtOnce } from "../src/Reaper.js"
import { Changes, Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { failingFleetLayer } from "./support/failing.js"
import type { FleetSwitch } from "./support/failing.js"

// Heartbeats are not the point of these cases: a day-long stale window keeps reservations alive.
const longLived = (() => {
  const r = Limits.make({ heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 })
  if (r._tag === "Invalid") throw new Error("bad test limits")
  return r.limits
})()

/** The coordinator's settings from these variables over the defaults. */
const settingsOf = (variables: Record<string, string>) => {
  const parsed = Config.parse(variables)
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Settings.of({ config: parsed.config, backend: "custom" })
}

const services = (store: Layer.Layer<Store>) => Layer.mergeAll(Metrics.layer, Notifier.layer.pipe(Layer.provide(Changes.local))).pipe(Layer.provideMerge(store))

// A measured host with `capacityMib` of room after policy, and a running session parked on it.
const parkedOn = (hostId: string, capacityMib: number, sessionId: string, memMib: number) =>
  Effect.gen(function* () {
    const store = yield* Store
    yield* store.registerHost({ id: hostId })
    yield* store.reportHost(hostId, { totalMib: capacityMib + 2048, allocatableMib: capacityMib + 1024, totalVcpus: 8 })
    yield* store.createSession({ id: sessionId, budget: { memMib, vcpus: 1 }, affinity: [hostId] })
    yield* store.markRunning(sessionId)
    yield* store.idle(sessionId)
  })

describe("reaperPass", () => {
  it.effect("a replica that has lost the leader lock starts no descent and drains nothing", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 2048, "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      const pass = yield* reaperPass.pipe(Effect.provideService(Leader, Leader.of({ tick: Effect.succeed(false), isLeader: () => false, fence: () => null })))
      assert.deepStrictEqual(pass, { _tag: "Held", reason: "lost the leader lock mid-pass" })
      assert.strictEqual((yield* store.getSession("p1")).state, "parked")
      assert.strictEqual((yield* store.getSession("q1")).state, "queued")
    }).pipe(Effect.provide(services(StoreSim.layer()))))

  it.effect("while nothing waits every park holds, also on a full host", () =>
    Effect.gen(function* () {
      yield* parkedOn("h1", 1024, "p1", 1024)
      const report = yield* reaperPass
      assert.deepStrictEqual(report._tag === "Done" ? report.descents : null, [])
      assert.strictEqual((yield* (yield* Store).getSession("p1")).state, "parked")
    }).pipe(Effect.provide(services(StoreSim.layer()))))

  it.effect("a park yields to a queued session with no room; the queued session places after the descent finishes", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 2048, "p1", 1536)
      yield* TestClock.adjust("1 minute")
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      const pass = yield* reaperPass
      assert.strictEqual(pass._tag, "Done")
      if (pass._tag !== "Done") return
      assert.deepStrictEqual(pass.descents, [{ hostId: "h1", sessionId: "p1", reason: "demand" }])
      assert.strictEqual(pass.withoutRoom, 1)
      assert.strictEqual((yield* store.getSession("q1")).state, "queued")
      // The descent runs: it counts for the waiting session, nothing more yields.
      const second = yield* reaperPass
      assert.deepStrictEqual(second._tag === "Done" ? second.descents : null, [])
      yield* store.finishDescent("p1")
      const third = yield* reaperPass
      assert.deepStrictEqual(third._tag === "Done" ? third.placed : null, [{ sessionId: "q1", hostId: "h1" }])
      assert.strictEqual((yield* store.getSession("q1")).state, "pending")
    }).pipe(Effect.provide(services(StoreSim.layer()))))

  it.effect("a failed fleet read ends the pass and holds every park", () => {
    const sw: FleetSwitch = { failFleet: false }
    return Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 2048, "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* TestClock.adjust("9 hours") // past the hard TTL too
      sw.failFleet = true
      const held = yield* reaperPass
      assert.deepStrictEqual(held, { _tag: "Held", reason: "fleet read failed (test)" })
      assert.strictEqual((yield* store.getSession("p1")).state, "parked")
      assert.strictEqual((yield* Metrics).reaperFleetReadFailures.get(), 1)
      sw.failFleet = false
      const next = yield* reaperPass
      assert.strictEqual(next._tag === "Done" ? next.descents.length : -1, 1)
    }).pipe(Effect.provide(services(failingFleetLayer(StoreSim.layer({ limits: longLived }), sw))))
  })

  it.effect("a park older than the hard TTL yields with nothing waiting", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 4096, "p1", 512)
      yield* TestClock.adjust("7 hours")
      const early = yield* reaperPass
      assert.deepStrictEqual(early._tag === "Done" ? early.descents : null, [])
      yield* TestClock.adjust("1 hour")
      yield* TestClock.adjust(1)
      const late = yield* reaperPass
      assert.deepStrictEqual(late._tag === "Done" ? late.descents : null, [{ hostId: "h1", sessionId: "p1", reason: "hard_ttl" }])
      assert.strictEqual((yield* store.getSession("p1")).state, "descending")
    }).pipe(Effect.provide(services(StoreSim.layer({ limits: longLived })))))

  const warnings: string[] = []
  it.effect("stale reservations are reclaimed: their sessions become lost", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 4096, "p1", 512)
      yield* TestClock.adjust(Limits.defaults.heartbeatStaleWindowMs + 1)
      const pass = yield* reaperPass
      assert.strictEqual(pass._tag === "Done" ? pass.reclaimed : -1, 1)
      assert.strictEqual((yield* store.getSession("p1")).state, "lost")
      assert.strictEqual((yield* Metrics).sessionsLost.get(), 1)
      // Guests lost are a warning naming the hosts, not an info line among the passes'.
      assert.deepStrictEqual(warnings, ["reaper: reclaimed reservations; 1 session lost (stale heartbeats or expired reservations) h1 p1"])
    }).pipe(
      Effect.provide(services(StoreSim.layer())),
      Effect.provide(
        Logger.layer([
          Logger.make(({ logLevel, message }) => {
            const [text, fields] = Array.isArray(message) ? message : [message]
            const f = fields as { hosts?: string[]; lostSessions?: string[] } | undefined
            if (logLevel === "Warn") warnings.push([String(text), ...(f?.hosts ?? []), ...(f?.lostSessions ?? [])].join(" "))
          }),
        ]),
      ),
    ))

  it.effect("a lost race is skipped: a park that changed first does not descend", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 2048, "p1", 1536)
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      // The park resumes between the fleet read and the CAS: simulate with a store whose read is stale.
      const fleet = yield* store.fleetView()
      yield* store.unpark("p1")
      const racing = Store.of({ ...store, fleetView: () => Effect.succeed(fleet) })
      const pass = yield* reaperPass.pipe(Effect.provideService(Store, racing))
      assert.deepStrictEqual(pass._tag === "Done" ? pass.descents : null, [])
      assert.strictEqual((yield* Metrics).reaperLostRaces.get(), 1)
      assert.strictEqual((yield* store.getSession("p1")).state, "running")
    }).pipe(Effect.provide(services(StoreSim.layer()))))

  it.effect("ReactAtOnce: a poke after a session queues without room starts its descent within one window, counted like a pass's", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* parkedOn("h1", 2048, "p1", 1536)
      const queued = yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      assert.strictEqual(queued._tag, "Queued")
      yield* (yield* Trigger).poke
      yield* TestClock.adjust(defaultTriggerWindowMs)
      assert.strictEqual((yield* store.getSession("p1")).state, "descending")
      assert.strictEqual((yield* Metrics).descents.get({ reason: "demand" }), 1)
      // The next pass shares the reaction's memory: the descent serves q1, nothing more yields.
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.descents : null, [])
    }).pipe(Effect.provide(ReactAtOnce.pipe(Layer.provideMerge(services(StoreSim.layer()))))))

  it.effect("a session with an idle timeout and no activity goes idle by itself: the pass parks it, with no explicit idle call", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 8 })
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, idleTimeoutMs: 5 * 60_000 })
      yield* store.markRunning("s1")
      yield* TestClock.adjust("4 minutes")
      // The agent's report says the guest was active: its idle clock starts again.
      yield* store.recordActivity("h1", ["s1"])
      yield* TestClock.adjust("4 minutes")
      const early = yield* reaperPass
      assert.deepStrictEqual(early._tag === "Done" ? early.idled : null, [])
      assert.strictEqual((yield* store.getSession("s1")).state, "running")
      yield* TestClock.adjust("1 minute")
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.idled : null, [{ sessionId: "s1", hostId: "h1", state: "parked" }])
      assert.strictEqual((yield* store.getSession("s1")).state, "parked")
    }).pipe(Effect.provide(services(StoreSim.layer({ limits: longLived })))))

  it.effect("an idle session descends at once when a queued session has no room: the gate decides, not the timeout", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
      yield* store.createSession({ id: "s1", budget: { memMib: 1536, vcpus: 1 }, idleTimeoutMs: 60_000 })
      yield* store.markRunning("s1")
      yield* store.createSession({ id: "q1", budget: { memMib: 1024, vcpus: 1 } })
      yield* TestClock.adjust("1 minute")
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.idled : null, [{ sessionId: "s1", hostId: "h1", state: "descending" }])
      assert.strictEqual((yield* store.getSession("s1")).state, "descending")
    }).pipe(Effect.provide(services(StoreSim.layer({ limits: longLived })))))

  it.effect("a TTL ends a parked session: its reservation goes and its history says ttl expired", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 8 })
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, ttlMs: 2 * 60 * 60_000 })
      yield* store.markRunning("s1")
      yield* store.idle("s1")
      yield* TestClock.adjust("1 hour")
      // Extended by an hour from now: it would have ended at 2 h, it ends at 3 h.
      yield* store.setTtl("s1", 2 * 60 * 60_000)
      yield* TestClock.adjust("1 hour")
      const before = yield* reaperPass
      assert.deepStrictEqual(before._tag === "Done" ? before.expired : null, [])
      yield* TestClock.adjust("1 hour")
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.expired : null, [{ sessionId: "s1", hostId: "h1", state: "ended", imageHostId: null, openMove: null }])
      const s = yield* store.getSession("s1")
      assert.deepStrictEqual([s.state, s.reservationId], ["ended", null])
      const events = yield* store.sessionEvents("s1")
      assert.deepStrictEqual(events.items.at(-1)?.event, { _tag: "Ended", hostId: "h1", reason: "ttl expired" })
    }).pipe(Effect.provide(services(StoreSim.layer({ limits: longLived })))))

  it.effect("with ENGRAM_RETENTION_MS the leader's pass prunes the history that ended longer ago, counted by kind; 0 keeps it", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const metrics = yield* Metrics
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 8 })
      for (const id of ["s1", "s2"]) {
        yield* store.createSession({ id, budget: { memMib: 1024, vcpus: 1 } })
        yield* store.endSession(id)
      }
      yield* TestClock.adjust("7 days")
      yield* TestClock.adjust(1)
      const keepAll = settingsOf({ ENGRAM_RETENTION_MS: "0" })
      const off = yield* reaperPass.pipe(Effect.provideService(Settings, keepAll))
      assert.strictEqual(off._tag === "Done" ? off.pruned : undefined, null)
      assert.strictEqual((yield* store.listSessions()).length, 2)
      // The default: 7 days, 1,000 rows of each kind a pass.
      const pass = yield* reaperPass.pipe(Effect.provideService(Settings, settingsOf({})))
      assert.deepStrictEqual(pass._tag === "Done" ? pass.pruned : null, { sessions: 2, events: 6, moves: 0, pairs: 0 })
      assert.deepStrictEqual(yield* store.listSessions(), [])
      assert.deepStrictEqual([metrics.reaperPruned.get({ kind: "sessions" }), metrics.reaperPruned.get({ kind: "events" })], [2, 6])
    }).pipe(Effect.provide(services(StoreSim.layer({ limits: longLived })))))
})

describe("the clock skew check", () => {
  it.effect("warns once when this replica's clock is 5 s or more from the database's, says so again when back within 2.5 s; nothing unmeasured", () => {
    const lines: string[] = []
    const capture = Logger.layer([
      Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`)),
    ])
    return Effect.gen(function* () {
      const check = clockSkewCheck()
      for (const skew of [null, 1_000, -4_999, 90_000, 120_000, 3_000, 2_400, -6_000]) yield* check(skew)
      assert.strictEqual(lines.length, 3, lines.join("\n"))
      assert.match(lines[0] ?? "", /^Warn this replica's clock is 90\.0 s behind the database's: the store's times \(heartbeats, reports, sessions\) follow the database's clock, but this replica's logs and traces carry its own/)
      assert.strictEqual(lines[1], "Info this replica's clock agrees with the database's again")
      assert.match(lines[2] ?? "", /^Warn this replica's clock is 6\.0 s ahead of the database's/)
    }).pipe(Effect.provide(capture))
  })
})
