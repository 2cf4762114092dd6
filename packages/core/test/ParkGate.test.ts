import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, ParkGate } from "../src/index.js"
import type { FleetHost, FleetView, Park } from "../src/index.js"

const GiB = 1024
const park = (sessionId: string, parkedAt: number, memMib = 4 * GiB): Park => ({ sessionId, parkedAt, budget: { memMib, vcpus: 1 } })
const fleetHost = (id: string, allocatableMib: number | null, reservedMib: number, parks: Park[] = [], extra: Partial<FleetHost> = {}): FleetHost => ({
  id,
  headroom: { allocatableMib, cpuBudget: 64, reserved: { memMib: reservedMib, vcpus: 0 } },
  descentsRunning: 0,
  parks,
  ...extra,
})
const queued = (sessionId: string, memMib: number, queuedAt = 0) => ({ sessionId, budget: { memMib, vcpus: 1 }, queuedAt })
const NOW = 1_000_000

describe("ParkGate", () => {
  it("a park yields to a queued session with no room", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("p1", 10), park("p2", 5)])],
      queue: [queued("q1", 4 * GiB)],
    }
    const d = ParkGate.evaluate(fleet, NOW)
    expect(d.withoutRoom).toBe(1)
    // The oldest park on the host yields.
    expect(d.yields).toEqual([{ hostId: "h1", sessionId: "p2", reason: "demand" }])
  })

  it("a full host holds its parks while nothing waits", () => {
    const fleet: FleetView = { hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("p1", 10), park("p2", 5)])], queue: [] }
    const d = ParkGate.evaluate(fleet, NOW)
    expect(d.yields).toEqual([])
    expect(d.mayPark("h1")).toBe(true)
  })

  it("parks hold while every queued session fits somewhere", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("p1", 10)]), fleetHost("h2", 8 * GiB, 0)],
      queue: [queued("q1", 4 * GiB), queued("q2", 8 * GiB)],
    }
    const d = ParkGate.evaluate(fleet, NOW)
    expect(d.withoutRoom).toBe(0)
    expect(d.yields).toEqual([])
  })

  it("each queued session is judged alone against the current headroom", () => {
    // Two 6 GiB sessions each fit alone on the one 8 GiB hole: neither counts as without room.
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("p1", 10)]), fleetHost("h2", 8 * GiB, 0)],
      queue: [queued("q1", 6 * GiB), queued("q2", 6 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).withoutRoom).toBe(0)
  })

  it("a session does not park while a queued session has no room", () => {
    const fleet: FleetView = { hosts: [fleetHost("h1", 8 * GiB, 8 * GiB)], queue: [queued("q1", 2 * GiB)] }
    const d = ParkGate.evaluate(fleet, NOW)
    expect(d.mayPark("h1")).toBe(false)
    expect(ParkGate.mayPark(fleet, "h1")).toBe(false)
  })

  it("an unmeasured host does not park", () => {
    const fleet: FleetView = { hosts: [fleetHost("u", null, 0)], queue: [] }
    expect(ParkGate.evaluate(fleet, NOW).mayPark("u")).toBe(false)
    expect(ParkGate.mayPark(fleet, "u")).toBe(false)
    expect(ParkGate.evaluate(fleet, NOW).mayPark("nowhere")).toBe(false)
  })

  it("one running descent counts for one waiting session", () => {
    const hosts = [
      fleetHost("h1", 8 * GiB, 8 * GiB, [park("a", 1)], { descentsRunning: 1 }),
      fleetHost("h2", 8 * GiB, 8 * GiB, [park("b", 1)]),
      fleetHost("h3", 8 * GiB, 8 * GiB, [park("c", 1)]),
    ]
    const one = ParkGate.evaluate({ hosts, queue: [queued("q1", 4 * GiB)] }, NOW)
    expect(one.withoutRoom).toBe(1)
    expect(one.yields).toEqual([])
    const two = ParkGate.evaluate({ hosts, queue: [queued("q1", 4 * GiB), queued("q2", 4 * GiB)] }, NOW)
    expect(two.yields.length).toBe(1)
  })

  it("at most one park yields per host per pass", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 16 * GiB, 16 * GiB, [park("a", 1), park("b", 2), park("c", 3), park("d", 4)])],
      queue: [queued("q1", 6 * GiB), queued("q2", 6 * GiB), queued("q3", 6 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([{ hostId: "h1", sessionId: "a", reason: "demand" }])
  })

  it("none yields on a host where a descent runs", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("a", 1)], { descentsRunning: 1 }), fleetHost("h2", 8 * GiB, 9 * GiB, [park("b", 1)], { descentsRunning: 1 })],
      queue: [queued("q1", 4 * GiB), queued("q2", 4 * GiB), queued("q3", 4 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([])
  })

  it("demand picks the hosts with the most unreserved RAM, ties by host id", () => {
    const fleet: FleetView = {
      hosts: [
        fleetHost("h1", 16 * GiB, 15 * GiB, [park("a", 1, 2 * GiB)]),
        fleetHost("h2", 16 * GiB, 13 * GiB, [park("b", 1, 2 * GiB)]),
        fleetHost("h0", 16 * GiB, 13 * GiB, [park("c", 1, 2 * GiB)]),
      ],
      queue: [queued("q1", 8 * GiB), queued("q2", 8 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).yields.map((y) => y.hostId)).toEqual(["h0", "h2"])
  })

  it("an over-reserved host yields its oldest park while nothing waits", () => {
    const fleet: FleetView = { hosts: [fleetHost("h1", 8 * GiB, 9 * GiB, [park("a", 7), park("b", 3)])], queue: [] }
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([{ hostId: "h1", sessionId: "b", reason: "over_reserved" }])
  })

  it("a park older than the hard TTL yields regardless of demand", () => {
    const limits = { ...Limits.defaults, parkHardTtlMs: 1000 }
    const fleet: FleetView = { hosts: [fleetHost("h1", 64 * GiB, 4 * GiB, [park("old", NOW - 1001), park("young", NOW - 10)])], queue: [] }
    expect(ParkGate.evaluate(fleet, NOW, limits).yields).toEqual([{ hostId: "h1", sessionId: "old", reason: "hard_ttl" }])
    expect(ParkGate.evaluate(fleet, NOW - 2, limits).yields).toEqual([])
  })

  it("no percentage floor: a host 100% reserved by parks keeps them with an empty queue", () => {
    const hosts = Array.from({ length: 5 }, (_, i) => fleetHost(`h${i}`, 8 * GiB, 8 * GiB, [park(`p${i}`, i)]))
    expect(ParkGate.evaluate({ hosts, queue: [] }, NOW).yields).toEqual([])
  })

  it("a cordoned host's parks do not yield for demand: its room cannot take the queue", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("c", 8 * GiB, 8 * GiB, [park("a", 1)], { state: "cordoned" }), fleetHost("r", 8 * GiB, 8 * GiB, [park("b", 1)])],
      queue: [queued("q1", 4 * GiB), queued("q2", 4 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([{ hostId: "r", sessionId: "b", reason: "demand" }])
  })

  it("property: demand yields never exceed max(0, withoutRoom − descents) and never two on one host", () => {
    const arbFleet = fc.record({
      hosts: fc.array(
        fc.record({
          cap: fc.option(fc.integer({ min: 1, max: 64 }), { nil: null }),
          reserved: fc.integer({ min: 0, max: 80 }),
          parks: fc.array(fc.record({ at: fc.integer({ min: 0, max: 100 }), mem: fc.integer({ min: 1, max: 8 }) }), { maxLength: 4 }),
          descents: fc.integer({ min: 0, max: 2 }),
          state: fc.constantFrom("ready", "ready", "cordoned", "draining"),
        }),
        { maxLength: 20 },
      ),
      queue: fc.array(fc.integer({ min: 1, max: 32 }), { maxLength: 20 }),
      now: fc.integer({ min: 0, max: 200 }),
    })
    fc.assert(
      fc.property(arbFleet, ({ hosts, queue, now }) => {
        const fleet: FleetView = {
          hosts: hosts.map((h, i) =>
            fleetHost(`h${i}`, h.cap === null ? null : h.cap * GiB, h.reserved * GiB, h.parks.map((p, j) => park(`h${i}p${j}`, p.at, p.mem * GiB)), {
              descentsRunning: h.descents,
              state: h.state as "ready",
            }),
          ),
          queue: queue.map((m, i) => queued(`q${i}`, m * GiB, i)),
        }
        const d = ParkGate.evaluate(fleet, now, { ...Limits.defaults, parkHardTtlMs: 150 })
        const demand = d.yields.filter((y) => y.reason === "demand").length
        expect(demand).toBeLessThanOrEqual(Math.max(0, d.withoutRoom - d.descentsRunning))
        const perHost = new Set(d.yields.map((y) => y.hostId))
        expect(perHost.size).toBe(d.yields.length)
        for (const y of d.yields) {
          const h = fleet.hosts.find((x) => x.id === y.hostId) as FleetHost
          expect(h.descentsRunning).toBe(0)
          expect(h.headroom.allocatableMib).not.toBeNull()
          // The yielding park is the host's oldest.
          const oldest = Math.min(...h.parks.map((p) => p.parkedAt))
          expect(h.parks.find((p) => p.sessionId === y.sessionId)?.parkedAt).toBe(oldest)
        }
      }),
    )
  })
})
