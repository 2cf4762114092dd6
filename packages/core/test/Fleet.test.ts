import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Fleet, Limits, ParkGate, ParkPolicy } from "../src/index.js"
import type { FleetView } from "../src/index.js"
import { arbFleet } from "./arb.js"

describe("Fleet.snapshot", () => {
  it("sums the headroom placement reserves against, and counts the queue without room", () => {
    const s = Fleet.snapshot({
      hosts: [
        { id: "a", headroom: { allocatableMib: 8192, cpuBudget: 16, reserved: { memMib: 8192, vcpus: 4 } }, descentsRunning: 1, parks: [{ sessionId: "p", parkedAt: 0, budget: { memMib: 4096, vcpus: 2 } }] },
        { id: "b", headroom: { allocatableMib: 4096, cpuBudget: 8, reserved: { memMib: 1024, vcpus: 1 } }, descentsRunning: 0, parks: [] },
        { id: "c", headroom: { allocatableMib: 4096, cpuBudget: 8, reserved: { memMib: 0, vcpus: 0 } }, descentsRunning: 0, parks: [], state: "cordoned" },
        { id: "u", headroom: { allocatableMib: null, cpuBudget: null, reserved: { memMib: 512, vcpus: 1 } }, descentsRunning: 0, parks: [] },
      ],
      queue: [
        { sessionId: "q1", budget: { memMib: 2048, vcpus: 1 }, queuedAt: 0 },
        { sessionId: "q2", budget: { memMib: 4096, vcpus: 1 }, queuedAt: 1 },
      ],
    })
    expect(s.hosts).toEqual({ total: 4, ready: 3, measured: 3, cordoned: 1, draining: 0, silent: 0, readySilent: 0 })
    expect([s.capacityMib, s.reservedMib, s.freeMib]).toEqual([12288, 9216, 3072])
    expect([s.cpuBudget, s.reservedVcpus, s.freeVcpus]).toEqual([24, 5, 19])
    // q2 (4 GiB) fits on the unmeasured host u, which RAM does not gate.
    expect(s.queue).toEqual({ sessions: 2, memMib: 6144, vcpus: 2, withoutRoom: 0 })
    expect([s.parks, s.descentsRunning]).toEqual([1, 1])
    expect(s.unplaceable).toEqual({ count: 0, largestMemMib: 0, largestVcpus: 0 })
  })

  it("with the read's time, a silent host's room is no room for the queue: the cue for more hosts shows while a dead agent's host looks empty", () => {
    const host = (id: string, reservedMib: number, reportedAt: number) => ({
      id,
      headroom: { allocatableMib: 8192, cpuBudget: 16, reserved: { memMib: reservedMib, vcpus: 0 } },
      descentsRunning: 0,
      parks: [],
      reportedAt,
    })
    const now = 10 * 60_000
    const fleet = {
      // "dead" is empty but its agent last reported 5 minutes ago (the window is 2); "live" is full.
      hosts: [host("dead", 0, now - 5 * 60_000), host("live", 8192, now)],
      queue: [{ sessionId: "q1", budget: { memMib: 2048, vcpus: 1 }, queuedAt: 0 }],
    }
    expect(Fleet.snapshot(fleet).queue.withoutRoom).toBe(0)
    expect(Fleet.snapshot(fleet, undefined, now).queue.withoutRoom).toBe(1)
    // Within the window the same host's room counts.
    expect(Fleet.snapshot({ ...fleet, hosts: [host("dead", 0, now - 60_000), host("live", 8192, now)] }, undefined, now).queue.withoutRoom).toBe(0)
  })

  it("with the read's time, the silent hosts are counted and their room named; ready and freeMib keep their meaning", () => {
    const host = (id: string, reservedMib: number, reportedAt: number, state?: "cordoned") => ({
      id,
      headroom: { allocatableMib: 8192, cpuBudget: 16, reserved: { memMib: reservedMib, vcpus: 2 } },
      descentsRunning: 0,
      parks: [],
      reportedAt,
      ...(state === undefined ? {} : { state }),
    })
    const now = 10 * 60_000
    const fleet = {
      // dead and gone are silent (5 minutes; the window is 2); gone is cordoned besides.
      hosts: [host("dead", 1024, now - 5 * 60_000), host("gone", 0, now - 5 * 60_000, "cordoned"), host("live", 4096, now)],
      queue: [],
    }
    const s = Fleet.snapshot(fleet, undefined, now)
    expect(s.hosts).toEqual({ total: 3, ready: 2, measured: 3, cordoned: 1, draining: 0, silent: 2, readySilent: 1 })
    // Every ready host's room as before; the silent part of it named beside.
    expect([s.freeMib, s.silentFreeMib]).toEqual([7168 + 4096, 7168])
    expect([s.freeVcpus, s.silentFreeVcpus]).toEqual([28, 14])
    // Without the read's time nothing is judged silent.
    const untimed = Fleet.snapshot(fleet)
    expect([untimed.hosts.silent, untimed.hosts.readySilent, untimed.silentFreeMib, untimed.silentFreeVcpus]).toEqual([0, 0, 0, 0])
  })

  it("reports the queued sessions no ready measured host could take even empty, and their largest budget", () => {
    const host = (id: string, allocatableMib: number, cpuBudget: number) => ({
      id,
      headroom: { allocatableMib, cpuBudget, reserved: { memMib: allocatableMib, vcpus: 0 } },
      descentsRunning: 0,
      parks: [],
    })
    const s = Fleet.snapshot({
      hosts: [host("a", 65_536, 64), host("b", 131_072, 32)],
      queue: [
        { sessionId: "fits-b", budget: { memMib: 100_000, vcpus: 8 }, queuedAt: 0 },
        { sessionId: "ram", budget: { memMib: 200_000, vcpus: 8 }, queuedAt: 1 },
        { sessionId: "cpu", budget: { memMib: 1024, vcpus: 96 }, queuedAt: 2 },
      ],
    })
    expect(s.unplaceable).toEqual({ count: 2, largestMemMib: 200_000, largestVcpus: 96 })
    // The placeable one waits for room; the two others are the cue for a bigger host, not for more hosts.
    expect(s.queue.withoutRoom).toBe(1)
  })

  describe("the queue's withoutRoom is the park gate's", () => {
    const GiB = 1024
    const LIMIT = ParkGate.defaultOptions.starvationLimitMs
    const NOW = 10 * LIMIT
    const host = (id: string, reservedMib: number) => ({
      id,
      headroom: { allocatableMib: 16 * GiB, cpuBudget: 64, reserved: { memMib: reservedMib, vcpus: 0 } },
      descentsRunning: 0,
      parks: [],
    })
    // C has 12 GiB free, D 2 GiB. S (14 GiB) fits nowhere; B (10 GiB) fits on C alone.
    const fleet = (sQueuedAt: number): FleetView => ({
      hosts: [host("C", 4 * GiB), host("D", 14 * GiB)],
      queue: [
        { sessionId: "S", budget: { memMib: 14 * GiB, vcpus: 1 }, queuedAt: sQueuedAt },
        { sessionId: "B", budget: { memMib: 10 * GiB, vcpus: 1 }, queuedAt: NOW - 1000 },
      ],
    })

    it("with the read's time, a host placement claims for a starving session is no room for the others: a session that fits only there counts", () => {
      // S has starved: placement claims C for it and places nobody else there, so B waits too.
      const starving = fleet(NOW - LIMIT)
      expect(ParkGate.evaluate(starving, NOW).withoutRoom).toBe(2)
      // Before, the snapshot counted B as having room (on C): 1 against the gate's 2.
      expect(Fleet.snapshot(starving, Limits.defaults, NOW).queue.withoutRoom).toBe(2)
      // The limit is the gate's option: under a longer one S does not starve yet, and nothing is claimed.
      expect(Fleet.snapshot(starving, Limits.defaults, NOW, { starvationLimitMs: LIMIT + 1 }).queue.withoutRoom).toBe(1)
      // Before S starves nothing is claimed, and B has room on C, for both.
      const waiting = fleet(NOW - 1000)
      expect([Fleet.snapshot(waiting, Limits.defaults, NOW).queue.withoutRoom, ParkGate.evaluate(waiting, NOW).withoutRoom]).toEqual([1, 1])
      // Without the read's time no claim is judged (nor silence).
      expect(Fleet.snapshot(starving).queue.withoutRoom).toBe(1)
    })

    it("property: with the read's time, the snapshot's withoutRoom is the gate's (the default policy's and demand's), starving sessions and silent hosts included", () => {
      const limits = { ...Limits.defaults, heartbeatStaleWindowMs: 60_000 }
      const options = { ...ParkPolicy.defaultOptions, starvationLimitMs: 1000 }
      const now = 100_000
      const arbView = fc.record({
        hosts: arbFleet,
        // Silence: never reported, within the window, past it.
        reported: fc.array(fc.constantFrom(undefined, now - 1000, now - 120_000), { minLength: 10, maxLength: 10 }),
        queue: fc.array(
          fc.record({ memMib: fc.integer({ min: 1, max: 64 }), vcpus: fc.integer({ min: 0, max: 16 }), waitedMs: fc.constantFrom(0, 500, 1000, 5000) }),
          { maxLength: 8 },
        ),
      })
      fc.assert(
        fc.property(arbView, ({ hosts, reported, queue }) => {
          const view: FleetView = {
            hosts: hosts.map((h, i) => ({ ...h, descentsRunning: 0, parks: [], ...(reported[i] === undefined ? {} : { reportedAt: reported[i] }) })),
            queue: queue.map((q, i) => ({ sessionId: `q${i}`, budget: { memMib: q.memMib * 256, vcpus: q.vcpus }, queuedAt: now - q.waitedMs - i })),
          }
          const snap = Fleet.snapshot(view, limits, now, options).queue.withoutRoom
          for (const name of [ParkPolicy.defaultName, "demand"] as const) expect(snap, name).toBe(ParkPolicy.evaluate(name, view, now, limits, options).withoutRoom)
        }),
        { numRuns: 300 },
      )
    })
  })
})
