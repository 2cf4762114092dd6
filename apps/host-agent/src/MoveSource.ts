/**
 * The source's side of a live move (SPEC §5). The runtime owns the data plane and applies the
 * downtime guard between its rounds (`@engram/runtime`'s `migrate` over `MoveGuard`, i.e.
 * `@engram/core`'s `Downtime`); this module carries the move between the coordinator, the
 * target agent and the runtime:
 *
 * 1. the target prepares an incoming VM and answers its endpoint (`link.prepare`);
 * 2. the runtime migrates to it, each pre-copy round recorded with the coordinator as it is
 *    measured; a refusal before the pause or an abort at the post-capture check ends the move
 *    with the guest running here. With the intent on (`moveIntent`, `ENGRAM_AGENT_MOVE_INTENT=1`),
 *    before the runtime may let the guest pause (`beforePause`) the source records its intent
 *    with the coordinator, the guest still running: the next round is the final one, and the
 *    target may run the guest once that stream is complete (the point of no return: no timeout
 *    aborts the move from then on). Off (the default) nothing is recorded before the pause;
 * 3. at the post-capture check point (guest paused, nothing of the final round sent) the source
 *    writes that it owes the move's outcome (durably, in the state file), then the runtime sends
 *    the final round. Off, the final round's record goes beside its send, in the pause: it is the
 *    point of no return, and the paused path waits for it. On, the paused path waits for no
 *    record (a runtime that paused before the intent was held has it recorded beside the send);
 * 4. the target commits (resumes the VM); then, outside the pause, the source records the final
 *    round's measured figures (on; off they were recorded in the pause), posts the phases and
 *    drops its paused copy.
 *
 * What it decides: the target runs the guest only once the coordinator holds the point of no
 * return (the intent, or with it off the final round) and the stream is complete; from then on
 * the source copy is resumed only when the target answered that
 * the guest does not run there (it refused the commit, or confirmed an abort) and the coordinator
 * has ended the move. A link failure leaves the commit owed: the source stays paused and asks
 * again. Never two running copies. The commit allowance
 * of the guard is learned from this host pair's recent commits (core's `Downtime.commitAllowance`);
 * the phases name every part of the pause and sum to it.
 */
import { Effect, Fiber } from "effect"
import { type Downtime, Limits, Move as CoreMove } from "@engram/core"
import { Move, MoveGuard, type MoveRound, nowMs, type VmRuntimeShape } from "@engram/runtime"
import { type AssignedMove, type Conflict, CoordinatorError, type CoordinatorShape, isNotFound, notVisible, placedOn, refusedInput, refusesKey, type NumberedRound, type PhasesReport, type RoundReport } from "./Coordinator.js"
import type { PendingCommit } from "./LocalState.js"
import * as Pacing from "./Pacing.js"
import type { MoveHeader } from "./MoveTarget.js"
import type { PeerLink } from "./PeerLink.js"
import type { Residents } from "./Residents.js"

export interface MoveSourceDeps {
  readonly hostId: string
  readonly runtime: VmRuntimeShape
  readonly coordinator: CoordinatorShape
  readonly link: PeerLink
  readonly residents: Residents
  /** Pre-copy rounds at most (the full round included). */
  readonly maxPreCopyRounds: number
  /**
   * The guard's commit allowance for this host pair: learned from its recent commits, the
   * coordinator's `commitAllowanceMs` (from the assignments answer) before any.
   */
  readonly allowance: Downtime.Allowance
  /** Whether the coordinator keeps the guard's figures (it sent the allowance): the commit then carries them. */
  readonly coordinatorKeepsGuard: boolean
  /**
   * Whether the intent is recorded before the pause (`ENGRAM_AGENT_MOVE_INTENT=1`). Off (the
   * default): the final round's record, beside its send in the pause, is the point of no return.
   */
  readonly moveIntent?: boolean | undefined
}

/**
 * Where a committed move's pause went, on the source's clock (ms): consecutive parts that sum
 * to the pause. The reported phases fold them: `captureMs` = capture, `sendMs` = the runtime's
 * send, `commitMs` = the rest (persist, record wait, the target's commit, and the send's own
 * round trips beyond the runtime's figure).
 */
export interface PauseParts {
  /** Pause to the post-capture verdict. */
  readonly captureMs: number
  /** Writing the owed record (state file, fsync) before the final round leaves. */
  readonly persistMs: number
  /** The final round's send, from its start until the runtime said it was sent. */
  readonly sendMs: number
  /**
   * Waiting for the point of no return's record with the coordinator after the send was done:
   * 0 when the intent was held before the pause (`intentBeforePause`), else the part of the round
   * trip beside the send (the intent's, or with the intent off the final round's) that outlasted
   * the send.
   */
  readonly recordWaitMs: number
  /** The target's commit: the peer round trip, its wait for the stream's end, the resume. */
  readonly peerCommitMs: number
  /**
   * The point of no return's own round trip (not a part of the pause of its own): the intent's,
   * before the pause or beside the send; with the intent off, the final round's, beside the send.
   */
  readonly recordMs: number
  /** Whether the coordinator held the intent before the pause (false: the runtime paused on its own first, or the intent is off). */
  readonly intentBeforePause: boolean
}

/** How a move ended on the source. */
export type MoveOutcome =
  | {
      readonly _tag: "Committed"
      readonly phases: PhasesReport
      readonly rounds: readonly RoundReport[]
      /** The hypervisor's own figure for the pause (QEMU's `downtime`), when it has one (never for a guest `alreadyPaused`). */
      readonly runtimeDowntimeMs: number | null
      /**
       * The guest was paused before the move began (parked in RAM): the move paused it no
       * further, so the guard held it to no budget (its estimate is reported all the same), and
       * the phases time the switchover, final capture to the target's resume, not a pause the
       * move caused.
       */
      readonly alreadyPaused: boolean
      /** Where the pause went, part by part; null for a commit confirmed on a later pass. */
      readonly pause: PauseParts | null
      /** What the guard decided on (the allowance it used and where it came from, its estimate) and how far off each was. */
      readonly guard: CoreMove.Guard
    }
  | {
      readonly _tag: "Refused"
      /** `pre-pause`: refused before pausing; `post-capture`: aborted paused, guest resumed here. */
      readonly stage: "pre-pause" | "post-capture"
      readonly estimateMs: number
      readonly reason: string
      readonly paused: boolean
      readonly rounds: readonly RoundReport[]
    }
  /**
   * `abortOwed`: the move is to end aborted (the guest runs here) and the coordinator did not
   * acknowledge the abort: the action fails, so a later pass (the retry pass) asks again.
   */
  | { readonly _tag: "Failed"; readonly reason: string; readonly paused: boolean; readonly abortOwed?: boolean }
  /** The coordinator no longer holds the move pending (ended or aborted elsewhere). */
  | { readonly _tag: "Gone"; readonly reason: string }
  /**
   * The point of no return is recorded (the intent, or with it off the final round) and the final round
   * sent, but the target's commit is not confirmed (the link failed): the source keeps its copy
   * paused and the outcome stays owed, settled on a later pass.
   */
  | { readonly _tag: "Owed"; readonly reason: string }
  /**
   * The target committed, but the coordinator had already aborted the move (a race the
   * coordinator fences against; see README "The move protocol"). `restoredOnSource`: the
   * coordinator says the session runs here, so the target's copy was destroyed and the guest
   * resumed here from its paused copy.
   */
  | { readonly _tag: "CommitRefused"; readonly reason: string; readonly phases: PhasesReport; readonly restoredOnSource: boolean }

/**
 * How the coordinator answered a source's abort of a move it abandoned: acknowledged (aborted,
 * now or before); not acknowledged (asked again on a later pass; `tellTarget`: whether the target
 * is told to drop what it got all the same); the move reads committed, settled with the target's
 * word (`settled`); or the abort was refused and the move cannot be read (`InDoubt`: aborted or
 * committed, not known which): the source copy is paused and owed, the move read again on a later
 * pass (an `abandoned` debt), the target not told anything.
 */
type Abandoned =
  | { readonly _tag: "Acknowledged" }
  | { readonly _tag: "NotAcknowledged"; readonly tellTarget: boolean }
  | { readonly _tag: "Committed"; readonly reason: string; readonly settled: Settled }
  | { readonly _tag: "InDoubt"; readonly reason: string }

/**
 * The brief back-off of a move's calls: the n-th retry waits a time drawn in
 * `[100, min(450, 100 · 2^n)]` ms (`Pacing.retryDelayMs`; the highest draws 200, 400, 450, 450).
 * The four waits add up to 400–1500 ms, 950 on average: never longer than the fixed 100, 200,
 * 400, 800 ms before them, since some of these calls run in the guest's pause.
 */
export const briefBackoff: Pacing.Backoff = { baseMs: 100, capMs: 450 }

/**
 * The coordinator's call, retried briefly (4 times) on transient errors (a 409, the API's 400
 * naming a field, or a 404 naming the record, is an answer, not retried: the same request would be
 * refused again; a 400 the API did not answer, a proxy's, is retried as before). Each wait is drawn as `Pacing`'s are (from
 * Effect's `Random`, which tests fix; `briefBackoff`), so the sources of moves that failed
 * together do not come back in lock-step. A 503's `retryAfterMs` is not waited for: some of
 * these calls run in the guest's pause, whose bound is this back-off's.
 */
export const retrying = <A, E extends { readonly _tag: string }>(eff: Effect.Effect<A, E>) =>
  eff.pipe(
    Effect.retry({
      schedule: Pacing.retrySchedule(briefBackoff, false),
      times: 4,
      while: (e) => e._tag === "CoordinatorError" && (e as unknown as CoordinatorError).notFound === undefined && !refusedInput(e),
    }),
  )

/**
 * Records one round at its position (`seq`), retried as `retrying` does. A round recorded whose
 * answer was lost (a replica hung after its write, a timeout, a reset) is tried again at the same
 * position, on the next replica or the same: the store holds it already and answers success
 * without recording it twice (`Move.placeRound`). So a 409 is the move's end (or a position this
 * source got wrong), never our own round: no read of the move is needed to tell them apart, for
 * the final round either. A coordinator older than round positions refuses `seq` as an unknown
 * key (during a rolling upgrade, or with the agents upgraded first): the round goes again without
 * it, appended as before. A newer one refuses only a bad `seq` that way, which this agent never sends.
 */
export const recordRound = (coordinator: CoordinatorShape, moveId: string, round: NumberedRound) =>
  retrying(coordinator.round(moveId, round)).pipe(
    Effect.catchIf(
      (e): e is CoordinatorError => round.seq !== undefined && refusesKey(e, "seq"),
      () =>
        Effect.logWarning("the coordinator does not take round positions (it is older than this agent): the round is recorded without one, appended as before", { moveId, seq: round.seq }).pipe(
          Effect.andThen(retrying(coordinator.round(moveId, withoutSeq(round)))),
        ),
    ),
  )

const withoutSeq = ({ seq: _seq, ...round }: NumberedRound): RoundReport => round

/** `rounds` from position `seq` on: the positions of records sent one after the other. */
const numbered = (rounds: readonly RoundReport[], seq: number): (RoundReport & { readonly seq: number })[] => rounds.map((r, i) => ({ ...r, seq: seq + i }))

/**
 * The records a debt still owes a move that holds `rounds`, each at its position: its late rounds
 * (`lateRounds`, the records not known recorded at the pause) at the positions they took on the
 * first run (from `lateSeq`) where the move does not hold them yet, then `next` (its intent or
 * its final round) after them. Only this source records the move's rounds, one after the other:
 * the move holds every position before `lateSeq`, and from it on only these records, in order, so
 * what it holds is not sent again (a source restarted between their records would record the
 * first ones twice at new positions). A move holding fewer records than `lateSeq` (none of the
 * first run's from there can be held then) gets them after what it holds. A debt of an older
 * agent (no `lateSeq`): its late rounds after what the move holds, unless `heldByFigures` says
 * the move holds them (judged by their figures, as that agent did). So are a debt's whose
 * positions the move holds with other figures: a coordinator older than positions appends, and
 * a retried record it appended twice shifts every later one.
 */
