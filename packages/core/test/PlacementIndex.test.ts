import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, Placement, PlacementIndex } from "../src/index.js"
import type { Candidate } from "../src/index.js"
import { arbCandidate, arbTemplateBudget, templateNames } from "./arb.js"

const ids = Array.from({ length: 12 }, (_, i) => `h${i}`)

describe("PlacementIndex", () => {
  it("property: after any sequence of upserts and removals, pick equals Placement.pick", () => {
    const op = fc.oneof(
      fc.constantFrom(...ids).chain((id) => arbCandidate(id).map((c) => ({ kind: "upsert" as const, c }))),
      fc.constantFrom(...ids).map((id) => ({ kind: "remove" as const, id })),
    )
    const query = fc.record({
      budget: arbTemplateBudget,
      affinity: fc.array(fc.constantFrom(...ids, "nowhere"), { maxLength: 4 }),
      template: fc.option(fc.constantFrom(...templateNames, "t9"), { nil: undefined }),
      exclude: fc.option(fc.constantFrom(...ids), { nil: undefined }),
      takesMovesOnly: fc.option(fc.boolean(), { nil: undefined }),
    })
    fc.assert(
      fc.property(fc.array(op, { maxLength: 40 }), fc.array(query, { minLength: 1, maxLength: 8 }), fc.boolean(), (ops, queries, requireMeasured) => {
        const limits = { ...Limits.defaults, maxEntriesPerNode: 4, requireMeasured }
        const index = new PlacementIndex.Index(limits)
        const model = new Map<string, Candidate>()
        for (const o of ops) {
          if (o.kind === "upsert") {
            index.upsert(o.c)
            model.set(o.c.id, o.c)
          } else {
            index.remove(o.id)
            model.delete(o.id)
          }
        }
        expect(index.size).toBe(model.size)
        // Built in one go from the upserts (a later one of an id replaces an earlier), it picks the same.
        const built = PlacementIndex.Index.of(ops.flatMap((o) => (o.kind === "upsert" ? [o.c] : [])), limits)
        for (const q of queries) {
          const req = { budget: q.budget, affinity: q.affinity, template: q.template, exclude: q.exclude, takesMovesOnly: q.takesMovesOnly }
          expect(index.pick(req)).toBe(Placement.pick([...model.values()], req, limits))
          const survivors = new Map<string, Candidate>()
          for (const o of ops) if (o.kind === "upsert") survivors.set(o.c.id, o.c)
          expect(built.pick(req)).toBe(Placement.pick([...survivors.values()], req, limits))
        }
      }),
      { numRuns: 2000 },
    )
  })

  it("property: on a fleet of thousands (many blocks, split and emptied), pick equals Placement.pick", () => {
    // Deterministic random walk: 3,000 hosts upserted in any order, then churned and removed.
    let seed = 7
    const rnd = (n: number): number => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0
      return seed % n
    }
    const host = (i: number): Candidate => ({
      id: `h${String(i).padStart(4, "0")}`,
      headroom: { allocatableMib: 256 * (1 + rnd(64)), cpuBudget: 1 + rnd(16), reserved: { memMib: 256 * rnd(64), vcpus: rnd(16) } },
      entries: rnd(6),
      ...(rnd(10) === 0 ? { state: "cordoned" as const } : {}),
      ...(rnd(3) === 0 ? { takesMoves: false } : {}),
    })
    const limits = { ...Limits.defaults, maxEntriesPerNode: 5 }
    const index = new PlacementIndex.Index(limits)
    const model = new Map<string, Candidate>()
    const check = () => {
      expect(index.size).toBe(model.size)
      for (let q = 0; q < 20; q++) {
        const req = { budget: { memMib: 1 + rnd(64 * 256), vcpus: rnd(16) }, ...(rnd(2) === 0 ? { takesMovesOnly: true } : {}) }
        expect(index.pick(req)).toBe(Placement.pick([...model.values()], req, limits))
      }
    }
    for (let i = 0; i < 3000; i++) {
      const c = host(rnd(3000))
      index.upsert(c)
      model.set(c.id, c)
    }
    check()
    for (let i = 0; i < 6000; i++) {
      const c = host(rnd(3000))
      if (rnd(3) === 0) {
        index.remove(c.id)
        model.delete(c.id)
      } else {
        index.upsert(c)
        model.set(c.id, c)
      }
    }
    check()
    for (const id of [...model.keys()]) {
      if (rnd(10) !== 0) {
        index.remove(id)
        model.delete(id)
      }
    }
    check()
  })

  it("an unmeasured host with a reported 0 RAM ranks by its free RAM, as Placement.pick ranks it", () => {
    // Found by the property above: fit limits are not the ranking key for unmeasured hosts.
    const hosts: Candidate[] = [
      { id: "h3", headroom: { allocatableMib: null, cpuBudget: null, reserved: { memMib: 0, vcpus: 0 } } },
      { id: "h4", headroom: { allocatableMib: 0, cpuBudget: null, reserved: { memMib: 0, vcpus: 0 } }, measured: false },
    ]
    const index = new PlacementIndex.Index()
    for (const h of hosts) index.upsert(h)
    const req = { budget: { memMib: 1, vcpus: 0 } }
    expect(index.pick(req)).toBe(Placement.pick(hosts, req))
    expect(index.pick(req)).toBe("h4")
  })

  it("a host whose CPU budget is 0 (not gated) ranks by its free vCPUs, as Placement.pick ranks it", () => {
    const hosts: Candidate[] = [
      { id: "a", headroom: { allocatableMib: 4096, cpuBudget: null, reserved: { memMib: 0, vcpus: 3 } } },
      { id: "b", headroom: { allocatableMib: 4096, cpuBudget: 0, reserved: { memMib: 0, vcpus: 3 } } },
    ]
    const index = new PlacementIndex.Index()
    for (const h of hosts) index.upsert(h)
    const req = { budget: { memMib: 1024, vcpus: 8 } }
    expect(index.pick(req)).toBe(Placement.pick(hosts, req))
    expect(index.pick(req)).toBe("b")
  })

  it("setLimits re-files every host", () => {
    const index = new PlacementIndex.Index()
    index.upsert({ id: "a", headroom: { allocatableMib: 8192, cpuBudget: 8, reserved: { memMib: 0, vcpus: 0 } }, entries: 3 })
    expect(index.pick({ budget: { memMib: 1024, vcpus: 1 } })).toBe("a")
    index.setLimits({ ...Limits.defaults, maxEntriesPerNode: 3 })
    expect(index.pick({ budget: { memMib: 1024, vcpus: 1 } })).toBeNull()
  })
})
