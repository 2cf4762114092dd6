// The offered load of a workload on a fleet, before any policy runs, and the overload warning.
import { Limits } from "@engram/core"
import { describe, expect, it } from "vitest"
import { Load, Simulation, Workload } from "../src/index.js"
import type { Workload as W } from "../src/Workload.js"

const HOUR = 3_600_000
/** Two hosts that report 3 GiB each: 2 GiB of capacity each after the 1 GiB reserve, 4 cores × 4 = 16 vCPUs each. */
const fleet: Simulation.FleetConfig = { ...Simulation.defaultFleet, hosts: 2, hostMib: 3072, hostVcpus: 4, limits: Limits.defaults }
const script = (id: string, arriveAtMs: number, memMib: number, activeMs: number[], idleMs: number[] = []): Workload.Script => ({
  id,
  arriveAtMs,
  budget: { memMib, vcpus: 1 },
  activeMs,
  idleMs,
  endAfterIdle: false,
})

describe("the offered load", () => {
  it("is the mean RAM of active sessions over the run against the fleet's capacity after the reserve, and the peak of it", () => {
    // 1 GiB active the whole 2 h, and 2 GiB active for the first hour only: mean 1 GiB + 1 GiB = 2 GiB of 4 GiB.
    const w: W = { horizonMs: 2 * HOUR, scripts: [script("a", 0, 1024, [2 * HOUR]), script("b", 0, 2048, [HOUR])] }
    const load = Load.offered(w, fleet)
    expect(load.ramRatio).toBeCloseTo(0.5, 6)
    expect(load.peakRamRatio).toBeCloseTo(0.75, 6)
    // 1 vCPU for 2 h and 1 for 1 h over 2 h = 1.5 vCPUs of 32.
    expect(load.cpuRatio).toBeCloseTo(1.5 / 32, 6)
    expect(load.sessionsPerHostHour).toBeCloseTo(0.5, 6)
    expect(Load.isOverloaded(load)).toBe(false)
    expect(Load.warning(load)).toBeNull()
  })

  it("counts active periods only, and only inside the run", () => {
    // Active 30 min, idle 1 h, active 30 min (the last 15 min past the end of the run).
    const w: W = { horizonMs: 2 * HOUR, scripts: [script("a", 15 * 60_000, 4096, [HOUR / 2, HOUR / 2], [HOUR])] }
    expect(Load.offered(w, fleet).ramRatio).toBeCloseTo((4096 * 0.75) / 2 / 4096, 6)
  })

  it("warns when the mean reaches the fleet, or the peak twice the fleet, naming which", () => {
    const mean: W = { horizonMs: HOUR, scripts: [script("a", 0, 2048, [HOUR]), script("b", 0, 2048, [HOUR])] }
    expect(Load.warning(Load.offered(mean, fleet))).toMatch(/^WARNING: overloaded: the active sessions alone ask for 1\.0× the fleet's RAM on average, /)
    // 8 GiB for the first 10 minutes of 10 hours: a low mean, a peak of 2×.
    const peak: W = { horizonMs: 10 * HOUR, scripts: [script("a", 0, 8192, [10 * 60_000])] }
    const load = Load.offered(peak, fleet)
    expect(load.ramRatio).toBeLessThan(0.1)
    expect(Load.warning(load)).toMatch(/ask for 2\.0× the fleet's RAM at the peak/)
  })

  it("the default workload of a short run is sized to the run: 50 sessions per host in 2 hours was overloaded, the scaled default is not", () => {
    const gen = (sessions: number) => Workload.generate({ ...Workload.defaultGenerator, seed: 1, sessions, hours: 2 })
    const twenty = { ...Simulation.defaultFleet, hosts: 20 }
    expect(Load.isOverloaded(Load.offered(gen(50 * 20), twenty))).toBe(true)
    expect(Load.isOverloaded(Load.offered(gen(Math.round((50 * 20 * 2) / 24)), twenty))).toBe(false)
  })
})