const owedRecords = (owed: PendingCommit, rounds: readonly RoundReport[], next: readonly RoundReport[], heldByFigures: () => boolean): NumberedRound[] => {
  const late = owed.lateRounds ?? []
  const held = rounds.length
  const byFigures = () => numbered([...(heldByFigures() ? [] : late), ...next], held)
  if (owed.lateSeq === undefined) return byFigures()
  const from = Math.min(owed.lateSeq, held)
  const shifted = late.some((r, i) => {
    const at = rounds[from + i]
    return at !== undefined && !CoreMove.sameFigures(at, r)
  })
  if (shifted) return byFigures()
  return [...numbered(late, from).filter((r) => r.seq >= held), ...numbered(next, Math.max(held, from + late.length))]
}

const jsonMs = (ms: number) => (Number.isFinite(ms) ? Math.ceil(ms) : Number.MAX_SAFE_INTEGER)

/** The source's intent as the coordinator records it: the next round is the final one (no figures). */
const intentRound: RoundReport = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }

/** The round as the coordinator records it. */
const report = (r: MoveRound): RoundReport => ({ kind: r.kind, wireBytes: r.wireBytes, apparentBytes: r.apparentBytes, sendMs: r.sendMs, captureMs: r.captureMs })

/**
 * Records a move's records (pre-copy rounds, the intent, the final round) with the coordinator
 * in order, each in a fiber of its own (in the caller's scope): the runtime's migration loop does
 * not wait for the coordinator, so a slow answer never runs into the pause. Each gets its
 * position when pushed, counted from `held` (the records the move held when this run began), so
 * a retried one is recorded once. `recorded` waits for every record pushed so far and fails with
 * the first failure (a 409: the move is no longer pending); `record` pushes one and waits for it.
 * `ended` answers, without waiting, the 409 a record already got (the move ended meanwhile), if any.
 * `unrecorded` answers, without waiting, the records pushed whose record is not known yet and the
 * position of the first (every position before it is recorded): what a debt must carry.
 */
const roundRecorder = (coordinator: CoordinatorShape, moveId: string, held: number) =>
  Effect.gen(function* () {
    const scope = yield* Effect.scope
    let last: Fiber.Fiber<void, Conflict | CoordinatorError> | null = null
    let conflict: Conflict | null = null
    let next = held
    /** The records pushed, from position `held` on, and the position up to which they are recorded. */
    const pushed: RoundReport[] = []
    let recordedTo = held
    const push = (round: RoundReport) =>
      Effect.gen(function* () {
        const before = last
        const seq = next++
        pushed.push(round)
        last = yield* Effect.forkIn(
          Effect.gen(function* () {
            if (before !== null) yield* Fiber.join(before)
            yield* recordRound(coordinator, moveId, { ...round, seq })
            recordedTo = seq + 1
          }).pipe(Effect.tapError((e) => Effect.sync(() => void (e._tag === "Conflict" && conflict === null ? (conflict = e) : undefined)))),
          scope,
        )
      })
    const recorded = Effect.suspend(() => (last === null ? Effect.void : Fiber.join(last)))
    const record = (round: RoundReport) => Effect.andThen(push(round), recorded)
    const ended = Effect.sync(() => conflict)
    const unrecorded = Effect.sync(() => ({ seq: recordedTo, rounds: pushed.slice(recordedTo - held) }))
    return { push, record, recorded, ended, unrecorded }
  })

/**
 * The least time a record made in the guest's pause is given (ms), whatever is left of the
 * downtime budget: a coordinator slow under load (a busy PGlite) still answers within it and the
 * move commits, its pause over budget as measured; a hung one holds the guest no longer.
 */
export const inPauseRecordFloorMs = 5_000

