import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Headroom, Limits, Placement, PlacementIndex } from "../src/index.js"
import type { Candidate } from "../src/index.js"
import { arbBudget, arbCandidate, arbFleet, arbTemplateBudget, hostIds, templateNames, templateSizes } from "./arb.js"

const host = (id: string, allocatableMib: number | null, cpuBudget: number | null, memMib = 0, vcpus = 0, extra: Partial<Candidate> = {}): Candidate => ({
  id,
  headroom: { allocatableMib, cpuBudget, reserved: { memMib, vcpus } },
  ...extra,
})
const req = (memMib: number, vcpus = 1, affinity?: string[]) => (affinity ? { budget: { memMib, vcpus }, affinity } : { budget: { memMib, vcpus } })

describe("Placement.rank", () => {
  it("best fit: the smallest free RAM that still fits ranks first", () => {
    const hosts = [host("a", 16384, 64, 0), host("b", 16384, 64, 12288), host("c", 16384, 64, 8192)]
    expect(Placement.rank(hosts, req(2048))).toEqual(["b", "c", "a"])
    expect(Placement.rank(hosts, req(6000))).toEqual(["c", "a"])
  })

  it("ties on free RAM go to fewer free vCPUs, then to the host id", () => {
    const hosts = [host("z", 8192, 64, 0, 0), host("y", 8192, 64, 0, 10), host("x", 8192, 64, 0, 10)]
    expect(Placement.rank(hosts, req(1024))).toEqual(["x", "y", "z"])
  })

  it("affinity hosts come first in their order of preference", () => {
    const hosts = [host("a", 16384, 64), host("b", 16384, 64, 12000), host("c", 16384, 64)]
    expect(Placement.rank(hosts, req(1024, 1, ["c", "a"]))).toEqual(["c", "a", "b"])
  })

  it("an affinity host that does not fit is skipped", () => {
    const hosts = [host("a", 4096, 64, 4000), host("b", 16384, 64)]
    expect(Placement.rank(hosts, req(1024, 1, ["a"]))).toEqual(["b"])
  })

  it("unmeasured hosts are a last resort, after every measured host", () => {
    const hosts = [host("u", null, null), host("m", 16384, 64), host("v", null, 64)]
    expect(Placement.rank(hosts, req(1024, 1, ["u"]))).toEqual(["m", "u", "v"])
  })

  it("registration is not readiness: a host that has not reported takes no placement and names unmeasured (SPEC §12)", () => {
    const hosts = [host("fresh", null, null, 0, 0, { reported: false }), host("late", null, null, 0, 0, { reported: true })]
    expect(Placement.rank(hosts, req(1024))).toEqual(["late"])
    expect(Placement.pick(hosts.slice(0, 1), req(1))).toBeNull()
    expect(Placement.isOpen(hosts[0] as Candidate)).toBe(false)
    expect(Placement.reasonFor(hosts[0] as Candidate, { memMib: 1, vcpus: 1 })).toBe("unmeasured")
    expect(Placement.choose(hosts, { budget: { memMib: 1, vcpus: 1 }, target: "fresh" })).toMatchObject({ _tag: "NoFit" })
    expect(Placement.roomIndex(hosts.slice(0, 1)).anyFits({ memMib: 1, vcpus: 1 })).toBe(false)
  })

  it("cordoned and draining hosts take no placements", () => {
    const hosts = [host("a", 16384, 64, 0, 0, { state: "cordoned" }), host("b", 16384, 64, 0, 0, { state: "draining" }), host("c", 16384, 64)]
    expect(Placement.rank(hosts, req(1024))).toEqual(["c"])
  })

  it("a host at maxEntriesPerNode takes no placement", () => {
    const limits = { ...Limits.defaults, maxEntriesPerNode: 2 }
    const hosts = [host("a", 16384, 64, 0, 0, { entries: 2 }), host("b", 16384, 64, 0, 0, { entries: 1 })]
    expect(Placement.rank(hosts, req(1024), limits)).toEqual(["b"])
  })

  it("requireMeasured keeps unmeasured hosts out", () => {
    const hosts = [host("u", null, null), host("m", 16384, 64)]
    expect(Placement.rank(hosts, req(1024), { ...Limits.defaults, requireMeasured: true })).toEqual(["m"])
  })

  it("pick is the head of rank", () => {
    const hosts = [host("a", 16384, 64, 100), host("b", 16384, 64, 12288), host("u", null, null)]
    expect(Placement.pick(hosts, req(2048))).toBe("b")
    expect(Placement.pick(hosts, req(1 << 30, 1))).toBe("u")
    expect(Placement.pick([host("a", 1024, 4)], req(2048))).toBeNull()
  })

  it("property: rank returns only hosts that fit, each once, and pick agrees with its head", () => {
    const arbHost = fc.record({
      allocatableMib: fc.option(fc.integer({ min: 0, max: 65536 }), { nil: null }),
      cpuBudget: fc.option(fc.integer({ min: 0, max: 128 }), { nil: null }),
      mem: fc.integer({ min: 0, max: 65536 }),
      cpu: fc.integer({ min: 0, max: 128 }),
      state: fc.constantFrom("ready", "ready", "ready", "cordoned", "draining"),
      entries: fc.integer({ min: 0, max: 40 }),
    })
    fc.assert(
      fc.property(fc.array(arbHost, { maxLength: 30 }), fc.integer({ min: 1, max: 32768 }), fc.integer({ min: 0, max: 16 }), (raw, memMib, vcpus) => {
        const hosts = raw.map((r, i) => host(`h${i}`, r.allocatableMib, r.cpuBudget, r.mem, r.cpu, { state: r.state as Placement.HostState, entries: r.entries }))
        const ranked = Placement.rank(hosts, req(memMib, vcpus))
        expect(new Set(ranked).size).toBe(ranked.length)
        for (const id of ranked) {
          const c = hosts.find((h) => h.id === id) as Candidate
          expect(Headroom.fits(c.headroom, { memMib, vcpus })).toBe(true)
          expect(c.state).toBe("ready")
          expect(c.entries ?? 0).toBeLessThan(Limits.defaults.maxEntriesPerNode)
        }
        const fitting = hosts.filter((h) => Placement.fitsOn(h, { memMib, vcpus }))
        expect(ranked.length).toBe(fitting.length)
        expect(Placement.pick(hosts, req(memMib, vcpus))).toBe(ranked[0] ?? null)
        const index = Placement.roomIndex(hosts)
        expect(index.anyFits({ memMib, vcpus })).toBe(ranked.length > 0)
      }),
    )
  })
})

