import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, Placement, PlacementIndex, QueueWalk } from "../src/index.js"
import type { Candidate } from "../src/index.js"
import { arbCandidate, arbTemplateBudget, templateNames } from "./arb.js"

const ids = Array.from({ length: 12 }, (_, i) => `h${i}`)

const arbSpread = fc.integer({ min: 1, max: 5 }).chain((replicas) => fc.record({ replica: fc.integer({ min: 0, max: replicas - 1 }), replicas: fc.constant(replicas) }))

const arbFleet = fc.uniqueArray(fc.constantFrom(...ids), { maxLength: ids.length }).chain((hostIds) => fc.tuple(...hostIds.map((id) => arbCandidate(id))))

const arbQuery = fc.record({
  memMib: fc.integer({ min: 1, max: 64 * 256 }),
  vcpus: fc.integer({ min: 0, max: 16 }),
  affinity: fc.array(fc.constantFrom(...ids, "nowhere"), { maxLength: 3 }),
})

const limitsOf = (requireMeasured: boolean) => ({ ...Limits.defaults, maxEntriesPerNode: 4, requireMeasured })

/** `n` empty hosts alike: every one fits the same budgets equally well. */
const equalHosts = (n: number): Candidate[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `host-${String(i).padStart(4, "0")}`,
    headroom: { allocatableMib: 65_536, cpuBudget: 32, reserved: { memMib: 0, vcpus: 0 } },
  }))