/** Runs one move from the source. Never fails: every failure is cleaned up and answered. */
export const runSource = (move: AssignedMove, deps: MoveSourceDeps): Effect.Effect<MoveOutcome> =>
  Effect.gen(function* () {
    const { runtime, coordinator, link, residents } = deps
    const vm = yield* residents.get(move.sessionId)
    if (vm === undefined) {
      const reason = "source VM not resident on the source host"
      yield* retrying(coordinator.abort(move.id, reason)).pipe(Effect.ignore)
      return { _tag: "Failed", reason, paused: false } as const
    }
    const header: MoveHeader = {
      moveId: move.id,
      sessionId: move.sessionId,
      sourceHostId: deps.hostId,
      targetHostId: move.targetHostId,
      memMib: vm.memMib,
      vcpus: vm.vcpus,
    }
    const rounds: RoundReport[] = []

    /**
     * Ends the move without a commit: the guest runs here (the runtime gave it back), the target
     * drops what it got. The coordinator first: it frees the move's reservations and records why
     * (the guard's refusal, its estimate); a target that hangs (each try waits up to the peer
     * link's bound) is told after, once: it runs nothing without this source's commit, and its
     * own pass drops the incoming VM of a move it reads aborted.
     *
     * A refused abort (409) means the move is no longer pending, and it is read, not trusted: a
     * move read `aborted` (a timeout, an operator's abort, the session ended) is acknowledged;
     * one read `committed` lives on the target by the coordinator's word. That can happen here:
     * the coordinator commits a move on the source's commit (which this run never sent), on the
     * target's report that it runs the guest (it runs it only on the source's commit, or on its
     * own once the coordinator holds the move committed), or on an operator's word (`engram moves
     * commit`, or an admin's `POST …/commit`), which needs only the point of no return: with the
     * intent off, a final round whose record's answer was lost while its send completed leaves
     * the move in doubt, the target holding a complete stream that its reconcile resumes once
     * the move reads committed. So the target's word decides (`settleCommit`, as for any owed
     * outcome): the source copy is paused and owed, the target asked to commit; it runs the guest
     * → the source copy is destroyed; it refuses → the coordinator's record still wins (the copy
     * goes, as `confirmAtTarget` does); no answer → the copy stays paused, asked again. Never a
     * second running copy beside the one the coordinator places on the target, and never the
     * target told to drop a stream the coordinator's commit needs. A move that cannot be read may
     * be either: the source copy is paused and owed all the same (an `abandoned` debt; the target
     * is told nothing, it may be the session's now), and a later pass reads the move
     * (`settleAbandoned`): committed → the target's word, as above; aborted → the copy resumes here.
     */
    const abandon = (reason: string, estimateMs?: number) =>
      Effect.gen(function* () {
        // The guest as the runtime gave it back: one it could not resume (QEMU did not answer)
        // it lists paused, and so it is recorded, so the session's next pass unparks it (failing,
        // and tried again, until QEMU answers) instead of taking it for running.
        const listed = (yield* runtime.list).find((v) => v.vmId === move.sessionId)?.status
        yield* residents.update(move.sessionId, (v) => ({ ...v, status: listed === "paused" ? "paused" : "running" }))
        const answer = yield* retrying(coordinator.abort(move.id, reason, estimateMs === undefined ? undefined : jsonMs(estimateMs))).pipe(
          Effect.as<Abandoned>({ _tag: "Acknowledged" }),
          Effect.catchTag("Conflict", (refused) => endedHow(refused.message)),
          Effect.catch((e) => Effect.logWarning("move abort not acknowledged; asked again on a later pass", { moveId: move.id, error: e.message }).pipe(Effect.as<Abandoned>({ _tag: "NotAcknowledged", tellTarget: true }))),
        )
        if (answer._tag === "Acknowledged" || (answer._tag === "NotAcknowledged" && answer.tellTarget)) yield* link.abort(header).pipe(Effect.ignore)
        return answer
      })

    /**
     * The source copy paused and owed (a debt in the state file, `settleCommit` on later passes):
     * the move may have been committed, so the target may run the guest. `abandoned`: whether it
     * was committed is not known (the move could not be read); settling reads it first.
     */
    const oweAbandoned = (abandoned: boolean) =>
      Effect.gen(function* () {
        // Paused before the target is asked: it resumes the guest on our commit if it does not run it yet.
        const running = (yield* runtime.list).some((v) => v.vmId === move.sessionId && v.status === "running")
        if (running) yield* runtime.park(move.sessionId).pipe(
          Effect.catch((e) => Effect.logError("the source copy could not be paused; it is destroyed once the target confirms it runs the guest", { moveId: move.id, sessionId: move.sessionId, error: e.message })),
        )
        yield* residents.update(move.sessionId, (v) => ({ ...v, status: "paused" }))
        const atMs = yield* nowMs
        const targetUrl = link.addressOf?.(header)
        const owed: PendingCommit = {
          moveId: move.id,
          sessionId: move.sessionId,
          phases: null,
          target: { targetHostId: move.targetHostId, memMib: vm.memMib, vcpus: vm.vcpus, ...(targetUrl === undefined ? {} : { peerUrl: targetUrl }) },
          // No pause of the move's own: the figures are not recorded (the commit is refused, 409, and read committed).
          pause: { pausedAtMs: atMs, captureMs: 0, sendMs: 0, sentAtMs: atMs },
          finalRecorded: true,
          ...(deps.moveIntent === true ? { intentRecorded: true } : {}),
          ...(abandoned ? { abandoned: true } : {}),
        }
        yield* residents.addPendingCommit(owed)
        return owed
      })

    /** How a move whose abort was refused (409) ended: read, not trusted (see `abandon`). */
    const endedHow = (refusal: string) =>
      Effect.gen(function* () {
        const read = yield* retrying(coordinator.getMove(move.id)).pipe(Effect.result)
        if (read._tag === "Failure") {
          // Aborted or committed, not known which: committed, the target may run the guest (its
          // reconcile resumes a complete stream of a move it reads committed), so the copy here
          // must not run on; aborted, it is the only copy. Paused and owed, the move read again
          // on a later pass (`settleCommit`), never left running as if the abort held.
          const reason = `move ${move.id}: its abort was refused (${refusal}) and the move cannot be read (${read.failure.message}): it may have been committed; the source copy is paused and owed, the move read again on a later pass`
          yield* Effect.logWarning(reason, { hostId: deps.hostId, moveId: move.id, sessionId: move.sessionId })
          yield* oweAbandoned(true)
          return { _tag: "InDoubt", reason } as const
        }
        const m = read.success
        if (m.state === "aborted") return { _tag: "Acknowledged" } as const
        if (m.state === "pending") {
          yield* Effect.logWarning("move abort refused while the move reads pending; asked again on a later pass", { moveId: move.id, refusal })
          return { _tag: "NotAcknowledged", tellTarget: true } as const
        }
        const why = `move ${m.id} was committed on the coordinator (the session placed on ${m.targetHostId}) while this source ended it without a commit`
        yield* Effect.logError(`move abort refused: ${why}; the source copy is paused and the target asked whether it runs the guest: it decides which copy is kept`, {
          hostId: deps.hostId,
          moveId: m.id,
          sessionId: move.sessionId,
          target: m.targetHostId,
        })
        const owed = yield* oweAbandoned(false)
        const settled = yield* settleCommit(deps, owed)
        return { _tag: "Committed", reason: `${why}: ${settled._tag === "Owed" ? `the target's word is awaited, the source copy stays paused (${settled.reason})` : settled._tag === "Acknowledged" ? "the target's word settled it, the source copy was dropped" : settled.reason}`, settled } as const
      })

    /** The outcome of a move abandoned: `otherwise` (given whether the abort was acknowledged), unless the coordinator holds it committed. */
    const abandoned = (a: Abandoned, otherwise: (acknowledged: boolean) => MoveOutcome): MoveOutcome =>
      a._tag === "InDoubt"
        ? { _tag: "Owed", reason: a.reason }
        : a._tag === "Committed"
          ? a.settled._tag === "Owed" ? { _tag: "Owed", reason: a.reason } : { _tag: "Gone", reason: a.reason }
          : otherwise(a._tag === "Acknowledged")

    const budget = { maxDowntimeMs: move.maxDowntimeMs, commitAllowanceMs: deps.allowance.allowanceMs, maxPreCopyRounds: deps.maxPreCopyRounds }
    const protocol = Effect.gen(function* () {
      // A budget below the allowance alone is refused before the target starts anything, unless
      // the guest is paused already (parked): its move pauses it no further (core's
      // `Downtime.check`). The runtime judges again from its own VM's state once it streams.
      const upfront = MoveGuard.beforeStart(budget, { alreadyPaused: vm.status === "paused" })
      if (upfront._tag === "Refuse") {
        return abandoned(yield* abandon(upfront.reason, upfront.estimateMs), () => ({ _tag: "Refused", stage: "pre-pause", estimateMs: upfront.estimateMs, reason: upfront.reason, paused: false, rounds }))
      }
      // The records the move already holds (an earlier run of this move, before a restart):
      // this run's positions follow them.
      const held = yield* retrying(coordinator.getMove(move.id))
      // A move that ended meanwhile (aborted, timed out, its session ended) is not started: the
      // target would prepare for nothing and the guest stream for nothing until the first round's 409.
      if (held.state !== "pending") return { _tag: "Gone", reason: `move no longer pending on the coordinator: it reads ${held.state}${held.abortReason === null ? "" : ` (${held.abortReason})`}` } as const
      // Its final round recorded, while this source owes no outcome of it and the guest runs here:
      // an earlier run gave the pause back (the final round's record unanswered, or its stream
      // incomplete) and its abort was not acknowledged. The commit reaches the target only after
      // the debt is written, and the debt goes only once the move ends or the pause was given
      // back before any commit: the target never ran the guest. Streamed again, the move would
      // only pause the guest for a final round the coordinator refuses (409) every pass, the
      // session `moving` for ever: the source ends it (SPEC §13: a source that holds the guest
      // while the target runs none aborts the in-doubt move).
      const owes = (yield* residents.pendingCommits).some((p) => p.moveId === move.id || p.sessionId === move.sessionId)
      if (CoreMove.finalRoundRecorded(held) && !owes && vm.status === "running" && vm.moveId === null) {
        const reason = "move aborted by its source: its final round is recorded, but the source gave the pause back (the record's answer was lost, or the stream did not complete) and never sent the target its commit; the guest runs on the source"
        yield* Effect.logWarning(reason, { hostId: deps.hostId, moveId: move.id, sessionId: move.sessionId })
        return abandoned(yield* abandon(reason), (acknowledged) => ({ _tag: "Failed", reason, paused: false, ...(acknowledged ? {} : { abortOwed: true }) }))
      }
      const recorder = yield* roundRecorder(coordinator, move.id, held.rounds.length)
      const endpoint = yield* link.prepare(header)
      // The point of no return, recorded while the guest still runs (after the rounds so far).
      // Only with `moveIntent`; off, the final round's record (in the pause) is that point. An
      // intent an earlier run recorded holds already (a second one at a new position is refused).
      const withIntent = deps.moveIntent === true
      const intent = { startedAtMs: null as number | null, heldAtMs: null as number | null }
      const recordIntent = CoreMove.intentRecorded(held) ? Effect.void : recorder.record(intentRound)
      yield* Effect.logInfo("move: the target waits; streaming", { hostId: deps.hostId, moveId: move.id, endpoint: endpoint.uri })
      // Whether the move goes on after a refused record, its coordinator holding it committed (below).
      let goesOn = false
      /**
       * The guard refuses the move before the pause (over budget, the guest still running): with
       * its intent held, an operator may have committed it (a resolution's commit needs only the
       * intent; the coordinator takes it when it did not hear this source, frozen past the stale
       * window). Then the session is placed on the target, which holds no complete stream. So the
       * move is read (within 5 s), and a committed one goes on over budget: the commit overrides
       * the guard. Without the intent no commit precedes the final round, and nothing is read. At
       * the post-capture check only a commit known already overrides (no read in the pause).
       */
      const overBudget = (refusal: { readonly stage: string; readonly estimateMs: number; readonly reason: string }) =>
        Effect.gen(function* () {
          // Known committed (read before the pause, or a record refused for it): the refusal is overridden.
          if (goesOn) return true
          // Never a read with the guest paused (SPEC §5: an overrun after the capture gives the
          // pause back at once): a move committed meanwhile is found when its abort is refused, and
          // its target, holding no complete stream, refuses the commit (`noStream`): the copy here
          // is kept and streamed again (`resend`).
          if (refusal.stage !== "pre-pause") return false
          if (!withIntent || (intent.heldAtMs === null && !CoreMove.intentRecorded(held))) return false
          const read = yield* retrying(coordinator.getMove(move.id)).pipe(
            Effect.timeoutOrElse({ duration: inPauseRecordFloorMs, orElse: () => Effect.fail(new CoordinatorError({ op: "getMove", status: null, message: `not answered within ${inPauseRecordFloorMs} ms` })) }),
            Effect.result,
          )
          if (read._tag === "Failure" || read.success.state !== "committed") return false
          goesOn = true
          yield* Effect.logWarning(
            "the downtime guard refused the move, but it is committed on the coordinator (an operator's word before its final round): the commit overrides the budget; the move goes on so the target resumes the guest from a complete stream",
            { hostId: deps.hostId, moveId: move.id, sessionId: move.sessionId, stage: refusal.stage, estimateMs: jsonMs(refusal.estimateMs), maxDowntimeMs: move.maxDowntimeMs, refusal: refusal.reason },
          )
          return true
        })
      const result = yield* runtime.migrate(move.sessionId, {
        overBudget,
        moveId: move.id,
        endpoint,
        budget,
        onRound: (r) =>
          Effect.gen(function* () {
            const round = report(r)
            rounds.push(round)
            yield* recorder.push(round)
          }),
        ...(withIntent
          ? {
              beforePause: Effect.gen(function* () {
                intent.startedAtMs = yield* nowMs
                yield* recordIntent
                intent.heldAtMs = yield* nowMs
              }),
            }
          : {}),
      })
      if (result._tag !== "AtSwitchover") yield* recorder.recorded.pipe(Effect.ignore)
      if (result._tag === "Refused") {
        return abandoned(yield* abandon(result.reason, result.estimateMs), () => ({ _tag: "Refused", stage: "pre-pause", estimateMs: result.estimateMs, reason: result.reason, paused: false, rounds }))
      }
      if (result._tag === "Aborted") {
        return abandoned(yield* abandon(result.reason, result.estimateMs), () => ({ _tag: "Refused", stage: "post-capture", estimateMs: result.estimateMs, reason: result.reason, paused: true, rounds }))
      }

      // Paused at the post-capture check point: nothing of the final round has left this host.
      // First the debt, durably: once the send starts, a restarted agent finds the source copy
      // paused past the switchover and must know it owes the outcome. With the intent on, the
      // coordinator holds it (taken before the pause, `beforePause`), so the paused path waits
      // only for the send and the target's commit; a runtime that paused on its own before the
      // intent was taken (QEMU converging by itself) records it now, beside the send; the final
      // round's figures are recorded once the guest runs on the target, outside the pause. Off,
      // the final round itself is recorded beside the send, and the paused path waits for it.
      const at = result
      const checkedAtMs = yield* nowMs
      const final = report(at.final)
      const late = at.unreported.map(report)
      const intentBeforePause = intent.heldAtMs !== null
      const targetUrl = link.addressOf?.(header)
      // The pre-copy rounds QEMU finished before the pause are records like the others: they go
      // now, in the background, recorded before the final round (with the intent on, once the
      // guest runs on the target; off, beside the send).
      for (const r of late) yield* recorder.push(r)
      // The debt carries every record not known recorded yet (these late rounds, and pre-copy
      // rounds whose record is still in flight) with the position of the first: a source
      // restarted before they land sends them again at those positions, so none is recorded
      // twice (the coordinator holds every position before it).
      const unrecorded = yield* recorder.unrecorded
      const owed: PendingCommit = {
        moveId: move.id,
        sessionId: move.sessionId,
        phases: null,
        // With where the target was reached: a restarted source may find no assignment naming it.
        target: { targetHostId: move.targetHostId, memMib: vm.memMib, vcpus: vm.vcpus, ...(targetUrl === undefined ? {} : { peerUrl: targetUrl }) },
        pause: { pausedAtMs: at.pausedAtMs, captureMs: checkedAtMs - at.pausedAtMs },
        final,
        finalRecorded: false,
        ...(withIntent ? { intentRecorded: intentBeforePause } : {}),
        ...(unrecorded.rounds.length === 0 ? {} : { lateRounds: unrecorded.rounds, lateSeq: unrecorded.seq }),
        ...(deps.coordinatorKeepsGuard ? { guard: reportOf(deps.allowance, at.estimateMs) } : {}),
      }
      /**
       * What a step made in the pause may take, from `atMs`: what is left of the downtime budget, or
       * `inPauseRecordFloorMs` when that is more (a state disk or a coordinator that hangs would
       * otherwise hold the guest paused for as long as it hangs).
       */
      const inPauseMs = (atMs: number) => Math.max(inPauseRecordFloorMs, move.maxDowntimeMs - (atMs - at.pausedAtMs))
      // The pre-copy rounds are recorded in the background while the guest runs (in either mode;
      // with the intent on and held before the first round, as QEMU asks, the move is already
      // past its intent then): one refused (409) means the move is no longer pending, and it is
      // read, not trusted (as `abandon` reads a refused abort). Checked without waiting, before
      // the debt and again before the send. Ended without a commit (an admin abort, the session
      // ended), or still pending (a position refused): the pause is given back, nothing reaches
      // the target. Committed: an operator's word (a resolution's commit needs only the intent,
      // so it can land during the pre-copy rounds); the coordinator places the session on the
      // target, which holds no complete stream yet: the move goes on (the final round sent, the
      // target's commit), or the guest would be booted afresh there, its memory lost. Not
      // readable (within the pause's bound): given back, as an aborted one (below).
      const endedMeanwhile = Effect.gen(function* () {
        const conflict = yield* recorder.ended
        if (conflict === null || goesOn) return
        const readMs = inPauseMs(yield* nowMs)
        const read = yield* retrying(coordinator.getMove(move.id)).pipe(
          Effect.timeoutOrElse({ duration: readMs, orElse: () => Effect.fail(new CoordinatorError({ op: "getMove", status: null, message: `not answered within ${Math.round(readMs)} ms of the guest's pause` })) }),
          Effect.result,
        )
        const state = read._tag === "Success" ? read.success.state : null
        // A move not read is given back, as an aborted one: a refusal is far more often an abort
        // (an admin's, the session ended) than an operator's commit, and going on after an abort
        // would run the guest on the target from the paused copy, then roll it back to that copy
        // (the settle resumes it here): the target's work lost. With the intent off no commit
        // precedes the final round at all.
        if (state === "committed") {
          goesOn = true
          yield* Effect.logWarning(
            "a pre-copy round was refused: the move was committed on the coordinator (an operator's word) before its final round; the move goes on so the target resumes the guest from a complete stream",
            { hostId: deps.hostId, moveId: move.id, sessionId: move.sessionId, refusal: conflict.message },
          )
          return
        }
        yield* at.abort
        yield* residents.removePendingCommit(move.id)
        return yield* conflict
      })
      yield* endedMeanwhile
      // The debt's write is in the pause.
      const writeMs = inPauseMs(yield* nowMs)
      // The write itself is not cut (it goes on in its own fiber, holding the state file's lock,
      // so the file never goes back in time): the pause is, and the debt given up then is not
      // taken in the record when the write lands later (`owePaused`). While a write of the state
      // file hangs it fails at once: the pause is given back without waiting.
      const indebted = yield* residents.owePaused(owed).pipe(
        Effect.timeoutOrElse({ duration: writeMs, orElse: () => Effect.fail({ message: `not written within ${Math.round(writeMs)} ms of the guest's pause` }) }),
        Effect.result,
      )
      if (indebted._tag === "Failure") {
        // Nothing has left this host yet: the pause is given back and the move ends, rather than
        // a send whose debt a restarted agent would not find (it could then run the guest here
        // while the target runs it too).
        yield* at.abort
        const reason = `move failed: the source's state file could not record the move's debt before its final round: ${indebted.failure.message}`
        // The record holds no debt of a move that sent nothing (a write that lands in the same
        // instant as the bound may have taken it); this change's write, queued after the debt's
        // own (`owePaused`), puts the file in line with it. Before the abort: a move read
        // committed is owed anew (`abandon`).
        yield* residents.removePendingCommit(move.id)
        return abandoned(yield* abandon(reason), () => ({ _tag: "Failed", reason, paused: true }))
      }
      yield* endedMeanwhile
      const persistedAtMs = yield* nowMs
      const timed = <A, E>(eff: Effect.Effect<A, E>) => Effect.gen(function* () {
        const r = yield* Effect.result(eff)
        return { r, atMs: yield* nowMs }
      })
      // Off: the final round is recorded beside its send (the point of no return, in the pause).
      const recordFinal = recorder.record(final)
      // A record in the pause has what is left of the downtime budget, or `inPauseRecordFloorMs`
      // when that is more: a coordinator that hangs would otherwise hold the guest paused for its
      // calls' own timeouts (30 s each, tried again). Past it the pause is given back below, as
      // for a record refused; the target runs nothing without this source's commit.
      const leftMs = inPauseMs(persistedAtMs)
      const inPause = (record: typeof recordFinal) =>
        record.pipe(
          Effect.timeoutOrElse({
            duration: leftMs,
            orElse: () => Effect.fail(new CoordinatorError({ op: "round", status: null, message: `not answered within ${Math.round(leftMs)} ms of the guest's pause` })),
          }),
        )
      const record = withIntent ? (intentBeforePause ? Effect.void : inPause(recordIntent)) : inPause(recordFinal)
      const [recorded, sent] = yield* Effect.all([timed(record), timed(at.switchover)], { concurrency: 2 })
      if (recorded.r._tag === "Failure") {
        // The coordinator does not hold the point of no return (the intent, or off the final
        // round): the target never runs the guest (it runs only on our commit); the pause is
        // given back here, the target drops what it got.
        yield* at.abort
        yield* residents.removePendingCommit(move.id)
        if (recorded.r.failure._tag === "Conflict") return yield* recorded.r.failure
        const reason = `move failed: the ${withIntent ? "intent" : "final round"} could not be recorded: ${recorded.r.failure.message}`
        // Its record may have landed with its answer lost: an abort not acknowledged is owed.
        return abandoned(yield* abandon(reason), (acknowledged) => ({ _tag: "Failed", reason, paused: true, ...(acknowledged ? {} : { abortOwed: true }) }))
      }
      if (sent.r._tag === "Failure" && goesOn) {
        // The move is committed on the coordinator (an operator's word while this source was not
        // heard): the session is placed on the target, which holds no complete stream, and an
        // abort would be refused. The copy here is the guest's only memory: paused again (the
        // runtime gave the pause back) and owed with `resend`: a later pass streams it again
        // (`settleResend`) and it goes only once the target runs the guest.
        const reason = `the final round was not sent (${sent.r.failure.message}) of move ${move.id}, which is committed on the coordinator (the session placed on ${move.targetHostId}): the source copy is the guest's only memory, kept paused and streamed again on a later pass`
        yield* Effect.logError(reason, { hostId: deps.hostId, moveId: move.id, sessionId: move.sessionId, target: move.targetHostId })
        // Not marked yet: the send may have failed after the target got the whole stream (its ack
        // lost), and such a target resumes the guest itself; marked once it says it has none.
        yield* owedResend(deps, { ...owed, resend: true }, false)
        return { _tag: "Owed", reason } as const
      }
      if (sent.r._tag === "Failure") {
        // The stream did not complete: the target cannot run the guest (it runs only on our
        // commit, which is never sent now); the runtime gave the pause back here. The point of
        // no return (intent or final round) is no fence against that: the source's own abort
        // ends the move.
        const reason = `move failed: the final round was not sent: ${sent.r.failure.message}`
        // The debt goes first: a move read committed is owed anew (`abandon`).
        yield* residents.removePendingCommit(move.id)
        return abandoned(yield* abandon(reason), (acknowledged) => ({ _tag: "Failed", reason, paused: true, ...(acknowledged ? {} : { abortOwed: true }) }))
      }
      const bothAtMs = Math.max(recorded.atMs, sent.atMs)
      // The final round as measured: its bytes on the wire and its send.
      const measured: RoundReport = { ...final, wireBytes: Math.round(sent.r.success.finalWireBytes), sendMs: sent.r.success.sendMs }
      const sentOwed: PendingCommit = {
        ...owed,
        ...(withIntent ? { final: measured, intentRecorded: true } : { finalRecorded: true }),
        pause: { ...owed.pause!, sendMs: sent.r.success.sendMs, sentAtMs: bothAtMs },
      }
      const settled = yield* confirmAtTarget(deps, sentOwed)
      if (settled._tag === "Owed") return { _tag: "Owed", reason: settled.reason } as const
      if (settled._tag === "CommittedElsewhere") return { _tag: "Gone", reason: settled.reason } as const
      if (settled._tag === "Refused") {
        return { _tag: "Failed", reason: settled.reason, paused: true } as const
      }
      const pause: PauseParts = {
        captureMs: checkedAtMs - at.pausedAtMs,
        persistMs: persistedAtMs - checkedAtMs,
        sendMs: sent.atMs - persistedAtMs,
        recordWaitMs: Math.max(0, recorded.atMs - sent.atMs),
        peerCommitMs: settled.runningAtMs - bothAtMs,
        recordMs: intent.heldAtMs !== null && intent.startedAtMs !== null ? intent.heldAtMs - intent.startedAtMs : recorded.atMs - persistedAtMs,
        intentBeforePause,
      }
      // The guest runs on the target: the late rounds and the final round's measured figures
      // go to the coordinator now, outside the pause (the commit needs the final round). A
      // failure here leaves `finalRecorded` false: settling the debt records it first.
      // Off: the final round was recorded in the pause; nothing is left to record.
      const figures = withIntent ? yield* recorder.record(measured).pipe(Effect.result) : null
      const owedNow: PendingCommit = figures === null ? settled.owed : { ...settled.owed, finalRecorded: figures._tag === "Success" }
      if (figures?._tag === "Success") yield* residents.addPendingCommit(owedNow)
      rounds.push(...late, measured)
      return { _tag: "Confirmed", owed: owedNow, runtimeDowntimeMs: sent.r.success.runtimeDowntimeMs, pause, estimateMs: at.estimateMs, alreadyPaused: at.alreadyPaused } as const
    })

    const outcome = yield* Effect.scoped(protocol).pipe(
      Effect.catchTag("Conflict", (e) =>
        Effect.gen(function* () {
          // The coordinator refused a round: the move is no longer pending there. The runtime
          // gave the guest back (a failed `onRound` ends `migrate` with the guest running here).
          const reason = `move no longer pending on the coordinator: ${e.message}`
          yield* residents.update(move.sessionId, (v) => ({ ...v, status: "running" }))
          yield* link.abort(header).pipe(Effect.ignore)
          return { _tag: "Gone", reason } as const
        }),
      ),
      Effect.catch((e) =>
        Effect.gen(function* () {
          const reason = `move failed: ${e._tag} ${"op" in e ? e.op : ""}: ${e.message}`
          return abandoned(yield* abandon(reason), () => ({ _tag: "Failed", reason, paused: false }))
        }),
      ),
    )
    if (outcome._tag !== "Confirmed") return outcome

    // The target runs the guest. The commit is owed (durably, in the state file) until the
    // coordinator records it; until then the paused local copy is kept, because a coordinator
    // that answers "aborted" still places the session here (settleCommit).
    const phases = outcome.owed.phases!
    const settled = yield* settleCommit(deps, outcome.owed)
    if (settled._tag === "Refused") {
      return { _tag: "CommitRefused", reason: settled.reason, phases, restoredOnSource: settled.restoredOnSource } as const
    }
    return {
      _tag: "Committed",
      phases,
      rounds,
      runtimeDowntimeMs: outcome.runtimeDowntimeMs,
      alreadyPaused: outcome.alreadyPaused,
      pause: outcome.pause,
      guard: CoreMove.guardOf(reportOf(deps.allowance, outcome.estimateMs), phases),
    } as const
  })

/** What the guard decided on, as the commit posts it. */
const reportOf = (a: Downtime.Allowance, estimateMs: number): CoreMove.GuardReport => ({
  allowanceMs: a.allowanceMs,
  allowanceSource: a.source,
  allowanceSamples: a.samples,
  estimateMs: jsonMs(estimateMs),
})

/** How settling an owed move ended. */
export type Settled =
  | { readonly _tag: "Acknowledged" }
  | { readonly _tag: "Owed"; readonly reason: string }
  | { readonly _tag: "Refused"; readonly reason: string; readonly restoredOnSource: boolean }

/** What settling an owed move needs. */
export type SettleDeps = Pick<MoveSourceDeps, "hostId" | "coordinator" | "residents" | "runtime" | "link"> & {
  /** The coordinator's stale window (ms; default `Limits.defaults.heartbeatStaleWindowMs`): bounds a debt of a committed move whose session cannot be read (a `resend` debt, or a target that refused plainly: `resendGiveUpMs`). */
  readonly staleWindowMs?: number | undefined
}

/**
 * How long a move's target waits for the stream of a move it refused with `noStream` before it
 * boots the session afresh and tells the loss: twice the coordinator's stale window.
 */
export const resendWaitMs = (staleWindowMs: number): number => 2 * staleWindowMs

/**
 * How long a source keeps a `resend` debt whose session's placement it cannot read (403, or no
 * answer) from when the debt began: the target's own wait and a stale window more. By then the
 * target has resumed a stream, booted the session afresh, or the session went elsewhere or ended:
 * the copy is of no use, and held outside the ledger (its reservation went at the commit).
 */
export const resendGiveUpMs = (staleWindowMs: number): number => resendWaitMs(staleWindowMs) + staleWindowMs

const headerOf = (deps: SettleDeps, owed: PendingCommit, target: { readonly targetHostId: string; readonly memMib: number; readonly vcpus: number }): MoveHeader => ({
  moveId: owed.moveId,
  sessionId: owed.sessionId,
  sourceHostId: deps.hostId,
  targetHostId: target.targetHostId,
  memMib: target.memMib,
  vcpus: target.vcpus,
})

/** Whether the coordinator answered that it no longer holds the owed move (its 404 naming the move). */
const moveGone = (owed: PendingCommit, e: { readonly _tag: string }) => isNotFound(e, "move", owed.moveId)

/**
 * Settles a debt whose move the coordinator no longer holds (its 404 of the move): a pending move
 * is never pruned, so the move ended (committed or aborted, no longer known which) longer ago
 * than the coordinator keeps history (`ENGRAM_RETENTION_MS`), while this host was away. The
 * session's placement decides, by the rule of a move read `aborted` (`settleCommit`):
 *
 * - placed on this host: the coordinator's view wins. The target's copy is destroyed first (two
 *   running copies must never outlive this step; not reachable: still owed), then the paused
 *   copy resumes here;
 * - not here (elsewhere, ended, lost, or itself pruned): the guest is not this host's to run;
 *   the paused copy is destroyed and the target's is not touched (its reconcile decides);
 * - unreadable: still owed, asked again on the next pass.
 */
const settleGone = (deps: SettleDeps, owed: PendingCommit, step: string) =>
  Effect.gen(function* () {
    const { coordinator, residents, runtime, link } = deps
    const reason = `move ${owed.moveId} is no longer on the coordinator (${step} answered 404): it ended longer ago than the coordinator keeps history`
    const session = yield* retrying(coordinator.getSession(owed.sessionId)).pipe(Effect.result)
    if (session._tag === "Failure") {
      yield* Effect.logWarning(`${reason}; the session's placement cannot be read, retried on the next pass`, { moveId: owed.moveId, sessionId: owed.sessionId, error: session.failure.message })
      return { _tag: "Owed", reason: `${reason}; the session's placement cannot be read: ${session.failure.message}` } as const
    }
    // Not visible (403) is not this host's placement either: the rule "not here" holds for it.
    const here = placedOn(session.success, deps.hostId)
    const local = yield* residents.get(owed.sessionId)
    const paused = local !== undefined && local.moveId === null
    if (!here) {
      if (paused) {
        yield* runtime.destroy(owed.sessionId)
        yield* residents.remove(owed.sessionId)
      }
      yield* residents.removePendingCommit(owed.moveId)
      yield* Effect.logWarning(`${reason}. The session is not on this host (${session.success === null ? "unknown to the coordinator" : session.success === notVisible ? "placed elsewhere, not visible to this host" : `${session.success.state} on ${session.success.hostId ?? "no host"}`}): ${paused ? "the paused copy was destroyed" : "no copy was left here"}; the target's copy was not touched`, {
        moveId: owed.moveId,
        sessionId: owed.sessionId,
      })
      return { _tag: "Refused", reason, restoredOnSource: false } as const
    }
    if (!paused) {
      yield* residents.removePendingCommit(owed.moveId)
      yield* Effect.logError(`${reason}. The coordinator places the session on this host but no local copy is left; the target's copy was not touched`, { moveId: owed.moveId, sessionId: owed.sessionId })
      return { _tag: "Refused", reason, restoredOnSource: false } as const
    }
    if (owed.target === undefined) {
      yield* Effect.logError(`${reason}. The coordinator places the session on this host, but the owed move has no target recorded (a state file of an older agent): the source copy stays paused`, { moveId: owed.moveId, sessionId: owed.sessionId })
      return { _tag: "Owed", reason: `${reason}; no target recorded` } as const
    }
    const dropped = yield* link.abort(headerOf(deps, owed, { ...owed.target, memMib: local.memMib, vcpus: local.vcpus })).pipe(Effect.retry({ times: 2 }), Effect.result)
    if (dropped._tag === "Failure") {
      yield* Effect.logWarning(`${reason}. The coordinator places the session on this host, but the target's copy could not be destroyed yet; retried on the next pass`, {
        moveId: owed.moveId,
        sessionId: owed.sessionId,
        target: owed.target.targetHostId,
        error: dropped.failure.message,
      })
      return { _tag: "Owed", reason: `${reason}; the target's copy could not be destroyed yet: ${dropped.failure.message}` } as const
    }
    yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
    yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
    yield* residents.removePendingCommit(owed.moveId)
    yield* Effect.logWarning(`${reason}. The coordinator places the session on this host: the target's copy was destroyed and the guest resumed here from its pause`, {
      moveId: owed.moveId,
      sessionId: owed.sessionId,
      target: owed.target.targetHostId,
    })
    return { _tag: "Refused", reason, restoredOnSource: true } as const
  })

/**
 * Asks the target to commit a move whose point of no return is recorded (its intent, or with the
 * intent off its final round) and, normally, whose final round is sent:
 *
 * - it commits (or had committed: a repeat succeeds): the phases are measured to its answer and
 *   the owed record carries them (`Confirmed`);
 * - it refuses (`refused`: the guest does not run there, its incoming VM is gone, e.g. its stream
 *   was incomplete): the move is aborted with the coordinator, and only once the coordinator has
 *   ended it the source copy resumes (`Refused`; an abort not acknowledged: `Owed`, still paused).
 *   An abort refused (409) means the move ended either way: it is read, and the source copy
 *   resumes only if it reads aborted with the session on this host; committed: a refusal saying
 *   that the target's stream never completed (`noStream`) keeps the copy, owed with `resend`; a
 *   plain one (the target's report landed while the link was down and its reconcile cleared the
 *   move, or an agent older than the word, or one without its state file) is settled by the
 *   session's placement (`settlePlainRefusal`): placed on the target, the paused copy is dropped
 *   (`CommittedElsewhere`); never on an unknown placement (kept, up to the give-up);
 * - no answer (the link failed, the target is down): the owed record stays, the source stays
 *   paused (`Owed`), asked again on a later pass. Never two running copies.
 */
const confirmAtTarget = (deps: SettleDeps, owed: PendingCommit) =>
  Effect.gen(function* () {
    const { runtime, residents, link, coordinator } = deps
    if (owed.target === undefined || owed.pause === undefined) {
      const reason = "the owed move has no target recorded (a state file of an older agent)"
      yield* Effect.logError(`move outcome owed: ${reason}; the source copy stays paused`, { moveId: owed.moveId })
      return { _tag: "Owed", reason } as const
    }
    const header = headerOf(deps, owed, owed.target)
    const committed = yield* link.commit(header).pipe(Effect.result)
    if (committed._tag === "Success") {
      // The pause ends where the guest resumed on the target: its answer less the target's own
      // bookkeeping after the resume (never before the commit was asked for).
      const answeredAtMs = yield* nowMs
      const runningAtMs = Math.max(owed.pause.sentAtMs ?? answeredAtMs, answeredAtMs - committed.success.resumedForMs)
      const { pausedAtMs, captureMs } = owed.pause
      // A final round whose send was never measured (the agent stopped during it): its send is
      // not known, so the whole rest of the pause counts as the commit but for a nominal 1 ms.
      const phases = Move.phases({ pausedAtMs, checkedAtMs: pausedAtMs + captureMs, sendMs: owed.pause.sendMs ?? 1, runningAtMs })
      const confirmed: PendingCommit = { ...owed, phases }
      yield* residents.addPendingCommit(confirmed)
      return { _tag: "Confirmed", owed: confirmed, runningAtMs } as const
    }
    const e = committed.failure
    if (owed.refusedSinceMs !== undefined && e.noStream !== true) {
      // An earlier pass read the move committed (final: it is not asked to abort again) and the
      // target refusing plainly while the session's placement was not known: the placement
      // decides again, whatever the target answers now, and the give-up counts on when it cannot
      // be read. Placed on the target, unanswering now: its earlier plain refusal said that it
      // boots the session afresh there, so the copy is of no use (kept, it would hold RAM outside
      // the ledger for as long as the two hosts cannot reach each other).
      return yield* settlePlainRefusal(deps, owed, e.refused ? e.message : `refused earlier; unanswered now: ${e.message}`)
    }
    if (!e.refused) {
      yield* residents.addPendingCommit(owed)
      const reason = `the target's commit is not confirmed (${e.message}); the source copy stays paused, asked again on the next pass`
      yield* Effect.logWarning(`move outcome owed: ${reason}`, { moveId: owed.moveId, target: owed.target.targetHostId })
      return { _tag: "Owed", reason } as const
    }
    // The target answered: the guest does not run there (its stream was incomplete, or its VM
    // failed). The coordinator holds the point of no return (the intent, or off the final round),
    // so it ends the move first (the source's abort);
    // only then the source copy runs again. An abort not acknowledged leaves the debt: the
    // source stays paused and asks the target again on the next pass (it refuses again).
    const reason = `move failed: the target refused the commit: ${e.message}`
    const stayPaused = (why: string) =>
      Effect.gen(function* () {
        yield* residents.addPendingCommit(owed)
        yield* Effect.logWarning(`${reason}; ${why}; the source copy stays paused`, { moveId: owed.moveId })
        return { _tag: "Owed", reason: `${reason}; ${why}` } as const
      })
    const aborted = yield* retrying(coordinator.abort(owed.moveId, reason)).pipe(Effect.result)
    if (aborted._tag === "Failure") {
      if (moveGone(owed, aborted.failure)) return yield* settleGone(deps, owed, "its abort")
      if (aborted.failure._tag !== "Conflict") return yield* stayPaused(`the coordinator has not ended the move yet (${aborted.failure.message})`)
      // 409: the move is no longer pending, but it may have ended either way: committed (the
      // target's report landed while the link was down; the target then refuses a late commit,
      // its reconcile having cleared the move) means the guest runs there. Read which.
      const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
      if (read._tag === "Failure" && moveGone(owed, read.failure)) return yield* settleGone(deps, owed, "its read")
      if (read._tag === "Failure") return yield* stayPaused(`the move cannot be read (${read.failure.message})`)
      const m = read.success
      if (m.state === "committed" && e.noStream === true) {
        // The target's word: no guest of the move ran there, its stream never completed (an
        // operator committed the move before its final round, whose send then failed). The
        // coordinator's "committed" alone does not make the copy here go: it is the guest's only
        // memory, kept paused and streamed again on a later pass (`settleResend`).
        const why = `move ${m.id} is committed on the coordinator (the session placed on ${m.targetHostId}), but its target refused the commit: no guest of the move ran there, its stream never completed. The source copy is the guest's only memory: kept paused and streamed again on a later pass`
        yield* Effect.logError(why, { hostId: deps.hostId, moveId: m.id, sessionId: owed.sessionId, target: m.targetHostId })
        const { refusedSinceMs: _plain, ...resend } = owed
        yield* owedResend(deps, { ...resend, resend: true }, true)
        return { _tag: "Owed", reason: why } as const
      }
      if (m.state === "committed") return yield* settlePlainRefusal(deps, owed, e.message)
      if (m.state !== "aborted") return yield* stayPaused(`the move reads ${m.state}`)
      const session = yield* retrying(coordinator.getSession(owed.sessionId)).pipe(Effect.result)
      if (session._tag === "Failure") return yield* stayPaused(`the session's placement cannot be read (${session.failure.message})`)
      const here = placedOn(session.success, deps.hostId)
      if (!here) {
        yield* residents.removePendingCommit(owed.moveId)
        yield* Effect.logError(`${reason}; the move was aborted but the session is not on this host: the source copy is not resumed`, { moveId: owed.moveId, sessionId: owed.sessionId })
        return { _tag: "Refused", reason, restoredOnSource: false } as const
      }
    }
    yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
    yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
    yield* residents.removePendingCommit(owed.moveId)
    yield* Effect.logWarning(reason, { moveId: owed.moveId, sessionId: owed.sessionId })
    return { _tag: "Refused", reason, restoredOnSource: true } as const
  })

/** What `refusedSinceMs` counts from, as the give-up's log names it. */
const refusedSince = "the target first refused the commit without `noStream` while the session's placement was not known"

/**
 * A move the coordinator holds committed whose target refused the commit without saying that
 * its stream never completed (`noStream`): an agent older than that word, or one that lost its
 * state file, which boots the session afresh where the coordinator places it. The refusal alone
 * does not say where that is: the session's placement decides (`settleByPlacement`, the read a
 * `resend` debt takes):
 *
 * - placed on the target: it boots the session afresh, the copy here is of no use: destroyed,
 *   the debt paid (`CommittedElsewhere`);
 * - ended (pruned), or elsewhere: destroyed; placed on this source (the coordinator's way back):
 *   the guest resumes from its pause (`Refused`);
 * - not known (unreadable, or the coordinator's 403): the copy stays paused and owed, the time
 *   written (`refusedSinceMs`, once) so the give-up (`resendGiveUpMs` from it) ends a wait that
 *   never learns more: the copy never holds RAM outside the ledger for ever.
 */
const settlePlainRefusal = (deps: SettleDeps, owed: PendingCommit, refusal: string) =>
  Effect.gen(function* () {
    const { runtime, residents } = deps
    const targetHostId = owed.target?.targetHostId ?? "its target"
    const placement = yield* settleByPlacement(deps, owed, { ms: owed.refusedSinceMs, what: refusedSince })
    if (placement._tag === "Refused") return placement
    if (placement._tag === "Unknown") {
      const dated: PendingCommit = owed.refusedSinceMs === undefined ? { ...owed, refusedSinceMs: Math.round(yield* nowMs) } : owed
      yield* residents.addPendingCommit(dated)
      const reason = `move ${owed.moveId} is committed on the coordinator, its target ${targetHostId} refused the commit without saying that its stream never completed (${refusal}), and ${placement.why}: the source copy is kept paused while where the session is placed is not known, asked again on the next pass`
      yield* Effect.logWarning(`move outcome owed: ${reason}`, { hostId: deps.hostId, moveId: owed.moveId, sessionId: owed.sessionId })
      return { _tag: "Owed", reason } as const
    }
    const vm = yield* residents.get(owed.sessionId)
    if (vm !== undefined && vm.moveId === null) {
      yield* runtime.destroy(owed.sessionId)
      yield* residents.remove(owed.sessionId)
    }
    yield* residents.removePendingCommit(owed.moveId)
    const why = `the target refused a late commit of move ${owed.moveId}, which the coordinator holds committed with the session placed on ${targetHostId} (it boots the session afresh there, or runs it already); the paused source copy was dropped (${refusal})`
    yield* Effect.logWarning(why, { moveId: owed.moveId, sessionId: owed.sessionId })
    return { _tag: "CommittedElsewhere", reason: why } as const
  })

/**
 * Whether an owed move's point of no return is known to be held by the coordinator: its intent
 * (`intentRecorded`, a debt of an agent with the intent on), else its final round's record (a
 * debt with the intent off, or of an older agent).
 */
const intentHeld = (owed: PendingCommit): boolean => owed.intentRecorded ?? owed.finalRecorded !== false

/**
 * An owed move whose point of no return may not be recorded (the agent stopped while recording
 * it beside the send: the intent, after the runtime paused on its own, or with the intent off the
 * final round): the move is read, and a pending move without it gets it (the intent, or off the
 * late rounds and the final round) before the target may run the guest. Recording it now is safe whatever the
 * stream did: the target runs the guest only on our commit and only with a complete stream; it
 * refuses an incomplete one, and then the move is aborted before the source copy resumes
 * (`confirmAtTarget`). A committed move goes on; one that ended otherwise must not run on the
 * target: the target drops what it holds, then the source copy resumes.
 */
const ensureIntent = (deps: SettleDeps, owed: PendingCommit) =>
  Effect.gen(function* () {
    const { coordinator, residents, runtime, link } = deps
    if (intentHeld(owed)) return { _tag: "Held", owed } as const
    const held = { _tag: "Held", owed: { ...owed, intentRecorded: true } } as const
    const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure" && moveGone(owed, read.failure)) return yield* settleGone(deps, owed, "its read")
    if (read._tag === "Failure") return { _tag: "Owed", reason: `the move cannot be read: ${read.failure.message}` } as const
    const m = read.success
    if (m.state === "pending" && owed.intentRecorded === undefined) {
      // A debt of an agent without the intent (`moveIntent` off, or older): its point of no
      // return is the final round, recorded (the late rounds first unless held) before the
      // target may run the guest.
      if (owed.final !== undefined && !CoreMove.finalRoundRecorded(m)) {
        const lastLate = owed.lateRounds?.at(-1)
        const lateHeld = () => lastLate !== undefined && JSON.stringify(m.rounds.at(-1)) === JSON.stringify(lastLate)
        const records = owedRecords(owed, m.rounds, [owed.final], lateHeld)
        const r = yield* Effect.forEach(records, (round) => recordRound(coordinator, owed.moveId, round), { discard: true }).pipe(Effect.result)
        if (r._tag === "Failure" && moveGone(owed, r.failure)) return yield* settleGone(deps, owed, "its final round")
        if (r._tag === "Failure") return { _tag: "Owed", reason: `the final round is not recorded yet: ${r.failure.message}` } as const
      }
      const recorded = { ...owed, finalRecorded: true }
      yield* residents.addPendingCommit(recorded)
      return { _tag: "Held", owed: recorded } as const
    }
    if (m.state === "pending") {
      if (!CoreMove.pastNoReturn(m)) {
        // The late rounds went before the intent on the first run (it was to be recorded beside
        // the send): theirs first, at their positions. An older agent's debt: the intent alone,
        // its late rounds follow with the final round (`ensureFinalRecorded`).
        const records = owedRecords(owed, m.rounds, [intentRound], () => true)
        const r = yield* Effect.forEach(records, (round) => recordRound(coordinator, owed.moveId, round), { discard: true }).pipe(Effect.result)
        if (r._tag === "Failure" && moveGone(owed, r.failure)) return yield* settleGone(deps, owed, "its intent")
        if (r._tag === "Failure") return { _tag: "Owed", reason: `the intent is not recorded yet: ${r.failure.message}` } as const
      }
      yield* residents.addPendingCommit(held.owed)
      return held
    }
    if (m.state === "committed") return held
    const target = owed.target ?? { targetHostId: m.targetHostId, memMib: 0, vcpus: 0 }
    const dropped = yield* link.abort(headerOf(deps, owed, target)).pipe(Effect.retry({ times: 2 }), Effect.result)
    if (dropped._tag === "Failure") return { _tag: "Owed", reason: `the move ended before its intent was recorded; the target's copy could not be dropped yet: ${dropped.failure.message}` } as const
    yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
    yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
    yield* residents.removePendingCommit(owed.moveId)
    const reason = `the move ended (${m.state}: ${m.abortReason ?? "no reason"}) before its intent was recorded; the guest resumed on the source`
    yield* Effect.logWarning(reason, { moveId: owed.moveId, sessionId: owed.sessionId })
    return { _tag: "Refused", reason, restoredOnSource: true } as const
  })

/**
 * The final round's figures of a move the target runs, recorded before the commit (which needs
 * them) when the coordinator may not hold them yet: the late rounds first unless held. A move
 * that no longer reads pending needs none (the commit's answer tells what happened to it); so
 * does one a refused (409) round leaves read ended or holding a final round. A 409 on a move
 * still pending without one (a wrong position) leaves the figures owed.
 */
const ensureFinalRecorded = (deps: SettleDeps, owed: PendingCommit) =>
  Effect.gen(function* () {
    const { coordinator, residents } = deps
    if (owed.finalRecorded !== false || owed.final === undefined) return { _tag: "Recorded", owed } as const
    const recorded = { _tag: "Recorded", owed: { ...owed, finalRecorded: true } } as const
    const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure" && moveGone(owed, read.failure)) return yield* settleGone(deps, owed, "its read")
    if (read._tag === "Failure") return { _tag: "Owed", reason: `the move cannot be read: ${read.failure.message}` } as const
    const m = read.success
    if (m.state === "pending" && !CoreMove.finalRoundRecorded(m)) {
      const lastLate = owed.lateRounds?.at(-1)
      const lateHeld = () => lastLate === undefined || m.rounds.some((round) => JSON.stringify(round) === JSON.stringify(lastLate))
      // A final round whose send was never measured (the agent stopped during it): the send time known at the pause, if any.
      const final = owed.final.sendMs === 0 && owed.pause?.sendMs !== undefined ? { ...owed.final, sendMs: owed.pause.sendMs } : owed.final
      const r = yield* Effect.forEach(owedRecords(owed, m.rounds, [final], lateHeld), (round) => recordRound(coordinator, owed.moveId, round), { discard: true }).pipe(Effect.result)
      if (r._tag === "Failure" && moveGone(owed, r.failure)) return yield* settleGone(deps, owed, "its final round")
      if (r._tag === "Failure" && r.failure._tag !== "Conflict") return { _tag: "Owed", reason: `the final round is not recorded yet: ${r.failure.message}` } as const
      if (r._tag === "Failure") {
        // A 409 is the move's end, or a position refused on a move still pending (its records
        // changed since the read): only a move read again as ended, or holding a final round, needs none.
        const again = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
        if (again._tag === "Failure" && moveGone(owed, again.failure)) return yield* settleGone(deps, owed, "its read")
        if (again._tag === "Failure") return { _tag: "Owed", reason: `the final round was refused (${r.failure.message}) and the move cannot be read: ${again.failure.message}` } as const
        if (again.success.state === "pending" && !CoreMove.finalRoundRecorded(again.success)) {
          return { _tag: "Owed", reason: `the final round is not recorded yet: ${r.failure.message}` } as const
        }
      }
    }
    yield* residents.addPendingCommit(recorded.owed)
    return recorded
  })

/**
 * Settles a debt of a move its source ended without a commit whose abort was refused (409) while
 * the move could not be read (`abandoned`): it ended aborted or committed, not known which, and
 * the source copy is paused. The move is read now:
 *
 * - committed: the target may run the guest; the debt is settled as any owed outcome, with the
 *   target's word (`settleCommit`: the copy here goes once the target runs the guest);
 * - aborted: the target never runs the guest (it runs it only on this source's commit, never
 *   sent, or once the coordinator holds the move committed): it is told to drop what it got (its
 *   own pass drops it too) and the copy resumes here, as an acknowledged abort leaves it;
 * - still pending: the abort is asked again; acknowledged → as aborted; anything else → still owed;
 * - gone (404): the session's placement decides (`settleGone`);
 * - not readable: still owed, the copy stays paused, read again on the next pass.
 */
const settleAbandoned = (deps: SettleDeps, owed: PendingCommit): Effect.Effect<Settled> =>
  Effect.gen(function* () {
    const { coordinator, residents, runtime, link } = deps
    const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure" && moveGone(owed, read.failure)) return yield* settleGone(deps, owed, "its read")
    if (read._tag === "Failure") {
      const reason = `the abandoned move cannot be read (${read.failure.message}): it may have been committed; the source copy stays paused`
      yield* Effect.logWarning(`move outcome owed: ${reason}`, { moveId: owed.moveId, sessionId: owed.sessionId })
      return { _tag: "Owed", reason } as const
    }
    const m = read.success
    if (m.state === "committed") {
      const { abandoned: _abandoned, ...committed } = owed
      yield* Effect.logError(`move ${m.id} was committed on the coordinator (the session placed on ${m.targetHostId}) while this source ended it without a commit; the source copy stays paused and the target is asked whether it runs the guest: it decides which copy is kept`, {
        hostId: deps.hostId,
        moveId: m.id,
        sessionId: owed.sessionId,
        target: m.targetHostId,
      })
      yield* residents.addPendingCommit(committed)
      return yield* settleCommit(deps, committed)
    }
    if (m.state === "pending") {
      const aborted = yield* retrying(coordinator.abort(owed.moveId, "move aborted by its source: it ended the move without a commit")).pipe(Effect.result)
      if (aborted._tag === "Failure" && moveGone(owed, aborted.failure)) return yield* settleGone(deps, owed, "its abort")
      if (aborted._tag === "Failure") {
        const reason = `the abandoned move reads pending and its abort is not acknowledged yet (${aborted.failure.message}); the source copy stays paused`
        yield* Effect.logWarning(`move outcome owed: ${reason}`, { moveId: owed.moveId, sessionId: owed.sessionId })
        return { _tag: "Owed", reason } as const
      }
    }
    const target = owed.target ?? { targetHostId: m.targetHostId, memMib: 0, vcpus: 0 }
    yield* link.abort(headerOf(deps, owed, target)).pipe(Effect.ignore)
    yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
    yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
    yield* residents.removePendingCommit(owed.moveId)
    const reason = `the abandoned move ${m.id} reads aborted (${m.state === "pending" ? "its abort acknowledged now" : (m.abortReason ?? "no reason")}): the guest resumed on the source`
    yield* Effect.logWarning(reason, { moveId: owed.moveId, sessionId: owed.sessionId })
    return { _tag: "Refused", reason, restoredOnSource: true } as const
  })

/**
 * Settles a move whose outcome the source owes. Every step is idempotent, so it runs again
 * after a lost answer or a restart:
 *
 * - the target's commit not confirmed yet (`phases` null): ask the target again (see
 *   `confirmAtTarget`); the source copy stays paused until the target answers;
 * - the coordinator records the commit (200), or it was already recorded (409 and the move
 *   reads `committed`): the session runs on the target; the local copy is destroyed, the debt paid;
 * - 409 and the move reads `aborted`: the coordinator aborted the move after the guest went to
 *   the target. This is logged as an error. If the coordinator says the session is on this
 *   host, the coordinator's view wins: the target's copy is destroyed (peer abort) and the
 *   paused local copy resumed; the guest loses what it ran on the target since the commit.
 *   If the session is not here (ended, or elsewhere), nothing is destroyed on the target by
 *   this agent; the reconcile loops on both hosts drop what is no longer assigned;
 * - 404 of the move (at any step: its read, final round, commit or abort): the coordinator
 *   pruned it, long ended; the session's placement decides as for `aborted` (`settleGone`);
 * - anything else (the coordinator unreachable, the target unreachable for the abort): still
 *   owed, retried on the next pass.
 */
export const settleCommit = (deps: SettleDeps, debt: PendingCommit): Effect.Effect<Settled> =>
  Effect.gen(function* () {
    if (debt.resend === true) return yield* settleResend(deps, debt)
    if (debt.abandoned === true) return yield* settleAbandoned(deps, debt)
    if (debt.phases === null) {
      const held = yield* ensureIntent(deps, debt)
      if (held._tag !== "Held") return held
      const confirmed = yield* confirmAtTarget(deps, held.owed)
      if (confirmed._tag === "CommittedElsewhere") return { _tag: "Acknowledged" } as const
      if (confirmed._tag !== "Confirmed") return confirmed
      return yield* settleCommit(deps, confirmed.owed)
    }
    const figures = yield* ensureFinalRecorded(deps, debt)
    if (figures._tag !== "Recorded") return figures
    const owed = figures.owed
    const phases = owed.phases!
    const { coordinator, residents, runtime, link } = deps
    const dropLocalCopy = Effect.gen(function* () {
      const vm = yield* residents.get(owed.sessionId)
      if (vm !== undefined && vm.moveId === null) {
        yield* runtime.destroy(owed.sessionId)
        yield* residents.remove(owed.sessionId)
      }
      yield* residents.removePendingCommit(owed.moveId)
      return { _tag: "Acknowledged" } as const
    })
    const posted = yield* retrying(coordinator.commit(owed.moveId, phases, owed.guard)).pipe(Effect.result)
    if (posted._tag === "Success") return yield* dropLocalCopy
    if (moveGone(owed, posted.failure)) return yield* settleGone(deps, owed, "its commit")
    if (posted.failure._tag !== "Conflict") {
      const reason = `move commit owed; retried on the next pass: ${posted.failure.message}`
      yield* Effect.logWarning("move commit owed; retried on the next pass", { moveId: owed.moveId, error: posted.failure.message })
      return { _tag: "Owed", reason } as const
    }
    // 409: already recorded, or the move ended otherwise. Ask which.
    const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure" && moveGone(owed, read.failure)) return yield* settleGone(deps, owed, "its read")
    if (read._tag === "Failure") {
      yield* Effect.logWarning("move commit refused and the move cannot be read; retried on the next pass", { moveId: owed.moveId, error: read.failure.message })
      return { _tag: "Owed", reason: `the move cannot be read: ${read.failure.message}` } as const
    }
    const m = read.success
    if (m.state === "committed") return yield* dropLocalCopy
    if (m.state === "pending") {
      yield* Effect.logWarning("move commit refused while the move is pending; retried on the next pass", { moveId: owed.moveId, error: posted.failure.message })
      return { _tag: "Owed", reason: `commit refused while pending: ${posted.failure.message}` } as const
    }
    const reason = `the target committed move ${m.id} but the coordinator had aborted it (${m.abortReason ?? "no reason"})`
    const session = yield* retrying(coordinator.getSession(owed.sessionId)).pipe(Effect.result)
    if (session._tag === "Failure") {
      yield* Effect.logError(`move commit refused: ${reason}; the session's placement cannot be read, retried on the next pass`, {
        moveId: m.id,
        sessionId: owed.sessionId,
        error: session.failure.message,
      })
      return { _tag: "Owed", reason } as const
    }
    const here = placedOn(session.success, deps.hostId)
    const local = yield* residents.get(owed.sessionId)
    if (here && local !== undefined && local.moveId === null) {
      // The coordinator places the session here: its view wins. Destroy the target's copy first
      // (two running copies must never outlive this step), then resume the paused local one.
      const header = headerOf(deps, owed, { targetHostId: m.targetHostId, memMib: local.memMib, vcpus: local.vcpus })
      const dropped = yield* link.abort(header).pipe(Effect.retry({ times: 2 }), Effect.result)
      if (dropped._tag === "Failure") {
        yield* Effect.logError(`move commit refused: ${reason}; the coordinator places the session on this host, but the target's copy could not be destroyed yet; retried on the next pass`, {
          moveId: m.id,
          sessionId: owed.sessionId,
          target: m.targetHostId,
          error: dropped.failure.message,
        })
        return { _tag: "Owed", reason } as const
      }
      yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
      yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
      yield* residents.removePendingCommit(owed.moveId)
      yield* Effect.logError(`move commit refused: ${reason}. The coordinator places the session on this host: the target's copy was destroyed and the guest resumed here from its pause (what it ran on the target since is lost)`, {
        moveId: m.id,
        sessionId: owed.sessionId,
        target: m.targetHostId,
      })
      return { _tag: "Refused", reason, restoredOnSource: true } as const
    }
    yield* residents.removePendingCommit(owed.moveId)
    yield* Effect.logError(
      here
        ? `move commit refused: ${reason}. The coordinator places the session on this host but no local copy is left; the target's copy was not touched`
        : `move commit refused: ${reason}. The session is not on this host (${session.success === null ? "unknown to the coordinator" : session.success === notVisible ? "placed elsewhere, not visible to this host" : session.success.state}); the target's copy was not touched`,
      { moveId: m.id, sessionId: owed.sessionId, target: m.targetHostId },
    )
    return { _tag: "Refused", reason, restoredOnSource: false } as const
  })

/**
 * Keeps the source copy of a `resend` debt paused (a runtime that gave a pause back resumed it)
 * and the debt written (the state file: a restarted agent settles it the same way); answers the
 * debt written. `noStream`: the target has answered that it runs nothing of the move (its stream
 * never completed, or its "not yet" says it resumed nothing), so the copy here is the guest's
 * only whole one: the coordinator is told (`tellResend`) if it was not. Before that word the mark
 * is not set: a target that got the whole stream (the source's send failing after its last byte)
 * resumes the guest itself, and a way back to this source would resume an older copy beside it.
 */
const owedResend = (deps: SettleDeps, owed: PendingCommit, noStream: boolean): Effect.Effect<PendingCommit> =>
  Effect.gen(function* () {
    const { runtime, residents } = deps
    const running = (yield* runtime.list).some((v) => v.vmId === owed.sessionId && v.status === "running")
    if (running) {
      yield* runtime.park(owed.sessionId).pipe(
        Effect.catch((e) => Effect.logError("the source copy of a committed move could not be paused again; it is kept, and streamed again on a later pass", { moveId: owed.moveId, sessionId: owed.sessionId, error: e.message })),
      )
    }
    yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "paused" }))
    const dated = owed.resendSinceMs === undefined ? { ...owed, resendSinceMs: Math.round(yield* nowMs) } : owed
    // Told on the target's word that it runs nothing (`noStream`), and on every later pass while a
    // tell it owes went unanswered (`resendTold: false`), whatever the target answers then.
    const tell = dated.resendTold !== true && (noStream || dated.resendTold === false)
    const written = tell ? yield* tellResend(deps, dated) : dated
    yield* residents.addPendingCommit(written)
    return written
  })

