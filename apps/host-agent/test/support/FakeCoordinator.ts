/**
 * An in-memory coordinator for clock-driven tests: the agent-facing API with the same CAS
 * rules (a repeat or a stale step is a 409 `Conflict`), and the admin steps tests need.
 */
import { Move as CoreMove } from "@engram/core"
import { Effect, Ref } from "effect"
import {
  type AssignedAllowance,
  type AssignedMove,
  type AssignedSession,
  type Assignments,
  Conflict,
  CoordinatorError,
  type CoordinatorShape,
  notVisible,
  type PhasesReport,
  type RoundReport,
} from "../../src/Coordinator.js"
import type { HostReport } from "../../src/Measure.js"

export interface FakeMove extends AssignedMove {
  readonly rounds: readonly RoundReport[]
  readonly phases: PhasesReport | null
  readonly abortReason: string | null
  readonly estimateMs: number | null
  /** The source's resend mark (`resendOwed`); absent: never marked. */
  readonly resendOwed?: boolean
}

export interface FakeState {
  readonly sessions: ReadonlyMap<string, AssignedSession>
  readonly moves: ReadonlyMap<string, FakeMove>
  readonly reports: ReadonlyMap<string, HostReport>
  /** Each report's active sessions (the guests that did work since the host's previous report), in order. */
  readonly activity: readonly { readonly hostId: string; readonly activeSessions: readonly string[] }[]
  readonly heartbeats: ReadonlyMap<string, number>
  readonly calls: readonly string[]
  /** The coordinator's `commitAllowanceMs` sent with the assignments; null = sent no limits (an older coordinator). */
  readonly commitAllowanceMs: number | null
  /** The coordinator's `heartbeatStaleWindowMs` sent with the limits; null = not sent (a coordinator before it). */
  readonly heartbeatStaleWindowMs: number | null
  /** The learned allowances sent with the assignments, as the wire carries them; null = sent none (an older coordinator). */
  readonly allowances: readonly AssignedAllowance[] | null
  /**
   * The guests the agents reported lost, as recorded (in the sessions' history), in order;
   * `moveId`/`toHostId` for a copy lost before the session's latest committed move took it away.
   */
  readonly guestsLost: readonly { readonly hostId: string; readonly sessionId: string; readonly reason: string; readonly moveId?: string; readonly toHostId?: string }[]
  /** The committed moves, in the order they committed (the sessions' `moved` history). */
  readonly moved: readonly { readonly moveId: string; readonly sessionId: string; readonly fromHostId: string; readonly toHostId: string }[]
  /** The image hosts sent with every host's assignments (`imageHosts`); null = sent none. */
  readonly imageHosts: NonNullable<Assignments["imageHosts"]> | null
}

