import { describe, expect, it } from "vitest"
import { ParkPolicy, Plan, Session } from "../src/index.js"
import type { Move } from "../src/index.js"

const legal: [Session.State, Session.State][] = [
  ["queued", "pending"],
  ["pending", "running"],
  ["running", "parked"],
  ["running", "descending"],
  ["parked", "running"],
  ["parked", "descending"],
  ["descending", "descended"],
  ["descended", "queued"],
  ["descended", "pending"],
  ["running", "moving"],
  ["moving", "running"],
  ["pending", "lost"],
  ["running", "lost"],
  ["parked", "lost"],
  ["descending", "lost"],
  ["moving", "lost"],
  ["lost", "ended"],
]

describe("Session transitions", () => {
  it.each(legal)("%s → %s is legal", (from, to) => {
    expect(Session.transition(from, to)._tag).toBe("Legal")
  })

  it("any state but ended may end", () => {
    for (const s of Session.states) expect(Session.canTransition(s, "ended")).toBe(s !== "ended")
  })

  it("every other pair is illegal, with a message naming both states", () => {
    const allowed = new Set([...legal.map(([a, b]) => `${a}>${b}`), ...Session.states.filter((s) => s !== "ended").map((s) => `${s}>ended`)])
    let illegal = 0
    for (const from of Session.states)
      for (const to of Session.states) {
        if (allowed.has(`${from}>${to}`)) continue
        const t = Session.transition(from, to)
        expect(t._tag).toBe("Illegal")
        if (t._tag === "Illegal") expect(t.message).toContain(`from ${from} to ${to}`)
        illegal++
      }
    expect(illegal).toBe(81 - allowed.size)
  })

  it("a session holds a reservation exactly from pending until it descends, ends or is lost", () => {
    expect(Session.states.filter(Session.holdsReservation)).toEqual(["pending", "running", "parked", "descending", "moving"])
  })
})

describe("Session operations", () => {
  it("each operation starts only from its own states", () => {
    expect(Session.apply("markRunning", "pending", "running")._tag).toBe("Legal")
    // The life cycle allows parked → running, but that is unpark, not markRunning.
    expect(Session.apply("markRunning", "parked", "running")._tag).toBe("Illegal")
    expect(Session.apply("unpark", "parked", "running")._tag).toBe("Legal")
    // queued → pending is a drain, not a resume.
    expect(Session.apply("resume", "queued", "pending")._tag).toBe("Illegal")
    expect(Session.apply("resume", "descended", "queued")._tag).toBe("Legal")
    expect(Session.apply("idle", "parked", "descending")._tag).toBe("Illegal")
    expect(Session.apply("end", "ended", "ended")._tag).toBe("Illegal")
  })

  it("every operation's moves are legal in the life cycle (resume: parked → running warm, descended → pending or queued cold)", () => {
    for (const [op, rule] of Object.entries(Session.operations))
      for (const from of rule.from)
        for (const to of rule.to) {
          if (op === "resume" && (from === "parked") !== (to === "running")) continue
          expect(Session.apply(op as Session.Operation, from, to)._tag, `${op}: ${from} → ${to}`).toBe("Legal")
        }
    expect(Session.apply("resume", "parked", "pending")._tag).toBe("Illegal")
    expect(Session.apply("resume", "descended", "running")._tag).toBe("Illegal")
  })

  it("canReach: a state still reachable through legal transitions; nothing after ended, only ended after lost", () => {
    expect(Session.canReach("queued", "running")).toBe(true)
    expect(Session.canReach("running", "queued")).toBe(true)
    expect(Session.canReach("parked", "parked")).toBe(true)
    expect(Session.canReach("ended", "running")).toBe(false)
    expect(Session.canReach("lost", "running")).toBe(false)
    expect(Session.canReach("lost", "ended")).toBe(true)
    for (const s of Session.states) expect(Session.canReach(s, "ended")).toBe(true)
  })

  it("the illegal message names the operation and both states", () => {
    const t = Session.apply("markRunning", "moving", "running")
    expect(t._tag === "Illegal" && t.message).toBe("markRunning needs a session in pending, not moving (cannot go from moving to running)")
  })
})

