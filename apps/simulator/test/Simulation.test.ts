import { readFileSync } from "node:fs"
import { join } from "node:path"
import { ParkPolicy } from "@engram/core"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Cli, Report, Simulation, Workload } from "../src/index.js"
import { EventHeap } from "../src/EventHeap.js"

const HOUR = 3_600_000
/** A small day: enough to fill hosts with parks at the afternoon peak. */
const small = (seed: number, sessions = 400, hours = 12) => Workload.generate({ ...Workload.defaultGenerator, seed, sessions, hours })
const fleetOf = (hosts: number): Partial<Simulation.FleetConfig> => ({ hosts })

describe("Simulation", () => {
  it("same seed, same result", () => {
    const a = Simulation.run(small(3), { policy: "demand", fleet: fleetOf(8) })
    const b = Simulation.run(small(3), { policy: "demand", fleet: fleetOf(8) })
    expect(b).toEqual(a)
    expect(a.events).toBeGreaterThan(1000)
    // A different seed is a different day.
    expect(Simulation.run(small(4), { policy: "demand", fleet: fleetOf(8) }).queueWait).not.toEqual(a.queueWait)
  })

  it("a recorded trace replays to the same figures as the generated run", () => {
    const generated = small(5)
    const parsed = Workload.parseTrace(Workload.toTrace(generated, "test"))
    expect(parsed._tag).toBe("Parsed")
    if (parsed._tag !== "Parsed") return
    expect(parsed.workload).toEqual(generated)
    for (const policy of ["demand", "floor30"] as const) {
      expect(Simulation.run(parsed.workload, { policy, fleet: fleetOf(8) })).toEqual(Simulation.run(generated, { policy, fleet: fleetOf(8) }))
    }
  })

  it("no over-commit and no ledger drift under every policy, on a fleet that queues", () => {
    // 6 hosts for 500 sessions: the queue is long at the peak, so every path runs.
    const w = small(6, 500)
    for (const policy of ParkPolicy.names) {
      const r = Simulation.run(w, { policy, fleet: fleetOf(6) })
      expect(Report.invariantBreaks(r)).toEqual([])
      expect(r.overCommits).toBe(0)
      expect(r.queued).toBeGreaterThan(0)
      expect(r.lostSessions).toBe(0)
    }
  })

  it("no over-commit with heartbeats modelled, drains only at passes, and small odd fleets (property)", () => {
    fc.assert(
      fc.property(
        fc.record({ seed: fc.integer({ min: 0, max: 1000 }), hosts: fc.integer({ min: 1, max: 4 }), policy: fc.constantFrom(...ParkPolicy.names), drainOnRelease: fc.boolean() }),
        ({ seed, hosts, policy, drainOnRelease }) => {
          const w = Workload.generate({ ...Workload.defaultGenerator, seed, sessions: 60, hours: 3 })
          const r = Simulation.run(w, { policy, fleet: { hosts, hostMib: 32_768, heartbeatIntervalMs: 60_000, drainOnRelease } })
          expect(Report.invariantBreaks(r)).toEqual([])
          expect(r.lostSessions).toBe(0)
        },
      ),
      { numRuns: 12 },
    )
  })

  it("the seed's claim on the reference workload: the demand gate keeps more parks warm than the 30 % floor, with no worse p99 queue wait", () => {
    // The reference workload: 40 hosts of 64 GiB, 45 sessions per host over a day. The fleet is
    // sized for its running load, and at the afternoon peak parks fill hosts (the gate yields).
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 1, sessions: 1800, hours: 24 })
    const demand = Simulation.run(w, { policy: "demand", fleet: fleetOf(40) })
    const floor = Simulation.run(w, { policy: "floor30", fleet: fleetOf(40) })
    expect(demand.yields.demand).toBeGreaterThan(0)
    expect(demand.warmResumes).toBeGreaterThan(floor.warmResumes)
    expect(demand.queueWait.p99).toBeLessThanOrEqual(floor.queueWait.p99)
    expect(demand.descents).toBeLessThan(floor.descents)
  })

  it("never-park never parks and park-forever never descends for demand", () => {
    const w = small(7, 300)
    const never = Simulation.run(w, { policy: "never-park", fleet: fleetOf(4) })
    expect(never.parks).toBe(0)
    expect(never.warmResumes).toBe(0)
    const forever = Simulation.run(w, { policy: "park-forever", fleet: fleetOf(4) })
    expect(forever.idleDescents).toBe(0)
    expect(forever.yields.demand + forever.yields.floor + forever.yields.over_reserved).toBe(0)
  })

  it("time comes from the simulated clock: a day runs without sleeping", () => {
    const t0 = performance.now()
    const r = Simulation.run(Workload.generate({ ...Workload.defaultGenerator, seed: 2, sessions: 50, hours: 24 }), { policy: "demand", fleet: fleetOf(2) })
    expect(r.horizonMs).toBe(24 * HOUR)
    expect(r.passes).toBe(24 * 720 + 1)
    expect(performance.now() - t0).toBeLessThan(20_000)
  })
})

describe("EventHeap", () => {
  it("pops in (time, scheduling order) order (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { maxLength: 200 }), (times) => {
        const heap = new EventHeap()
        times.forEach((t, i) => heap.push(t, 0, i))
        const out: number[] = []
        for (let e = heap.pop(); e !== undefined; e = heap.pop()) out.push(e.subject)
        const expected = times.map((t, i) => ({ t, i })).sort((a, b) => a.t - b.t || a.i - b.i).map((x) => x.i)
        expect(out).toEqual(expected)
      }),
    )
  })
})