describe("Placement spread (a replica's share of the hosts)", () => {
  it("property: the index picks exactly as Placement.pick and rank with the same spread", () => {
    fc.assert(
      fc.property(arbFleet, fc.array(arbQuery, { minLength: 1, maxLength: 6 }), arbSpread, fc.boolean(), (hosts, queries, spread, requireMeasured) => {
        const limits = limitsOf(requireMeasured)
        const index = PlacementIndex.Index.of(hosts, limits)
        for (const q of queries) {
          const req = { budget: { memMib: q.memMib, vcpus: q.vcpus }, affinity: q.affinity, spread }
          const picked = Placement.pick(hosts, req, limits)
          expect(index.pick(req)).toBe(picked)
          expect(Placement.rank(hosts, req, limits)[0] ?? null).toBe(picked)
        }
      }),
      { numRuns: 2000 },
    )
  })

  it("property: with a template too, the index picks exactly as Placement.pick and rank (the template's holders first, then the own share)", () => {
    fc.assert(
      fc.property(
        arbFleet,
        fc.array(
          fc.record({
            budget: arbTemplateBudget,
            template: fc.option(fc.constantFrom(...templateNames), { nil: undefined }),
            affinity: fc.array(fc.constantFrom(...ids), { maxLength: 2 }),
            exclude: fc.option(fc.constantFrom(...ids), { nil: undefined }),
          }),
          { minLength: 1, maxLength: 6 },
        ),
        arbSpread,
        fc.boolean(),
        fc.boolean(),
        (hosts, queries, spread, requireMeasured, incremental) => {
          const limits = limitsOf(requireMeasured)
          // Built at once, or host by host (each host filed twice: the second replaces the first).
          const index = incremental ? new PlacementIndex.Index(limits) : PlacementIndex.Index.of(hosts, limits)
          if (incremental) for (const h of [...hosts, ...hosts]) index.upsert(h)
          for (const q of queries) {
            const req = { budget: q.budget, affinity: q.affinity, template: q.template, spread, exclude: q.exclude }
            const picked = Placement.pick(hosts, req, limits)
            expect(index.pick(req)).toBe(picked)
            expect(Placement.rank(hosts, req, limits)[0] ?? null).toBe(picked)
            // Neither preference changes whether it fits.
            expect(picked === null).toBe(Placement.pick(hosts, { budget: q.budget, exclude: q.exclude }, limits) === null)
          }
        },
      ),
      { numRuns: 2000 },
    )
  })

  it("property: a spread never changes whether a budget fits, only which fitting host is chosen", () => {
    fc.assert(
      fc.property(arbFleet, arbQuery, arbSpread, fc.boolean(), (hosts, q, spread, requireMeasured) => {
        const limits = limitsOf(requireMeasured)
        const plain = { budget: { memMib: q.memMib, vcpus: q.vcpus }, affinity: q.affinity }
        const spreadPick = Placement.pick(hosts, { ...plain, spread }, limits)
        const plainPick = Placement.pick(hosts, plain, limits)
        expect(spreadPick === null).toBe(plainPick === null)
        if (spreadPick !== null) expect(Placement.fitsOn(hosts.find((h) => h.id === spreadPick) as Candidate, plain.budget, limits)).toBe(true)
        // The same hosts fit, in another order.
        expect([...Placement.rank(hosts, { ...plain, spread }, limits)].sort()).toEqual([...Placement.rank(hosts, plain, limits)].sort())
      }),
      { numRuns: 2000 },
    )
  })

  it("property: with one replica, or none, the choice is the one without a spread", () => {
    fc.assert(
      fc.property(arbFleet, arbQuery, fc.boolean(), (hosts, q, requireMeasured) => {
        const limits = limitsOf(requireMeasured)
        const plain = { budget: { memMib: q.memMib, vcpus: q.vcpus }, affinity: q.affinity }
        const index = PlacementIndex.Index.of(hosts, limits)
        const expected = Placement.pick(hosts, plain, limits)
        expect(Placement.pick(hosts, { ...plain, spread: { replica: 0, replicas: 1 } }, limits)).toBe(expected)
        expect(index.pick({ ...plain, spread: { replica: 0, replicas: 1 } })).toBe(expected)
        expect(index.pick(plain)).toBe(expected)
      }),
      { numRuns: 1000 },
    )
  })

  it("property: without affinity, a host of the replica's own share is chosen whenever one fits, the best fit among them", () => {
    fc.assert(
      fc.property(arbFleet, arbQuery, arbSpread, (hosts, q, spread) => {
        const budget = { memMib: q.memMib, vcpus: q.vcpus }
        const measured = hosts.filter((h) => Placement.isMeasured(h))
        const own = measured.filter((h) => Placement.isOwn(spread, h.id))
        const ownBest = Placement.pick(own, { budget })
        const picked = Placement.pick(hosts, { budget, spread })
        if (ownBest !== null) expect(picked).toBe(ownBest)
        // No own host fits: the best of the measured hosts, as without a spread.
        else if (Placement.pick(measured, { budget }) !== null) expect(picked).toBe(Placement.pick(measured, { budget }))
      }),
      { numRuns: 2000 },
    )
  })

  it("property: on a fleet of equal hosts, replicas' first choices for the same session all differ", () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 8 }), fc.integer({ min: 1, max: 4096 }), (replicas, memMib) => {
        const hosts = equalHosts(64)
        const index = PlacementIndex.Index.of(hosts)
        const choices = Array.from({ length: replicas }, (_, replica) => index.pick({ budget: { memMib, vcpus: 1 }, spread: { replica, replicas } }))
        expect(choices.every((c) => c !== null)).toBe(true)
        expect(new Set(choices).size).toBe(replicas)
        // Without the spread they would all choose the same host.
        expect(index.pick({ budget: { memMib, vcpus: 1 } })).toBe("host-0000")
      }),
    )
  })

  it("property: a walk with a spread leaves no session unplaced that fits on a host when the walk ends", () => {
    fc.assert(
      fc.property(arbFleet, fc.array(fc.record({ budget: fc.record({ memMib: fc.integer({ min: 1, max: 16 * 256 }), vcpus: fc.integer({ min: 0, max: 4 }) }) }), { maxLength: 20 }), arbSpread, (hosts, queue, spread) => {
        const index = PlacementIndex.Index.of(hosts)
        const walk = QueueWalk.walkOn(index, queue, { spread })
        expect(walk.placed.length + walk.unplaced.length).toBe(queue.length)
        for (const w of walk.unplaced) expect(index.anyFits(w.budget)).toBe(false)
      }),
      { numRuns: 1000 },
    )
  })

  it("the share of a host is a function of its id and the number of replicas alone", () => {
    expect(Placement.shareOf("host-0001", 3)).toBe(Placement.shareOf("host-0001", 3))
    const counts = [0, 0, 0]
    for (const h of equalHosts(3000)) counts[Placement.shareOf(h.id, 3)]! += 1
    // Every share gets a fair part of the hosts (FNV-1a spreads ids that differ in a digit).
    for (const n of counts) expect(n).toBeGreaterThan(800)
  })
})
