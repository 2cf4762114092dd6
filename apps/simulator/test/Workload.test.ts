import { readFileSync } from "node:fs"
import { join } from "node:path"
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Report, Simulation, Workload } from "../src/index.js"

const HOUR = 3_600_000
const fleetOf = (hosts: number): Partial<Simulation.FleetConfig> => ({ hosts })

describe("Workload", () => {
  it("the example trace parses and runs", () => {
    const text = readFileSync(join(import.meta.dirname, "..", "examples", "small.jsonl"), "utf8")
    const parsed = Workload.parseTrace(text)
    if (parsed._tag !== "Parsed") throw new Error(`example trace: line ${parsed.issue.line}: ${parsed.issue.message}`)
    expect(parsed.workload.scripts.length).toBeGreaterThan(0)
    const r = Simulation.run(parsed.workload, { policy: "demand", fleet: fleetOf(4) })
    expect(Report.invariantBreaks(r)).toEqual([])
  })

  it("a trace line that breaks the format is refused with its line number", () => {
    const bad = (lines: unknown[]) => Workload.parseTrace(lines.map((l) => (typeof l === "string" ? l : JSON.stringify(l))).join("\n"))
    const arrive = { t: 0, kind: "arrive", sessionId: "a", memMib: 1024, vcpus: 1 }
    expect(bad([arrive, "{nope"])).toEqual({ _tag: "Invalid", issue: { line: 2, message: "not valid JSON" } })
    expect(bad([{ t: 5, kind: "idle", sessionId: "a" }])).toMatchObject({ _tag: "Invalid", issue: { line: 1 } })
    expect(bad([arrive, { t: 5, kind: "resume", sessionId: "a" }])).toMatchObject({ issue: { line: 2, message: "session a resumes while active" } })
    expect(bad([arrive, { t: 5, kind: "idle", sessionId: "a" }, { t: 4, kind: "resume", sessionId: "a" }])).toMatchObject({ issue: { line: 3 } })
    expect(bad([{ ...arrive, memMib: 0 }])).toMatchObject({ issue: { line: 1, message: "memMib must be a positive integer on arrive" } })
    expect(bad([arrive, { t: 9, kind: "sleep", sessionId: "a" }])).toMatchObject({ issue: { line: 2 } })
  })

  it("trace times are the delay-free timeline: gaps become period lengths", () => {
    const text = [
      { kind: "meta", horizonMs: 10_000 },
      { t: 100, kind: "arrive", sessionId: "a", memMib: 2048, vcpus: 1 },
      { t: 400, kind: "idle", sessionId: "a" },
      { t: 1400, kind: "resume", sessionId: "a" },
      { t: 1500, kind: "end", sessionId: "a" },
    ]
      .map((l) => JSON.stringify(l))
      .join("\n")
    const parsed = Workload.parseTrace(text)
    expect(parsed).toEqual({
      _tag: "Parsed",
      workload: { horizonMs: 10_000, scripts: [{ id: "a", arriveAtMs: 100, budget: { memMib: 2048, vcpus: 1 }, activeMs: [300, 100], idleMs: [1000], endAfterIdle: false }] },
    })
  })

  it("the generator is seeded and keeps its scripts well formed (property)", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 10_000 }), (seed) => {
        const w = Workload.generate({ ...Workload.defaultGenerator, seed, sessions: 50, hours: 2 })
        expect(Workload.generate({ ...Workload.defaultGenerator, seed, sessions: 50, hours: 2 })).toEqual(w)
        for (const s of w.scripts) {
          expect(s.arriveAtMs).toBeLessThan(2 * HOUR)
          expect(s.idleMs.length).toBe(s.endAfterIdle ? s.activeMs.length : s.activeMs.length - 1)
          for (const d of [...s.activeMs, ...s.idleMs]) expect(Number.isInteger(d) && d >= 1).toBe(true)
        }
      }),
      { numRuns: 20 },
    )
  })

  it("resident memory rides on the arrive line and round-trips; a resident size above the budget is refused", () => {
    const text = [
      { kind: "meta", horizonMs: 10_000 },
      { t: 0, kind: "arrive", sessionId: "a", memMib: 8192, vcpus: 2, residentMib: 2048 },
      { t: 10, kind: "arrive", sessionId: "b", memMib: 4096, vcpus: 1 },
      { t: 500, kind: "end", sessionId: "a" },
    ]
      .map((l) => JSON.stringify(l))
      .join("\n")
    const parsed = Workload.parseTrace(text)
    if (parsed._tag !== "Parsed") throw new Error("parse")
    expect(parsed.workload.scripts[0]).toMatchObject({ id: "a", residentMib: 2048 })
    expect(parsed.workload.scripts[1]?.residentMib).toBeUndefined()
    expect(Workload.parseTrace(Workload.toTrace(parsed.workload))).toEqual(parsed)
    const bad = Workload.parseTrace(JSON.stringify({ t: 0, kind: "arrive", sessionId: "a", memMib: 1024, vcpus: 1, residentMib: 2048 }))
    expect(bad).toEqual({ _tag: "Invalid", issue: { line: 1, message: "residentMib must be a positive number no larger than memMib" } })
  })

  it("a period that runs to the horizon (no end line) round-trips without a line past it", () => {
    const text = [
      { kind: "meta", horizonMs: 10_000 },
      { t: 0, kind: "arrive", sessionId: "a", memMib: 1024, vcpus: 1 },
      { t: 100, kind: "idle", sessionId: "a" },
      { t: 5, kind: "arrive", sessionId: "b", memMib: 1024, vcpus: 1 },
    ]
      .map((l) => JSON.stringify(l))
      .join("\n")
    const parsed = Workload.parseTrace(text)
    if (parsed._tag !== "Parsed") throw new Error("parse")
    expect(parsed.workload.scripts.map((s) => [s.activeMs, s.idleMs])).toEqual([
      [[100], [Workload.OPEN]],
      [[Workload.OPEN], []],
    ])
    const again = Workload.toTrace(parsed.workload)
    expect(again.trim().split("\n").length).toBe(4)
    expect(Workload.parseTrace(again)).toEqual(parsed)
  })
})

