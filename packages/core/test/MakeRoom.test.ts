import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Downtime, Headroom, Limits, MakeRoom, ParkGate, Placement } from "../src/index.js"
import type { Budget, Candidate, FleetHost, FleetView, Park } from "../src/index.js"

const GiB = 1024
const limits = { ...Limits.defaults, systemReserveMib: 0 }
const budget = (memMib: number, vcpus = 1): Budget => ({ memMib, vcpus })
const host = (id: string, capMib: number, reservedMib: number, parks: Park[] = [], extra: Partial<FleetHost> = {}): FleetHost => ({
  id,
  headroom: { allocatableMib: capMib, cpuBudget: 64, reserved: { memMib: reservedMib, vcpus: 0 } },
  descentsRunning: 0,
  parks,
  entries: 0,
  ...extra,
})
const running = (sessionId: string, memMib: number, residentMib = memMib): MakeRoom.Running => ({ sessionId, budget: budget(memMib, 0), residentMib })

describe("MakeRoom.estimate", () => {
  it("rounds of pre-copy, then the guard's own pre-pause estimate of the final round", () => {
    const costs = { ...MakeRoom.defaultCosts, copyMibPerSec: 1024, dirtyMibPerSec: 64, maxRounds: 2, commitAllowanceMs: 400, maxDowntimeMs: 1000 }
    const e = MakeRoom.estimate(8 * GiB, costs)
    // Round 1: 8 GiB in 8 s (512 MiB dirtied); round 2: 512 MiB in 0.5 s (32 MiB dirtied).
    expect(e.copyMs).toBeCloseTo(8500)
    expect(e.finalMib).toBeCloseTo(32)
    const guard = Downtime.prePauseEstimateMs({ lastDeltaWireBytes: 32 * 1024 * 1024, rateBytesPerMs: (1024 * 1024 * 1024) / 1000, commitAllowanceMs: 400 })
    expect(e.downtimeMs).toBeCloseTo(guard)
    expect(e.allowed).toBe(true)
  })

  it("a guest that dirties faster than the copy is refused by the guard", () => {
    const e = MakeRoom.estimate(8 * GiB, { ...MakeRoom.defaultCosts, copyMibPerSec: 100, dirtyMibPerSec: 200 })
    expect(e.allowed).toBe(false)
    expect(MakeRoom.estimate(1, { ...MakeRoom.defaultCosts, copyMibPerSec: 0 }).allowed).toBe(false)
  })

  it("a move whose pre-copy would outlast maxCopyMs is not allowed (it would be aborted before its point of no return)", () => {
    // 128 GiB at 1 GiB/s: about 136 s of pre-copy, and the guard would let it switch over.
    const unbounded = MakeRoom.estimate(128 * GiB, MakeRoom.defaultCosts)
    expect(unbounded.copyMs).toBeGreaterThan(120_000)
    expect(unbounded.allowed).toBe(true)
    expect(MakeRoom.estimate(128 * GiB, { ...MakeRoom.defaultCosts, maxCopyMs: 60_000 }).allowed).toBe(false)
    expect(MakeRoom.estimate(32 * GiB, { ...MakeRoom.defaultCosts, maxCopyMs: 60_000 }).allowed).toBe(true)
    // So the plan leaves it out: only the sessions that copy in time move.
    const held = host("h0", 256 * GiB, 256 * GiB)
    const costs = { ...MakeRoom.defaultCosts, maxCopyMs: 60_000 }
    const plan = (r: MakeRoom.Running[]) => MakeRoom.plan({ budget: budget(128 * GiB), host: held, running: r, targets: [host("h1", 512 * GiB, 0)], costs, limits })
    expect(plan([running("x", 128 * GiB), running("y", 128 * GiB)])).toBeNull()
    expect(plan([running("x", 128 * GiB), running("a", 32 * GiB), running("b", 32 * GiB), running("c", 32 * GiB), running("d", 32 * GiB)])?.map((m) => m.sessionId).sort()).toEqual(["a", "b", "c", "d"])
  })
})

