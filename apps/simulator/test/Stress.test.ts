import { describe, expect, it } from "vitest"
import { Cli, Simulation, Stress, Workload } from "../src/index.js"
import { Effect } from "effect"

const HOUR = 3_600_000
const arrivalsIn = (w: Workload.Workload, fromH: number, toH: number): number =>
  w.scripts.filter((s) => s.arriveAtMs >= fromH * HOUR && s.arriveAtMs < toH * HOUR).length

describe("Stress workloads", () => {
  it("every stress workload is seeded: the same seed gives the same scripts, another seed others", () => {
    for (const s of Stress.scenarios) {
      const a = Workload.generate(s.generator(3, 400))
      const b = Workload.generate(s.generator(3, 400))
      const c = Workload.generate(s.generator(4, 400))
      expect(a, s.name).toEqual(b)
      expect(a.scripts.map((x) => x.arriveAtMs), s.name).not.toEqual(c.scripts.map((x) => x.arriveAtMs))
      expect(a.scripts.length).toBe(400)
    }
  })

  it("a flash crowd quintuples the arrival rate for ten minutes", () => {
    const w = Workload.generate(Stress.byName("flash-crowd").generator(1, 20_000))
    const crowd = arrivalsIn(w, 14, 14 + 1 / 6)
    // The ten minutes before and after, at the same point of the daily cycle.
    const around = (arrivalsIn(w, 14 - 1 / 6, 14) + arrivalsIn(w, 14 + 1 / 6, 14 + 1 / 3)) / 2
    expect(crowd / around).toBeGreaterThan(4)
    expect(crowd / around).toBeLessThan(6)
  })

  it("a phase with sizes draws its sessions from them; outside it the generator's sizes hold", () => {
    const cfg = Stress.byName("big-bursts").generator(2, 20_000)
    const w = Workload.generate(cfg)
    const big = (s: Workload.Script) => s.budget.memMib >= 128 * 1024
    const inBurst = w.scripts.filter((s) => s.arriveAtMs >= 10 * HOUR && s.arriveAtMs < 10 * HOUR + HOUR / 3)
    const outside = w.scripts.filter((s) => s.arriveAtMs < 10 * HOUR)
    expect(inBurst.filter(big).length).toBeGreaterThan(10)
    expect(outside.filter(big)).toEqual([])
  })

  it("an abrupt shift changes the rate and the sizes from its hour on", () => {
    const w = Workload.generate(Stress.byName("shift").generator(5, 20_000))
    const mean = (xs: readonly Workload.Script[]) => xs.reduce((a, s) => a + s.budget.memMib, 0) / xs.length
    const before = w.scripts.filter((s) => s.arriveAtMs >= 11 * HOUR && s.arriveAtMs < 12 * HOUR)
    const after = w.scripts.filter((s) => s.arriveAtMs >= 12 * HOUR && s.arriveAtMs < 13 * HOUR)
    expect(after.length / before.length).toBeGreaterThan(1.3)
    expect(mean(after) / mean(before)).toBeGreaterThan(1.7)
  })

  it("size jitter shrinks every session by at most the share, and changes nothing else", () => {
    const plain = Workload.generate({ ...Workload.defaultGenerator, seed: 9, sessions: 2000 })
    const noisy = Workload.generate({ ...Workload.defaultGenerator, seed: 9, sessions: 2000, sizeJitterPct: 3 })
    let changed = 0
    plain.scripts.forEach((p, i) => {
      const n = noisy.scripts[i] as Workload.Script
      expect({ ...n, budget: null }).toEqual({ ...p, budget: null })
      expect(n.budget.vcpus).toBe(p.budget.vcpus)
      expect(n.budget.memMib).toBeLessThanOrEqual(p.budget.memMib)
      expect(n.budget.memMib).toBeGreaterThanOrEqual(Math.floor(p.budget.memMib * 0.97))
      if (n.budget.memMib !== p.budget.memMib) changed++
    })
    expect(changed).toBeGreaterThan(1900)
  })

  it("--workload picks a stress workload and its fleet; --host replaces the fleet; an unknown name is refused", async () => {
    const o = await Effect.runPromise(Cli.parse(["--workload", "big-bursts", "--seed", "4"], { quiet: true }))
    expect(o?.scenario).toBe("big-bursts")
    expect(o?.fleet.shapes).toEqual(Stress.byName("big-bursts").shapes)
    expect(o?.generator.phases?.length).toBe(3)
    expect(o?.generator.sessions).toBe(Stress.byName("big-bursts").sessions)
    const own = await Effect.runPromise(Cli.parse(["--workload", "shift", "--host", "10x64gx16", "--sessions", "300", "--size-jitter-pct", "2"], { quiet: true }))
    expect(own?.fleet.shapes).toEqual([{ count: 10, memMib: 65536, vcpus: 16 }])
    expect(own?.generator.sessions).toBe(300)
    expect(own?.generator.sizeJitterPct).toBe(2)
    const bad = await Effect.runPromise(Effect.flip(Cli.parse(["--workload", "nope"], { quiet: true })))
    expect(bad).toMatchObject({ _tag: "UsageError", option: "--workload" })
  })
})

describe("the figures a table needs", () => {
  it("no policy beats the TTL bound on warm resumes; the waits per size class cover every wait", () => {
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 3, sessions: 300, hours: 4 })
    const fleet = { hosts: 6, limits: { ...Simulation.defaultFleet.limits, parkHardTtlMs: 3_600_000 } }
    const bound = Simulation.ttlWarmBound(w, fleet.limits)
    // Resumes after a longer idle period than the TTL exist, so the bound is below the resumes.
    const resumes = w.scripts.reduce((a, s) => a + Math.max(0, s.activeMs.length - 1), 0)
    expect(bound).toBeLessThan(resumes)
    for (const policy of ["park-forever", "demand-reserve"] as const) {
      const r = Simulation.run(w, { policy, fleet })
      expect(r.warmBoundTtl).toBe(bound)
      expect(r.warmResumes).toBeLessThanOrEqual(bound)
      expect(Math.max(...r.waitsBySize.map((c) => c.maxMs))).toBe(r.queueWait.max)
      expect(r.waitsBySize.map((c) => c.memMib)).toStrictEqual([2048, 4096, 8192, 16_384, 32_768])
    }
  })
})
