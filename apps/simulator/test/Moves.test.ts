// Moves as a policy action: running sessions moved off a starving session's held host (core's
// MakeRoom) bound its wait where parks cannot make the room; both hosts hold the RAM meanwhile.
import { Limits } from "@engram/core"
import { describe, expect, it } from "vitest"
import { Report, Simulation } from "../src/index.js"
import type { Script } from "../src/Workload.js"
import { session } from "./helpers.js"

const GiB = 1024
const MIN = 60_000
const HOUR = 60 * MIN
const limits = { ...Limits.defaults, systemReserveMib: 0 }
const fleet = (moves: boolean): Partial<Simulation.FleetConfig> => ({ hosts: 3, hostMib: 64 * GiB, hostVcpus: 64, limits, moves })

/**
 * Three 64 GiB hosts filled with 8 GiB sessions that run for 4 h (best fit: eight per host, in
 * order); half of the second and of the third host's end at 10 min, leaving 32 GiB free on each.
 * A 48 GiB session arriving at 20 min fits nowhere, and no park can make its room.
 */
const fragmented = (): Script[] => {
  const out: Script[] = []
  for (let k = 0; k < 24; k++) {
    const endsEarly = (k >= 8 && k < 12) || (k >= 16 && k < 20)
    out.push(session(`s${String(k).padStart(2, "0")}`, k * 1000, 8 * GiB, { activeMs: [endsEarly ? 10 * MIN : 4 * HOUR] }))
  }
  out.push(session("big", 20 * MIN, 48 * GiB, { activeMs: [HOUR] }))
  return out
}

const bigWait = (r: Simulation.Result): number => r.longestWaits.find((w) => w.sessionId === "big")?.waitMs ?? 0

describe("moves for starving sessions", () => {
  it("a starving session's room is made by moving running sessions: its wait is the starvation limit plus the copy", () => {
    const w = { scripts: fragmented(), horizonMs: 5 * HOUR }
    const off = Simulation.run(w, { policy: "demand-reserve", fleet: fleet(false) })
    const on = Simulation.run(w, { policy: "demand-reserve", fleet: fleet(true) })
    // Without moves it waits for the 4-hour sessions to end.
    expect(bigWait(off)).toBeGreaterThan(3 * HOUR)
    expect(off.moves).toBe(0)
    // With moves: two 8 GiB sessions leave its host (16 GiB: the gap), it places soon after starving.
    expect(on.moves).toBe(2)
    expect(on.movesCommitted).toBe(2)
    expect(on.movedMib).toBe(16 * GiB)
    const limitMs = Simulation.defaultFleet.policyOptions.starvationLimitMs
    expect(bigWait(on)).toBeGreaterThanOrEqual(limitMs)
    expect(bigWait(on)).toBeLessThan(limitMs + MIN)
    // Each move cost its session the guard's estimate, within the downtime budget.
    expect(on.moveDowntime.max).toBeGreaterThan(0)
    expect(on.moveDowntime.max).toBeLessThanOrEqual(Simulation.defaultFleet.moveCosts.maxDowntimeMs + 2)
    expect(Report.invariantBreaks(on)).toEqual([])
    expect(Report.invariantBreaks(off)).toEqual([])
    expect(Report.waitsBySizeText([on])).toContain("moves for starving sessions: 2 started, 2 committed")
  })

  it("at most movesPerPass moves a pass: with one, the second move starts after the first commits, and the session still places", () => {
    const w = { scripts: fragmented(), horizonMs: 5 * HOUR }
    const one = Simulation.run(w, { policy: "demand-reserve", fleet: { ...fleet(true), movesPerPass: 1 } })
    const all = Simulation.run(w, { policy: "demand-reserve", fleet: fleet(true) })
    expect([one.moves, one.movesCommitted]).toEqual([2, 2])
    // The moves ran one after the other: the session waited longer than with both at once, but far less than without.
    expect(bigWait(one)).toBeGreaterThan(bigWait(all))
    expect(bigWait(one)).toBeLessThan(Simulation.defaultFleet.policyOptions.starvationLimitMs + 5 * MIN)
    expect(Report.invariantBreaks(one)).toEqual([])
  })

  it("a session that goes idle or ends during its move is handled after it: no over-commit, no drift, no store error", () => {
    // "big" starves at 20 min + the starvation limit, when the moves begin. The sessions left on
    // the second and third hosts go idle a minute later (for a minute, then run 5 more and end),
    // s12 ends 1.5 min later: both while a slow copy runs (64 MiB/s: 8 GiB in 128 s).
    // The moves are s15 (the last of the equal sizes) and then s12 (the first that closes the gap).
    const starvesAt = 20 * MIN + Simulation.defaultFleet.policyOptions.starvationLimitMs
    const late = ["s13", "s14", "s15", "s20", "s21", "s22", "s23"]
    const scripts = fragmented().map((s) =>
      late.includes(s.id) ? { ...s, activeMs: [starvesAt + MIN, 5 * MIN], idleMs: [MIN] } : s.id === "s12" ? { ...s, activeMs: [starvesAt + 1.5 * MIN] } : s,
    )
    const r = Simulation.run(
      { scripts, horizonMs: 5 * HOUR },
      { policy: "demand-reserve", fleet: { ...fleet(true), moveCosts: { ...Simulation.defaultFleet.moveCosts, copyMibPerSec: 64, dirtyMibPerSec: 1, maxDowntimeMs: 5000 } } },
    )
    expect(r.moves).toBe(2)
    // One moved session ended mid-copy (its move aborted with it), the other went idle once moved.
    expect(r.movesCommitted).toBe(1)
    expect(r.parks + r.idleDescents).toBe(late.length)
    expect(Report.invariantBreaks(r)).toEqual([])
  })

  it("the guard's refusal: sessions whose downtime estimate passes the budget are never moved", () => {
    const w = { scripts: fragmented(), horizonMs: 5 * HOUR }
    const r = Simulation.run(w, {
      policy: "demand-reserve",
      fleet: { ...fleet(true), moveCosts: { ...Simulation.defaultFleet.moveCosts, copyMibPerSec: 100, dirtyMibPerSec: 200 } },
    })
    expect(r.moves).toBe(0)
    expect(bigWait(r)).toBeGreaterThan(3 * HOUR)
  })
})