/**
 * Tells the coordinator that this source owes the move's target a resend (`POST
 * /v1/moves/{id}/resend {"owed": true}`): it holds the guest's only whole copy, paused. Only this
 * mark lets the coordinator send the session back here should the target die (a commit without
 * phases alone may be the target's own resolution: it ran the guest, and this copy is older).
 * Answers the debt with `resendTold` once the coordinator recorded it, or answered that it does not
 * know the call (older: the session is lost there should the target die, as before) or refused it
 * (the move is not committed without phases: no way back is owed); unanswered, the debt as it was,
 * told again on the next pass.
 */
const tellResend = (deps: SettleDeps, owed: PendingCommit) =>
  Effect.gen(function* () {
    const fields = { hostId: deps.hostId, moveId: owed.moveId, sessionId: owed.sessionId }
    // The mark's clears read first (after the target's word that it runs nothing), named in the
    // tell: should the tell reach the coordinator late, after the target cleared the mark and
    // resumed a stream sent again, it changes nothing (the coordinator's `resendTellStale`).
    // Unread: not told (owed), as an unanswered tell. A coordinator older than the count shows
    // none: the tell goes without it (set as before).
    const read = yield* retrying(deps.coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure" && !moveGone(owed, read.failure)) {
      yield* Effect.logWarning(`the coordinator was not told of the resend owed yet: the move's resend mark could not be read first (${read.failure.message}); told on the next pass, before the target is asked anything`, fields)
      return { ...owed, resendTold: false }
    }
    const seenClears = read._tag === "Success" ? read.success.resendClears : undefined
    const told = yield* retrying(deps.coordinator.resendOwed(owed.moveId, true, seenClears)).pipe(Effect.result)
    if (told._tag === "Success") {
      if (told.success === "stale") {
        // Cleared since the read: the target clears the mark before it resumes a stream sent
        // again. Not told, and owed no more as a tell first: the target is asked first on the next
        // pass (it runs the guest, or says that it runs nothing, and the mark is told again then).
        yield* Effect.logWarning("the coordinator answered the resend mark cleared since this source read it (the target cleared it before resuming a stream sent again): nothing set; the target is asked on the next pass before the mark is told again", fields)
        const { resendTold: _told, ...untold } = owed
        return untold
      }
      if (told.success === "unknown")
        yield* Effect.logWarning("the coordinator does not know the resend mark (older than it): should the move's target die, the session ends lost there, and this copy goes with it", fields)
      return { ...owed, resendTold: true }
    }
    if (told.failure._tag === "Conflict" || moveGone(owed, told.failure)) {
      yield* Effect.logWarning(`the coordinator refused the resend mark (${told.failure.message}); the debt stays as it is`, fields)
      return { ...owed, resendTold: true }
    }
    yield* Effect.logWarning(`the coordinator was not told of the resend owed yet (${told.failure.message}); told on the next pass, before the target is asked anything`, fields)
    // Owed (false, not absent): told on every later pass until answered (`owedResend`).
    return { ...owed, resendTold: false }
  })

