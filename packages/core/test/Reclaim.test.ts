import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Ledger, Limits, Plan, Reclaim, Session } from "../src/index.js"
import type { LedgerEntry , Move} from "../src/index.js"

const windowMs = Limits.defaults.heartbeatStaleWindowMs
const now = 10 * windowMs
const stale = 0
const fresh = now

const entry = (id: string, ownerKind: LedgerEntry["ownerKind"], ownerId: string, beat: number, hostId = "h1"): LedgerEntry => ({
  id,
  hostId,
  ownerKind,
  ownerId,
  memMib: 1024,
  vcpus: 1,
  vramMib: null,
  createdAt: 0,
  lastHeartbeatAt: beat,
  expiresAt: null,
  description: null,
})

const session = (id: string, state: Session.State, reservationId: string | null, hostId: string | null = "h1"): Session.Record => ({
  id,
  state,
  budget: { memMib: 1024, vcpus: 1 },
  affinity: [],
  hostId,
  reservationId,
  queuedAt: null,
  parkedAt: state === "parked" ? 5 : null,
  idleTimeoutMs: null,
  lastActiveAt: 0,
  endsAt: null,
  template: null,
  imageHostId: null,
  createdAt: 0,
  updatedAt: 0,
})

const move = (id: string, sessionId: string, reservationId: string): Move.Record => ({
  id,
  sessionId,
  sourceHostId: "h1",
  targetHostId: "h2",
  reservationId,
  maxDowntimeMs: 600,
  state: "pending",
  rounds: [],
  phases: null,
  abortReason: null,
  abortEstimateMs: null,
  guard: null,
  resendOwed: false,
  createdAt: 0,
  endedAt: null,
})

/** A decided pass in the shape the cases read: the plan's removals by how they count, its records, its events. */
const decide = (input: Reclaim.Input, t: number) => {
  const d = Reclaim.decide(input, t)
  const removals = d.plan.ledger.flatMap((c) => (c._tag === "Release" ? [c] : []))
  // Every reclaimed entry leaves the ledger in the plan, counted as reclaimed; nothing else is reserved or handed over.
  expect(removals.filter((c) => c.how === "reclaimed").map((c) => c.id).sort()).toStrictEqual(d.reclaimed.map((e) => e.id))
  expect(d.plan.ledger.length).toBe(removals.length)
  return {
    reclaimed: d.reclaimed,
    released: removals.filter((c) => c.how === "released").map((c) => c.id),
    lostSessions: d.lostSessions,
    sessions: d.plan.sessions.map((w) => w.record),
    moves: d.plan.moves.map((m) => m.move),
    events: d.plan.events,
  }
}

/** A pass that takes only expired entries (the failover grace's). */
const decide2 = (input: Reclaim.Input) => Reclaim.decide(input, now, Limits.defaults, { stale: false })