describe("Placement.noFit", () => {
  it("names one reason per host with its free figures, sorted by id", () => {
    const limits = { ...Limits.defaults, maxEntriesPerNode: 4, requireMeasured: true }
    const hosts = [
      host("f-ram", 4096, 64, 4000),
      host("e-cpu", 65536, 4, 0, 4),
      host("d-entries", 65536, 64, 0, 0, { entries: 4 }),
      host("c-cordoned", 65536, 64, 0, 0, { state: "cordoned" }),
      host("b-draining", 65536, 64, 0, 0, { state: "draining" }),
      host("a-unmeasured", null, null),
      host("g-fits", 65536, 64),
    ]
    expect(Placement.noFit(hosts, req(1024), limits)).toEqual([
      { hostId: "a-unmeasured", reason: "unmeasured", freeMib: null, freeVcpus: null },
      { hostId: "b-draining", reason: "draining", freeMib: 65536, freeVcpus: 64 },
      { hostId: "c-cordoned", reason: "cordoned", freeMib: 65536, freeVcpus: 64 },
      { hostId: "d-entries", reason: "entries_full", freeMib: 65536, freeVcpus: 64 },
      { hostId: "e-cpu", reason: "cpu_full", freeMib: 65536, freeVcpus: 0 },
      { hostId: "f-ram", reason: "ram_full", freeMib: 96, freeVcpus: 64 },
      { hostId: "g-fits", reason: "fits_now", freeMib: 65536, freeVcpus: 64 },
    ])
  })

  it("the 9th create is queued when two hosts are fully reserved by 8", () => {
    // Two 16 GiB hosts (after the reserve), eight 4 GiB sessions fill them.
    const hosts = [host("h1", 16384, 64, 16384, 8), host("h2", 16384, 64, 16384, 8)]
    expect(Placement.pick(hosts, req(4096))).toBeNull()
    expect(Placement.noFit(hosts, req(4096)).map((d) => d.reason)).toEqual(["ram_full", "ram_full"])
  })
})

