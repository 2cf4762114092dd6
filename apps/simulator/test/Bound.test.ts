import { describe, expect, it } from "vitest"
import { Limits } from "@engram/core"
import { Bound, Simulation, Workload } from "../src/index.js"

const MIN = 60_000
const GiB = 1024
const session = (id: string, arriveAtMs: number, gib: number, activeMs: number[], idleMs: number[]): Workload.Script => ({
  id,
  arriveAtMs,
  budget: { memMib: gib * GiB, vcpus: 1 },
  activeMs,
  idleMs,
  endAfterIdle: false,
})

describe("the pooled-RAM LP bound", () => {
  // One host of 9 GiB less the 1 GiB system reserve: 8 GiB pooled.
  const shapes = [{ count: 1, memMib: 9 * GiB, vcpus: 8 }]

  it("counts the parks that fit in the pooled RAM beside what runs, at most the TTL bound", async () => {
    // a and b (4 GiB each) idle over the same 30 minutes and come back: both parks fit in 8 GiB.
    const two = [session("a", 0, 4, [10 * MIN, 10 * MIN], [30 * MIN]), session("b", 0, 4, [10 * MIN, 10 * MIN], [30 * MIN])]
    const horizonMs = 120 * MIN
    const both = await Bound.pooledRam({ scripts: two, horizonMs }, shapes, Limits.defaults, MIN)
    expect(both).toMatchObject({ warm: 2, ttl: 2, status: "Optimal" })
    // c (4 GiB) runs through their idle periods: one park fits beside it.
    const three = [...two, session("c", 0, 4, [100 * MIN], [])]
    expect((await Bound.pooledRam({ scripts: three, horizonMs }, shapes, Limits.defaults, MIN)).warm).toBe(1)
    // An idle period longer than a park may last is never warm.
    const ttl = { ...Limits.defaults, parkHardTtlMs: 20 * MIN, reaperIntervalMs: MIN }
    expect(await Bound.pooledRam({ scripts: two, horizonMs }, shapes, ttl, MIN)).toMatchObject({ warm: 0, ttl: 0 })
    expect(Simulation.ttlWarmBound({ scripts: two, horizonMs }, ttl)).toBe(0)
  })

  it("a policy that makes nobody wait does not beat it on a generated workload", async () => {
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 5, sessions: 100, hours: 12 })
    const fleet = { shapes: [{ count: 4, memMib: 64 * GiB, vcpus: 16 }], hosts: 4 }
    const bound = await Bound.pooledRam(w, fleet.shapes, Limits.defaults)
    expect(bound.warm).toBeLessThanOrEqual(bound.ttl)
    const r = Simulation.run(w, { policy: "demand-reserve", fleet })
    expect(r.queued).toBe(0)
    expect(r.warmResumes).toBeLessThanOrEqual(bound.warm)
  })
})