/**
 * The resend debt is over (the target runs the guest, or the session is no longer placed there):
 * the coordinator's mark is cleared, after the copy here went, so a later death of the target
 * does not send the session back here. Unanswered, the mark stays: should the target then die, the
 * session comes back here, finds no copy, and is booted afresh with its loss told (never an older
 * copy resumed: the copy went first). Sent whether or not the mark was told (a pass may have
 * told it after its debt was read): clearing a mark never set changes nothing.
 */
const untellResend = (deps: SettleDeps, owed: PendingCommit) =>
  retrying(deps.coordinator.resendOwed(owed.moveId, false)).pipe(
    Effect.catch((e) => Effect.logWarning(`the coordinator's resend mark could not be cleared (${e.message})`, { hostId: deps.hostId, moveId: owed.moveId, sessionId: owed.sessionId })),
    Effect.asVoid,
  )

/**
 * The budget of a stream sent again (`settleResend`): the guest is paused already, so its pause
 * is not the move's budget any more, and the runtime's guard refuses a guest already paused
 * nothing (core's `Downtime.check`); one whose park failed (it runs) is let go by `overBudget`
 * (the move is committed). The long budget bounds the final round's send.
 */
const resendBudget = { maxDowntimeMs: 3_600_000, commitAllowanceMs: 400, maxPreCopyRounds: 2 }

