/**
 * The source's side of a live move (SPEC §5): pre-copy rounds while the guest runs (a full
 * capture, then deltas while the dirty set shrinks, up to `maxPreCopyRounds`), the pre-pause
 * estimate, the pause, the final capture, the post-capture check, the final round and the
 * target's commit. Every estimate and verdict comes from `@engram/core`'s `Downtime`; this
 * module only measures and acts. The guard refuses before pausing, or, once paused, aborts
 * before the final round is sent and resumes the guest here.
 */
import { Downtime } from "@engram/core"
import { Clock, Effect, Schedule } from "effect"
import type { AssignedMove, CoordinatorShape, PhasesReport, RoundReport } from "./Coordinator.js"
import type { PendingCommit } from "./LocalState.js"
import type { MoveHeader } from "./MoveTarget.js"
import type { PeerLink } from "./PeerLink.js"
import type { Residents } from "./Residents.js"
import type { Capture, VmRuntimeShape } from "./Runtime.js"

export interface MoveSourceDeps {
  readonly hostId: string
  readonly runtime: VmRuntimeShape
  readonly coordinator: CoordinatorShape
  readonly link: PeerLink
  readonly residents: Residents
  /** Pre-copy rounds at most (the full round included). */
  readonly maxPreCopyRounds: number
  /** The coordinator's `commitAllowanceMs`, from the assignments answer that carried the move. */
  readonly commitAllowanceMs: number
}

/** How a move ended on the source. */
export type MoveOutcome =
  | { readonly _tag: "Committed"; readonly phases: PhasesReport; readonly rounds: readonly RoundReport[] }
  | {
      readonly _tag: "Refused"
      /** `pre-pause`: refused before pausing; `post-capture`: aborted paused, guest resumed here. */
      readonly stage: "pre-pause" | "post-capture"
      readonly estimateMs: number
      readonly reason: string
      readonly paused: boolean
      readonly rounds: readonly RoundReport[]
    }
  | { readonly _tag: "Failed"; readonly reason: string; readonly paused: boolean }
  /** The coordinator no longer holds the move pending (ended or aborted elsewhere). */
  | { readonly _tag: "Gone"; readonly reason: string }
  /**
   * The target committed, but the coordinator had already aborted the move (a race the
   * coordinator fences against; see README "The move protocol"). `restoredOnSource`: the
   * coordinator says the session runs here, so the target's copy was destroyed and the guest
   * resumed here from its paused copy.
   */
  | { readonly _tag: "CommitRefused"; readonly reason: string; readonly phases: PhasesReport; readonly restoredOnSource: boolean }

// Phases are timed in nanoseconds (sub-millisecond on a real clock): SPEC §12 wants every
// phase of a commit > 0, and a fast phase measured in whole milliseconds reads 0.
const nowNs = Clock.currentTimeNanos
const msSince = (t0: bigint) => Effect.map(nowNs, (t) => Number(t - t0) / 1e6)

const timed = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const t0 = yield* nowNs
    const a = yield* eff
    return [a, yield* msSince(t0)] as const
  })

/** The coordinator's call, retried briefly on transient errors (a 409 is an answer, not retried). */
const retrying = <A, E extends { readonly _tag: string }>(eff: Effect.Effect<A, E>) =>
  eff.pipe(Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 4, while: (e) => e._tag === "CoordinatorError" }))