export const makeFakeCoordinator = Effect.gen(function* () {
  const ref = yield* Ref.make<FakeState>({ sessions: new Map(), moves: new Map(), reports: new Map(), activity: [], heartbeats: new Map(), calls: [], commitAllowanceMs: 400, heartbeatStaleWindowMs: null, allowances: null, guestsLost: [], moved: [], imageHosts: null })
  type Step = Effect.Effect<void, Conflict>
  const modify = (f: (s: FakeState) => readonly [Step, FakeState]) => Ref.modify(ref, f)
  const conflict = (op: string, message: string): Step => Effect.fail(new Conflict({ op, message }))
  const setSession = (s: FakeState, id: string, patch: Partial<AssignedSession>): FakeState => {
    const cur = s.sessions.get(id)
    return cur === undefined ? s : { ...s, sessions: new Map(s.sessions).set(id, { ...cur, ...patch }) }
  }
  const setMove = (s: FakeState, id: string, patch: Partial<FakeMove>): FakeState => {
    const cur = s.moves.get(id)
    return cur === undefined ? s : { ...s, moves: new Map(s.moves).set(id, { ...cur, ...patch }) }
  }
  const log = (s: FakeState, call: string): FakeState => ({ ...s, calls: [...s.calls, call] })
  /** A session's `lastActiveAt` once it runs again: a second after the last (none when it carries no figures). */
  const lastActiveNow = (x: AssignedSession): Partial<AssignedSession> => (x.lastActiveAt === undefined ? {} : { lastActiveAt: x.lastActiveAt + 1000 })
  /** `s` with `m`'s commit in the sessions' history. */
  const committed = (s: FakeState, m: FakeMove): FakeState => ({ ...s, moved: [...s.moved, { moveId: m.id, sessionId: m.sessionId, fromHostId: m.sourceHostId, toHostId: m.targetHostId }] })

  /**
   * Whether rounds that add a record lose their answer, every other one from the first (recorded,
   * then the caller sees a timeout: a replica that hung after its write); and how many added one so far.
   */
  let losingRoundAnswers = false
  /** Whether the coordinator is older than `POST /v1/moves/{id}/resend` (its 404 of the route). */
  let olderThanResend = false
  /** Whether the coordinator is older than letting a move's parties read its session (403 for any session not placed on the host). */
  let olderThanMoveReads = false
  let roundsAdded = 0
  /** Hosts whose calls never arrive (a frozen or cut-off agent, as the coordinator sees it). */
  const silenced = new Set<string>()
  const silent = (hostId: string) => new CoordinatorError({ op: "any", status: null, message: `host ${hostId} is cut off` })
  /** The client of one host; every call fails while the host is silenced. */
  const client = (hostId: string): CoordinatorShape => {
    const c = answering(hostId)
    const gate = <A>(eff: Effect.Effect<A, Conflict | CoordinatorError>) => Effect.suspend(() => (silenced.has(hostId) ? Effect.fail(silent(hostId)) : eff))
    return {
      report: (r, active) => gate(c.report(r, active)),
      heartbeat: gate(c.heartbeat),
      assignments: (o) => gate(c.assignments(o)),
      started: (id) => gate(c.started(id)),
      descended: (id, options) => gate(c.descended(id, options)),
      round: (id, r) => gate(c.round(id, r)),
      commit: (id, p, g) => gate(c.commit(id, p, g)),
      abort: (id, reason, estimateMs) => gate(c.abort(id, reason, estimateMs)),
      reportRunning: (id, reason) => gate(c.reportRunning(id, reason)),
      resendOwed: (id, owed, seenClears) => gate(c.resendOwed(id, owed, seenClears)),
      guestLost: (id, reason) => gate(c.guestLost(id, reason)),
      getMove: (id) => gate(c.getMove(id)),
      getSession: (id) => gate(c.getSession(id)),
    }
  }
  const answering = (hostId: string): CoordinatorShape => ({
    report: (r, active = []) =>
      Ref.update(ref, (s) => ({ ...s, reports: new Map(s.reports).set(hostId, r), activity: [...s.activity, { hostId, activeSessions: active }] })),
    heartbeat: Ref.modify(ref, (s) => [1, { ...s, heartbeats: new Map(s.heartbeats).set(hostId, (s.heartbeats.get(hostId) ?? 0) + 1) }]),
    assignments: () =>
      Effect.map(Ref.get(ref), (s): Assignments => ({
        version: String(s.calls.length),
        sessions: [...s.sessions.values()].filter((x) => x.hostId === hostId && ["pending", "running", "parked", "descending", "moving"].includes(x.state)),
        moves: [...s.moves.values()].filter((m) => m.state === "pending" && (m.sourceHostId === hostId || m.targetHostId === hostId)),
        ...(s.commitAllowanceMs === null
          ? {}
          : { limits: { commitAllowanceMs: s.commitAllowanceMs, ...(s.heartbeatStaleWindowMs === null ? {} : { heartbeatStaleWindowMs: s.heartbeatStaleWindowMs }) } }),
        ...(s.allowances === null ? {} : { allowances: s.allowances.filter((x) => x.sourceHostId === hostId) }),
        ...(s.imageHosts === null ? {} : { imageHosts: s.imageHosts }),
      })),
    getMove: (id) =>
      Effect.flatMap(Ref.get(ref), (s) => {
        const m = s.moves.get(id)
        // As the coordinator: an unknown move is its 404 naming the move; another host's, a 403.
        if (m === undefined) return Effect.fail(new CoordinatorError({ op: "getMove", status: 404, message: `no move ${id}`, notFound: { entity: "move", id } }))
        return m.sourceHostId !== hostId && m.targetHostId !== hostId
          ? Effect.fail(new CoordinatorError({ op: "getMove", status: 403, message: `move ${id} is not host ${hostId}'s` }))
          : Effect.succeed(m)
      }),
    getSession: (id) =>
      Effect.map(Ref.get(ref), (s) => {
        const x = s.sessions.get(id)
        // As the coordinator, through the HTTP client: none (404) is null; a session this host may
        // not read (403: not placed here, and this host neither the source nor the target of its
        // latest move, the one begun last) is `notVisible`.
        if (x === undefined) return null
        if (x.hostId === hostId) return x
        if (olderThanMoveReads) return notVisible
        const latest = [...s.moves.values()].filter((m) => m.sessionId === id).at(-1)
        return latest !== undefined && (latest.sourceHostId === hostId || latest.targetHostId === hostId) ? x : notVisible
      }),
    started: (id) =>
      Effect.flatten(
        modify((s) =>
          s.sessions.get(id)?.state === "pending"
            ? // As the coordinator's: running sets `lastActiveAt` to now (a later time), when the session carries its figures, and names no image host.
              [Effect.void as Step, log(setSession(s, id, { state: "running", ...lastActiveNow(s.sessions.get(id)!), ...(s.sessions.get(id)!.imageHostId === undefined ? {} : { imageHostId: null }) }), `started ${id}`)]
            : [conflict("started", `session ${id} is not pending`), s],
        ),
      ),
    // As the coordinator: the host it descended on holds its image, unless the descent left none.
    descended: (id, options = {}) =>
      Effect.flatten(
        modify((s) =>
          s.sessions.get(id)?.state === "descending"
            ? [
                Effect.void as Step,
                log(
                  setSession(s, id, { state: "descended", hostId: null, reservationId: null, imageHostId: options.imageless === true ? null : s.sessions.get(id)!.hostId }),
                  `descended ${id}${options.imageless === true ? " image=none" : ""}`,
                ),
              ]
            : [conflict("descended", `session ${id} is not descending`), s],
        ),
      ),
    guestLost: (id, reason) =>
      Effect.flatten(
        Ref.modify(ref, (s): readonly [Effect.Effect<void, Conflict | CoordinatorError>, FakeState] => {
          const x = s.sessions.get(id)
          // As the coordinator: an unknown session is its 404; an ended one, or one on another host
          // (or none) that its latest committed move did not take from this one, a 409; nothing written.
          if (x === undefined) return [Effect.fail(new CoordinatorError({ op: "guestLost", status: 404, message: `no session ${id}`, notFound: { entity: "session", id } })), s]
          if (x.state === "ended") return [conflict("guestLost", `session ${id} is ended`), s]
          const lastMove = s.moved.filter((m) => m.sessionId === id).at(-1)
          if (x.hostId !== hostId && lastMove?.fromHostId !== hostId) return [conflict("guestLost", `session ${id} is not on host ${hostId}`), s]
          const away = x.hostId !== hostId && lastMove !== undefined ? { moveId: lastMove.moveId, toHostId: lastMove.toHostId } : {}
          return [Effect.void, log({ ...s, guestsLost: [...s.guestsLost, { hostId, sessionId: id, reason, ...away }] }, `guestLost ${id}`)]
        }),
      ),
    round: (id, round) =>
      Effect.flatten(
        Ref.modify(ref, (s): readonly [Effect.Effect<void, Conflict | CoordinatorError>, FakeState] => {
          const m = s.moves.get(id)
          if (m === undefined) return [conflict("round", `move ${id} is not pending`), s]
          // As the store (SPEC §12): core's rule. Rounds after the final round are refused; a
          // second intent without a position changes nothing; a round with a position is recorded
          // once (a repeat with the same figures changes nothing), other figures or a gap are refused.
          const placed = CoreMove.placeRound(m, round)
          if (typeof placed !== "string") return [conflict("round", `move ${id}: ${placed.reason}`), s]
          if (placed === "held") return [Effect.void, s]
          const { kind, wireBytes, apparentBytes, sendMs, captureMs } = round
          const answer = losingRoundAnswers && roundsAdded++ % 2 === 0 ? Effect.fail(new CoordinatorError({ op: "round", status: null, message: "timed out (the answer was lost)" })) : Effect.void
          return [answer, log(setMove(s, id, { rounds: [...m.rounds, { kind, wireBytes, apparentBytes, sendMs, captureMs }] }), `round ${id} ${round.kind}`)]
        }),
      ),
    commit: (id, phases) =>
      Effect.flatten(
        modify((s) => {
          const m = s.moves.get(id)
          if (m?.state !== "pending") return [conflict("commit", `move ${id} is not pending`), s]
          // SPEC §12: a commit needs the move's final round recorded.
          if (!m.rounds.some((r) => r.kind === "final")) return [conflict("commit", `move ${id} has no final round recorded`), s]
          const next = setSession(setMove(committed(s, m), id, { state: "committed", phases }), m.sessionId, {
            state: "running",
            hostId: m.targetHostId,
            reservationId: `res-move-${id}`,
          })
          return [Effect.void as Step, log(next, `commit ${id}`)]
        }),
      ),
    reportRunning: (id) =>
      Effect.flatten(
        modify((s) => {
          const m = s.moves.get(id)
          // As the store: a commit on a resolution needs the move pending past its point of no return (its intent or its final round).
          if (m?.state !== "pending" || m.targetHostId !== hostId || !m.rounds.some((r) => r.kind === "final" || r.kind === "intent"))
            return [conflict("reportRunning", `move ${id} is not in doubt here`), s]
          const next = setSession(setMove(committed(s, m), id, { state: "committed", phases: null }), m.sessionId, {
            state: "running",
            hostId: m.targetHostId,
            reservationId: `res-move-${id}`,
          })
          return [Effect.void as Step, log(next, `reportRunning ${id}`)]
        }),
      ),
    resendOwed: (id, owed) =>
      Effect.flatten(
        Ref.modify(ref, (s): readonly [Effect.Effect<"recorded" | "unknown", Conflict | CoordinatorError>, FakeState] => {
          // As a coordinator older than the call: its 404 of the route.
          if (olderThanResend) return [Effect.succeed("unknown"), log(s, `resendOwed ${id} ${owed} (unknown)`)]
          const m = s.moves.get(id)
          if (m === undefined) return [Effect.fail(new CoordinatorError({ op: "resendOwed", status: 404, message: `no move ${id}`, notFound: { entity: "move", id } })), s]
          // As the coordinator: its source marks and clears, its target only clears.
          if (m.sourceHostId !== hostId && (owed || m.targetHostId !== hostId)) return [Effect.fail(new CoordinatorError({ op: "resendOwed", status: 403, message: `move ${id} is not host ${hostId}'s` })), s]
          const refused = CoreMove.refuseResendMark({ id, state: m.state, phases: m.phases === null ? null : { ...m.phases } }, owed)
          if (refused) return [Effect.fail(new Conflict({ op: "resendOwed", message: refused.reason })), s]
          return [Effect.succeed("recorded"), log(setMove(s, id, { resendOwed: owed }), `resendOwed ${id} ${owed}`)]
        }),
      ),
    abort: (id, reason, estimateMs) =>
      Effect.flatten(
        modify((s) => {
          const m = s.moves.get(id)
          if (m?.state !== "pending") return [conflict("abort", `move ${id} is not pending`), s]
          const next = setSession(setMove(s, id, { state: "aborted", abortReason: reason, estimateMs: estimateMs ?? null }), m.sessionId, { state: "running" })
          return [Effect.void as Step, log(next, `abort ${id}`)]
        }),
      ),
  })

  return {
    ref,
    client,
    get: Ref.get(ref),
    /** From now on every other round that adds a record (the first, the third, ...) loses its answer: it is recorded, the caller sees a timeout (`true`); or none (`false`). */
    loseRoundAnswers: (on: boolean) => Effect.sync(() => void (losingRoundAnswers = on)),
    /** Answers `resendOwed` as a coordinator older than the call does. */
    olderThanResend: (on: boolean) => Effect.sync(() => void (olderThanResend = on)),
    /** Answers a session read as a coordinator older than letting a move's parties read its session does: 403 unless placed on the host. */
    olderThanMoveReads: (on: boolean) => Effect.sync(() => void (olderThanMoveReads = on)),
    /** From now on the host's calls fail (`true`) or arrive again (`false`). */
    silence: (hostId: string, on: boolean) => Effect.sync(() => (on ? silenced.add(hostId) : silenced.delete(hostId))),
    addSession: (id: string, hostId: string, memMib: number, vcpus = 1, template?: string) =>
      Ref.update(ref, (s) => ({
        ...s,
        sessions: new Map(s.sessions).set(id, { id, state: "pending", budget: { memMib, vcpus }, hostId, reservationId: `res-${id}`, ...(template === undefined ? {} : { template }) }),
      })),
    /** Takes a move's recorded final round away (as if its record never landed). */
    forgetFinalRound: (moveId: string) => Ref.update(ref, (s) => setMove(s, moveId, { rounds: (s.moves.get(moveId)?.rounds ?? []).filter((r) => r.kind !== "final") })),
    setState: (id: string, state: AssignedSession["state"]) => Ref.update(ref, (s) => setSession(s, id, { state })),
    setCommitAllowance: (ms: number | null) => Ref.update(ref, (s) => ({ ...s, commitAllowanceMs: ms })),
    setStaleWindow: (ms: number | null) => Ref.update(ref, (s) => ({ ...s, heartbeatStaleWindowMs: ms })),
    /** The learned allowances to send with the assignments (as the wire carries them); null = send none. */
    setAllowances: (allowances: readonly AssignedAllowance[] | null) => Ref.update(ref, (s) => ({ ...s, allowances })),
    /** An explicit abort of a pending move (an operator's, the end of its session, a race across replicas): never refused while pending. */
    abortMove: (moveId: string, reason: string) => client("admin").abort(moveId, reason).pipe(Effect.ignore),
    /**
     * The coordinator's move wait timed out: as the store's abort `onlyBeforeFinalRound`, refused
     * (nothing changes) once the move is past its point of no return (its intent or its final
     * round recorded). Answers whether it aborted.
     */
    timeoutAbort: (moveId: string) =>
      Ref.get(ref).pipe(
        Effect.flatMap((s) =>
          s.moves.get(moveId)?.rounds.some((r) => r.kind === "intent" || r.kind === "final") === true
            ? Effect.succeed(false)
            : client("admin").abort(moveId, "MoveTimeout").pipe(Effect.as(true), Effect.orElseSucceed(() => false)),
        ),
      ),
    /** Takes a move's recorded intent away (as if its record never landed). */
    forgetIntent: (moveId: string) => Ref.update(ref, (s) => setMove(s, moveId, { rounds: (s.moves.get(moveId)?.rounds ?? []).filter((r) => r.kind !== "intent") })),
    beginMove: (moveId: string, sessionId: string, targetHostId: string, maxDowntimeMs: number) =>
      Ref.update(ref, (s) => {
        const sess = s.sessions.get(sessionId)!
        const move: FakeMove = {
          id: moveId,
          sessionId,
          sourceHostId: sess.hostId!,
          targetHostId,
          maxDowntimeMs,
          state: "pending",
          rounds: [],
          phases: null,
          abortReason: null,
          estimateMs: null,
        }
        return setSession({ ...s, moves: new Map(s.moves).set(moveId, move) }, sessionId, { state: "moving" })
      }),
    assignmentsOf: (hostId: string) => answering(hostId).assignments({ waitMs: 0, since: undefined }),
    /** Places a session on `hostId` in `state` (a new reservation there), as the coordinator's placement does. */
    place: (id: string, hostId: string, state: AssignedSession["state"]) => Ref.update(ref, (s) => setSession(s, id, { hostId, state, reservationId: `res-${id}-${hostId}` })),
    /** Forgets a move (pruned: its history kept no longer), so reading it is the coordinator's 404. */
    forgetMove: (moveId: string) => Ref.update(ref, (s) => {
      const moves = new Map(s.moves)
      moves.delete(moveId)
      return { ...s, moves }
    }),
  }
})
export type FakeCoordinator = Effect.Success<typeof makeFakeCoordinator>