describe("Placement: templates rank, never fit (SPEC §13)", () => {
  const held = (name: string, memMib: number, vcpus: number) => ({ templates: [{ name, memMib, vcpus }] })

  it("a host holding the session's template ranks first among the hosts that fit, over a better fit", () => {
    const hosts = [host("a", 16384, 64, 12288), host("b", 16384, 64, 0, 0, held("py", 1024, 1)), host("c", 16384, 64, 8192)]
    expect(Placement.rank(hosts, { budget: { memMib: 1024, vcpus: 1 }, template: "py" })).toEqual(["b", "a", "c"])
    expect(Placement.rank(hosts, { budget: { memMib: 1024, vcpus: 1 } })).toEqual(["a", "c", "b"])
  })

  it("a template of the same name but another size is no match", () => {
    const hosts = [host("a", 16384, 64, 12288), host("b", 16384, 64, 0, 0, held("py", 2048, 1))]
    expect(Placement.pick(hosts, { budget: { memMib: 1024, vcpus: 1 }, template: "py" })).toBe("a")
  })

  it("a host without the template still takes the session when it is the only fit", () => {
    const hosts = [host("a", 4096, 64, 0), host("b", 16384, 64, 16000, 0, held("py", 1024, 1))]
    expect(Placement.pick(hosts, { budget: { memMib: 1024, vcpus: 1 }, template: "py" })).toBe("a")
  })

  it("affinity still ranks above the template", () => {
    const hosts = [host("a", 16384, 64), host("b", 16384, 64, 0, 0, held("py", 1024, 1))]
    expect(Placement.pick(hosts, { budget: { memMib: 1024, vcpus: 1 }, affinity: ["a"], template: "py" })).toBe("a")
  })

  it("the image's host ranks first among the hosts that fit, before affinity hosts and template holders", () => {
    const hosts = [host("a", 16384, 64), host("b", 16384, 64, 12000), host("c", 16384, 64, 0, 0, held("py", 1024, 1)), host("img", 16384, 64)]
    const budget = { memMib: 1024, vcpus: 1 }
    expect(Placement.rank(hosts, { budget, affinity: ["a"], template: "py", imageHost: "img" })).toEqual(["img", "a", "c", "b"])
    expect(Placement.pick(hosts, { budget, affinity: ["a", "img"], imageHost: "img" })).toBe("img")
    expect(PlacementIndex.Index.of(hosts).pick({ budget, affinity: ["a"], template: "py", imageHost: "img" })).toBe("img")
    expect(Placement.requestOf({ budget, imageHostId: "img" })).toMatchObject({ imageHost: "img", affinity: [] })
  })

  it("an image's host without room, unknown or unmeasured is only a preference: the rest rank as without it", () => {
    const budget = { memMib: 1024, vcpus: 1 }
    const hosts = [host("full", 4096, 64, 4000), host("b", 16384, 64, 12000), host("u", null, null)]
    expect(Placement.rank(hosts, { budget, imageHost: "full" })).toEqual(["b", "u"])
    expect(Placement.rank(hosts, { budget, imageHost: "gone" })).toEqual(["b", "u"])
    expect(Placement.rank(hosts, { budget, imageHost: "u" })).toEqual(["b", "u"])
    expect(PlacementIndex.Index.of(hosts).pick({ budget, imageHost: "full" })).toBe("b")
  })

  it("property: the template never changes whether a session is placed, only where among the hosts that fit", () => {
    fc.assert(
      fc.property(arbFleet, arbTemplateBudget, fc.constantFrom(...templateNames), fc.array(fc.constantFrom(...hostIds), { maxLength: 3 }), (hosts, budget, template, affinity) => {
        const plain = { budget, affinity }
        const withTemplate = { budget, affinity, template }
        // The same hosts fit, in the same number; only the order may differ.
        expect([...Placement.rank(hosts, withTemplate)].sort()).toEqual([...Placement.rank(hosts, plain)].sort())
        expect(Placement.pick(hosts, withTemplate) === null).toBe(Placement.pick(hosts, plain) === null)
        const picked = Placement.pick(hosts, withTemplate)
        if (picked !== null) expect(Placement.rank(hosts, withTemplate)[0]).toBe(picked)
      }),
      { numRuns: 1000 },
    )
  })

  it("property: of two otherwise equal hosts, the one holding the template wins", () => {
    fc.assert(
      fc.property(arbCandidate("x"), fc.constantFrom(...templateSizes), fc.constantFrom(...templateNames), (base, size, template) => {
        const plain: Candidate = { ...base, templates: [] }
        const holder: Candidate = { ...base, id: "y", templates: [{ name: template, ...size }] }
        // "x" wins every tie by id; the template must outrank that.
        const req = { budget: size, template }
        const fits = Placement.fitsOn(plain, size)
        expect(Placement.pick([plain, holder], req)).toBe(fits ? "y" : null)
        expect(new PlacementIndex.Index().pick(req)).toBeNull()
        expect(PlacementIndex.Index.of([plain, holder]).pick(req)).toBe(fits ? "y" : null)
      }),
      { numRuns: 500 },
    )
  })
})