const jsonMs = (ms: number) => (Number.isFinite(ms) ? Math.ceil(ms) : Number.MAX_SAFE_INTEGER)

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
    let paused = false

    /** Ends the move without a commit: the guest runs here, the target drops what it got. */
    const abandon = (reason: string, estimateMs?: number) =>
      Effect.gen(function* () {
        if (paused) yield* runtime.resume(move.sessionId).pipe(Effect.ignore)
        yield* runtime.stopTracking(move.sessionId).pipe(Effect.ignore)
        yield* residents.update(move.sessionId, (v) => ({ ...v, status: "running" }))
        yield* link.abort(header).pipe(Effect.retry({ times: 2 }), Effect.ignore)
        yield* retrying(coordinator.abort(move.id, reason, estimateMs === undefined ? undefined : jsonMs(estimateMs))).pipe(
          Effect.catchTag("Conflict", () => Effect.void),
          Effect.catch((e) => Effect.logWarning("move abort not acknowledged", { moveId: move.id, error: e.message })),
        )
      })

    const sendRound = (capture: Capture, captureMs: number) =>
      Effect.gen(function* () {
        const [, sendMs] = yield* timed(runtime.paceSend(capture.wireBytes).pipe(Effect.andThen(link.send(header, capture))))
        const round: RoundReport = { kind: capture.kind, wireBytes: capture.wireBytes, apparentBytes: capture.apparentBytes, sendMs, captureMs }
        rounds.push(round)
        return round
      })
    const live = (capture: Capture, captureMs: number) =>
      Effect.gen(function* () {
        const round = yield* sendRound(capture, captureMs)
        yield* retrying(coordinator.round(move.id, round))
        return round
      })

    const protocol = Effect.gen(function* () {
      // Pre-copy, guest running.
      const [full, fullMs] = yield* timed(runtime.fullCapture(move.sessionId))
      yield* live(full, fullMs)
      let lastDelta: RoundReport | null = null
      while (rounds.length < Math.max(2, deps.maxPreCopyRounds)) {
        const [delta, deltaMs] = yield* timed(runtime.deltaCapture(move.sessionId, "delta"))
        const round = yield* live(delta, deltaMs)
        const shrank = lastDelta === null || round.apparentBytes < lastDelta.apparentBytes
        lastDelta = round
        if (!shrank || round.apparentBytes === 0) break
      }
      const last = lastDelta as RoundReport
      const rateBytesPerMs = Downtime.rateBytesPerMs(rounds)
      const pre = Downtime.check({
        lastDeltaWireBytes: last.wireBytes,
        rateBytesPerMs,
        commitAllowanceMs: deps.commitAllowanceMs,
        maxDowntimeMs: move.maxDowntimeMs,
      })
      if (pre._tag === "Overrun") {
        const reason = `ErrMoveDowntime: pre-pause estimate ${jsonMs(pre.estimateMs)} ms > maxDowntimeMs ${move.maxDowntimeMs} ms; refused before pausing`
        yield* abandon(reason, pre.estimateMs)
        return { _tag: "Refused", stage: "pre-pause", estimateMs: pre.estimateMs, reason, paused: false, rounds } as const
      }

      // Paused: the downtime runs from here to the target's resume.
      const pausedAt = yield* nowNs
      paused = true
      yield* runtime.pause(move.sessionId)
      const [final, captureMs] = yield* timed(runtime.deltaCapture(move.sessionId, "final"))
      const post = Downtime.check({
        captureMs,
        lastDeltaWireBytes: last.wireBytes,
        lastDeltaApparentBytes: last.apparentBytes,
        finalApparentBytes: final.apparentBytes,
        rateBytesPerMs,
        commitAllowanceMs: deps.commitAllowanceMs,
        maxDowntimeMs: move.maxDowntimeMs,
      })
      if (post._tag === "Overrun") {
        const reason = `ErrMoveDowntime: post-capture estimate ${jsonMs(post.estimateMs)} ms > maxDowntimeMs ${move.maxDowntimeMs} ms (final capture ${captureMs} ms); aborted before the final round, guest resumed on the source`
        yield* abandon(reason, post.estimateMs)
        return { _tag: "Refused", stage: "post-capture", estimateMs: post.estimateMs, reason, paused: true, rounds } as const
      }
      // Record the final round BEFORE it leaves this host: from this record on the coordinator
      // will not abort the move on its own (its move wait may time out, but the pause is spent
      // and the target may run the guest soon). A 409 here means the move is no longer pending
      // there (a timeout abort, the session ended): nothing has reached the target's commit, so
      // the guest resumes here (the Conflict path below). The send time is not known yet: the
      // record's `sendMs` is 0 and the measured one is the commit's `sendMs` phase.
      yield* retrying(
        coordinator.round(move.id, { kind: "final", wireBytes: final.wireBytes, apparentBytes: final.apparentBytes, sendMs: 0, captureMs }),
      )
      const finalRound = yield* sendRound(final, captureMs)
      const [, commitMs] = yield* timed(link.commit(header))
      const downtimeMs = yield* msSince(pausedAt)
      // No second check: the pause is spent; the target runs the guest from here on.
      const phases: PhasesReport = { downtimeMs, captureMs, sendMs: finalRound.sendMs, commitMs }
      paused = false
      return { _tag: "Committed", phases, rounds } as const
    })

    const outcome = yield* protocol.pipe(
      Effect.catchTag("Conflict", (e) =>
        Effect.gen(function* () {
          // The coordinator refused a round: the move is no longer pending there.
          const reason = `move no longer pending on the coordinator: ${e.message}`
          if (paused) yield* runtime.resume(move.sessionId).pipe(Effect.ignore)
          yield* runtime.stopTracking(move.sessionId).pipe(Effect.ignore)
          yield* link.abort(header).pipe(Effect.ignore)
          return { _tag: "Gone", reason } as const
        }),
      ),
      Effect.catch((e) =>
        Effect.gen(function* () {
          const reason = `move failed: ${e._tag} ${"op" in e ? e.op : ""}: ${e.message}`
          const wasPaused = paused
          yield* abandon(reason)
          return { _tag: "Failed", reason, paused: wasPaused } as const
        }),
      ),
    )
    if (outcome._tag !== "Committed") return outcome

    // The target runs the guest. The commit is owed (durably, in the state file) until the
    // coordinator records it; until then the paused local copy is kept, because a coordinator
    // that answers "aborted" still places the session here (settleCommit).
    yield* runtime.stopTracking(move.sessionId).pipe(Effect.ignore)
    yield* residents.update(move.sessionId, (v) => ({ ...v, status: "paused" }))
    const owed: PendingCommit = { moveId: move.id, sessionId: move.sessionId, phases: outcome.phases }
    yield* residents.addPendingCommit(owed)
    const settled = yield* settleCommit(deps, owed)
    if (settled._tag === "Refused") {
      return { _tag: "CommitRefused", reason: settled.reason, phases: outcome.phases, restoredOnSource: settled.restoredOnSource } as const
    }
    return outcome
  })

