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
  /** Must match the coordinator's `commitAllowanceMs`. */
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

const now = Clock.currentTimeMillis

const timed = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const t0 = yield* now
    const a = yield* eff
    return [a, (yield* now) - t0] as const
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
      const pausedAt = yield* now
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
      const finalRound = yield* sendRound(final, captureMs)
      const [, commitMs] = yield* timed(link.commit(header))
      const downtimeMs = (yield* now) - pausedAt
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

    // The target runs the guest: drop the local copy, then tell the coordinator (durably owed).
    yield* residents.addPendingCommit({ moveId: move.id, sessionId: move.sessionId, phases: outcome.phases })
    yield* runtime.destroy(move.sessionId)
    yield* residents.remove(move.sessionId)
    const finalRound = outcome.rounds.at(-1)
    if (finalRound !== undefined) yield* retrying(coordinator.round(move.id, finalRound)).pipe(Effect.ignore)
    yield* acknowledgeCommit(deps, move.id, outcome.phases)
    return outcome
  })

/** Posts a commit the source owes; done on success or 409 (already recorded). A failure stays owed. */
export const acknowledgeCommit = (deps: Pick<MoveSourceDeps, "coordinator" | "residents">, moveId: string, phases: PhasesReport) =>
  retrying(deps.coordinator.commit(moveId, phases)).pipe(
    Effect.catchTag("Conflict", () => Effect.void),
    Effect.andThen(deps.residents.removePendingCommit(moveId)),
    Effect.catch((e) => Effect.logWarning("move commit owed; retried on the next pass", { moveId, error: e.message })),
  )
