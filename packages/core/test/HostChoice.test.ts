import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, Placement, PlacementIndex } from "../src/index.js"
import type { Candidate } from "../src/index.js"
import { arbBudget, arbFleet, hostIds } from "./arb.js"

const host = (id: string, allocatableMib: number | null, reservedMib = 0, state: Placement.HostState = "ready"): Candidate => ({
  id,
  headroom: { allocatableMib, cpuBudget: 32, reserved: { memMib: reservedMib, vcpus: 0 } },
  state,
})

describe("the host choice", () => {
  it("property: the index chooses exactly as Placement.choose (affinity, an excluded host, an asked-for target, only hosts that take moves)", () => {
    const req = fc.record({
      budget: arbBudget,
      affinity: fc.array(fc.constantFrom(...hostIds, "nowhere"), { maxLength: 3 }),
      exclude: fc.option(fc.constantFrom(...hostIds), { nil: undefined }),
      target: fc.option(fc.constantFrom(...hostIds, "nowhere"), { nil: undefined }),
      takesMovesOnly: fc.option(fc.boolean(), { nil: undefined }),
    })
    fc.assert(
      fc.property(arbFleet, fc.array(req, { minLength: 1, maxLength: 6 }), fc.boolean(), (hosts, reqs, requireMeasured) => {
        const limits = { ...Limits.defaults, maxEntriesPerNode: 4, requireMeasured }
        const index = PlacementIndex.Index.of(hosts, limits)
        for (const r of reqs) {
          expect(index.choose(r)).toStrictEqual(Placement.choose(hosts, r, limits))
          // Without a target the choice is the pick, and the pick never answers the excluded host.
          const picked = index.pick(r)
          expect(picked).toBe(Placement.pick(hosts, r, limits))
          if (r.exclude !== undefined) expect(picked).not.toBe(r.exclude)
          // Asked for a host that takes moves, the pick is one, else the pick among the hosts that do.
          if (r.takesMovesOnly === true) {
            expect(hosts.find((h) => h.id === picked)?.takesMoves).not.toBe(false)
            expect(picked).toBe(Placement.pick(hosts.filter((h) => h.takesMoves !== false), { ...r, takesMovesOnly: undefined }, limits))
          }
        }
      }),
      { numRuns: 1500 },
    )
    // 11.5 s of the default 30 s in CI at load ≈ 30: a property's time grows with the machine's load.
  }, 180_000)

  it("property: Placement.top is the ranking's first k", () => {
    fc.assert(
      fc.property(arbFleet, arbBudget, fc.integer({ min: 0, max: 12 }), fc.boolean(), (hosts, budget, k, takesMovesOnly) => {
        const req = { budget, affinity: ["h3", "h1"], takesMovesOnly }
        expect(Placement.top(hosts, req, k)).toStrictEqual(Placement.rank(hosts, req).slice(0, k))
      }),
      { numRuns: 500 },
    )
  })

  it("an asked-for target is chosen when the budget fits there, even over a better ranked host", () => {
    const hosts = [host("snug", 2048), host("roomy", 16384)]
    expect(Placement.choose(hosts, { budget: { memMib: 1024, vcpus: 1 } })).toStrictEqual({ _tag: "Chosen", hostId: "snug" })
    expect(Placement.choose(hosts, { budget: { memMib: 1024, vcpus: 1 }, target: "roomy" })).toStrictEqual({ _tag: "Chosen", hostId: "roomy" })
  })

  it("an asked-for target without room names its reason; the source as target and an unknown target are told apart", () => {
    const hosts = [host("src", 8192), host("full", 2048, 2048), host("off", 65536, 0, "draining")]
    const budget = { memMib: 1024, vcpus: 1 }
    expect(Placement.choose(hosts, { budget, exclude: "src", target: "full" })).toStrictEqual({
      _tag: "NoFit",
      message: "host full cannot take the session: ram_full",
    })
    expect(Placement.choose(hosts, { budget, exclude: "src", target: "off" })).toStrictEqual({
      _tag: "NoFit",
      message: "host off cannot take the session: draining",
    })
    expect(Placement.choose(hosts, { budget, exclude: "src", target: "src" })).toStrictEqual({ _tag: "SameHost", hostId: "src" })
    expect(Placement.choose(hosts, { budget, exclude: "src", target: "nope" })).toStrictEqual({ _tag: "UnknownHost", hostId: "nope" })
  })

  it("a move target is never the source, and none other fitting is a NoFit naming the source", () => {
    const hosts = [host("src", 8192), host("small", 512)]
    expect(Placement.choose(hosts, { budget: { memMib: 1024, vcpus: 1 }, exclude: "src" })).toStrictEqual({
      _tag: "NoFit",
      message: "no host other than src can take the session",
    })
    expect(Placement.choose(hosts, { budget: { memMib: 1024, vcpus: 1 } })).toStrictEqual({ _tag: "Chosen", hostId: "src" })
  })
  it("a move without a target goes only to a host that takes moves; with none that has room, a NoFit that says so", () => {
    const budget = { memMib: 1024, vcpus: 1 }
    const noPeer = (c: Candidate): Candidate => ({ ...c, takesMoves: false })
    // The snug host ranks first but takes no moves: the roomier one that does is chosen.
    const hosts = [host("src", 8192), noPeer(host("snug", 2048)), host("roomy", 16384)]
    expect(Placement.choose(hosts, { budget, exclude: "src", takesMovesOnly: true })).toStrictEqual({ _tag: "Chosen", hostId: "roomy" })
    expect(PlacementIndex.Index.of(hosts).choose({ budget, exclude: "src", takesMovesOnly: true })).toStrictEqual({ _tag: "Chosen", hostId: "roomy" })
    // Preferred (affinity) or not, a host that takes no moves is never the pick.
    expect(Placement.pick(hosts, { budget, exclude: "src", affinity: ["snug"], takesMovesOnly: true })).toBe("roomy")
    // Every other placement goes there as before.
    expect(Placement.choose(hosts, { budget, exclude: "src" })).toStrictEqual({ _tag: "Chosen", hostId: "snug" })
    // The only host with room takes no moves: refused as when nothing fits, saying why.
    const only = [host("src", 8192), noPeer(host("snug", 2048)), host("full", 2048, 2048)]
    const refused = { _tag: "NoFit", message: "no host other than src that takes moves (its agent advertises a peer URL) has room for the session" }
    expect(Placement.choose(only, { budget, exclude: "src", takesMovesOnly: true })).toStrictEqual(refused)
    expect(PlacementIndex.Index.of(only).choose({ budget, exclude: "src", takesMovesOnly: true })).toStrictEqual(refused)
    // Nothing has room at all: the plain NoFit (peer URLs are no reason then).
    const full = [host("src", 8192), noPeer(host("snug", 2048, 2048)), host("full", 2048, 2048)]
    const plain = { _tag: "NoFit", message: "no host other than src can take the session" }
    expect(Placement.choose(full, { budget, exclude: "src", takesMovesOnly: true })).toStrictEqual(plain)
    expect(PlacementIndex.Index.of(full).choose({ budget, exclude: "src", takesMovesOnly: true })).toStrictEqual(plain)
    // A named target is the operator's choice: chosen where the budget fits, taking moves or not.
    expect(Placement.choose(only, { budget, exclude: "src", target: "snug", takesMovesOnly: true })).toStrictEqual({ _tag: "Chosen", hostId: "snug" })
  })
})