/** `settleByPlacement`'s read of the session: still placed on the move's target. */
const onTarget = { _tag: "OnTarget" } as const
/** `settleByPlacement`'s read of the session: where it is placed is not known (unread, or `notVisible`: the coordinator's 403). */
const unknownPlacement = (why: string, notVisible: boolean) => ({ _tag: "Unknown", why, notVisible }) as const

/**
 * Settles a debt of a move committed on the coordinator by where its session is placed, read
 * whenever the target does not run the guest: the copy here is owed to the target only while
 * the session is placed there. One read for both debts that ask it (`settleResend`, and
 * `confirmAtTarget` on a refusal without `noStream`):
 *
 * - ended (or unknown to the coordinator: pruned), or placed elsewhere: the debt is over (placed
 *   here, the coordinator's way back after the target was silent: the guest resumes from its
 *   pause; else the copy is destroyed). `Refused`;
 * - still placed on the target: `onTarget`, the caller decides by the target's answer;
 * - unread, or not visible to this host (the coordinator's 403: one older than letting a move's
 *   source read its session, or a later move this host took no part in; it says nothing of where
 *   the session is): `Unknown`, the copy kept, unless the debt's wait began (`since.ms`; absent:
 *   it begins now, the caller writes it) longer ago than `resendGiveUpMs` (the target's own wait
 *   and a stale window more): then the copy, of no use by then and holding RAM outside the
 *   ledger, is destroyed (`Refused`, logged at error).
 *
 * A debt with `resend` has the coordinator's resend mark cleared once over (`untellResend`).
 */
