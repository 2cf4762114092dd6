// A VM's own overhead on its host, and a fleet that begins in steady state (a burn-in whose
// figures are not counted).
import { describe, expect, it } from "vitest"
import { Report, Simulation, Workload } from "../src/index.js"
import type { Script } from "../src/Workload.js"
import { expectWindowsAddUp, session } from "./helpers.js"

const HOUR = 3_600_000
// One host reporting 8 GiB: capacity (8192 − 1024 reserve) × 1.0 = 7168 MiB.
const oneHost = { hosts: 1, hostMib: 8192, hostVcpus: 16 }
const runOne = (scripts: Script[], vmOverheadMib: number) => Simulation.run({ scripts, horizonMs: 60_000 }, { policy: "demand", fleet: { ...oneHost, vmOverheadMib } })

describe("per-VM overhead", () => {
  it("every VM reserves its budget plus the overhead: fewer sessions fit on a host", () => {
    const eight = Array.from({ length: 8 }, (_, i) => session(`s${i}`, 0, 1024))
    // 7 × 1024 fit in 7168; with 512 MiB each, 4 × 1536 = 6144 fit and a fifth (7680) does not.
    expect(runOne(eight, 0).queued).toBe(1)
    const r = runOne(eight, 512)
    expect(r.queued).toBe(4)
    expect(Report.invariantBreaks(r)).toEqual([])
  })

  it("a session that fills an empty host alone is unplaceable once the overhead is counted (core's too_big)", () => {
    const whole = [session("whole", 0, 7168)]
    expect(runOne(whole, 0)).toMatchObject({ unplaceable: 0, queued: 0 })
    expect(runOne(whole, 1)).toMatchObject({ unplaceable: 1, stillQueued: 1 })
  })

  it("under load no host is over-committed counting the overhead, and more requests queue than without it", () => {
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 9, sessions: 300, hours: 6 })
    for (const policy of ["demand", "demand-reserve"] as const) {
      const at = (vmOverheadMib: number) => Simulation.run(w, { policy, fleet: { hosts: 12, vmOverheadMib } })
      const plain = at(0)
      const heavy = at(2048)
      // The checker sums footprints (budget + overhead) against capacity, and the store's ledger must match it.
      expect(Report.invariantBreaks(heavy)).toEqual([])
      expect(heavy.queued).toBeGreaterThan(plain.queued)
      expect(heavy.meanReservedPct).toBeGreaterThan(plain.meanReservedPct)
    }
  })
})

describe("a warm start", () => {
  const w = Workload.generate({ ...Workload.defaultGenerator, seed: 6, sessions: 300, hours: 6 })
  const fleet = { hosts: 12, windowMs: HOUR }
  const cold = Simulation.run(w, { policy: "demand", fleet })
  const warm = Simulation.run(w, { policy: "demand", fleet: { ...fleet, warmStartMs: 3 * HOUR } })

  it("the burn-in replays the trace's last hours before its start, which falls on a reaper pass", () => {
    const played = Simulation.withBurnIn(w, 3 * HOUR + 1, 5000)
    expect(played.startMs).toBe(3 * HOUR + 5000)
    const burn = played.scripts.slice(0, played.burnIn)
    expect(burn.length).toBe(w.scripts.filter((s) => s.arriveAtMs >= w.horizonMs - 3 * HOUR - 1).length)
    for (const s of burn) {
      expect(s.id.startsWith("warm.")).toBe(true)
      expect(s.arriveAtMs).toBeGreaterThanOrEqual(0)
      expect(s.arriveAtMs).toBeLessThan(played.startMs)
    }
    expect(played.scripts.slice(played.burnIn).map((s) => s.arriveAtMs - played.startMs)).toEqual(w.scripts.map((s) => s.arriveAtMs))
    // Longer than the trace: the whole trace once.
    expect(Simulation.withBurnIn(w, 100 * HOUR, 5000).burnIn).toBe(w.scripts.length)
    expect(Simulation.withBurnIn(w, 0, 5000)).toEqual({ scripts: w.scripts, startMs: 0, burnIn: 0 })
  })

  it("the fleet is not empty at the trace's start, and the run keeps its invariants", () => {
    expect(cold.series.tMs[0]).toBe(0)
    expect(cold.series.reservedPct[0]).toBe(0)
    expect(warm.series.tMs[0]).toBe(0)
    const firstHour = warm.series.reservedPct.filter((_, k) => (warm.series.tMs[k] as number) < HOUR)
    expect(Math.min(...firstHour)).toBeGreaterThan(0)
    expect(warm.windows[0]?.warm).toBeGreaterThan(cold.windows[0]?.warm ?? 0)
    expect(Report.invariantBreaks(warm)).toEqual([])
    expect(warm.lostSessions).toBe(0)
  })

  it("figures count from the trace's start only: the windows cover the trace and add up to the totals", () => {
    expect(warm).toMatchObject({ sessions: w.scripts.length, horizonMs: w.horizonMs })
    expectWindowsAddUp(warm, HOUR, 6)
    // A pass every reaper interval over the trace, none of the burn-in's.
    expect(warm.passes).toBe(cold.passes)
    for (const x of warm.longestWaits) expect(x.requestAtMs).toBeGreaterThanOrEqual(0)
    // The bound counts the burn-in's sessions too, whose resumes may fall in the trace.
    expect(warm.warmResumes).toBeLessThanOrEqual(warm.warmBoundTtl)
  })
})

describe("both off", () => {
  it("the same seed gives the identical report, with the options left out or set to 0", () => {
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 3, sessions: 200, hours: 4 })
    const fleet = { hosts: 3 }
    const a = Simulation.run(w, { policy: "demand-reserve", fleet })
    const b = Simulation.run(w, { policy: "demand-reserve", fleet: { ...fleet, vmOverheadMib: 0, warmStartMs: 0 } })
    expect(b).toEqual(a)
    expect(Report.text([b])).toBe(Report.text([a]))
  })
})