/** How settling an owed commit ended. */
export type Settled =
  | { readonly _tag: "Acknowledged" }
  | { readonly _tag: "Owed" }
  | { readonly _tag: "Refused"; readonly reason: string; readonly restoredOnSource: boolean }

/** What settling an owed commit needs. */
export type SettleDeps = Pick<MoveSourceDeps, "hostId" | "coordinator" | "residents" | "runtime" | "link">

/** The states of a session that mean "it runs (or is kept) on its host". */
const onHostStates = new Set(["pending", "running", "parked", "descending", "moving"])

/**
 * Settles a commit the source owes (after the target committed). Every step is idempotent, so
 * it runs again after a lost answer or a restart:
 *
 * - the coordinator records it (200), or it was already recorded (409 and the move reads
 *   `committed`): the session runs on the target; the local copy is destroyed, the debt paid;
 * - 409 and the move reads `aborted`: the coordinator aborted the move after the guest went to
 *   the target. This is logged as an error. If the coordinator says the session is on this
 *   host, the coordinator's view wins: the target's copy is destroyed (peer abort) and the
 *   paused local copy resumed; the guest loses what it ran on the target since the commit.
 *   If the session is not here (ended, or elsewhere), nothing is destroyed on the target by
 *   this agent; the reconcile loops on both hosts drop what is no longer assigned;
 * - anything else (the coordinator unreachable, the target unreachable for the abort): still
 *   owed, retried on the next pass.
 */