describe("MakeRoom.plan", () => {
  it("moves the smallest running session that closes the gap, to the tightest target", () => {
    // 64 GiB held host: 8 GiB free, 8 GiB of parks, 48 GiB running. A 32 GiB session needs 16 GiB more.
    const held = host("h0", 64 * GiB, 56 * GiB, [{ sessionId: "p", parkedAt: 1, budget: budget(8 * GiB, 0) }])
    const moves = MakeRoom.plan({
      budget: budget(32 * GiB),
      host: held,
      running: [running("a", 4 * GiB), running("b", 16 * GiB), running("c", 28 * GiB)],
      targets: [host("h1", 64 * GiB, 0), host("h2", 64 * GiB, 40 * GiB)],
      limits,
    })
    expect(moves?.map((m) => [m.sessionId, m.toHostId])).toEqual([["b", "h2"]])
  })

  it("nothing to move when the parks alone make the room; null when moves cannot", () => {
    const held = host("h0", 64 * GiB, 60 * GiB, [{ sessionId: "p", parkedAt: 1, budget: budget(32 * GiB, 0) }])
    expect(MakeRoom.plan({ budget: budget(32 * GiB), host: held, running: [running("a", 28 * GiB)], targets: [host("h1", 64 * GiB, 0)], limits })).toEqual([])
    const full = host("h0", 64 * GiB, 60 * GiB)
    // No target has room for the running session.
    expect(MakeRoom.plan({ budget: budget(32 * GiB), host: full, running: [running("a", 60 * GiB)], targets: [host("h1", 64 * GiB, 8 * GiB)], limits })).toBeNull()
    // Too big for the host even empty.
    expect(MakeRoom.plan({ budget: budget(65 * GiB), host: full, running: [running("a", 60 * GiB)], targets: [host("h1", 128 * GiB, 0)], limits })).toBeNull()
    // The guard would refuse the move: 60 GiB at 1 MiB/s with a busy guest.
    const slow = { ...MakeRoom.defaultCosts, copyMibPerSec: 1, dirtyMibPerSec: 2 }
    expect(MakeRoom.plan({ budget: budget(32 * GiB), host: full, running: [running("a", 60 * GiB)], targets: [host("h1", 64 * GiB, 0)], costs: slow, limits })).toBeNull()
  })

  it("a host that takes no moves (its agent advertises no peer URL) is no target; sessions still move off such a host", () => {
    // 64 GiB held host, 60 GiB running: a 32 GiB session needs a's 28 GiB moved, and h1 is the only room.
    const held = host("h0", 64 * GiB, 60 * GiB)
    const to = (target: FleetHost, from: FleetHost = held) =>
      MakeRoom.plan({ budget: budget(32 * GiB), host: from, running: [running("a", 28 * GiB)], targets: [target], limits })?.map((m) => [m.sessionId, m.toHostId]) ?? null
    expect(to(host("h1", 64 * GiB, 0, [], { takesMoves: false }))).toBeNull()
    expect(to(host("h1", 64 * GiB, 0, [], { takesMoves: true }))).toEqual([["a", "h1"]])
    // Not said: it takes moves (the simulator's and programmatic fleets keep their plans).
    expect(to(host("h1", 64 * GiB, 0))).toEqual([["a", "h1"]])
    // The source's own field does not matter: a host without a URL can still move out.
    expect(to(host("h1", 64 * GiB, 0), { ...held, takesMoves: false })).toEqual([["a", "h1"]])
    // With a choice, the tighter fit that takes no moves is passed over for one that does.
    const both = MakeRoom.plan({
      budget: budget(32 * GiB),
      host: held,
      running: [running("a", 28 * GiB)],
      targets: [host("h1", 64 * GiB, 32 * GiB, [], { takesMoves: false }), host("h2", 64 * GiB, 0)],
      limits,
    })
    expect(both?.map((m) => [m.sessionId, m.toHostId])).toEqual([["a", "h2"]])
  })

  it("drops a move that is not needed once a bigger one was taken", () => {
    // Gap 20 GiB: no single session closes it among a (8) and b (16); largest first (b, gap 4), then a (closes it). Neither can go.
    const held = host("h0", 64 * GiB, 64 * GiB)
    const moves = MakeRoom.plan({ budget: budget(20 * GiB), host: held, running: [running("a", 8 * GiB), running("b", 16 * GiB)], targets: [host("h1", 64 * GiB, 0)], limits })
    expect(moves?.map((m) => m.sessionId).sort()).toEqual(["a", "b"])
    // With c (40) present, c alone closes the gap.
    const one = MakeRoom.plan({
      budget: budget(20 * GiB),
      host: held,
      running: [running("a", 8 * GiB), running("b", 16 * GiB), running("c", 40 * GiB)],
      targets: [host("h1", 64 * GiB, 0)],
      limits,
    })
    expect(one?.map((m) => m.sessionId)).toEqual(["c"])
  })

  const arbInput = fc
    .record({
      cap: fc.integer({ min: 4, max: 32 }),
      parks: fc.array(fc.integer({ min: 1, max: 4 }), { maxLength: 3 }),
      run: fc.array(fc.record({ mem: fc.integer({ min: 1, max: 8 }), resident: fc.integer({ min: 0, max: 64 }) }), { maxLength: 6 }),
      want: fc.integer({ min: 1, max: 32 }),
      free: fc.integer({ min: 0, max: 4 }),
      targets: fc.array(fc.record({ cap: fc.integer({ min: 0, max: 32 }), used: fc.integer({ min: 0, max: 32 }), state: fc.constantFrom("ready", "ready", "cordoned") }), { maxLength: 4 }),
      dirty: fc.integer({ min: 0, max: 2048 }),
    })
    .map((r) => {
      const parks: Park[] = r.parks.map((m, k) => ({ sessionId: `p${k}`, parkedAt: k, budget: budget(m * GiB, 0) }))
      const runs = r.run.map((x, k) => running(`r${k}`, x.mem * GiB, x.resident * 256))
      const reserved = parks.reduce((a, p) => a + p.budget.memMib, 0) + runs.reduce((a, x) => a + x.budget.memMib, 0)
      const cap = Math.max(r.cap * GiB, reserved + r.free * GiB)
      const targets: Candidate[] = r.targets.map((t, k) => ({
        id: `t${k}`,
        headroom: { allocatableMib: t.cap * GiB, cpuBudget: 64, reserved: { memMib: Math.min(t.used, t.cap) * GiB, vcpus: 0 } },
        state: t.state as Placement.HostState,
        entries: 0,
      }))
      return {
        input: { budget: budget(r.want * GiB), host: host("h", cap, reserved, parks), running: runs, targets, costs: { ...MakeRoom.defaultCosts, dirtyMibPerSec: r.dirty }, limits },
      }
    })

  it("property: a plan makes the room, lands every move where it fits, passes the guard, and keeps no move it does not need", () => {
    fc.assert(
      fc.property(arbInput, ({ input }) => {
        const moves = MakeRoom.plan(input)
        if (moves === null) return
        const ids = moves.map((m) => m.sessionId)
        expect(new Set(ids).size).toBe(ids.length)
        const release = (h: FleetHost, b: Budget): FleetHost => ({ ...h, headroom: { ...h.headroom, reserved: Headroom.subtract(h.headroom.reserved, b) } })
        let after = input.host
        for (const p of input.host.parks) after = release(after, p.budget)
        const targets = new Map(input.targets.map((t) => [t.id, t]))
        for (const m of moves) {
          expect(m.fromHostId).toBe("h")
          expect(m.estimate.downtimeMs).toBeLessThanOrEqual(input.costs.maxDowntimeMs)
          expect(input.running.some((r) => r.sessionId === m.sessionId)).toBe(true)
          const t = targets.get(m.toHostId) as Candidate
          expect(t).toBeDefined()
          expect(Placement.fitsOn(t, m.budget, limits)).toBe(true)
          targets.set(t.id, { ...t, headroom: { ...t.headroom, reserved: Headroom.add(t.headroom.reserved, m.budget) }, entries: (t.entries ?? 0) + 1 })
          after = release(after, m.budget)
        }
        expect(Placement.fitsOn(after, input.budget, limits)).toBe(true)
        // Minimal: putting any one move back leaves no room.
        for (const m of moves) {
          const back = { ...after, headroom: { ...after.headroom, reserved: Headroom.add(after.headroom.reserved, m.budget) } }
          expect(Placement.fitsOn(back, input.budget, limits)).toBe(false)
        }
      }),
      { numRuns: 500 },
    )
  })

  it("property: with one empty target as big as the host, a plan exists whenever the guard allows every running session", () => {
    fc.assert(
      fc.property(arbInput, ({ input }) => {
        const big = { id: "big", headroom: { allocatableMib: input.host.headroom.allocatableMib, cpuBudget: 64, reserved: Headroom.zero }, entries: 0 }
        const allAllowed = input.running.every((r) => MakeRoom.estimate(r.residentMib, input.costs).allowed)
        const couldTake = Placement.fitsOn(Placement.emptied(input.host), input.budget, limits)
        if (!allAllowed || !couldTake) return
        expect(MakeRoom.plan({ ...input, targets: [big] })).not.toBeNull()
      }),
      { numRuns: 500 },
    )
  })

  it("roomIsSplit: moves only where the fleet's free RAM (parks counted free) covers the queue", () => {
    const q = (sessionId: string, memMib: number) => ({ sessionId, budget: budget(memMib), queuedAt: 0 })
    const hosts = [host("a", 64 * GiB, 40 * GiB, [{ sessionId: "p", parkedAt: 1, budget: budget(8 * GiB, 0) }]), host("b", 64 * GiB, 32 * GiB)]
    // Free: 24 + 8 (the park) + 32 = 64 GiB.
    expect(MakeRoom.roomIsSplit({ hosts, queue: [q("x", 48 * GiB), q("y", 16 * GiB)] }, limits)).toBe(true)
    expect(MakeRoom.roomIsSplit({ hosts, queue: [q("x", 48 * GiB), q("y", 17 * GiB)] }, limits)).toBe(false)
    // A session no host could take does not count; a cordoned host's room does not either.
    expect(MakeRoom.roomIsSplit({ hosts, queue: [q("x", 48 * GiB), q("giant", 100 * GiB)] }, limits)).toBe(true)
    expect(MakeRoom.roomIsSplit({ hosts: [hosts[0] as FleetHost, { ...(hosts[1] as FleetHost), state: "cordoned" }], queue: [q("x", 48 * GiB)] }, limits)).toBe(false)
  })
})

