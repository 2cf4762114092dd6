import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Headroom, Limits, ParkGate, ParkPolicy } from "../src/index.js"
import type { FleetHost, FleetView, Park } from "../src/index.js"

/** The SPEC §4.1 gate's idle decision for a session on `hostId`, from a whole fleet read. */
const mayPark = (fleet: FleetView, hostId: string): boolean =>
  ParkPolicy.mayPark({ name: "demand", options: ParkPolicy.defaultOptions }, ParkPolicy.idleViewOf(fleet, hostId))

const GiB = 1024
const park = (sessionId: string, parkedAt: number, memMib = 4 * GiB): Park => ({ sessionId, parkedAt, budget: { memMib, vcpus: 1 } })
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
    expect(mayPark(fleet, "h1")).toBe(true)
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
    expect(ParkGate.evaluate(fleet, NOW).withoutRoom).toBe(1)
    expect(mayPark(fleet, "h1")).toBe(false)
  })

  it("an unmeasured host does not park", () => {
    const fleet: FleetView = { hosts: [fleetHost("u", null, 0)], queue: [] }
    expect(mayPark(fleet, "u")).toBe(false)
    expect(mayPark(fleet, "nowhere")).toBe(false)
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
          // Only the hard TTL yields on a host that is not measured (any more).
          if (y.reason !== "hard_ttl") expect(h.headroom.allocatableMib).not.toBeNull()
          // The yielding park is the host's oldest.
          const oldest = Math.min(...h.parks.map((p) => p.parkedAt))
          expect(h.parks.find((p) => p.sessionId === y.sessionId)?.parkedAt).toBe(oldest)
        }
      }),
    )
  })

  it("the steps compose into the gate: forced yields, then K = U − E demand yields on the hosts nearest to a fit", () => {
    const fleet: FleetView = {
      hosts: [
        fleetHost("over", 8 * GiB, 9 * GiB, [park("o", 5)]),
        fleetHost("near", 16 * GiB, 12 * GiB, [park("n2", 3), park("n1", 2)]),
        fleetHost("far", 16 * GiB, 15 * GiB, [park("f", 1)]),
        fleetHost("busy", 16 * GiB, 16 * GiB, [park("b", 1)], { descentsRunning: 1 }),
      ],
      queue: [queued("q1", 6 * GiB), queued("q2", 6 * GiB), queued("q3", 6 * GiB)],
    }
    expect(ParkGate.withoutRoom(fleet).map((q) => q.sessionId)).toEqual(["q1", "q2", "q3"])
    expect(ParkGate.descentsRunning(fleet)).toBe(1)
    const { forced, pool } = ParkGate.mayYield(fleet, NOW)
    expect(forced).toEqual([{ hostId: "over", sessionId: "o", reason: "over_reserved" }])
    expect(pool.map((h) => h.id)).toEqual(["near", "far"])
    expect(ParkGate.nearestToFit(pool, 1)).toEqual([{ hostId: "near", sessionId: "n1", reason: "demand" }])
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([...forced, ...ParkGate.nearestToFit(pool, 3 - 1)])
  })

  describe("unplaceable sessions (too_big)", () => {
    const hosts = [fleetHost("h1", 16 * GiB, 16 * GiB, [park("p1", 1)]), fleetHost("h2", 32 * GiB, 31 * GiB, [park("p2", 1)])]

    it("a queued session bigger than every ready measured host even when empty is unplaceable, and does not count as without room", () => {
      const fleet: FleetView = { hosts, queue: [queued("huge", 40 * GiB), queued("ok", 20 * GiB)] }
      expect(ParkGate.unplaceable(fleet).map((q) => q.sessionId)).toEqual(["huge"])
      expect(ParkGate.withoutRoom(fleet).map((q) => q.sessionId)).toEqual(["ok"])
      const d = ParkGate.evaluate(fleet, NOW)
      expect(d.unplaceable).toBe(1)
      expect(d.withoutRoom).toBe(1)
      // One yield for "ok", none for "huge": no descent can help it.
      expect(d.yields).toEqual([{ hostId: "h2", sessionId: "p2", reason: "demand" }])
    })

    it("an unplaceable session alone does not poison the gate: parks hold and idle sessions park", () => {
      const fleet: FleetView = { hosts, queue: [queued("huge", 40 * GiB, 0)] }
      // Queued at 0: it has waited far past the starvation limit, and still nothing yields for it.
      const d = ParkGate.evaluate(fleet, NOW)
      expect(d.yields).toEqual([])
      expect(mayPark(fleet, "h1")).toBe(true)
    })

    it("the CPU budget counts too; cordoned and unmeasured hosts do not make a session placeable", () => {
      const fleet: FleetView = {
        hosts: [...hosts, fleetHost("big-cordoned", 128 * GiB, 0, [], { state: "cordoned" }), fleetHost("u", null, 0, [], { state: "draining" })],
        queue: [{ sessionId: "cpu", budget: { memMib: 1024, vcpus: 65 }, queuedAt: NOW }, queued("ram", 64 * GiB)],
      }
      expect(ParkGate.unplaceable(fleet).map((q) => q.sessionId)).toEqual(["cpu", "ram"])
    })

    it("with no ready measured host nothing is too big (the fleet's size is unknown)", () => {
      const fleet: FleetView = { hosts: [fleetHost("u", null, 0)], queue: [queued("any", 512 * GiB)] }
      expect(ParkGate.unplaceable(fleet)).toEqual([])
      expect(ParkGate.unplaceable({ hosts: [], queue: [queued("any", 1)] })).toEqual([])
    })
  })

  describe("the starvation bound", () => {
    const LIMIT = ParkGate.defaultOptions.starvationLimitMs
    // Four hosts of 64 GiB full of 8 GiB parks; a 40 GiB session waits.
    const full = (extra: Partial<FleetHost> = {}) =>
      Array.from({ length: 4 }, (_, i) =>
        fleetHost(`h${i}`, 64 * GiB, 64 * GiB - i * GiB, Array.from({ length: 7 }, (_, j) => park(`h${i}p${j}`, 100 + j * 10 + i, 8 * GiB)), extra),
      )

    it("a session waiting past the limit gets a host held for it and every park it takes yields there at once", () => {
      const fleet: FleetView = { hosts: full(), queue: [queued("big", 40 * GiB, NOW - LIMIT)] }
      const d = ParkGate.evaluate(fleet, NOW)
      // h3 has 3 GiB free: 5 parks (40 GiB) make 43 GiB; h0 needs the same 5 but h3 is nearer to a fit.
      expect(d.holds).toEqual([{ sessionId: "big", hostId: "h3", reason: "starving" }])
      expect(d.yields).toEqual(["h3p0", "h3p1", "h3p2", "h3p3", "h3p4"].map((sessionId) => ({ hostId: "h3", sessionId, reason: "starving" })))
      expect(mayPark(fleet, "h3")).toBe(false)
    })

    it("before the limit the same session gets the ordinary demand yield (one park on one host)", () => {
      const fleet: FleetView = { hosts: full(), queue: [queued("big", 40 * GiB, NOW - LIMIT + 1)] }
      const d = ParkGate.evaluate(fleet, NOW)
      expect(d.holds).toEqual([])
      expect(d.yields).toEqual([{ hostId: "h3", sessionId: "h3p0", reason: "demand" }])
    })

    it("the hold is remembered: while its descents run nothing more yields there, and other hosts serve the rest of the queue", () => {
      const hosts = full().map((h) => (h.id === "h0" ? { ...h, descentsRunning: 2 } : h))
      const fleet: FleetView = { hosts, queue: [queued("big", 40 * GiB, NOW - LIMIT), queued("small", 8 * GiB + 512)] }
      // Last pass held h0 for "big" (say it was nearest then): the hold stays although h3 now looks better.
      const d = ParkGate.evaluate(fleet, NOW, Limits.defaults, ParkGate.defaultOptions, { holds: [{ sessionId: "big", hostId: "h0", reason: "starving" }] })
      expect(d.holds).toEqual([{ sessionId: "big", hostId: "h0", reason: "starving" }])
      // "small" is served by one demand yield elsewhere; h0's two descents count for "big" alone.
      expect(d.yields).toEqual([{ hostId: "h3", sessionId: "h3p0", reason: "demand" }])
    })

    it("a pass chooses at most maxNewHoldsPerPass new holds, oldest first; the next pass keeps them and serves the rest", () => {
      const queue = [queued("s1", 40 * GiB, NOW - LIMIT - 3), queued("s2", 40 * GiB, NOW - LIMIT - 2), queued("s3", 40 * GiB, NOW - LIMIT - 1)]
      const options = { ...ParkGate.defaultOptions, maxNewHoldsPerPass: 2 }
      const first = ParkGate.evaluate({ hosts: full(), queue }, NOW, Limits.defaults, options)
      expect(first.holds.map((h) => h.sessionId)).toEqual(["s1", "s2"])
      const second = ParkGate.evaluate({ hosts: full(), queue }, NOW, Limits.defaults, options, { holds: first.holds })
      expect(second.holds.map((h) => h.sessionId)).toEqual(["s1", "s2", "s3"])
      expect(second.holds.slice(0, 2)).toEqual(first.holds)
      expect(new Set(second.holds.map((h) => h.hostId)).size).toBe(3)
    })

    // Three 16 GiB hosts: C 12 GiB free (a 4 GiB runner, no parks), D 2 GiB free (a 6 GiB runner, an
    // 8 GiB park), E 2 GiB free (an 8 GiB runner, a 6 GiB park). S (14 GiB) starves and fits nowhere.
    const claimFleet = (queue: FleetView["queue"]): FleetView => ({
      hosts: [
        fleetHost("C", 16 * GiB, 4 * GiB),
        fleetHost("D", 16 * GiB, 14 * GiB, [park("pD", 0, 8 * GiB)]),
        fleetHost("E", 16 * GiB, 14 * GiB, [park("pE", 0, 6 * GiB)]),
      ],
      queue,
    })

    it("a host placement claims for a starving session is no room for the others: a session that fits only there is without room, and a park elsewhere yields for it", () => {
      // B (10 GiB) fits on C alone, but placement claims C for S and places nobody else there.
      const fleet = claimFleet([queued("S", 14 * GiB, NOW - LIMIT), queued("B", 10 * GiB, NOW - LIMIT + 1)])
      for (const name of ["demand", "demand-cumulative", ParkPolicy.defaultName] as const) {
        let memory = ParkGate.noMemory
        for (let pass = 0; pass < 3; pass++) {
          const d = ParkPolicy.decide(name, fleet, { now: NOW + pass * 5000, memory })
          expect(d.withoutRoom, name).toBe(2)
          expect(d.holds[0], name).toEqual({ sessionId: "S", hostId: "C", reason: "starving" })
          // Before, B counted as placed (on C), nothing yielded, and B waited for C's runner to end.
          expect(d.yields.map((y) => y.sessionId), name).toContain("pD")
          memory = { holds: d.holds }
        }
      }
      // Without a starving session nothing is claimed, and B has room on C.
      expect(ParkGate.withoutRoom(claimFleet([queued("S", 14 * GiB), queued("B", 10 * GiB)]), Limits.defaults, NOW).map((q) => q.sessionId)).toEqual(["S"])
    })

    it("a starving session held where its parks cannot make the room moves its hold to room descents alone now make elsewhere", () => {
      const S = queued("S", 14 * GiB, NOW - LIMIT)
      const first = ParkGate.evaluate({ hosts: [fleetHost("C", 16 * GiB, 4 * GiB), fleetHost("D", 16 * GiB, 14 * GiB, [park("pD", 0, 8 * GiB)])], queue: [S] }, NOW)
      expect(first.holds).toEqual([{ sessionId: "S", hostId: "C", reason: "starving" }])
      // D's runner ended: its 8 GiB free and its park make 16 GiB. The hold of the last pass (on C,
      // which has no parks) used to stay there, pass after pass, with nothing yielding.
      const later: FleetView = { hosts: [fleetHost("C", 16 * GiB, 4 * GiB), fleetHost("D", 16 * GiB, 8 * GiB, [park("pD", 0, 8 * GiB)])], queue: [S] }
      for (const name of ["demand", ParkPolicy.defaultName] as const) {
        const d = ParkPolicy.decide(name, later, { now: NOW + 5000, memory: { holds: first.holds } })
        expect(d.holds, name).toEqual([{ sessionId: "S", hostId: "D", reason: "starving" }])
        expect(d.yields, name).toEqual([{ hostId: "D", sessionId: "pD", reason: "starving" }])
      }
      // Beyond the pass's new holds no host is searched: the hold stays where it was.
      const capped = ParkGate.evaluate(later, NOW + 5000, Limits.defaults, { ...ParkGate.defaultOptions, maxNewHoldsPerPass: 0 }, { holds: first.holds })
      expect(capped.holds).toEqual(first.holds)
    })

    it("a park past the hard TTL yields on a host whose agent stopped measuring it too", () => {
      const h = fleetHost("h1", null, 8 * GiB, [park("p1", 0, 8 * GiB)])
      expect(ParkGate.evaluate({ hosts: [h], queue: [] }, Limits.defaults.parkHardTtlMs + 1).yields).toEqual([{ hostId: "h1", sessionId: "p1", reason: "hard_ttl" }])
      expect(ParkGate.evaluate({ hosts: [h], queue: [] }, Limits.defaults.parkHardTtlMs).yields).toEqual([])
    })

    it("a hold ends when its session is no longer starving (placed or gone)", () => {
      const d = ParkGate.evaluate({ hosts: full(), queue: [] }, NOW, Limits.defaults, ParkGate.defaultOptions, { holds: [{ sessionId: "big", hostId: "h0", reason: "starving" }] })
      expect(d.holds).toEqual([])
      expect(mayPark({ hosts: full(), queue: [] }, "h0")).toBe(true)
    })

    it("property: the starving session fits on its held host once the yields there finish", () => {
      fc.assert(
        fc.property(
          fc.array(fc.record({ reserved: fc.integer({ min: 0, max: 16 }), parks: fc.array(fc.integer({ min: 1, max: 8 }), { maxLength: 6 }) }), { minLength: 1, maxLength: 6 }),
          fc.integer({ min: 1, max: 60 }),
          (spec, want) => {
            const hosts = spec.map((h, i) => {
              const parks = h.parks.map((m, j) => park(`h${i}p${j}`, j, m * GiB))
              const parked = h.parks.reduce((a, m) => a + m, 0)
              return fleetHost(`h${i}`, 64 * GiB, (h.reserved + parked) * GiB, parks)
            })
            const fleet: FleetView = { hosts, queue: [queued("s", want * GiB, NOW - LIMIT)] }
            const d = ParkGate.evaluate(fleet, NOW)
            if (d.withoutRoom === 0) return
            expect(d.holds.length).toBe(1)
            const hold = d.holds[0] as ParkGate.Hold
            const h = hosts.find((x) => x.id === hold.hostId) as FleetHost
            const freed = d.yields.filter((y) => y.hostId === h.id).reduce((a, y) => a + (h.parks.find((p) => p.sessionId === y.sessionId) as Park).budget.memMib, 0)
            const canFit = (Headroom.freeMib(h.headroom) as number) + h.parks.reduce((a, p) => a + p.budget.memMib, 0) >= want * GiB
            // Where parks alone can make room, they do; elsewhere every park on the nearest host yields.
            if (canFit) expect((Headroom.freeMib(h.headroom) as number) + freed).toBeGreaterThanOrEqual(want * GiB)
            else expect(freed).toBe(h.parks.reduce((a, p) => a + p.budget.memMib, 0))
          },
        ),
      )
    })
  })
})