export const settleCommit = (deps: SettleDeps, owed: PendingCommit): Effect.Effect<Settled> =>
  Effect.gen(function* () {
    const { coordinator, residents, runtime, link } = deps
    const dropLocalCopy = Effect.gen(function* () {
      const vm = yield* residents.get(owed.sessionId)
      if (vm !== undefined && vm.moveId === null) {
        yield* runtime.destroy(owed.sessionId).pipe(Effect.ignore)
        yield* residents.remove(owed.sessionId)
      }
      yield* residents.removePendingCommit(owed.moveId)
      return { _tag: "Acknowledged" } as const
    })
    const posted = yield* retrying(coordinator.commit(owed.moveId, owed.phases)).pipe(Effect.result)
    if (posted._tag === "Success") return yield* dropLocalCopy
    if (posted.failure._tag !== "Conflict") {
      yield* Effect.logWarning("move commit owed; retried on the next pass", { moveId: owed.moveId, error: posted.failure.message })
      return { _tag: "Owed" } as const
    }
    // 409: already recorded, or the move ended otherwise. Ask which.
    const read = yield* retrying(coordinator.getMove(owed.moveId)).pipe(Effect.result)
    if (read._tag === "Failure") {
      yield* Effect.logWarning("move commit refused and the move cannot be read; retried on the next pass", { moveId: owed.moveId, error: read.failure.message })
      return { _tag: "Owed" } as const
    }
    const m = read.success
    if (m.state === "committed") return yield* dropLocalCopy
    if (m.state === "pending") {
      yield* Effect.logWarning("move commit refused while the move is pending; retried on the next pass", { moveId: owed.moveId, error: posted.failure.message })
      return { _tag: "Owed" } as const
    }
    const reason = `the target committed move ${m.id} but the coordinator had aborted it (${m.abortReason ?? "no reason"})`
    const session = yield* retrying(coordinator.getSession(owed.sessionId)).pipe(Effect.result)
    if (session._tag === "Failure") {
      yield* Effect.logError(`move commit refused: ${reason}; the session's placement cannot be read, retried on the next pass`, {
        moveId: m.id,
        sessionId: owed.sessionId,
        error: session.failure.message,
      })
      return { _tag: "Owed" } as const
    }
    const here = session.success !== null && session.success.hostId === deps.hostId && onHostStates.has(session.success.state)
    const local = yield* residents.get(owed.sessionId)
    if (here && local !== undefined && local.moveId === null) {
      // The coordinator places the session here: its view wins. Destroy the target's copy first
      // (two running copies must never outlive this step), then resume the paused local one.
      const header: MoveHeader = {
        moveId: m.id,
        sessionId: owed.sessionId,
        sourceHostId: deps.hostId,
        targetHostId: m.targetHostId,
        memMib: local.memMib,
        vcpus: local.vcpus,
      }
      const dropped = yield* link.abort(header).pipe(Effect.retry({ times: 2 }), Effect.result)
      if (dropped._tag === "Failure") {
        yield* Effect.logError(`move commit refused: ${reason}; the coordinator places the session on this host, but the target's copy could not be destroyed yet; retried on the next pass`, {
          moveId: m.id,
          sessionId: owed.sessionId,
          target: m.targetHostId,
          error: dropped.failure.message,
        })
        return { _tag: "Owed" } as const
      }
      yield* runtime.resume(owed.sessionId).pipe(Effect.ignore)
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
        : `move commit refused: ${reason}. The session is not on this host (${session.success === null ? "not visible to this host" : session.success.state}); the target's copy was not touched`,
      { moveId: m.id, sessionId: owed.sessionId, target: m.targetHostId },
    )
    return { _tag: "Refused", reason, restoredOnSource: false } as const
  })