const settleByPlacement = (deps: SettleDeps, owed: PendingCommit, since: { readonly ms: number | undefined; readonly what: string }) =>
  Effect.gen(function* () {
    const { runtime, residents } = deps
    const fields = { hostId: deps.hostId, moveId: owed.moveId, sessionId: owed.sessionId }
    const targetHostId = owed.target?.targetHostId ?? "its target"
    const local = yield* residents.get(owed.sessionId)
    /** Whether the paused copy is here (a VM of the session with no move of its own). */
    const copy = local !== undefined && local.moveId === null
    const endDebt = Effect.gen(function* () {
      yield* residents.removePendingCommit(owed.moveId)
      if (owed.resend === true) yield* untellResend(deps, owed)
    })
    const destroyCopy = Effect.gen(function* () {
      if (!copy) return
      yield* runtime.destroy(owed.sessionId)
      yield* residents.remove(owed.sessionId)
    })
    const unknown = (why: string, notVisible = false) =>
      Effect.gen(function* () {
        const windowMs = deps.staleWindowMs ?? Limits.defaults.heartbeatStaleWindowMs
        const ageMs = since.ms === undefined ? 0 : (yield* nowMs) - since.ms
        if (ageMs <= resendGiveUpMs(windowMs)) return unknownPlacement(why, notVisible)
        yield* destroyCopy
        yield* endDebt
        const reason = `move ${owed.moveId}: ${why} for ${Math.round(ageMs)} ms since ${since.what}, past the target's own wait (${resendWaitMs(windowMs)} ms) and a stale window (${windowMs} ms): the target has resumed a stream, booted the session afresh, or the session went elsewhere or ended; ${copy ? "the paused source copy, of no use, was destroyed" : "no copy was left here"}`
        yield* Effect.logError(reason, { ...fields, target: targetHostId })
        return { _tag: "Refused", reason, restoredOnSource: false } as const
      })
    const read = yield* retrying(deps.coordinator.getSession(owed.sessionId)).pipe(Effect.result)
    if (read._tag === "Failure") return yield* unknown(`the session's placement cannot be read (${read.failure.message})`)
    const session = read.success
    if (session === notVisible) {
      yield* Effect.logWarning(`move ${owed.moveId}: the coordinator does not let this host read the session (403: older than letting a move's source read it, or a later move took it): its placement is not known, the paused copy stays`, fields)
      return yield* unknown("the coordinator does not let this host read the session (403)", true)
    }
    if (owed.target !== undefined && placedOn(session, owed.target.targetHostId)) return onTarget
    const here = placedOn(session, deps.hostId)
    if (copy && here) {
      yield* runtime.unpark(owed.sessionId).pipe(Effect.ignore)
      yield* residents.update(owed.sessionId, (v) => ({ ...v, status: "running" }))
    } else yield* destroyCopy
    yield* endDebt
    const where = session === null ? "unknown to the coordinator: ended and pruned" : `${session.state} on ${session.hostId ?? "no host"}`
    const reason = `move ${owed.moveId}: the session is no longer placed on its target ${targetHostId} (${where}): ${copy && here ? "the guest resumed here from its paused copy" : copy ? "the paused source copy was destroyed" : "no copy was left here"}`
    yield* Effect.logWarning(reason, fields)
    return { _tag: "Refused", reason, restoredOnSource: copy && here } as const
  })

