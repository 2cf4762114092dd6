/**
 * The fleet read (SPEC §4.1): hosts sorted by id with headroom, parks and descents, the queue
 * in FIFO order, read at the store's now; and the park gate of core deciding on it.
 */
import { ParkGate, ParkPolicy } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, kase, peerUrlOf, placed, queued, reportFor, reservationsNow, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

export const fleet: Group = {
  name: "fleet view",
  cases: [
    kase(
      "the fleet view lists hosts sorted by id with headroom, state, entries and measured",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("b", 8192, 2)
        yield* addHost("a")
        yield* s.setHostState("a", "cordoned")
        yield* placed("s1", { memMib: 1000, vcpus: 3 })
        yield* TestClock.adjust(77)
        const view = yield* s.fleetView()
        expect(view.readAt).toBe(77)
        expect(view.hosts).toStrictEqual([
          {
            id: "a",
            headroom: { allocatableMib: null, cpuBudget: null, reserved: { memMib: 0, vcpus: 0 } },
            state: "cordoned",
            entries: 0,
            measured: false,
            reported: true,
            reportedAt: 0,
            takesMoves: true,
            descentsRunning: 0,
            parks: [],
          },
          {
            id: "b",
            headroom: { allocatableMib: 8192, cpuBudget: 8, reserved: { memMib: 1000, vcpus: 3 } },
            state: "ready",
            entries: 1,
            measured: true,
            reported: true,
            reportedAt: 0,
            takesMoves: true,
            descentsRunning: 0,
            parks: [],
          },
        ])
        expect(view.queue).toStrictEqual([])
      }),
    ),
    kase(
      "the fleet view says which hosts take moves: those whose last report advertises a peer URL",
      Effect.gen(function* () {
        const s = yield* store
        const figures = { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }
        yield* s.registerHost({ id: "h1" })
        yield* s.registerHost({ id: "h2" })
        yield* s.registerHost({ id: "h3" })
        yield* s.reportHost("h1", figures)
        yield* s.reportHost("h2", { ...figures, peerUrl: "http://10.0.0.2:7100" })
        const takes = () => Effect.map(s.fleetView(), (v) => v.hosts.map((h) => [h.id, h.takesMoves]))
        // Unreported (h3) or reported without one (h1): no source could be told where to reach it.
        expect(yield* takes()).toStrictEqual([["h1", false], ["h2", true], ["h3", false]])
        // Each report decides: a URL advertised now, one no longer advertised.
        yield* s.reportHost("h1", { ...figures, peerUrl: "http://10.0.0.1:7100" })
        yield* s.reportHost("h2", figures)
        expect(yield* takes()).toStrictEqual([["h1", true], ["h2", false], ["h3", false]])
      }),
    ),
    kase(
      "the fleet view lists each host's parks with parkedAt and budget",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("p1", "running", { memMib: 1000, vcpus: 1 })
        yield* sessionIn("p2", "running", { memMib: 2000, vcpus: 2 })
        yield* TestClock.adjust(10)
        yield* s.idle("p2")
        yield* TestClock.adjust(10)
        yield* s.idle("p1")
        const parks = (yield* s.fleetView()).hosts[0]?.parks ?? []
        const sorted = [...parks].sort((x, y) => x.parkedAt - y.parkedAt)
        expect(sorted).toStrictEqual([
          { sessionId: "p2", parkedAt: 10, budget: { memMib: 2000, vcpus: 2 } },
          { sessionId: "p1", parkedAt: 20, budget: { memMib: 1000, vcpus: 1 } },
        ])
      }),
    ),
    kase(
      "the fleet view counts descents running per host and drops finished ones",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("d1", "descending")
        yield* sessionIn("d2", "descending")
        yield* sessionIn("p1", "parked")
        expect((yield* s.fleetView()).hosts[0]).toMatchObject({ descentsRunning: 2, entries: 3 })
        yield* s.finishDescent("d1")
        expect((yield* s.fleetView()).hosts[0]).toMatchObject({ descentsRunning: 1, entries: 2 })
        yield* s.beginDescent("p1")
        expect((yield* s.fleetView()).hosts[0]).toMatchObject({ descentsRunning: 2, parks: [] })
      }),
    ),
    kase(
      "the fleet view's queue is first in first out with budgets and queuedAt",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q2", { memMib: 2048, vcpus: 2 })
        yield* TestClock.adjust(5)
        yield* queued("q1", { memMib: 1024, vcpus: 1 })
        expect((yield* s.fleetView()).queue).toStrictEqual([
          { sessionId: "q2", budget: { memMib: 2048, vcpus: 2 }, queuedAt: 0 },
          { sessionId: "q1", budget: { memMib: 1024, vcpus: 1 }, queuedAt: 5 },
        ])
      }),
    ),
    kase(
      "on the fleet view the park gate yields the oldest park to a queued session with no room",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* sessionIn("old", "parked", { memMib: 2048, vcpus: 1 })
        yield* TestClock.adjust(1)
        yield* sessionIn("new", "parked", { memMib: 2048, vcpus: 1 })
        const calm = yield* s.fleetView()
        expect(ParkGate.evaluate(calm, calm.readAt, s.limits()).yields).toStrictEqual([])
        yield* queued("waiting", { memMib: 2048, vcpus: 1 })
        const view = yield* s.fleetView()
        const decision = ParkGate.evaluate(view, view.readAt, s.limits())
        expect(decision.yields).toStrictEqual([{ hostId: "h1", sessionId: "old", reason: "demand" }])
        // And an idle session would descend: core's idle decision on the same read.
        expect(ParkPolicy.mayPark(ParkPolicy.defaultRule, ParkPolicy.idleViewOf(view, "h1", s.limits()))).toBe(false)
      }),
    ),
    kase(
      "on the fleet view, at the store's time, a host whose agent went silent is no room for the park gate: a queue waiting on a dead agent's empty host makes the live host's oldest park yield",
      Effect.gen(function* () {
        const s = yield* store
        const window = s.limits().heartbeatStaleWindowMs
        yield* addHost("dead", 8192)
        yield* addHost("live", 4096)
        // Two parks fill live (best fit: the fuller host first); dead stays empty.
        yield* sessionIn("old", "parked", { memMib: 2048, vcpus: 1 })
        yield* TestClock.adjust(1)
        yield* sessionIn("new", "parked", { memMib: 2048, vcpus: 1 })
        expect((yield* s.fleetView()).hosts.map((h) => [h.id, h.parks.length])).toStrictEqual([["dead", 0], ["live", 2]])
        // dead's agent is killed: a window later only live's agent reports and heartbeats.
        yield* TestClock.setTime(window + 2)
        for (const r of yield* reservationsNow(s)) yield* s.heartbeat(r.id)
        yield* s.reportHost("live", { ...reportFor(4096, 8, s.limits()), peerUrl: peerUrlOf("live") })
        yield* queued("waiting", { memMib: 2048, vcpus: 1 })
        const view = yield* s.fleetView()
        const decision = ParkGate.evaluate(view, view.readAt, s.limits())
        expect(decision.withoutRoom).toBe(1)
        expect(decision.yields).toStrictEqual([{ hostId: "live", sessionId: "old", reason: "demand" }])
        // An idle session would descend, judged at the same time.
        expect(ParkPolicy.mayPark(ParkPolicy.defaultRule, ParkPolicy.idleViewOf(view, "live", s.limits(), view.readAt))).toBe(false)
      }),
    ),
  ],
}