describe("Placement: a host whose agent went silent takes nothing new", () => {
  const windowMs = Limits.defaults.heartbeatStaleWindowMs
  const now = 10_000_000
  // The dead host ranks best (best fit: the least free RAM that fits); the live one is roomier.
  const dead = host("dead", 16384, 64, 12288, 8, { reportedAt: now - windowMs - 1 })
  const live = host("live", 16384, 64, 0, 0, { reportedAt: now })

  it("a silent host is not chosen (pick, rank, choose, the index); without a now, silence is not judged", () => {
    const r = { budget: { memMib: 2048, vcpus: 1 }, now }
    expect(Placement.isSilent(dead, now, Limits.defaults)).toBe(true)
    expect(Placement.pick([dead, live], r)).toBe("live")
    expect(Placement.rank([dead, live], r)).toEqual(["live"])
    expect(Placement.choose([dead, live], r)).toEqual({ _tag: "Chosen", hostId: "live" })
    expect(PlacementIndex.Index.of([dead, live]).pick(r)).toBe("live")
    expect(PlacementIndex.Index.of([dead]).pick(r)).toBeNull()
    expect(PlacementIndex.Index.of([dead]).anyFits(r.budget, now)).toBe(false)
    expect(Placement.pick([dead], r)).toBeNull()
    // Its own affinity does not bring it back.
    expect(Placement.pick([dead, live], { ...r, affinity: ["dead"], imageHost: "dead" })).toBe("live")
    expect(Placement.pick([dead, live], { budget: r.budget })).toBe("dead")
  })

  it("an explicit target that is silent is refused with the reason", () => {
    const chosen = Placement.choose([dead, live], { budget: { memMib: 2048, vcpus: 1 }, now, target: "dead", exclude: "live" })
    expect(chosen).toEqual({ _tag: "NoFit", message: "host dead cannot take the session: silent" })
  })

  it("a host that reports again is chosen again at once", () => {
    const back = { ...dead, reportedAt: now }
    const r = { budget: { memMib: 2048, vcpus: 1 }, now }
    expect(Placement.pick([back, live], r)).toBe("dead")
    const index = PlacementIndex.Index.of([dead, live])
    expect(index.pick(r)).toBe("live")
    index.upsert(back)
    expect(index.pick(r)).toBe("dead")
  })

  it("silence is judged at the pick's now, not when the host was filed", () => {
    const index = PlacementIndex.Index.of([{ ...dead, reportedAt: now }])
    const b = { memMib: 2048, vcpus: 1 }
    expect(index.pick({ budget: b, now })).toBe("dead")
    expect(index.pick({ budget: b, now: now + windowMs + 1 })).toBeNull()
  })

  it("reasonFor says silent; noFit too", () => {
    const b = { memMib: 2048, vcpus: 1 }
    expect(Placement.reasonFor(dead, b, Limits.defaults, now)).toBe("silent")
    expect(Placement.reasonFor(live, b, Limits.defaults, now)).toBe("fits_now")
    expect(Placement.noFit([dead], { budget: b, now }).map((d) => d.reason)).toEqual(["silent"])
    // A cordoned host says cordoned, silent or not.
    expect(Placement.reasonFor({ ...dead, state: "cordoned" }, b, Limits.defaults, now)).toBe("cordoned")
  })

  it("the boundary: a last report exactly the window old is not silent, one ms older is", () => {
    const at = (age: number) => host("h", 16384, 64, 0, 0, { reportedAt: now - age })
    const r = { budget: { memMib: 2048, vcpus: 1 }, now }
    expect(Placement.isSilent(at(windowMs), now, Limits.defaults)).toBe(false)
    expect(Placement.pick([at(windowMs)], r)).toBe("h")
    expect(Placement.isSilent(at(windowMs + 1), now, Limits.defaults)).toBe(true)
    expect(Placement.pick([at(windowMs + 1)], r)).toBeNull()
    expect(Placement.reasonFor(at(windowMs + 1), r.budget, Limits.defaults, now)).toBe("silent")
    // The window is the limits' own.
    expect(Placement.isSilent(at(windowMs + 1), now, { ...Limits.defaults, heartbeatStaleWindowMs: windowMs + 1 })).toBe(false)
  })
})