/**
 * Settles a `resend` debt: a move committed on the coordinator (an operator's word while its
 * source was not heard) whose stream never completed at the target (the final round's send
 * failed, or the target refused its commit with `noStream`). The source copy, paused, is the
 * guest's only memory. Each pass:
 *
 * 1. the target is asked to commit: it runs the guest (a commit of an earlier pass whose answer
 *    was lost, a repeat, or a guest it booted afresh after its wait) → the copy here is
 *    destroyed, the debt paid; anything else → the session's placement is read
 *    (`settleByPlacement`): no longer on the target → the debt is over (ended or elsewhere: the
 *    copy destroyed; placed here, the coordinator's way back after the target was silent: the
 *    guest resumes from its pause); still on the target → a refusal saying that its stream never
 *    completed (`noStream`): step 2; no answer: still owed (a "not yet" saying that the target
 *    resumed nothing, `notResumed`: the mark set again, not streamed: the target holds the
 *    stream); a refusal without the word (an agent
 *    older than it, which boots the session afresh) → the copy destroyed; not readable (or not
 *    visible to this host) → still owed, whatever the target answered: the copy is never
 *    destroyed on an unknown (only on a placement read elsewhere, ended or pruned, on the
 *    target's run of the guest, or past `resendGiveUpMs`), and never streamed then: a target that
 *    answers `noStream` may not have read yet that the session went back to this source, and a
 *    stream it resumed there would be destroyed by its reconcile while this host boots the
 *    session afresh;
 * 2. the coordinator's resend mark is set again (`tellResend`): the target clears it before it
 *    resumes a stream sent again, and may have cleared it on an earlier pass before it found
 *    that stream incomplete (a stream that failed partway); a tell unanswered → still owed, not
 *    streamed (no pass streams while the mark may be unset);
 * 3. the target prepares again (a fresh incoming VM of the move) and the runtime migrates the
 *    paused copy to it, over any budget (`overBudget` always true: the move is committed), then
 *    sends the final round; the copy stays paused whatever happened;
 * 4. the target is asked to commit: it runs the guest → the copy here is destroyed; anything
 *    else → still owed, tried again on the next pass (on `noStream`, or a "not yet" saying it
 *    resumed nothing, the mark set again: the target may have cleared it first).
 *
 * The move is not recorded again: the coordinator holds it committed already (no phases: an
 * operator's commit has none). Never two running copies: the copy here resumes only where the
 * coordinator places the session here, off the target.
 */
const settleResend = (deps: SettleDeps, owed: PendingCommit): Effect.Effect<Settled> =>
  Effect.gen(function* () {
    const { runtime, residents, link } = deps
    const fields = { hostId: deps.hostId, moveId: owed.moveId, sessionId: owed.sessionId }
    /** The debt as this pass last wrote it. */
    let debt = owed
    /**
     * `noStream`: the target answered, this pass, that it runs nothing of the move (its stream
     * never completed, or it resumed nothing). `tellAgain`: the coordinator is told even if it
     * was (the target clears the mark before it resumes a stream sent again, and may have
     * cleared it before it answered so).
     */
    const stillOwed = (why: string, noStream = false, tellAgain = false) =>
      Effect.gen(function* () {
        const { resendTold: _told, ...untold } = debt
        debt = yield* owedResend(deps, tellAgain ? untold : debt, noStream)
        const reason = `move ${owed.moveId} is committed but its guest's memory is still only in the paused source copy: ${why}; the copy is kept paused and the target asked again on the next pass`
        yield* Effect.logWarning(reason, fields)
        return { _tag: "Owed", reason } as const
      })
    if (owed.target === undefined) return yield* stillOwed("no target recorded")
    const header = headerOf(deps, owed, owed.target)
    const local = yield* residents.get(owed.sessionId)
    /** Whether the paused copy is here (a VM of the session with no move of its own). */
    const copy = local !== undefined && local.moveId === null
    /** The paused copy here, if any, destroyed. */
    const destroyCopy = Effect.gen(function* () {
      if (!copy) return
      yield* runtime.destroy(owed.sessionId)
      yield* residents.remove(owed.sessionId)
    })
    const dropCopy = Effect.gen(function* () {
      yield* destroyCopy
      yield* residents.removePendingCommit(owed.moveId)
      yield* untellResend(deps, owed)
      // Its commit answers alike for a guest resumed from this stream and for one it booted
      // afresh after its wait (`Agent.resendWaitMs`; its own log, and its loss report, say which).
      yield* Effect.logWarning(`move ${owed.moveId}: the target runs the guest (resumed from the source copy streamed again, or booted afresh after waiting for it: see the target's log); the source copy was destroyed`, { ...fields, target: owed.target!.targetHostId })
      return { _tag: "Acknowledged" } as const
    })
    /** Still owed, the debt as written already (a tell unanswered this pass: not tried twice). */
    const owedUntold = (why: string) =>
      Effect.gen(function* () {
        const reason = `move ${owed.moveId} is committed but its guest's memory is still only in the paused source copy: ${why}; the copy is kept paused and the coordinator told on the next pass`
        yield* Effect.logWarning(reason, fields)
        return { _tag: "Owed", reason } as const
      })
    // A tell owed since a pass whose tell went unanswered (after the target's word that it runs
    // nothing): told first. Still unanswered, the target is not asked to commit (it clears the
    // mark before any resume: a tell landing late after that would send the session back to this
    // older copy); the placement is still read (the way back here, ended, elsewhere, the give-up).
    if (debt.resendTold === false) {
      debt = yield* owedResend(deps, debt, true)
      if (debt.resendTold !== true) {
        const placement = yield* settleByPlacement(deps, debt, { ms: debt.resendSinceMs, what: "the resend debt began" })
        if (placement._tag !== "OnTarget" && placement._tag !== "Unknown") return placement
        return yield* owedUntold("the coordinator was not told of the resend owed: the target is not asked to commit while the mark may be unset")
      }
    }
    const asked = yield* link.commit(header).pipe(Effect.result)
    if (asked._tag === "Success") return yield* dropCopy
    // Read whenever the target does not run the guest (before every stream sent again included).
    const placement = yield* settleByPlacement(deps, owed, { ms: owed.resendSinceMs, what: "the resend debt began" })
    if (placement._tag !== "OnTarget" && placement._tag !== "Unknown") return placement
    if (!asked.failure.refused) {
      // Its "not yet" saying that it resumed nothing (`notResumed`: it cleared the mark, say, then
      // could not read the placement): the mark is set again, and it clears it again before any
      // later resume; nothing streamed (it holds the stream). Any other: no answer, as before.
      const notResumed = asked.failure.notResumed === true
      return yield* stillOwed(`the target did not ${notResumed ? "resume the stream yet" : "answer its commit"} (${asked.failure.message})`, notResumed, notResumed)
    }
    if (asked.failure.noStream !== true) {
      // Where the session is placed is not known, and the refusal alone does not say it: a target
      // that forgot its note once the session left it (the coordinator's way back to this source,
      // say, which this host cannot read while the coordinator does not answer) refuses so too.
      // The copy stays until a read places the session, or past `resendGiveUpMs`.
      if (placement._tag === "Unknown") {
        return yield* stillOwed(`its target ${owed.target.targetHostId} refused the commit without saying that its stream never completed (${asked.failure.message}), and ${placement.why}: the copy is kept while where the session is placed is not known`)
      }
      // Placed on a target that refuses without `noStream`: an agent older than that word (or one
      // that lost its state file), which boots the session afresh where it is placed, as
      // `confirmAtTarget` takes such a refusal of a committed move: the copy here is of no use.
      yield* destroyCopy
      yield* residents.removePendingCommit(owed.moveId)
      yield* untellResend(deps, owed)
      const reason = `move ${owed.moveId}: its target ${owed.target.targetHostId} refused the commit without saying that its stream never completed (an agent older than that word, or one without its state file): it boots the session afresh, its memory lost; the paused source copy was destroyed (${asked.failure.message})`
      yield* Effect.logError(reason, fields)
      return { _tag: "Refused", reason, restoredOnSource: false } as const
    }
    // Streamed only while the session is placed on the target: not the coordinator's way back
    // to this source, say, which the target may not have read yet. Or where the coordinator does
    // not let this host read the session (403) while the target checks the placement itself
    // before it resumes a stream sent again (`checksPlacement`): a 403 rules out only "placed
    // here" (a host reads its own sessions), and such a target resumes nothing the coordinator
    // does not place on it (it drops the stream instead). An older target does not check: a
    // stream it resumed while the session is on a third host would run beside that guest.
    const targetChecks = placement._tag === "Unknown" && placement.notVisible && asked.failure.checksPlacement === true
    if (placement._tag === "Unknown" && !targetChecks) return yield* stillOwed(`the target says its stream never completed, but ${placement.why}: not streamed while where the session is placed is not known`, true, true)
    if (!copy) {
      // Nothing here to stream: the debt cannot be settled by this host.
      yield* residents.removePendingCommit(owed.moveId)
      yield* untellResend(deps, owed)
      const reason = `move ${owed.moveId}: the source copy to stream again is gone from this host; the guest's memory is lost`
      yield* Effect.logError(reason, fields)
      return { _tag: "Refused", reason, restoredOnSource: false } as const
    }
    // Its `noStream` proves the target runs nothing, and it may have cleared the mark before it
    // found its stream incomplete (one of an earlier pass that failed partway): set again before
    // this stream, and nothing streamed while that tell is unanswered.
    const { resendTold: _told, ...untold } = debt
    debt = yield* owedResend(deps, untold, true)
    if (debt.resendTold !== true) return yield* owedUntold("the coordinator was not told of the resend owed: not streamed while the mark may be unset")
    const sent = yield* Effect.gen(function* () {
      const endpoint = yield* link.prepare(header)
      const r = yield* runtime.migrate(owed.sessionId, {
        moveId: owed.moveId,
        endpoint,
        budget: resendBudget,
        onRound: () => Effect.void,
        overBudget: () => Effect.succeed(true),
      })
      if (r._tag !== "AtSwitchover") return yield* Effect.fail({ message: `the runtime did not reach the switchover (${r._tag}: ${r.reason})` })
      yield* Effect.logWarning(`move ${owed.moveId}: streaming the paused source copy again to its target (the move is committed; its first stream never completed there)`, { ...fields, target: owed.target!.targetHostId })
      return yield* r.switchover
    }).pipe(Effect.result)
    if (sent._tag === "Failure") return yield* stillOwed(`its stream failed again (${sent.failure.message})`, true)
    debt = yield* owedResend(deps, debt, true)
    const committed = yield* link.commit(header).pipe(Effect.result)
    if (committed._tag === "Success") return yield* dropCopy
    // Told again only on the target's word that it runs nothing: `noStream`, or a "not yet" saying
    // that it resumed nothing (`notResumed`); either may come after it cleared the mark.
    // Unanswered (or an older target's "not yet"), it may have cleared the mark and resumed the
    // guest (its answer lost): a mark set now would send the session back to this older copy.
    const runsNothing = committed.failure.noStream === true || committed.failure.notResumed === true
    return yield* stillOwed(`the target's commit of the stream sent again is not confirmed (${committed.failure.message})`, runsNothing, runsNothing)
  })
