import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, ParkGate, ParkPolicy } from "../src/index.js"
import type { FleetHost, FleetView, Park } from "../src/index.js"

const GiB = 1024
const park = (sessionId: string, parkedAt: number, memMib = 4 * GiB, vcpus = 1): Park => ({ sessionId, parkedAt, budget: { memMib, vcpus } })
const fleetHost = (id: string, allocatableMib: number | null, reservedMib: number, parks: Park[] = [], extra: Partial<FleetHost> = {}): FleetHost => ({
  id,
  headroom: { allocatableMib, cpuBudget: 64, reserved: { memMib: reservedMib, vcpus: 0 } },
  descentsRunning: 0,
  parks,
  ...extra,
})
const NOW = 1_000_000
// Queued a second before NOW by default: waiting, not starving.
const queued = (sessionId: string, memMib: number, queuedAt = NOW - 1000) => ({ sessionId, budget: { memMib, vcpus: 1 }, queuedAt })
const TTL_LIMITS = { ...Limits.defaults, parkHardTtlMs: 150 }

const arbFleet = fc
  .record({
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
  .map(({ hosts, queue, now }) => ({
    now,
    fleet: {
      hosts: hosts.map((h, i) =>
        fleetHost(`h${i}`, h.cap === null ? null : h.cap * GiB, h.reserved * GiB, h.parks.map((p, j) => park(`h${i}p${j}`, p.at, p.mem * GiB)), {
          descentsRunning: h.descents,
          state: h.state as "ready",
        }),
      ),
      queue: queue.map((m, i) => queued(`q${i}`, m * GiB, i)),
    } satisfies FleetView,
  }))

const parkOf = (fleet: FleetView, hostId: string, sessionId: string): Park | undefined =>
  fleet.hosts.find((h) => h.id === hostId)?.parks.find((p) => p.sessionId === sessionId)

describe("ParkPolicy", () => {
  it("every policy has a name, a summary and an answer", () => {
    const fleet: FleetView = { hosts: [fleetHost("h1", 8 * GiB, 0)], queue: [] }
    for (const name of ParkPolicy.names) {
      expect(ParkPolicy.isName(name)).toBe(true)
      expect(ParkPolicy.summaries[name].length).toBeGreaterThan(0)
      expect(ParkPolicy.evaluate(name, fleet, NOW).yields).toEqual([])
    }
    expect(ParkPolicy.isName("always-park")).toBe(false)
  })

  it("demand is ParkGate.evaluate, and every demand variant with its seam left at the default answers the same (property)", () => {
    fc.assert(
      fc.property(arbFleet, ({ fleet, now }) => {
        const gate = ParkGate.evaluate(fleet, now, TTL_LIMITS)
        const same = [
          ParkPolicy.evaluate("demand", fleet, now, TTL_LIMITS),
          // No minimum age: every host is eligible, as under demand.
          ParkPolicy.demandMinAge(fleet, now, TTL_LIMITS, { ...ParkPolicy.defaultOptions, minParkAgeMs: 0 }),
          // No recent demand: no reserve is kept.
          ParkPolicy.decide("demand-reserve", fleet, { now, limits: TTL_LIMITS }),
        ]
        for (const d of same) {
          expect(d.yields).toEqual(gate.yields)
          expect(d.withoutRoom).toBe(gate.withoutRoom)
          expect(d.unplaceable).toBe(gate.unplaceable)
          expect(d.descentsRunning).toBe(gate.descentsRunning)
          for (const h of fleet.hosts) expect(d.mayPark(h.id)).toBe(gate.mayPark(h.id))
        }
      }),
    )
  })

  it("property: every yield names a park on a host where no descent runs; one per host except under the floor", () => {
    fc.assert(
      fc.property(arbFleet, ({ fleet, now }) => {
        for (const name of ParkPolicy.names) {
          const d = ParkPolicy.evaluate(name, fleet, now, TTL_LIMITS)
          const ids = new Set(d.yields.map((y) => y.sessionId))
          expect(ids.size).toBe(d.yields.length)
          if (name !== "floor30") expect(new Set(d.yields.map((y) => y.hostId)).size).toBe(d.yields.length)
          for (const y of d.yields) {
            expect(parkOf(fleet, y.hostId, y.sessionId)).toBeDefined()
            expect(fleet.hosts.find((h) => h.id === y.hostId)?.descentsRunning).toBe(0)
          }
          const demandYields = d.yields.filter((y) => y.reason === "demand").length
          expect(demandYields).toBeLessThanOrEqual(Math.max(0, d.withoutRoom - d.descentsRunning))
        }
      }),
    )
  })

  it("property: the cumulative count is never below the count of sessions judged alone", () => {
    fc.assert(
      fc.property(arbFleet, ({ fleet }) => {
        expect(ParkPolicy.countWithoutRoomCumulative(fleet)).toBeGreaterThanOrEqual(ParkGate.countWithoutRoom(fleet))
      }),
    )
  })

  it("demand-cumulative: two sessions that each fit alone into the one hole count as one without room", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("p1", 10)]), fleetHost("h2", 8 * GiB, 0)],
      queue: [queued("q1", 6 * GiB), queued("q2", 6 * GiB)],
    }
    expect(ParkPolicy.demand(fleet, NOW).yields).toEqual([])
    const d = ParkPolicy.demandCumulative(fleet, NOW)
    expect(d.withoutRoom).toBe(1)
    expect(d.yields).toEqual([{ hostId: "h1", sessionId: "p1", reason: "demand" }])
    expect(d.mayPark("h2")).toBe(false)
  })

  it("demand-fitting: the park whose descent makes the waiting session fit yields, not the nearest host's", () => {
    // h1 is nearest to a fit (3 GiB free) but its park is 1 GiB: 4 GiB free is still short of 6.
    // h2 has 0 GiB free and an 8 GiB park: its descent makes the session fit.
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 16 * GiB, 13 * GiB, [park("small", 1, 1 * GiB)]), fleetHost("h2", 16 * GiB, 16 * GiB, [park("young", 50, 2 * GiB), park("big", 60, 8 * GiB)])],
      queue: [queued("q1", 6 * GiB)],
    }
    expect(ParkPolicy.demand(fleet, NOW).yields).toEqual([{ hostId: "h1", sessionId: "small", reason: "demand" }])
    // On h2 the oldest park (2 GiB) does not suffice; the oldest that does is "big".
    expect(ParkPolicy.demandFitting(fleet, NOW).yields).toEqual([{ hostId: "h2", sessionId: "big", reason: "demand" }])
  })

  it("demand-fitting: a session no single descent can help falls back to the host nearest to a fit", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 16 * GiB, 14 * GiB, [park("a", 1, 2 * GiB), park("b", 2, 2 * GiB)]), fleetHost("h2", 16 * GiB, 16 * GiB, [park("c", 1, 1 * GiB)])],
      queue: [queued("q1", 10 * GiB)],
    }
    expect(ParkPolicy.demandFitting(fleet, NOW).yields).toEqual([{ hostId: "h1", sessionId: "a", reason: "demand" }])
  })

  it("demand-minage: a park younger than the minimum age does not yield for demand", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 8 * GiB, [park("fresh", NOW - 1000)]), fleetHost("h2", 8 * GiB, 8 * GiB, [park("old", NOW - 600_000)])],
      queue: [queued("q1", 4 * GiB), queued("q2", 4 * GiB)],
    }
    expect(ParkPolicy.demand(fleet, NOW).yields.map((y) => y.sessionId).sort()).toEqual(["fresh", "old"])
    expect(ParkPolicy.demandMinAge(fleet, NOW, Limits.defaults, { ...ParkPolicy.defaultOptions, minParkAgeMs: 300_000 }).yields).toEqual([{ hostId: "h2", sessionId: "old", reason: "demand" }])
    expect(ParkPolicy.demandMinAge(fleet, NOW, Limits.defaults, { ...ParkPolicy.defaultOptions, minParkAgeMs: 1000 }).yields.length).toBe(2)
  })

  it("floor30: a host below the floor yields its oldest parks until the floor is back, with nothing waiting", () => {
    // 10 GiB capacity, 9 GiB reserved: 10 % free, 2 GiB short of 30 %.
    const fleet: FleetView = { hosts: [fleetHost("h1", 10 * GiB, 9 * GiB, [park("a", 3, 1 * GiB), park("b", 1, 1 * GiB), park("c", 2, 1 * GiB)])], queue: [] }
    const d = ParkPolicy.floor(fleet, NOW)
    expect(d.yields).toEqual([
      { hostId: "h1", sessionId: "b", reason: "floor" },
      { hostId: "h1", sessionId: "c", reason: "floor" },
    ])
    expect(d.mayPark("h1")).toBe(false)
  })

  it("floor30: a host at the floor holds its parks and takes new ones, even while sessions wait", () => {
    const fleet: FleetView = { hosts: [fleetHost("h1", 10 * GiB, 7 * GiB, [park("a", 1, 1 * GiB)])], queue: [queued("q1", 8 * GiB)] }
    const d = ParkPolicy.evaluate("floor30", fleet, NOW)
    expect(d.yields).toEqual([])
    expect(d.withoutRoom).toBe(1)
    expect(d.mayPark("h1")).toBe(true)
    expect(ParkPolicy.floor(fleet, NOW, Limits.defaults, 40).mayPark("h1")).toBe(false)
  })

  it("floor30: an unmeasured host does not park", () => {
    const fleet: FleetView = { hosts: [fleetHost("u", null, 0)], queue: [] }
    expect(ParkPolicy.floor(fleet, NOW).mayPark("u")).toBe(false)
  })

  it("never-park never parks; park-forever parks on any measured host and yields only at the hard TTL", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("h1", 8 * GiB, 9 * GiB, [park("over", NOW - 10)]), fleetHost("h2", 8 * GiB, 8 * GiB, [park("old", NOW - 1000)]), fleetHost("u", null, 0)],
      queue: [queued("q1", 4 * GiB)],
    }
    const limits = { ...Limits.defaults, parkHardTtlMs: 500 }
    const never = ParkPolicy.neverPark(fleet, NOW, limits)
    expect(never.mayPark("h1")).toBe(false)
    const forever = ParkPolicy.parkForever(fleet, NOW, limits)
    expect(forever.yields).toEqual([{ hostId: "h2", sessionId: "old", reason: "hard_ttl" }])
    expect(forever.mayPark("h1")).toBe(true)
    expect(forever.mayPark("u")).toBe(false)
  })

  describe("demand-reserve", () => {
    const OLD = NOW - 3_600_000
    // Four 64 GiB hosts, each holding eight 8 GiB parks parked an hour ago: the fleet is full.
    const fullOfParks = (parkedAt = OLD, freeGiB = 0): FleetView => ({
      hosts: Array.from({ length: 4 }, (_, i) =>
        fleetHost(`h${i}`, 64 * GiB, (64 - freeGiB) * GiB, Array.from({ length: 8 }, (_, j) => park(`h${i}p${j}`, parkedAt + j, 8 * GiB))),
      ),
      queue: [],
    })
    const recent = { reservedMibPerSec: 1024 }

    it("with nothing queued, old parks descend on a full fleet when the recent demand for room would not fit", () => {
      const fleet = fullOfParks()
      // 1 GiB/s over the 60 s lead: about 60 GiB of arrivals, none of which fits now.
      expect(ParkPolicy.expectedArrivals(fleet, recent).length).toBe(8)
      expect(ParkPolicy.reserveShortfall(fleet, ParkPolicy.expectedArrivals(fleet, recent))).toBe(8)
      const d = ParkPolicy.decide("demand-reserve", fleet, { now: NOW, recent })
      expect(d.yields).toEqual(["h0", "h1", "h2", "h3"].map((hostId) => ({ hostId, sessionId: `${hostId}p0`, reason: "reserve" })))
      // A session going idle still parks: the old parks make the room.
      expect(d.mayPark("h0")).toBe(true)
      // demand, on the same read, holds every park.
      expect(ParkPolicy.evaluate("demand", fleet, NOW).yields).toEqual([])
    })

    it("running descents count as room on its way", () => {
      const fleet = fullOfParks()
      const busy: FleetView = { ...fleet, hosts: fleet.hosts.map((h, i) => (i < 2 ? { ...h, descentsRunning: 4 } : h)) }
      expect(ParkPolicy.decide("demand-reserve", busy, { now: NOW, recent }).yields).toEqual([])
    })

    it("no reserve yields when the expected arrivals fit, when nothing was reserved recently, or when every park is young", () => {
      expect(ParkPolicy.decide("demand-reserve", fullOfParks(OLD, 20), { now: NOW, recent }).yields).toEqual([])
      expect(ParkPolicy.decide("demand-reserve", fullOfParks(), { now: NOW, recent: { reservedMibPerSec: 0 } }).yields).toEqual([])
      expect(ParkPolicy.decide("demand-reserve", fullOfParks(), { now: NOW }).yields).toEqual([])
      expect(ParkPolicy.decide("demand-reserve", fullOfParks(NOW - 60_000), { now: NOW, recent }).yields).toEqual([])
    })

    it("a waiting session is served as demand serves it, young parks included", () => {
      const fleet: FleetView = { ...fullOfParks(NOW - 60_000), queue: [queued("q", 4 * GiB)] }
      const d = ParkPolicy.decide("demand-reserve", fleet, { now: NOW, recent })
      expect(d.yields).toEqual([{ hostId: "h0", sessionId: "h0p0", reason: "demand" }])
      expect(d.mayPark("h0")).toBe(false)
    })

    it("is the default policy", () => {
      expect(ParkPolicy.defaultName).toBe("demand-reserve")
      expect(ParkPolicy.isName(ParkPolicy.defaultName)).toBe(true)
    })
  })
})