describe("ParkGate: a host whose agent went silent is no room, at the decision's time", () => {
  const windowMs = Limits.defaults.heartbeatStaleWindowMs
  // Its agent last reported a window and 1 ms before the decision: silent (`Placement.isSilent`).
  const silent = { reportedAt: NOW - windowMs - 1 }
  const live = { reportedAt: NOW }

  it("a queue waiting on a dead agent's empty host is without room: the full host's oldest park yields at once", () => {
    const fleet: FleetView = {
      hosts: [fleetHost("dead", 16 * GiB, 0, [], silent), fleetHost("full", 8 * GiB, 8 * GiB, [park("p1", 10), park("p2", 5)], live)],
      queue: [queued("q1", 4 * GiB)],
    }
    for (const name of ["demand", "demand-cumulative", "demand-fitting", "demand-minage", "demand-reserve"] as const) {
      const d = ParkPolicy.evaluate(name, fleet, NOW, Limits.defaults, { ...ParkPolicy.defaultOptions, minParkAgeMs: 0 })
      expect(d.withoutRoom, name).toBe(1)
      expect(d.yields, name).toEqual([{ hostId: "full", sessionId: "p2", reason: "demand" }])
    }
    // The baselines report the same count (the fleet signal and the simulator read it).
    expect(ParkPolicy.evaluate("floor30", fleet, NOW).withoutRoom).toBe(1)
    // And an idle session descends rather than parks, judged at the same time.
    expect(ParkPolicy.mayPark(ParkPolicy.defaultRule, ParkPolicy.idleViewOf(fleet, "full", Limits.defaults, NOW))).toBe(false)
    // The same host reporting again is room: nothing waits, nothing yields.
    const back: FleetView = { ...fleet, hosts: fleet.hosts.map((h) => ({ ...h, ...live })) }
    expect(ParkGate.evaluate(back, NOW)).toMatchObject({ withoutRoom: 0, yields: [] })
  })

  it("a silent host's parks do not yield for demand (its room cannot take the queue): the live host's do", () => {
    // dead has the most free RAM (the nearest to a fit) but its agent is gone.
    const fleet: FleetView = {
      hosts: [fleetHost("dead", 16 * GiB, 10 * GiB, [park("d1", 1, 10 * GiB)], silent), fleetHost("live", 8 * GiB, 8 * GiB, [park("l1", 5)], live)],
      queue: [queued("q1", 8 * GiB)],
    }
    expect(ParkGate.evaluate(fleet, NOW).yields).toEqual([{ hostId: "live", sessionId: "l1", reason: "demand" }])
    // The rules that do not wait for demand still hold on a silent host (here: the hard TTL).
    const old: FleetView = { ...fleet, hosts: [fleetHost("dead", 16 * GiB, 10 * GiB, [park("d1", NOW - Limits.defaults.parkHardTtlMs - 1, 10 * GiB)], silent)] }
    expect(ParkGate.evaluate(old, NOW).yields).toEqual([{ hostId: "dead", sessionId: "d1", reason: "hard_ttl" }])
  })

  it("a starving session's host is never held on a silent host, even where its parks would make the room cheapest", () => {
    const starvingSince = NOW - ParkGate.defaultOptions.starvationLimitMs
    const fleet: FleetView = {
      hosts: [
        fleetHost("dead", 16 * GiB, 12 * GiB, [park("d1", 1, 4 * GiB), park("d2", 2, 8 * GiB)], silent),
        fleetHost("live", 16 * GiB, 16 * GiB, [park("l1", 3, 8 * GiB), park("l2", 4, 8 * GiB)], live),
      ],
      queue: [queued("q1", 8 * GiB, starvingSince)],
    }
    const d = ParkGate.evaluate(fleet, NOW)
    expect(d.holds).toEqual([{ sessionId: "q1", hostId: "live", reason: "starving" }])
    expect(d.yields).toEqual([{ hostId: "live", sessionId: "l1", reason: "starving" }])
    // A hold kept from the last pass on a host that went silent since is dropped.
    const kept = ParkGate.evaluate(fleet, NOW, Limits.defaults, ParkGate.defaultOptions, { holds: [{ sessionId: "q1", hostId: "dead", reason: "starving" }] })
    expect(kept.holds).toEqual([{ sessionId: "q1", hostId: "live", reason: "starving" }])
  })
})