describe("the reclaim pass", () => {
  it("a stale session reservation makes its session lost, holding nothing", () => {
    const plan = decide(
      { entries: [entry("r1", "session", "s1", stale), entry("x1", "external", "ops", fresh)], sessions: [session("s1", "parked", "r1")], openMoves: [] },
      now,
    )
    expect(plan.reclaimed.map((e) => e.id)).toStrictEqual(["r1"])
    expect(plan.released).toStrictEqual([])
    expect(plan.lostSessions).toStrictEqual(["s1"])
    expect(plan.sessions).toStrictEqual([{ ...session("s1", "lost", null, null), parkedAt: null, updatedAt: now }])
    expect(plan.events).toStrictEqual([{ sessionId: "s1", event: { _tag: "Lost", hostId: "h1" } }])
  })

  it("a session reclaimed while moving is lost, its move closes and the move's fresh target is released", () => {
    const plan = decide(
      {
        entries: [entry("r1", "session", "s1", stale), entry("t1", "move", "m1", fresh, "h2")],
        sessions: [session("s1", "moving", "r1")],
        openMoves: [move("m1", "s1", "t1")],
      },
      now,
    )
    expect(plan.reclaimed.map((e) => e.id)).toStrictEqual(["r1"])
    expect(plan.released).toStrictEqual(["t1"])
    expect(plan.lostSessions).toStrictEqual(["s1"])
    expect(plan.moves).toStrictEqual([{ ...move("m1", "s1", "t1"), state: "aborted", abortReason: Session.lostReason, endedAt: now }])
  })

  it("a reclaimed move target closes the move and the session runs on its source again", () => {
    const plan = decide(
      {
        entries: [entry("r1", "session", "s1", fresh), entry("t1", "move", "m1", stale, "h2")],
        sessions: [session("s1", "moving", "r1")],
        openMoves: [move("m1", "s1", "t1")],
      },
      now,
    )
    expect(plan.reclaimed.map((e) => e.id)).toStrictEqual(["t1"])
    expect(plan.lostSessions).toStrictEqual([])
    expect(plan.sessions).toStrictEqual([{ ...session("s1", "running", "r1"), lastActiveAt: now, updatedAt: now }])
    expect(plan.moves.map((m) => [m.state, m.abortReason])).toStrictEqual([["aborted", Session.targetLostReason]])
  })

  it("when both of a moving session's entries are stale it ends lost whichever entry id sorts first; the first decides the move's reason", () => {
    for (const [own, target, reason] of [
      ["a-own", "b-target", Session.lostReason],
      ["b-own", "a-target", Session.targetLostReason],
    ] as const) {
      const plan = decide(
        {
          entries: [entry(own, "session", "s1", stale), entry(target, "move", "m1", stale, "h2")],
          sessions: [session("s1", "moving", own)],
          openMoves: [move("m1", "s1", target)],
        },
        now,
      )
      expect(plan.reclaimed.map((e) => e.id)).toStrictEqual([own, target].sort())
      expect(plan.released).toStrictEqual([])
      expect(plan.lostSessions).toStrictEqual(["s1"])
      expect(plan.sessions.map((s) => [s.state, s.hostId, s.reservationId])).toStrictEqual([["lost", null, null]])
      expect(plan.moves.map((m) => m.abortReason)).toStrictEqual([reason])
    }
  })

  it("an entry a session no longer holds is reclaimed without touching the session", () => {
    const plan = decide({ entries: [entry("old", "session", "s1", stale)], sessions: [session("s1", "running", "new")], openMoves: [] }, now)
    expect(plan.reclaimed.map((e) => e.id)).toStrictEqual(["old"])
    expect(plan.sessions).toStrictEqual([])
  })

  it("stale false (the failover grace): only expired entries go; a stale one and its session stay; a session whose entry expired is lost as by default", () => {
    const expired = { ...entry("e-exp", "session", "s-exp", fresh), expiresAt: now - 1 }
    const input: Reclaim.Input = {
      entries: [expired, entry("e-stale", "session", "s-stale", stale), entry("x-stale", "external", "ops", stale)],
      sessions: [session("s-exp", "running", "e-exp"), session("s-stale", "running", "e-stale")],
      openMoves: [],
    }
    const only = Reclaim.decide(input, now, Limits.defaults, { stale: false })
    expect(only.reclaimed.map((e) => e.id)).toStrictEqual(["e-exp"])
    expect(only.lostSessions).toStrictEqual(["s-exp"])
    expect(only.plan.sessions.map((w) => [w.record.id, w.record.state])).toStrictEqual([["s-exp", "lost"]])
    // The default (and stale true) takes both kinds.
    for (const options of [undefined, { stale: true }])
      expect(Reclaim.decide(input, now, Limits.defaults, options).reclaimed.map((e) => e.id)).toStrictEqual(["e-exp", "e-stale", "x-stale"])
    expect([Ledger.isReclaimable(expired, now, Limits.defaults, { stale: false }), Ledger.isReclaimable(entry("s", "external", "ops", stale), now, Limits.defaults, { stale: false })]).toStrictEqual([true, false])
  })

  it("stale false: a session lost for an expired entry releases its move's stale target, not counted as reclaimed", () => {
    const own = { ...entry("e1", "session", "s1", fresh), expiresAt: now - 1 }
    const d = decide2({ entries: [own, entry("t1", "move", "m1", stale, "h2")], sessions: [session("s1", "moving", "e1")], openMoves: [move("m1", "s1", "t1")] })
    expect(d.reclaimed.map((e) => e.id)).toStrictEqual(["e1"])
    expect(d.plan.ledger.map((c) => (c._tag === "Release" ? [c.id, c.how] : null))).toStrictEqual([
      ["e1", "reclaimed"],
      ["t1", "released"],
    ])
  })

  it("property: removes exactly the reclaimable entries plus the fresh targets of lost sessions' moves", () => {
    // A consistent store: each session holds its own entry, a moving one has an open move with a target entry.
    const arbStore = fc.array(
      fc.record({
        state: fc.constantFrom<Session.State>("pending", "running", "parked", "descending", "moving", "queued", "descended"),
        ownStale: fc.boolean(),
        targetStale: fc.boolean(),
      }),
      { maxLength: 12 },
    )
    fc.assert(
      fc.property(arbStore, fc.array(fc.boolean(), { maxLength: 5 }), (specs, externals) => {
        const entries: LedgerEntry[] = []
        const sessions: Session.Record[] = []
        const moves: Move.Record[] = []
        specs.forEach((x, i) => {
          const holds = Session.holdsReservation(x.state)
          sessions.push(session(`s${i}`, x.state, holds ? `e${i}` : null, holds ? "h1" : null))
          if (holds) entries.push(entry(`e${i}`, "session", `s${i}`, x.ownStale ? stale : fresh))
          if (x.state === "moving") {
            moves.push(move(`m${i}`, `s${i}`, `t${i}`))
            entries.push(entry(`t${i}`, "move", `m${i}`, x.targetStale ? stale : fresh, "h2"))
          }
        })
        externals.forEach((s, i) => entries.push(entry(`x${i}`, "external", "ops", s ? stale : fresh)))
        const plan = decide({ entries, sessions, openMoves: moves }, now)
        const reclaimable = Ledger.reclaimable(entries, now).map((e) => e.id).sort()
        expect(plan.reclaimed.map((e) => e.id)).toStrictEqual(reclaimable)
        const lost = specs.flatMap((x, i) => (Session.holdsReservation(x.state) && x.ownStale ? [`s${i}`] : []))
        expect(plan.lostSessions).toStrictEqual(lost.sort())
        const cascade = specs.flatMap((x, i) => (x.state === "moving" && x.ownStale && !x.targetStale ? [`t${i}`] : []))
        expect([...plan.released].sort()).toStrictEqual(cascade.sort())
        // Every move with a reclaimed entry of its own or of its session closes; the others stay open.
        const closing = specs.flatMap((x, i) => (x.state === "moving" && (x.ownStale || x.targetStale) ? [`m${i}`] : []))
        expect(plan.moves.map((m) => m.id)).toStrictEqual(closing.sort())
        // Sessions that only lost their move target run again on their source.
        for (const s of plan.sessions) expect(s.state).toBe(lost.includes(s.id) ? "lost" : "running")
      }),
      { numRuns: 1000 },
    )
  })
})