describe("Placement.fitsReturn: room for a guest the host already holds", () => {
  it("property: fitsOn's room rule without readiness; a cordoned or draining host takes back what fits, never more", () => {
    fc.assert(
      fc.property(arbCandidate("x"), arbBudget, fc.integer({ min: 0, max: 6 }), fc.boolean(), (c, budget, maxEntriesPerNode, requireMeasured) => {
        const limits = { ...Limits.defaults, maxEntriesPerNode, requireMeasured }
        const ready: Candidate = { ...c, state: "ready" }
        // The same answer as a ready host's fitsOn, whatever the state: the one headroom rule (RAM never over-committed, the entries cap).
        expect(Placement.fitsReturn(c, budget, limits)).toBe(Placement.fitsOn(ready, budget, limits))
        if ((c.state ?? "ready") !== "ready") expect(Placement.fitsOn(c, budget, limits)).toBe(false)
        else expect(Placement.fitsReturn(c, budget, limits)).toBe(Placement.fitsOn(c, budget, limits))
        if (Placement.fitsReturn(c, budget, limits)) {
          expect(Headroom.fits(c.headroom, budget)).toBe(true)
          expect(c.entries ?? 0).toBeLessThan(maxEntriesPerNode)
        }
      }),
      { numRuns: 1000 },
    )
  })

  it("a draining or cordoned host with room takes it back; full, at its entries cap or unreported it does not", () => {
    const budget = { memMib: 1024, vcpus: 1 }
    for (const state of ["cordoned", "draining"] as const) {
      expect(Placement.fitsReturn(host("a", 4096, 8, 3072, 0, { state }), budget)).toBe(true)
      expect(Placement.fitsOn(host("a", 4096, 8, 3072, 0, { state }), budget)).toBe(false)
      expect(Placement.fitsReturn(host("a", 4096, 8, 3073, 0, { state }), budget)).toBe(false)
      expect(Placement.fitsReturn(host("a", 4096, 8, 0, 0, { state, entries: Limits.defaults.maxEntriesPerNode }), budget)).toBe(false)
      expect(Placement.fitsReturn(host("a", 4096, 8, 0, 0, { state, reported: false }), budget)).toBe(false)
    }
  })
})