describe("Session.step", () => {
  const t = 1000
  const base: Session.Record = {
    id: "s1",
    state: "running",
    budget: { memMib: 1024, vcpus: 1 },
    affinity: [],
    hostId: "h1",
    reservationId: "r1",
    queuedAt: null,
    parkedAt: null,
    idleTimeoutMs: null,
    lastActiveAt: 0,
    endsAt: null,
    template: null,
    imageHostId: null,
    createdAt: 0,
    updatedAt: 0,
  }
  const at = (state: Session.State, more: Partial<Session.Record> = {}): Session.Record => ({ ...base, state, ...more })
  const finalRound = { kind: "final" as const, wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 }
  const move = {
    id: "m1",
    sessionId: "s1",
    sourceHostId: "h1",
    targetHostId: "h2",
    reservationId: "t1",
    maxDowntimeMs: 600,
    state: "pending" as const,
    rounds: [],
    phases: null,
    abortReason: null,
    abortEstimateMs: null,
    guard: null,
    resendOwed: false,
    createdAt: 0,
    endedAt: null,
  }
  /** A step's plan, read as the one session it writes, the one move it changes, and its events. */
  const applied = (a: Session.Answer) => {
    if (a._tag !== "Plan") throw new Error(`expected a plan, got ${JSON.stringify(a)}`)
    expect(a.sessions.length).toBe(1)
    expect(a.moves.length).toBeLessThanOrEqual(1)
    expect(a.at).toBe(t)
    const session = (a.sessions[0] as Plan.SessionWrite).record
    for (const e of a.events) expect(e.sessionId).toBe(session.id)
    return { plan: a, session, from: (a.sessions[0] as Plan.SessionWrite).from, ledger: a.ledger, move: a.moves[0] ?? null, events: a.events.map((e) => e.event) }
  }
  // The idle decision's inputs: a measured host with nothing queued parks; a queued session without room makes it descend.
  const measuredHost = { id: "h1", headroom: { allocatableMib: 8192, cpuBudget: 32, reserved: { memMib: 1024, vcpus: 1 } } }
  const idle = (park: boolean): Extract<Session.Step, { readonly _tag: "idle" }> => ({
    _tag: "idle",
    policy: ParkPolicy.defaultRule,
    view: { host: measuredHost, queueWithoutRoom: !park },
  })

  it("a create with a host is pending there with a new session reservation; without one it queues", () => {
    const placed = applied(Session.step(null, { _tag: "create", id: "s1", budget: base.budget, affinity: ["h1"], placement: { hostId: "h1", version: 4, reservationId: "r9" } }, t))
    expect(placed.session).toStrictEqual({ ...base, state: "pending", affinity: ["h1"], reservationId: "r9", lastActiveAt: t, createdAt: t, updatedAt: t })
    expect(placed.ledger).toStrictEqual([
      { _tag: "Reserve", entry: { id: "r9", hostId: "h1", ownerKind: "session", ownerId: "s1", memMib: 1024, vcpus: 1, vramMib: null, createdAt: t, lastHeartbeatAt: t, expiresAt: null, description: null } },
    ])
    expect(placed.events.map((e) => e._tag)).toStrictEqual(["Created", "Placed"])
    // A new session is written only if no session has its id, and only while its host is at the version chosen on.
    expect(placed.from).toBeNull()
    expect(placed.plan.host).toStrictEqual({ hostId: "h1", version: 4 })
    const queued = applied(Session.step(null, { _tag: "create", id: "s1", budget: base.budget, affinity: [], placement: null }, t))
    expect(queued.session).toMatchObject({ state: "queued", queuedAt: t, hostId: null, reservationId: null })
    expect(queued.ledger).toStrictEqual([])
    expect(queued.plan.host).toBeNull()
  })

  it("a repeated create answers the session unchanged, or a Conflict on another budget", () => {
    const create = (memMib: number): Session.Step => ({ _tag: "create", id: "s1", budget: { memMib, vcpus: 1 }, affinity: [], placement: null })
    expect(Session.step(base, create(1024), t)).toStrictEqual({ _tag: "Unchanged", session: base })
    expect(Session.step(base, create(2048), t)).toStrictEqual({ _tag: "Conflict", entity: "session", id: "s1", reason: "session exists with another budget", state: base.state })
  })

  it("a repeated create that asks for another session (affinity, idle timeout, TTL, template, or a refusal to queue) is a Conflict naming the first field that differs", () => {
    // Created at 500 with affinity [h1, h2], idle timeout 5 s, TTL 60 s and template t1.
    const s = at("pending", { affinity: ["h1", "h2"], idleTimeoutMs: 5000, endsAt: 60_500, template: "t1", createdAt: 500 })
    const repeat = (more: Partial<Extract<Session.Step, { _tag: "create" }>>): Session.Answer =>
      Session.step(s, { _tag: "create", id: "s1", budget: base.budget, placement: null, ...more }, t)
    const conflict = (a: Session.Answer) => (a._tag === "Conflict" ? [a.entity, a.id, a.state, a.reason] : a._tag)
    // The same create, or one that leaves options out (it asks nothing of them), answers the session.
    const same = { affinity: ["h1", "h2"], idleTimeoutMs: 5000, ttlMs: 60_000, template: "t1", onNoRoom: "refuse" as const }
    expect(repeat(same)).toStrictEqual({ _tag: "Unchanged", session: s })
    expect(repeat({})).toStrictEqual({ _tag: "Unchanged", session: s })
    // A TTL counts from the first create: 60 s later, 60 s is still the same TTL.
    expect(Session.step(s, { _tag: "create", id: "s1", budget: base.budget, placement: null, ttlMs: 60_000 }, 60_000)._tag).toBe("Unchanged")
    for (const [more, reason] of [
      [{ affinity: ["h2", "h1"] }, "session exists with another affinity (h1, h2)"],
      [{ affinity: [] }, "session exists with another affinity (h1, h2)"],
      [{ idleTimeoutMs: 5001 }, "session exists with another idleTimeoutMs (5000)"],
      [{ ttlMs: 1000 }, "session exists with another ttlMs: it ends at 60500, not at its create's time + ttlMs (1500; a TTL counts from the first create, and a new TTL moves it)"],
      [{ template: "t2" }, "session exists with another template (t1)"],
      // The first field that differs is named.
      [{ ...same, idleTimeoutMs: 1, template: "t2" }, "session exists with another idleTimeoutMs (5000)"],
      [{ ...same, budget: { memMib: 2048, vcpus: 1 }, affinity: [] }, "session exists with another budget"],
    ] as const)
      expect(conflict(repeat(more)), JSON.stringify(more)).toStrictEqual(["session", "s1", "pending", reason])
    // A session created without the options: each one given is another session.
    const bare = at("running")
    const bareRepeat = (more: Partial<Extract<Session.Step, { _tag: "create" }>>) =>
      conflict(Session.step(bare, { _tag: "create", id: "s1", budget: base.budget, placement: null, ...more }, t))
    expect(bareRepeat({ affinity: ["h1"] })).toStrictEqual(["session", "s1", "running", "session exists with another affinity (none)"])
    expect(bareRepeat({ idleTimeoutMs: 5000 })).toStrictEqual(["session", "s1", "running", "session exists with another idleTimeoutMs (none)"])
    expect(bareRepeat({ ttlMs: 1000 })).toStrictEqual(["session", "s1", "running", "session exists with another ttlMs (none: it has no TTL)"])
    expect(bareRepeat({ template: "t" })).toStrictEqual(["session", "s1", "running", "session exists with another template (none)"])
    expect(bareRepeat({ affinity: [], onNoRoom: "refuse" })).toBe("Unchanged")
    // A queued session is no answer to a create that refuses to queue.
    expect(conflict(Session.step(at("queued", { hostId: null, reservationId: null, queuedAt: 0 }), { _tag: "create", id: "s1", budget: base.budget, placement: null, onNoRoom: "refuse" }, t))).toStrictEqual([
      "session",
      "s1",
      "queued",
      "session exists and is queued: onNoRoom refuse asks for a session that is placed, or none",
    ])
  })

  it("a repeated create of a session that ended or was lost is a Conflict naming its state", () => {
    const create: Session.Step = { _tag: "create", id: "s1", budget: base.budget, affinity: [], placement: null }
    for (const state of ["ended", "lost"] as const)
      expect(Session.step(at(state), create, t)).toStrictEqual({
        _tag: "Conflict",
        entity: "session",
        id: "s1",
        reason: `session exists and is ${state}: a create does not start it again (a new session needs a new id)`,
        state,
      })
    for (const state of ["queued", "pending", "running", "parked", "descending", "moving"] as const)
      expect(Session.step(at(state), create, t)._tag).toBe("Unchanged")
  })

  it("a repeated create of a descended session is a Conflict: it is neither placed nor queued, and only a resume restores it", () => {
    const create: Session.Step = { _tag: "create", id: "s1", budget: base.budget, affinity: [], placement: null }
    expect(Session.step(at("descended"), create, t)).toStrictEqual({
      _tag: "Conflict",
      entity: "session",
      id: "s1",
      reason: "session exists and is descended: a create does not restore it (a resume does)",
      state: "descended",
    })
  })

  it("finishing a descent releases the reservation and clears the host", () => {
    const done = applied(Session.step(at("descending"), { _tag: "finishDescent" }, t))
    expect(done.session).toMatchObject({ state: "descended", hostId: null, reservationId: null, updatedAt: t })
    expect(done.ledger).toStrictEqual([{ _tag: "Release", id: "r1", hostId: "h1", memMib: 1024, vcpus: 1, how: "released" }])
    expect(done.from).toBe("descending")
  })

  it("a descent remembers its image's host; a cold resume keeps it until the session runs, is lost or ends", () => {
    const descended = applied(Session.step(at("descending"), { _tag: "finishDescent" }, t)).session
    expect(descended).toMatchObject({ state: "descended", hostId: null, imageHostId: "h1" })
    const queued = applied(Session.step(descended, { _tag: "resume", placement: null }, t)).session
    expect(queued).toMatchObject({ state: "queued", imageHostId: "h1" })
    const pending = applied(Session.step(queued, { _tag: "place", placement: { hostId: "h2", version: 1, reservationId: "r2" } }, t)).session
    expect(pending).toMatchObject({ state: "pending", hostId: "h2", imageHostId: "h1" })
    expect(applied(Session.step(pending, { _tag: "markRunning" }, t)).session.imageHostId).toBeNull()
    expect(applied(Session.step(pending, { _tag: "lose", openMove: null, targetReclaimed: false }, t)).session.imageHostId).toBeNull()
    expect(applied(Session.step(descended, { _tag: "end", openMove: null }, t)).session.imageHostId).toBeNull()
  })

  it("a descent that left no image (imageless) names no image host: its resume boots fresh, fetching from nobody", () => {
    const done = applied(Session.step(at("descending"), { _tag: "finishDescent", imageless: true }, t))
    expect(done.session).toMatchObject({ state: "descended", hostId: null, reservationId: null, imageHostId: null })
    expect(done.ledger).toStrictEqual([{ _tag: "Release", id: "r1", hostId: "h1", memMib: 1024, vcpus: 1, how: "released" }])
    expect(done.events).toStrictEqual([{ _tag: "Descended", hostId: "h1" }])
    const pending = applied(Session.step(done.session, { _tag: "resume", placement: { hostId: "h2", version: 1, reservationId: "r2" } }, t)).session
    expect(pending).toMatchObject({ state: "pending", hostId: "h2", imageHostId: null })
  })

  it("idle parks (stamping parkedAt) or descends; unpark is a warm resume, a resume of a descended session a cold one", () => {
    expect(applied(Session.step(base, idle(true), t)).session).toMatchObject({ state: "parked", parkedAt: t })
    expect(applied(Session.step(base, idle(false), t)).events).toStrictEqual([
      { _tag: "Descending", hostId: "h1", cause: "idle", reason: null },
    ])
    expect(applied(Session.step(at("parked", { parkedAt: 5 }), { _tag: "unpark" }, t)).events).toStrictEqual([{ _tag: "Resumed", warm: true, hostId: "h1" }])
    const cold = applied(Session.step(at("descended", { hostId: null, reservationId: null }), { _tag: "resume", placement: null }, t))
    expect(cold.session).toMatchObject({ state: "queued", queuedAt: t })
    expect(cold.events).toStrictEqual([{ _tag: "Resumed", warm: false, hostId: null }, { _tag: "Queued" }])
  })

  it("resume is one verb: a park resumes warm in place (same host, same reservation, no placement), a descended session cold", () => {
    const warm = applied(Session.step(at("parked", { parkedAt: 5 }), { _tag: "resume", placement: null }, t))
    expect(warm.session).toStrictEqual({ ...base, state: "running", parkedAt: null, lastActiveAt: t, updatedAt: t })
    expect(warm.ledger).toStrictEqual([])
    expect(warm.events).toStrictEqual([{ _tag: "Resumed", warm: true, hostId: "h1" }])
    expect(Session.resumesWarm("parked")).toBe(true)
    expect(Session.resumesWarm("descended")).toBe(false)
    expect(Session.judgeResume(at("parked"))).toBeNull()
    expect(Session.judgeResume(at("descended"))).toBeNull()
    expect(Session.judgeResume(at("running"))).toMatchObject({ _tag: "Illegal", from: "running", to: "pending" })
    expect(Session.judgeResume(at("running"))?.message).toContain("resume needs a session in parked or descended, not running")
  })

  it("a yield keeps the gate's reason in the history", () => {
    expect(applied(Session.step(at("parked", { parkedAt: 5 }), { _tag: "beginDescent", reason: "demand" }, t)).events).toStrictEqual([
      { _tag: "Descending", hostId: "h1", cause: "yield", reason: "demand" },
    ])
    expect(applied(Session.step(at("parked", { parkedAt: 5 }), { _tag: "beginDescent" }, t)).events).toMatchObject([{ cause: "yield", reason: null }])
  })

  it("ending an ended session is unchanged: the session as it is, no ledger change, no event", () => {
    const ended = at("ended")
    expect(Session.step(ended, { _tag: "end", openMove: null }, t)).toStrictEqual({ _tag: "Unchanged", session: ended })
  })

  it("a refused step names the operation, both states, and the state it asked for", () => {
    expect(Session.step(at("running"), { _tag: "resume", placement: null }, t)).toMatchObject({ _tag: "Illegal", sessionId: "s1", from: "running", to: "pending" })
    expect(Session.step(at("pending"), idle(true), t)).toMatchObject({ _tag: "Illegal", to: "parked" })
    expect(Session.step(at("lost"), { _tag: "markRunning" }, t)).toMatchObject({ _tag: "Illegal", from: "lost", to: "running" })
    expect(Session.step(at("queued"), { _tag: "place", placement: { hostId: "h1", version: 0, reservationId: "r2" } }, t)._tag).toBe("Plan")
    expect(Session.step(at("pending"), { _tag: "place", placement: { hostId: "h1", version: 0, reservationId: "r2" } }, t)).toMatchObject({ _tag: "Illegal", to: "pending" })
    expect(Session.step(null, { _tag: "markRunning" }, t)).toStrictEqual({ _tag: "NotFound" })
  })

  it("a move begins only from running, one at a time (the open move is a Conflict, judged first)", () => {
    const newMove = { id: "m2", targetHostId: "h2", targetVersion: 9, reservationId: "t2", maxDowntimeMs: 600 }
    expect(Session.step(at("parked"), { _tag: "beginMove", openMove: move, move: newMove }, t)).toMatchObject({ _tag: "Conflict", entity: "move", id: "m1" })
    expect(Session.step(at("parked"), { _tag: "beginMove", openMove: null, move: newMove }, t)).toMatchObject({ _tag: "Illegal", to: "moving" })
    const begun = applied(Session.step(base, { _tag: "beginMove", openMove: null, move: newMove }, t))
    expect(begun.session.state).toBe("moving")
    expect(begun.move).toMatchObject({ _tag: "Open", move: { id: "m2", sourceHostId: "h1", targetHostId: "h2", state: "pending", createdAt: t } })
    expect(begun.ledger).toMatchObject([{ _tag: "Reserve", entry: { id: "t2", hostId: "h2", ownerKind: "move", ownerId: "m2" } }])
    expect(begun.plan.host).toStrictEqual({ hostId: "h2", version: 9 })
  })

  it("a commit needs the move's final round recorded (SPEC §12): a Conflict on the move otherwise", () => {
    const phases = { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 }
    expect(Session.step(at("moving"), { _tag: "commitMove", move, phases }, t)).toStrictEqual({
      _tag: "Conflict",
      entity: "move",
      id: "m1",
      reason: "no final round recorded: a commit needs the final round",
    })
  })

  it("a commit hands the target's reservation to the session and releases the source's", () => {
    const phases = { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 }
    const done = applied(Session.step(at("moving"), { _tag: "commitMove", move: { ...move, rounds: [finalRound] }, phases }, t))
    expect(done.session).toMatchObject({ state: "running", hostId: "h2", reservationId: "t1" })
    expect(done.ledger).toStrictEqual([
      { _tag: "Transfer", id: "t1", ownerId: "s1", heartbeatAt: t },
      { _tag: "Release", id: "r1", hostId: "h1", memMib: 1024, vcpus: 1, how: "released" },
    ])
    expect(done.move).toMatchObject({ _tag: "Update", move: { state: "committed", phases, endedAt: t } })
    expect(done.events).toStrictEqual([{ _tag: "Moved", moveId: "m1", fromHostId: "h1", toHostId: "h2", phases }])
  })

  it("a commit keeps its source guard's figures with their errors against the measured phases; a resolution keeps none", () => {
    const phases = { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 }
    const guard = { allowanceMs: 250, allowanceSource: "learned", allowanceSamples: 7, estimateMs: 420 } as const
    const done = applied(Session.step(at("moving"), { _tag: "commitMove", move: { ...move, rounds: [finalRound] }, phases, guard }, t))
    expect(done.move).toMatchObject({ move: { guard: { ...guard, estimateErrorMs: -80, allowanceErrorMs: -50 } } })
    const resolved = applied(Session.step(at("moving"), { _tag: "commitMove", move: { ...move, rounds: [finalRound] }, phases: null, guard }, t))
    expect(resolved.move).toMatchObject({ move: { phases: null, guard: null } })
  })

  it("commit, abort and lose are judged like every other operation", () => {
    const phases = { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 }
    const abort = (m: typeof move | Move.Record, onlyBeforeFinalRound = false): Session.Step => ({
      _tag: "abortMove",
      move: m,
      reason: "test",
      estimateMs: 812,
      onlyBeforeFinalRound,
      targetReclaimed: false,
    })
    // A session that is not moving: never while the store is consistent, refused all the same.
    expect(Session.step(at("running"), { _tag: "commitMove", move: { ...move, rounds: [finalRound] }, phases }, t)).toMatchObject({
      _tag: "Illegal",
      from: "running",
      to: "running",
    })
    expect(Session.step(at("ended"), abort(move), t)).toMatchObject({ _tag: "Illegal", from: "ended" })
    expect(Session.step(at("queued"), { _tag: "lose", openMove: null, targetReclaimed: false }, t)).toMatchObject({ _tag: "Illegal", to: "lost" })
    // A finished move is a Conflict on the move, before the session is judged.
    expect(Session.step(at("ended"), abort({ ...move, state: "aborted" }), t)).toStrictEqual({ _tag: "Conflict", entity: "move", id: "m1", reason: "move is aborted" })
    expect(Session.step(at("moving"), abort({ ...move, rounds: [{ kind: "final", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 }] }, true), t)).toMatchObject({
      _tag: "Conflict",
      reason: "final round recorded: the pause is spent",
    })
    const aborted = applied(Session.step(at("moving"), abort(move), t))
    expect(aborted.session).toMatchObject({ state: "running", hostId: "h1", reservationId: "r1" })
    expect(aborted.ledger).toStrictEqual([{ _tag: "Release", id: "t1", hostId: "h2", memMib: 1024, vcpus: 1, how: "released" }])
    expect(aborted.move).toMatchObject({ _tag: "Update", move: { state: "aborted", abortReason: "test", abortEstimateMs: 812, endedAt: t } })
  })

  it("ending or losing a moving session closes its move and lets both reservations go", () => {
    const ended = applied(Session.step(at("moving"), { _tag: "end", openMove: move }, t))
    expect(ended.session).toMatchObject({ state: "ended", hostId: null, reservationId: null })
    expect(ended.ledger).toStrictEqual([
      { _tag: "Release", id: "t1", hostId: "h2", memMib: 1024, vcpus: 1, how: "released" },
      { _tag: "Release", id: "r1", hostId: "h1", memMib: 1024, vcpus: 1, how: "released" },
    ])
    expect(ended.move).toMatchObject({ _tag: "Update", move: { abortReason: Session.endedReason } })
    const lost = applied(Session.step(at("moving"), { _tag: "lose", openMove: move, targetReclaimed: true }, t))
    expect(lost.ledger).toStrictEqual([
      { _tag: "Release", id: "r1", hostId: "h1", memMib: 1024, vcpus: 1, how: "reclaimed" },
      { _tag: "Release", id: "t1", hostId: "h2", memMib: 1024, vcpus: 1, how: "reclaimed" },
    ])
    expect(lost.events.map((e) => e._tag)).toStrictEqual(["MoveAborted", "Lost"])
  })

  it("every applied step leads where its operation's rule says, and the next record holds a reservation exactly when its state does", () => {
    const steps: Exclude<Session.Step, { readonly _tag: "setTtl" | "guestLost" }>[] = [
      { _tag: "place", placement: { hostId: "h1", version: 0, reservationId: "r2" } },
      { _tag: "markRunning" },
      idle(true),
      idle(false),
      { _tag: "unpark" },
      { _tag: "beginDescent" },
      { _tag: "finishDescent" },
      { _tag: "resume", placement: null },
      { _tag: "resume", placement: { hostId: "h1", version: 0, reservationId: "r2" } },
      { _tag: "beginMove", openMove: null, move: { id: "m2", targetHostId: "h2", targetVersion: 0, reservationId: "t2", maxDowntimeMs: 600 } },
      { _tag: "commitMove", move: { ...move, rounds: [finalRound] }, phases: { downtimeMs: 3, captureMs: 1, sendMs: 1, commitMs: 1 } },
      { _tag: "abortMove", move, reason: "x", estimateMs: null, onlyBeforeFinalRound: false, targetReclaimed: false },
      { _tag: "lose", openMove: null, targetReclaimed: false },
      { _tag: "end", openMove: null },
    ]
    for (const from of Session.states)
      for (const op of steps) {
        const holds = Session.holdsReservation(from)
        const s = at(from, { hostId: holds ? "h1" : null, reservationId: holds ? "r1" : null })
        const answer = Session.step(s, op, t)
        const rule = Session.operations[op._tag]
        if (answer._tag !== "Plan") {
          expect((rule.from as readonly Session.State[]).includes(from), `${op._tag} from ${from}`).toBe(false)
          continue
        }
        expect((rule.from as readonly Session.State[]).includes(from), `${op._tag} from ${from}`).toBe(true)
        const a = applied(answer)
        // Written only while the session is still in the state it was decided on; a group of it is applicable.
        expect(a.from).toBe(from)
        expect(Plan.checkGroup([answer])).toBeNull()
        expect(rule.to as readonly Session.State[]).toContain(a.session.state)
        expect(Session.canTransition(from, a.session.state)).toBe(true)
        expect(a.session.reservationId !== null).toBe(Session.holdsReservation(a.session.state))
        expect(a.session.hostId !== null).toBe(Session.holdsReservation(a.session.state))
        expect(a.session.updatedAt).toBe(t)
      }
  })
})