describe("Reclaim grace (the failover grace)", () => {
  const graceMs = 120_000
  const gapMs = 40_000
  /** The grace after successful reads at these times, from a new leadership. */
  const after = (times: readonly number[]) => times.reduce((g, now) => Reclaim.graceAfterContact(g, now, gapMs).grace, Reclaim.graceRestart)

  it("holds until a leadership's first read starts it, then for graceMs from that read while reads come without a gap", () => {
    expect(Reclaim.graceHolds(Reclaim.graceRestart, 0, graceMs)).toBe(true)
    const first = Reclaim.graceAfterContact(Reclaim.graceRestart, 1000, gapMs)
    expect(first).toEqual({ grace: { startedAt: 1000, lastContactAt: 1000 }, started: true })
    // Reads every 5 s keep it (counted from the first), and it ends graceMs after it.
    const steady = after(Array.from({ length: 30 }, (_, k) => 1000 + k * 5000))
    expect(steady.startedAt).toBe(1000)
    expect([Reclaim.graceHolds(steady, 1000 + graceMs - 1, graceMs), Reclaim.graceHolds(steady, 1000 + graceMs, graceMs)]).toEqual([true, false])
    expect(Reclaim.graceEnds(steady, graceMs)).toBe(1000 + graceMs)
  })

  it("a gap of more than gapMs between reads starts it again: a frozen process, an outage of failed reads, a forward clock step", () => {
    const long = after(Array.from({ length: 60 }, (_, k) => k * 5000)) // 295 s of passes: the grace is over
    expect(Reclaim.graceHolds(long, 295_000, graceMs)).toBe(false)
    // Frozen for 3 minutes: the first read after it starts a new grace.
    const thawed = Reclaim.graceAfterContact(long, 295_000 + 180_000, gapMs)
    expect(thawed.started).toBe(true)
    expect(Reclaim.graceHolds(thawed.grace, 475_000 + graceMs - 1, graceMs)).toBe(true)
    // A pause of exactly gapMs is not a gap.
    expect(Reclaim.graceAfterContact(long, 295_000 + gapMs, gapMs).started).toBe(false)
  })

  it("a backward clock step past gapMs starts it again from the new time, never stretched by the step; a small one does not", () => {
    const long = after(Array.from({ length: 60 }, (_, k) => 10_000_000 + k * 5000))
    const stepped = Reclaim.graceAfterContact(long, 10_000_000 - 3 * 3_600_000, gapMs)
    expect(stepped.started).toBe(true)
    expect(Reclaim.graceEnds(stepped.grace, graceMs)).toBe(10_000_000 - 3 * 3_600_000 + graceMs)
    // An NTP step of a second back: no restart (the grace stays ended).
    const small = Reclaim.graceAfterContact(long, 10_000_000 + 59 * 5000 - 1000, gapMs)
    expect(small.started).toBe(false)
    expect(Reclaim.graceHolds(small.grace, 10_000_000 + 59 * 5000 - 1000, graceMs)).toBe(false)
  })

  it("every store call that succeeds is a contact: a long pass of calls is no gap; one call (or a freeze) longer than gapMs is", () => {
    const g = after([0, 5000])
    // A 55 s pass whose calls succeed every 10 s: no gap, the grace goes on from 0.
    const calls = [15_000, 25_000, 35_000, 45_000, 55_000, 60_000].reduce((x, now) => Reclaim.graceAfterContact(x, now, gapMs).grace, g)
    expect(calls.startedAt).toBe(0)
    expect(Reclaim.graceAfterContact(calls, 65_000, gapMs).started).toBe(false)
    // The same pass frozen 55 s inside one call: its return is a gap.
    const hung = Reclaim.graceAfterContact(g, 60_000, gapMs)
    expect(hung).toEqual({ grace: { startedAt: 60_000, lastContactAt: 60_000 }, started: true })
    // A check is no contact: it moves nothing when there is no gap.
    expect(Reclaim.graceCheck(g, 30_000, gapMs)).toEqual({ grace: g, started: false })
  })

  it("failed reads now and then restart nothing: reads a minute apart at most… the grace ends and stays ended", () => {
    // Reads every 5 s with one 20 s hole a minute (failed reads in between): never a gap.
    const times: number[] = []
    for (let t = 0; t < 3_600_000; t += 5000) if (t % 60_000 < 40_000 || t % 60_000 >= 55_000) times.push(t)
    const g = after(times)
    expect(g.startedAt).toBe(0)
    expect(Reclaim.graceHolds(g, 3_600_000, graceMs)).toBe(false)
  })

  it("a check (right before a stale reclaim, at a pass's end): a gap since the last contact (a freeze mid-pass) starts it again; none keeps it as it is", () => {
    const long = after(Array.from({ length: 60 }, (_, k) => k * 5000)) // the grace is over; last read at 295 s
    expect(Reclaim.graceCheck(long, 295_000 + gapMs, gapMs)).toEqual({ grace: long, started: false })
    const frozen = Reclaim.graceCheck(long, 295_000 + 180_000, gapMs)
    expect(frozen).toEqual({ grace: { startedAt: 475_000, lastContactAt: 475_000 }, started: true })
    expect(Reclaim.graceHolds(frozen.grace, 475_000, graceMs)).toBe(true)
    // The clock stepped back past gapMs mid-pass: started again too.
    expect(Reclaim.graceCheck(long, 295_000 - gapMs - 1, gapMs).started).toBe(true)
    // The next pass's read after the restart is no second gap.
    expect(Reclaim.graceAfterContact(frozen.grace, 480_000, gapMs).started).toBe(false)
  })

  it("graceMs 0: never holds; graceGapMs is a third of the stale window (not of the grace), at least two reaper intervals", () => {
    expect(Reclaim.graceHolds(Reclaim.graceRestart, 1000, 0)).toBe(false)
    expect(Reclaim.graceGapMs(120_000, 5000)).toBe(40_000)
    expect(Reclaim.graceGapMs(120_000)).toBe(40_000)
    expect(Reclaim.graceGapMs(4000, 500)).toBe(1333)
    expect(Reclaim.graceGapMs(120_000, 30_000)).toBe(60_000)
    // The shortest grace worth having: the agents' heartbeat interval.
    expect([Reclaim.minGraceMs(120_000), Reclaim.minGraceMs(4000)]).toEqual([40_000, 1333])
  })
})

