// Arbitraries shared by the property tests of core: candidate hosts over a small id space.
import fc from "fast-check"
import type { Candidate, Placement } from "../src/index.js"

/** Template names the arbitraries draw from. */
export const templateNames = ["t1", "t2"]

/** Sizes a template of the arbitraries starts (a budget of one of them may match a host's template). */
export const templateSizes = [
  { memMib: 256, vcpus: 1 },
  { memMib: 1024, vcpus: 1 },
  { memMib: 1024, vcpus: 2 },
]

/** A template a host holds: one of a few names and sizes. */
export const arbHeldTemplate = fc
  .record({ name: fc.constantFrom(...templateNames), size: fc.constantFrom(...templateSizes) })
  .map((r): Placement.HeldTemplate => ({ name: r.name, ...r.size }))

/** A budget that is often a template's size. */
export const arbTemplateBudget = fc.oneof(
  fc.constantFrom(...templateSizes),
  fc.record({ memMib: fc.integer({ min: 1, max: 64 * 256 }), vcpus: fc.integer({ min: 0, max: 16 }) }),
)

/** A candidate host `id`: any mix of measured, unmeasured, gated and full, in any state, taking moves or not. */
export const arbCandidate = (id: string) =>
  fc
    .record({
      allocatableMib: fc.option(fc.integer({ min: 0, max: 64 }), { nil: null }),
      cpuBudget: fc.option(fc.integer({ min: 0, max: 16 }), { nil: null }),
      mem: fc.integer({ min: 0, max: 64 }),
      cpu: fc.integer({ min: 0, max: 16 }),
      state: fc.constantFrom("ready", "ready", "ready", "cordoned", "draining"),
      entries: fc.integer({ min: 0, max: 5 }),
      measured: fc.option(fc.boolean(), { nil: undefined }),
      templates: fc.option(fc.array(arbHeldTemplate, { maxLength: 2 }), { nil: undefined }),
      takesMoves: fc.option(fc.boolean(), { nil: undefined }),
    })
    .map(
      (r): Candidate => ({
        id,
        headroom: {
          allocatableMib: r.allocatableMib === null ? null : r.allocatableMib * 256,
          cpuBudget: r.cpuBudget,
          reserved: { memMib: r.mem * 256, vcpus: r.cpu },
        },
        state: r.state as Placement.HostState,
        entries: r.entries,
        ...(r.measured === undefined ? {} : { measured: r.measured }),
        ...(r.templates === undefined ? {} : { templates: r.templates }),
        ...(r.takesMoves === undefined ? {} : { takesMoves: r.takesMoves }),
      }),
    )

/** Host ids the arbitraries draw from. */
export const hostIds = Array.from({ length: 10 }, (_, i) => `h${i}`)

/** A fleet: a subset of `hostIds`, each an arbitrary candidate. */
export const arbFleet = fc
  .subarray(hostIds, { minLength: 0 })
  .chain((ids) => fc.tuple(...ids.map((id) => arbCandidate(id))))
  .map((hosts) => hosts as Candidate[])

/** A budget within the arbitrary hosts' range. */
export const arbBudget = fc.record({ memMib: fc.integer({ min: 1, max: 64 * 256 }), vcpus: fc.integer({ min: 0, max: 16 }) })