describe("a late report of a lost guest, judged on the latest committed move", () => {
  const moved: Session.Event = { _tag: "Moved", moveId: "m1", fromHostId: "a", toHostId: "b", phases: null }
  const running = { id: "s1", state: "running", hostId: "b" } as unknown as Session.Record
  it("is taken from the host the move left, once, and not after the session was there again", () => {
    const fresh = Session.lastMoveOf([{ _tag: "Placed", hostId: "a" }, moved, { _tag: "Running", hostId: "b" }], "a")
    expect(fresh).toStrictEqual({ moveId: "m1", fromHostId: "a", toHostId: "b", revisited: false })
    expect(Session.refuseGuestLost(running, "a", fresh)).toBeNull()
    // Told already since the move: the same loss again.
    const told = Session.lastMoveOf([moved, { _tag: "GuestLost", hostId: "a", reason: "QEMU exited", moveId: "m1", toHostId: "b" }], "a")
    expect(told?.revisited).toBe(true)
    expect(Session.refuseGuestLost(running, "a", told)?._tag).toBe("Conflict")
    // The session was placed on a again after the move (its loss there is not of the copy the move left).
    const back = Session.lastMoveOf([moved, { _tag: "Descended", hostId: "b" }, { _tag: "Placed", hostId: "a" }, { _tag: "Lost", hostId: "a" }], "a")
    expect(Session.refuseGuestLost(running, "a", back)?._tag).toBe("Conflict")
    // Another host, or no move at all.
    expect(Session.refuseGuestLost(running, "c", Session.lastMoveOf([moved], "c"))?._tag).toBe("Conflict")
    expect(Session.lastMoveOf([{ _tag: "Placed", hostId: "a" }], "a")).toBeNull()
  })
})
