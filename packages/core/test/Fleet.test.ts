import { describe, expect, it } from "vitest"
import { Fleet } from "../src/index.js"

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
})