describe("a reclaimed session goes back to the source of a move committed without its phases whose source owes a resend", () => {
  const moved = (from: string, to: string, phases: Move.Phases | null = null): Session.Event => ({ _tag: "Moved", moveId: `m-${from}`, fromHostId: from, toHostId: to, phases })
  /** Source `src` with room for `roomMib` more, heard at `reportedAt`. */
  const source = (roomMib: number, reportedAt: number | null = now) => ({
    id: "src",
    headroom: { allocatableMib: 4096, cpuBudget: 32, reserved: { memMib: 4096 - roomMib, vcpus: 0 } },
    reportedAt,
  })
  /** The move `moved` names, marked (or not) by its source as owing a resend. */
  const owed = (resendOwed = true, from = "src") => ({ id: `m-${from}`, resendOwed })
  const way = (sessionId: string, roomMib: number, lastEvent = moved("src", "h1"), reportedAt: number | null = now, lastMove = owed()): Reclaim.Way => ({
    sessionId,
    lastEvent,
    lastMove,
    source: source(roomMib, reportedAt),
    version: 7,
    reservationId: `back-${sessionId}`,
  })
  const decide = (ways: readonly Reclaim.Way[], sessions = [session("s1", "running", "e1"), session("s2", "running", "e2")]) =>
    Reclaim.decide({ entries: [entry("e1", "session", "s1", stale), entry("e2", "session", "s2", stale)], sessions, openMoves: [], ways }, now)

  it("goes back while the source is heard and has room; two never share the last room there", () => {
    const d = decide([way("s1", 1024), way("s2", 1024)])
    expect(d.returned.map((r) => [r.sessionId, r.hostId])).toStrictEqual([["s1", "src"]])
    expect(d.lostSessions).toStrictEqual(["s2"])
    expect(d.reclaimed.map((e) => e.id)).toStrictEqual(["e1", "e2"])
    const back = d.returned[0]!.plan
    expect(back.host).toStrictEqual({ hostId: "src", version: 7 })
    expect(back.sessions.map((w) => [w.record.state, w.record.hostId, w.record.reservationId, w.from])).toStrictEqual([["running", "src", "back-s1", "running"]])
    // The pass's own plan releases both reclaimed entries; the way back only reserves on the source.
    expect(d.plan.ledger.map((c) => [c._tag, c._tag === "Release" ? c.how : null, c._tag === "Release" ? c.id : null])).toStrictEqual([
      ["Release", "reclaimed", "e1"],
      ["Release", "reclaimed", "e2"],
    ])
    expect(d.plan.sessions.map((w) => w.record.id)).toStrictEqual(["s2"])
  })

  it("ends lost when the source is silent, unreported, full, the commit had phases, or something happened since", () => {
    const one = (w: Reclaim.Way) => decide([w], [session("s1", "running", "e1")])
    expect(one(way("s1", 1024, moved("src", "h1"), now - windowMs - 1)).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 1024, moved("src", "h1"), null)).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 512)).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 1024, moved("src", "h1", { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 }))).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 1024, { _tag: "Parked", hostId: "h1" })).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 1024, moved("elsewhere", "h1"))).lostSessions).toStrictEqual(["s1"])
    expect(one(way("s1", 1024)).returned.map((r) => r.sessionId)).toStrictEqual(["s1"])
  })

  it("ends lost when the source never declared a resend: the target's own resolution commit (it ran the guest), a mark cleared, or another move's mark", () => {
    const one = (w: Reclaim.Way) => decide([w], [session("s1", "running", "e1")])
    // The target resolved the move itself ("I run the guest"): no phases either, but no resend owed.
    const resolvedByTarget = one(way("s1", 1024, moved("src", "h1"), now, owed(false)))
    expect(resolvedByTarget.lostSessions).toStrictEqual(["s1"])
    expect(resolvedByTarget.returned).toStrictEqual([])
    expect(one(way("s1", 1024, moved("src", "h1"), now, { id: "m-other", resendOwed: true })).lostSessions).toStrictEqual(["s1"])
    const s = session("s1", "running", "e1")
    const e = { id: "e1", hostId: "h1" }
    expect(Reclaim.wayBackOf(s, e, moved("src", "h1"), undefined)).toBeNull()
    expect(Reclaim.wayBackOf(s, e, moved("src", "h1"), owed(false))).toBeNull()
    expect(Reclaim.wayBackOf(s, e, moved("src", "h1"), owed())).toBe("src")
  })

  it("is held, not lost, while the pass releases an entry on the source for another session (a lost session's move to it): the group would be refused whole", () => {
    // s2 was moving from hx (now dead: its entry stale) to src; its loss releases the move's entry on src.
    const m2: Move.Record = { ...move("m2", "s2", "me2"), sourceHostId: "hx", targetHostId: "src" }
    const d = Reclaim.decide(
      {
        entries: [entry("e1", "session", "s1", stale), entry("e2", "session", "s2", stale, "hx")],
        sessions: [session("s1", "running", "e1"), session("s2", "moving", "e2", "hx")],
        openMoves: [m2],
        ways: [way("s1", 4096)],
      },
      now,
    )
    expect(d.lostSessions).toStrictEqual(["s2"])
    expect(d.plan.ledger.flatMap((c) => (c._tag === "Release" ? [[c.id, c.hostId]] : []))).toContainEqual(["me2", "src"])
    expect(d.returned).toStrictEqual([])
    expect(d.held.map((e) => e.id)).toStrictEqual(["e1"])
    expect(d.reclaimed.map((e) => e.id)).toStrictEqual(["e2"])
    // The group a store applies is one it accepts.
    expect(Plan.checkGroup([d.plan, ...d.returned.map((r) => r.plan)])).toBeNull()
    // The next pass, the release written (the move closed, s2 lost): s1 goes back.
    const next = Reclaim.decide({ entries: [entry("e1", "session", "s1", stale)], sessions: [session("s1", "running", "e1")], openMoves: [], ways: [way("s1", 4096)] }, now)
    expect(next.returned.map((r) => r.sessionId)).toStrictEqual(["s1"])
  })

  it("goes back to a cordoned or draining source too (the guest is already there: no new placement), heard and with room", () => {
    const one = (w: Reclaim.Way) => decide([w], [session("s1", "running", "e1")])
    for (const state of ["cordoned", "draining"] as const) {
      const d = one({ ...way("s1", 1024), source: { ...source(1024), state } })
      expect(d.returned.map((r) => [r.sessionId, r.hostId])).toStrictEqual([["s1", "src"]])
      expect(d.lostSessions).toStrictEqual([])
      expect(d.returned[0]!.plan.host).toStrictEqual({ hostId: "src", version: 7 })
      // Silent, full, or at its entries cap: lost, as a ready source would be.
      expect(one({ ...way("s1", 1024, moved("src", "h1"), now - windowMs - 1), source: { ...source(1024, now - windowMs - 1), state } }).lostSessions).toStrictEqual(["s1"])
      expect(one({ ...way("s1", 512), source: { ...source(512), state } }).lostSessions).toStrictEqual(["s1"])
      expect(one({ ...way("s1", 1024), source: { ...source(1024), state, entries: Limits.defaults.maxEntriesPerNode } }).lostSessions).toStrictEqual(["s1"])
    }
  })

  it("property: goes back exactly when the source is heard, reported, under its entries cap and has the room, whatever its state; two never share its last room", () => {
    const cap = Limits.defaults.maxEntriesPerNode
    fc.assert(
      fc.property(
        fc.constantFrom("ready" as const, "cordoned" as const, "draining" as const),
        fc.integer({ min: 0, max: 4096 }),
        fc.constantFrom<number | null>(now, now - windowMs, now - windowMs - 1, null),
        fc.integer({ min: cap - 2, max: cap }),
        fc.boolean(),
        (state, roomMib, reportedAt, entries, both) => {
          const src = { ...source(roomMib, reportedAt), state, entries }
          const ways = both ? [{ ...way("s1", roomMib), source: src }, { ...way("s2", roomMib), source: src }] : [{ ...way("s1", roomMib), source: src }]
          const d = decide(ways, both ? undefined : [session("s1", "running", "e1")])
          const heard = reportedAt !== null && now - reportedAt <= windowMs
          // Each return takes 1024 MiB and one entry on the source: as many go back as fit.
          const fit = heard ? Math.min(Math.floor(roomMib / 1024), cap - entries, ways.length) : 0
          const back = ways.slice(0, Math.max(0, fit)).map((w) => w.sessionId)
          expect(d.returned.map((r) => r.sessionId)).toStrictEqual(back)
          expect(d.returned.every((r) => r.hostId === "src")).toBe(true)
          expect(d.lostSessions).toStrictEqual(ways.map((w) => w.sessionId).filter((id) => !back.includes(id)))
          expect(Plan.checkGroup([d.plan, ...d.returned.map((r) => r.plan)])).toBeNull()
        },
      ),
    )
  })

  it("is held, not lost, while the source's own entries are reclaimed in the same pass", () => {
    const d = Reclaim.decide(
      { entries: [entry("e1", "session", "s1", stale), entry("x", "external", "op", stale, "src")], sessions: [session("s1", "running", "e1")], openMoves: [], ways: [way("s1", 1024)] },
      now,
    )
    expect(d.held.map((e) => e.id)).toStrictEqual(["e1"])
    expect(d.lostSessions).toStrictEqual([])
    expect(d.returned).toStrictEqual([])
    expect(d.reclaimed.map((e) => e.id)).toStrictEqual(["x"])
  })
})