describe("MakeRoom.forHolds", () => {
  const q = (sessionId: string, memMib: number, queuedAt = 0) => ({ sessionId, budget: budget(memMib), queuedAt })
  const starving = (sessionId: string, hostId: string): ParkGate.Hold => ({ sessionId, hostId, reason: "starving" })
  // h1 held for a 48 GiB session: 24 GiB free, five 8 GiB sessions running; h0 16 GiB free, h2 24 GiB.
  const fleet = (h0FreeGiB = 16, h2FreeGiB = 24): FleetView => ({
    hosts: [host("h0", 64 * GiB, (64 - h0FreeGiB) * GiB), host("h1", 64 * GiB, 40 * GiB), host("h2", 64 * GiB, (64 - h2FreeGiB) * GiB)],
    queue: [q("big", 48 * GiB)],
  })
  const onH1 = new Map([["h1", ["s1", "s2", "s3", "s4", "s5"].map((id) => running(id, 8 * GiB))]])
  const input = (over: Partial<MakeRoom.HoldsInput> = {}): MakeRoom.HoldsInput => ({
    fleet: fleet(),
    holds: [starving("big", "h1")],
    running: onH1,
    movingFrom: new Set(),
    now: 0,
    gate: ParkGate.defaultOptions,
    maxMoves: 4,
    limits,
    ...over,
  })
  const pairs = (moves: readonly MakeRoom.Planned[]) => moves.map((m) => [m.sessionId, m.fromHostId, m.toHostId])

  it("a starving session's held host full of small running sessions: the moves that make its room, best fit first", () => {
    // Gap 24 GiB: no one session closes it, so the largest (ties by id, the last) until one does; h0 fits tightest.
    expect(pairs(MakeRoom.forHolds(input()))).toEqual([
      ["s5", "h1", "h0"],
      ["s4", "h1", "h0"],
      ["s1", "h1", "h2"],
    ])
  })

  it("none while the room is not split, on a host with a move or a descent running, or for a hold that is not starving", () => {
    expect(MakeRoom.forHolds(input({ fleet: fleet(0, 16) }))).toEqual([])
    expect(MakeRoom.forHolds(input({ movingFrom: new Set(["h1"]) }))).toEqual([])
    const descending = fleet()
    expect(MakeRoom.forHolds(input({ fleet: { ...descending, hosts: descending.hosts.map((h) => (h.id === "h1" ? { ...h, descentsRunning: 1 } : h)) } }))).toEqual([])
    expect(MakeRoom.forHolds(input({ holds: [{ sessionId: "big", hostId: "h1", reason: "fit" }] }))).toEqual([])
  })

  it("a session whose move aborted is not planned to move, to any target, until its cooldown has passed", () => {
    const aborted = [{ sessionId: "s5", targetHostId: "h0", endedAt: 1000 }]
    // The room is still made, by the others.
    expect(pairs(MakeRoom.forHolds(input({ aborted, now: 1000 + MakeRoom.defaultCooldownMs - 1 })))).toEqual([
      ["s4", "h1", "h0"],
      ["s3", "h1", "h0"],
      ["s1", "h1", "h2"],
    ])
    expect(pairs(MakeRoom.forHolds(input({ aborted, now: 1000 + MakeRoom.defaultCooldownMs })))).toEqual(pairs(MakeRoom.forHolds(input())))
    expect(pairs(MakeRoom.forHolds(input({ aborted, now: 2000, cooldownMs: 1000 })))).toEqual(pairs(MakeRoom.forHolds(input())))
    expect(MakeRoom.cooling(aborted, 1999, 1000)).toEqual(aborted)
    expect(MakeRoom.cooling(aborted, 2000, 1000)).toEqual([])
  })

  it("a target whose pair's learned allowance alone passes the downtime budget takes no move; the prior elsewhere", () => {
    const allowanceMs = new Map([["h1", new Map([["h0", MakeRoom.defaultCosts.maxDowntimeMs + 1]])]])
    const moves = MakeRoom.forHolds(input({ allowanceMs }))
    expect(pairs(moves)).toEqual([
      ["s5", "h1", "h2"],
      ["s4", "h1", "h2"],
      ["s1", "h1", "h2"],
    ])
    expect(moves.every((m) => m.estimate.allowed && m.estimate.downtimeMs === MakeRoom.estimate(8 * GiB, MakeRoom.defaultCosts).downtimeMs)).toBe(true)
    // A learned allowance under the budget is planned on: the estimate carries it.
    const fast = MakeRoom.forHolds(input({ allowanceMs: new Map([["h1", new Map([["h0", 50]])]]) }))
    expect(pairs(fast)).toEqual(pairs(MakeRoom.forHolds(input())))
    const toH0 = fast.find((m) => m.toHostId === "h0")
    expect(toH0?.estimate.downtimeMs).toBe(MakeRoom.estimate(8 * GiB, { ...MakeRoom.defaultCosts, commitAllowanceMs: 50 }).downtimeMs)
  })

  it("moves land on no host that takes no moves: the room is made through the others", () => {
    const fl = fleet()
    const noUrl = { ...fl, hosts: fl.hosts.map((h) => (h.id === "h0" ? { ...h, takesMoves: false } : h)) }
    expect(pairs(MakeRoom.forHolds(input({ fleet: noUrl })))).toEqual([
      ["s5", "h1", "h2"],
      ["s4", "h1", "h2"],
      ["s1", "h1", "h2"],
    ])
    // No host but the held one takes moves: none planned.
    const none = { ...fl, hosts: fl.hosts.map((h) => (h.id === "h1" ? h : { ...h, takesMoves: false })) }
    expect(MakeRoom.forHolds(input({ fleet: none }))).toEqual([])
  })

  it("moves land on no host claimed for another starving session, though it holds none", () => {
    // big (48 GiB) and big2 (40) starve; big is held on h1. Claims: big h1 (24 free, ties by id), big2 h2.
    const fl: FleetView = {
      hosts: [host("h0", 64 * GiB, 48 * GiB), host("h1", 64 * GiB, 40 * GiB), host("h2", 64 * GiB, 40 * GiB), host("h3", 64 * GiB, 40 * GiB)],
      queue: [q("big", 48 * GiB), q("big2", 40 * GiB)],
    }
    const now = ParkGate.defaultOptions.starvationLimitMs
    expect([...ParkGate.claimedHosts(fl, now, limits, ParkGate.defaultOptions)].map(([s, h]) => [s, h.id])).toEqual([
      ["big", "h1"],
      ["big2", "h2"],
    ])
    // h2 (tied with h3, first by id) would take the third move without the claim.
    expect(pairs(MakeRoom.forHolds(input({ fleet: fl, now })))).toEqual([
      ["s5", "h1", "h0"],
      ["s4", "h1", "h0"],
      ["s1", "h1", "h3"],
    ])
  })

  it("at most maxMoves a pass: the first of the plan now, the rest once those end", () => {
    expect(pairs(MakeRoom.forHolds(input({ maxMoves: 2 })))).toEqual([
      ["s5", "h1", "h0"],
      ["s4", "h1", "h0"],
    ])
    expect(MakeRoom.forHolds(input({ maxMoves: 0 }))).toEqual([])
  })

  it("moves land on no host held for another session, and a later hold's plan sees the earlier moves' targets reserved", () => {
    // A second 48 GiB session is held on h0: its host is off limits to the first's moves.
    const two: FleetView = {
      hosts: [host("h0", 64 * GiB, 40 * GiB), host("h1", 64 * GiB, 40 * GiB), host("h2", 64 * GiB, 16 * GiB), host("h3", 64 * GiB, 40 * GiB)],
      queue: [q("big", 48 * GiB), q("big2", 48 * GiB)],
    }
    const runs = new Map([
      ["h1", ["s1", "s2", "s3", "s4", "s5"].map((id) => running(id, 8 * GiB))],
      ["h0", ["t1", "t2", "t3", "t4", "t5"].map((id) => running(id, 8 * GiB))],
    ])
    const moves = MakeRoom.forHolds(input({ fleet: two, holds: [starving("big", "h1"), starving("big2", "h0")], running: runs, maxMoves: 10 }))
    expect(moves.every((m) => m.toHostId !== "h0" && m.toHostId !== "h1")).toBe(true)
    // h2 has 48 GiB free, h3 24: the first session's moves fill h3 (tightest), the second's then go to h2.
    const into = new Map<string, number>()
    for (const m of moves) into.set(m.toHostId, (into.get(m.toHostId) ?? 0) + m.budget.memMib)
    expect((into.get("h2") ?? 0) <= 48 * GiB && (into.get("h3") ?? 0) <= 24 * GiB).toBe(true)
    expect(pairs(moves)).toEqual([
      ["s5", "h1", "h3"],
      ["s4", "h1", "h3"],
      ["s1", "h1", "h3"],
      ["t5", "h0", "h2"],
      ["t4", "h0", "h2"],
      ["t1", "h0", "h2"],
    ])
  })
})
