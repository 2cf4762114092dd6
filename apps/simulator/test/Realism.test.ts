// The simulator's realism: mixed host shapes, every limit, resident memory, figures per window,
// the longest waits by name.
import { Limits } from "@engram/core"
import { describe, expect, it } from "vitest"
import { Report, Simulation, Workload } from "../src/index.js"
import type { Script } from "../src/Workload.js"
import { expectWindowsAddUp, session } from "./helpers.js"

const HOUR = 3_600_000
const run = (scripts: Script[], fleet: Partial<Simulation.FleetConfig>, horizonMs = 60_000) =>
  Simulation.run({ scripts, horizonMs }, { policy: "demand", fleet })

describe("mixed host shapes", () => {
  it("a session too big for the small shape places on the big one; one too big for every shape is unplaceable", () => {
    const shapes = [
      { count: 2, memMib: 32_768, vcpus: 8 },
      { count: 1, memMib: 131_072, vcpus: 32 },
    ]
    const w = [session("mid", 0, 100_000), session("small", 1, 16_384), session("giant", 2, 200_000)]
    const r = run(w, { shapes })
    expect(r.hosts).toBe(3)
    expect(r.unplaceable).toBe(1)
    expect(r.stillQueued).toBe(1)
    expect(r.queued).toBe(1)
    expect(Report.invariantBreaks(r)).toEqual([])
    // Without the big shape, "mid" is unplaceable too.
    expect(run(w, { shapes: [{ count: 2, memMib: 32_768, vcpus: 8 }] }).unplaceable).toBe(2)
    expect(Simulation.hostCount({ ...Simulation.defaultFleet, shapes })).toBe(3)
  })

  it("no over-commit and no ledger drift on a mixed fleet under load", () => {
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 9, sessions: 300, hours: 6 })
    for (const policy of ["demand", "demand-reserve", "floor30"] as const) {
      const r = Simulation.run(w, {
        policy,
        fleet: { shapes: [{ count: 3, memMib: 49_152, vcpus: 12 }, { count: 2, memMib: 98_304, vcpus: 24 }] },
      })
      expect(Report.invariantBreaks(r)).toEqual([])
      expect(r.queued).toBeGreaterThan(0)
    }
  })
})

describe("every limit of the store is a knob of the run", () => {
  // One host reporting 8 GiB and 2 cores; eight 1 GiB, 1-vCPU sessions at once.
  const eight = Array.from({ length: 8 }, (_, i) => session(`s${i}`, 0, 1024))
  const placed = (limits: Partial<Limits.Limits>, cores = 8) => {
    const made = Limits.make(limits)
    if (made._tag === "Invalid") throw new Error("bad limits")
    return 8 - run(eight, { hosts: 1, hostMib: 8192, hostVcpus: cores, limits: made.limits }).queued
  }

  it("system reserve, RAM overcommit, entries per host and CPU overcommit each bound the placements", () => {
    // Capacity (8192 − 1024) × 1.0 = 7 GiB by default.
    expect(placed({})).toBe(7)
    expect(placed({ systemReserveMib: 0 })).toBe(8)
    expect(placed({ systemReserveMib: 4096 })).toBe(4)
    expect(placed({ memOvercommitRatio: 2 })).toBe(8)
    expect(placed({ maxEntriesPerNode: 3 })).toBe(3)
    // 2 cores × 1.5 = 3 vCPUs.
    expect(placed({ cpuOvercommit: 1.5 }, 2)).toBe(3)
  })
})

describe("resident memory", () => {
  it("a descent and a restore take the time of the resident RAM, not of the budget", () => {
    // A (6 GiB, 1 GiB resident) parks at 60 s; B arrives at 62 s with no room: A's descent takes 1 s.
    const a = (resident?: number) =>
      session("a", 0, 6144, { activeMs: [58_000, 1], idleMs: [Workload.OPEN], ...(resident === undefined ? {} : { residentMib: resident }) })
    const b = session("b", 62_000, 4096)
    const fleet = { hosts: 1, hostMib: 8192, reactWindowMs: 250, descentMibPerSec: 1024 }
    expect(run([a(1024), b], fleet, 120_000).queueWait.max).toBe(250 + 1000)
    expect(run([a(), b], fleet, 120_000).queueWait.max).toBe(250 + 6000)
  })
})

describe("figures per window and the longest waits", () => {
  const w = Workload.generate({ ...Workload.defaultGenerator, seed: 6, sessions: 300, hours: 6 })
  const r = Simulation.run(w, { policy: "demand", fleet: { hosts: 4, windowMs: HOUR, worstSessions: 5 } })

  it("the windows cover the run and add up to the totals", () => {
    expectWindowsAddUp(r, HOUR, 6)
  })

  it("the longest waits are named, longest first, the first being the run's maximum", () => {
    expect(r.queued).toBeGreaterThan(5)
    expect(r.longestWaits).toHaveLength(5)
    expect(r.longestWaits[0]?.waitMs).toBe(r.queueWait.max)
    const waits = r.longestWaits.map((x) => x.waitMs)
    expect([...waits].sort((a, b) => b - a)).toEqual(waits)
    for (const x of r.longestWaits) expect(w.scripts.find((s) => s.id === x.sessionId)?.budget.memMib).toBe(x.memMib)
    expect(Report.longestWaitsText([r])).toContain(r.longestWaits[0]?.sessionId)
    expect(Report.windowsText([r]).split("\n").length).toBeGreaterThan(7)
  })
})

describe("a host's shared link and users' patience", () => {
  it("descents on one host share its link: the second waits for the first", () => {
    // a1 and a2 (3 GiB each) go idle at 12 s (after a 2 s boot) and descend at once (never-park),
    // 3 s each at 1 GiB/s; b (6 GiB) arrives at 10.5 s and needs both gone.
    const idleAt10 = { activeMs: [10_000, 1], idleMs: [Workload.OPEN] }
    const w = [session("a1", 0, 3072, idleAt10), session("a2", 0, 3072, idleAt10), session("b", 10_500, 6144)]
    const waitOf = (hostTransferMibPerSec: number) =>
      Simulation.run({ scripts: w, horizonMs: 60_000 }, { policy: "never-park", fleet: { hosts: 1, hostMib: 8192, descentMibPerSec: 1024, startMs: 2000, hostTransferMibPerSec } }).queueWait.max
    expect(waitOf(0)).toBe(4500)
    expect(waitOf(1024)).toBe(7500)
    // A link faster than both descents together holds neither back.
    expect(waitOf(4096)).toBe(4500)
  })

  it("a queued request gives up after its patience: the session ends, counted as lost demand", () => {
    const w = [session("a", 0, 6144), session("b", 1000, 4096)]
    const fleet = { hosts: 1, hostMib: 8192, patienceSigma: 1e-6 }
    const patient = run(w, fleet, 120_000)
    expect(patient).toMatchObject({ gaveUp: 0, stillQueued: 1 })
    const impatient = run(w, { ...fleet, patienceMedianS: 30 }, 120_000)
    expect(impatient).toMatchObject({ gaveUp: 1, stillQueued: 0 })
    expect(Math.abs(impatient.queueWait.max - 30_000)).toBeLessThan(10)
  })
})
