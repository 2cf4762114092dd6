/**
 * The target's side of a live move. The move's data plane belongs to the runtime: `prepare`
 * asks it for an incoming VM and answers the endpoint the source's runtime streams to; `commit`
 * waits for the stream to be complete and resumes the VM here; `abort` destroys whatever the
 * move left here. An incoming VM is recorded as resident (paused, with its move id) from the
 * moment it is prepared, so its RAM is counted and a restarted agent adopts it.
 *
 * What it decides: a refused commit (`PeerError` with `refused: true`) means the guest does
 * not run here and nothing of the move is left (the incoming VM is destroyed); the source may
 * then resume its own copy. A commit refused because the stream never completed here says so
 * (`noStream`), on every later ask too, and the move is noted in the state file (`unfinished`):
 * the guest's memory is on the source alone, which keeps its copy and streams it again, and the
 * agent, for a while (`Agent.resendWaitMs`), neither boots the session afresh here nor commits a
 * new incoming VM of that move on its own (the source's commit does, once its stream is
 * complete). Every other failure leaves the question open. Each operation runs
 * to its end once started (a source that hangs up does not leave a half-started VM behind), and
 * the operations of one move run one at a time, so each finds what the one before it left: an
 * abort never destroys a VM a commit is resuming or a prepare is starting, a commit never resumes
 * one an abort is destroying, and an abort this agent decided on an incoming VM keeps a guest a
 * commit resumed meanwhile.
 *
 * A stream sent again (the move noted `unfinished`) is resumed only once the coordinator says so
 * (`ResendCheck`): the move's resend mark cleared, then the session read placed here. Else the
 * incoming VM stays paused and the commit is answered "not yet" (a 503, never a refusal), or,
 * the session placed elsewhere or ended, the VM is dropped and the commit refused.
 */
import { Clock, Effect, Ref, Schema, Semaphore } from "effect"
import type { IncomingEndpoint, VmRuntimeShape, VmSpec } from "@engram/runtime"
import { type CoordinatorShape, isNotFound, notVisible, placedOn } from "./Coordinator.js"
import type { ResidentVm, UnfinishedMove } from "./LocalState.js"
import type { Residents } from "./Residents.js"

/** Who a move belongs to: sent with every peer request of the move. */
export interface MoveHeader {
  readonly moveId: string
  readonly sessionId: string
  readonly sourceHostId: string
  readonly targetHostId: string
  readonly memMib: number
  readonly vcpus: number
}

/**
 * A peer operation failed. `refused`: the target answered and did not act (for a commit: the
 * guest does not run there and its incoming VM is gone); otherwise the target could not be
 * reached or did not answer, and what it did is unknown. `noStream` (a commit's refusal): no
 * guest of the move ran here, its stream never having completed here: the guest's memory is on
 * the source alone, whatever the coordinator holds. Absent from an older target's refusal.
 * `checksPlacement` (with `noStream`): this target resumes a stream sent again only once the
 * coordinator reads the session placed on it (`ResendCheck`), so the source may stream again
 * where it cannot read the placement itself (403). Absent from a target older than the check.
 * `notResumed` (not refused: a commit's "not yet"): this target resumed nothing and holds the
 * stream paused; it may have cleared the move's resend mark before it found it could not go on,
 * so the source sets the mark again (the target clears it again before any later resume).
 * Absent from an older target's "not yet", and from every failure with no answer.
 */
export class PeerError extends Schema.TaggedError<PeerError>()("PeerError", {
  op: Schema.String,
  moveId: Schema.String,
  message: Schema.String,
  refused: Schema.Boolean,
  noStream: Schema.optionalKey(Schema.Boolean),
  checksPlacement: Schema.optionalKey(Schema.Boolean),
  notResumed: Schema.optionalKey(Schema.Boolean),
}) {}

/** A target's commit: how long the guest had run here when it answered (0: it ran already, a repeated commit). */
export interface Committed {
  readonly resumedForMs: number
}

/**
 * `adopt`: the agent's own commit of a move the coordinator holds committed (its session placed
 * here): the VM becomes the session's (its move cleared, the session's reservation recorded) in
 * the same turn as the resume, so an abort of the move after it (the source's) finds nothing of
 * the move to destroy.
 */
export interface CommitOptions {
  readonly adopt?: { readonly reservationId: string | null }
}

/** `incomingOnly`: destroy the move's VM only while it is incoming (not resumed by a commit). */
export interface AbortOptions {
  readonly incomingOnly?: boolean
}

/** What an abort did: destroyed the move's VM, found none, or kept the guest a commit had resumed (`incomingOnly`). */
export type Aborted = "dropped" | "none" | "kept-running"

/** An incoming VM this target holds for a move, not committed yet. */
export interface IncomingMove {
  readonly moveId: string
  readonly vmId: string
}

export interface MoveTarget {
  /**
   * Prepares (or finds again, for a repeated request) the incoming VM of a move; answers its
   * endpoint. Refused once a commit of the move resumed its guest here, and for a move aborted here
   * lately (`ENDED_KEPT`, `ENDED_KEPT_MS`).
   */
  readonly prepare: (header: MoveHeader) => Effect.Effect<IncomingEndpoint, PeerError>
  /**
   * The stream is complete: resume the VM here. Committing a committed move succeeds. Answers
   * how long the guest had run here when the answer left (the bookkeeping after the resume:
   * recording it in the state file), so the source ends the pause where the guest resumed.
   */
  readonly commit: (header: MoveHeader, options?: CommitOptions) => Effect.Effect<Committed, PeerError>
  /**
   * Destroys what the move left here: its incoming VM, or the guest a commit of the move resumed
   * (the source's word: the guest runs on the source, which resumes its own copy once this
   * answers); nothing left succeeds. `incomingOnly`: this agent's own drop of a VM it saw
   * incoming; a guest a commit resumed meanwhile is kept (`"kept-running"`).
   */
  readonly abort: (moveId: string, options?: AbortOptions) => Effect.Effect<Aborted>
  /** The incoming VMs not committed yet. */
  readonly incoming: Effect.Effect<readonly IncomingMove[]>
  /**
   * When this target last acted for a move (prepared or committed it); recorded now for a
   * move it never saw in this process (a VM adopted after a restart). The grace of a VM whose
   * move the coordinator does not show pending runs from here.
   */
  readonly lastActivity: (moveId: string) => Effect.Effect<number>
  /**
   * The move whose commit of the session this target refused because its stream never completed
   * here (kept in the state file), if any: its guest's memory is in the source's paused copy,
   * which the source streams again. While noted, within the agent's wait (`Agent.resendWaitMs`),
   * the agent neither boots the session afresh here nor descends it as lost (its memory would be
   * lost) nor commits an incoming VM of the move on its own (the source's commit does, once its
   * stream is complete). Forgotten once a commit of the move resumes the guest here, a fresh
   * guest is recorded after the wait, on a prepare of another move of the session, or once the
   * session is no longer assigned here.
   */
  readonly unfinished: (sessionId: string) => Effect.Effect<UnfinishedMove | undefined>
  /**
   * The agent's wait for the unfinished move's stream is over (`Agent.resendWaitMs`): under the
   * move's lock, marks the note `expired` (the move's prepares refused from then on) and answers
   * true, so the session may be booted afresh; false when an incoming VM of the move is here (a
   * prepare came first: its stream decides).
   */
  readonly endWait: (sessionId: string, moveId: string) => Effect.Effect<boolean>
}

/**
 * The coordinator's calls a target makes before it resumes a stream sent again (a move it noted
 * `unfinished`): the agent's own client. None (tests of the target alone): resumed unasked, as
 * before the check.
 */
export type ResendCheck = Pick<CoordinatorShape, "resendOwed" | "getSession">

/** How many aborted moves a target remembers, and for how long, to refuse their late prepares. */
export const ENDED_KEPT = 4096
export const ENDED_KEPT_MS = 60 * 60_000

export const makeMoveTarget = (hostId: string, runtime: VmRuntimeShape, residents: Residents, coordinator?: ResendCheck): Effect.Effect<MoveTarget> =>
  Effect.gen(function* () {
    const activity = yield* Ref.make(new Map<string, number>())
    const touch = (moveId: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => Ref.update(activity, (m) => new Map(m).set(moveId, now)))
    /**
     * The moves aborted here lately, and when: a prepare of one (a request delayed on the wire, or
     * replayed) is refused rather than starting an incoming VM that nothing would commit and only
     * the staging grace would drop. The newest `ENDED_KEPT` for `ENDED_KEPT_MS` each (a restart
     * forgets them: the grace still drops what such a prepare starts).
     */
    const ended = new Map<string, number>()
    const end = (moveId: string) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        ended.delete(moveId)
        ended.set(moveId, now)
        for (const [id, at] of ended) {
          if (ended.size <= ENDED_KEPT && now - at < ENDED_KEPT_MS) break
          ended.delete(id)
        }
        // The move is over here: its activity is no longer asked for.
        yield* Ref.update(activity, (m) => {
          if (!m.has(moveId)) return m
          const left = new Map(m)
          left.delete(moveId)
          return left
        })
      })
    const refuse = (op: string, moveId: string, message: string) => Effect.fail(new PeerError({ op, moveId, message, refused: true }))
    const unfinishedOf = (sessionId: string) => Effect.map(residents.unfinished, (us) => us.find((u) => u.sessionId === sessionId))
    /**
     * The move's stream never completed here: said so, and noted (the source keeps its copy and
     * streams it again); a note of the move already made keeps its time (the agent's wait for
     * the stream counts from the first refusal).
     */
    const noStream = (h: MoveHeader, message: string) =>
      Effect.gen(function* () {
        const noted = yield* unfinishedOf(h.sessionId)
        if (noted?.moveId !== h.moveId) yield* residents.noteUnfinished({ sessionId: h.sessionId, moveId: h.moveId, notedAt: yield* Clock.currentTimeMillis })
        return yield* Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message, refused: true, noStream: true, ...(coordinator === undefined ? {} : { checksPlacement: true }) }))
      })
    /**
     * Not resumed now, the incoming VM kept paused: the source asks again (a 503 at the peer
     * server, never a refusal). Said so (`notResumed`): the resend mark may have been cleared
     * here, and the source, whose copy is still the guest's only whole one, sets it again.
     */
    const notYet = (h: MoveHeader, message: string) => Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message, refused: false, notResumed: true }))
    /**
     * Before a stream sent again resumes here (`resent`): the coordinator's resend mark is
     * cleared, so a death of this host from now on leaves the session lost, never sent back to the
     * source's older copy (the guest would roll back past what it ran here, should the answer of
     * this commit be lost); then the session is read placed here. Cleared first: a reclaim that
     * sent the session back to the source before the clear is seen by the read after it. A
     * coordinator older than the mark (`unknown`) or the move pruned (its 404) holds no mark to
     * clear; one older than the target's right to clear it (403) is let go as before the check,
     * warned (the rollback stays possible there). Anything else unanswered → not yet (`notYet`).
     * Placed elsewhere, or ended → the incoming VM and the note go, the commit is refused.
     */
    const mayResumeResent = (h: MoveHeader, c: ResendCheck) =>
      Effect.gen(function* () {
        const fields = { hostId, moveId: h.moveId, sessionId: h.sessionId, source: h.sourceHostId }
        const cleared = yield* c.resendOwed(h.moveId, false).pipe(Effect.result)
        if (cleared._tag === "Failure") {
          const e = cleared.failure
          if (e._tag === "CoordinatorError" && e.status === 403) yield* Effect.logWarning("the coordinator refuses this target the clearing of the move's resend mark (403: older than the target's right to it): the stream sent again is resumed as before, and should this host die the session may go back to the source's older copy", fields)
          else if (!isNotFound(e, "move", h.moveId)) return yield* notYet(h, `the coordinator's resend mark of the move could not be cleared (${e.message}): the stream sent again is not resumed yet, its VM kept paused`)
        }
        const read = yield* c.getSession(h.sessionId).pipe(Effect.result)
        if (read._tag === "Failure") return yield* notYet(h, `the session's placement cannot be read (${read.failure.message}): the stream sent again is not resumed yet, its VM kept paused`)
        if (placedOn(read.success, hostId)) return
        yield* drop(h.moveId, h.sessionId)
        yield* residents.forgetUnfinished(h.sessionId)
        const where = read.success === null ? "unknown to the coordinator: ended and pruned" : read.success === notVisible ? "not visible to this host" : `${read.success.state} on ${read.success.hostId ?? "no host"}`
        const message = `the session is not placed on ${hostId} (${where}): the stream sent again is not resumed, its VM dropped`
        yield* Effect.logWarning(`move ${h.moveId}: ${message}`, fields)
        return yield* refuse("commit", h.moveId, message)
      })
    const specOf = (h: MoveHeader): VmSpec => ({ vmId: h.sessionId, memMib: h.memMib, vcpus: h.vcpus })

    /** Destroys the VM a move left here, if the resident VM is that move's. */
    const drop = (moveId: string, vmId: string) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(vmId)
        if (vm?.moveId !== moveId) return
        yield* runtime.destroy(vmId)
        yield* residents.remove(vmId)
      })

    /**
     * One operation of a move at a time: its prepare, its commits (the peer server's, from the
     * source, and the agent's own, for a move the coordinator holds committed, may run together)
     * and its aborts (the source's, the agent's own). A second commit finds the guest running and
     * answers so, where a second `commitIncoming` of a VM already resumed could fail and drop the
     * guest; an abort finds the VM as the commit or the prepare left it, never one half resumed or
     * half started (a VM the runtime started after the abort would be left behind, unrecorded); a
     * commit finds none where an abort destroyed it, never one half destroyed. Keyed by move; an
     * entry lives while an operation of its move runs or waits.
     */
    const moveLocks = new Map<string, { readonly lock: Semaphore.Semaphore; users: number }>()
    const oneAtATime = (moveId: string) => <A, E>(self: Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.acquireUseRelease(
        Effect.sync(() => {
          const entry = moveLocks.get(moveId) ?? { lock: Semaphore.makeUnsafe(1), users: 0 }
          entry.users++
          moveLocks.set(moveId, entry)
          return entry
        }),
        (entry) => entry.lock.withPermits(1)(self),
        (entry) =>
          Effect.sync(() => {
            if (--entry.users === 0) moveLocks.delete(moveId)
          }),
      )

    const target: MoveTarget = {
      prepare: (h) =>
        Effect.gen(function* () {
          if (h.targetHostId !== hostId) return yield* refuse("prepare", h.moveId, `this host is ${hostId}, not ${h.targetHostId}`)
          if (ended.has(h.moveId)) return yield* refuse("prepare", h.moveId, "the move was aborted here")
          const here = yield* residents.get(h.sessionId)
          // The move's guest runs here already (a commit resumed it): a prepare now (a request
          // delayed on the wire, or replayed by whoever saw one) has nothing to prepare, and
          // preparing again would mark the guest incoming, or fail in the runtime and destroy it.
          if (here !== undefined && here.moveId === h.moveId && here.status === "running") return yield* refuse("prepare", h.moveId, "the move is committed here: its guest runs")
          if (here !== undefined && here.moveId !== h.moveId) {
            // An incoming VM of an earlier move of the session (one open move per session: that
            // move is over) goes; a VM that runs the session here means the move is wrong.
            if (here.moveId === null || here.status === "running") return yield* refuse("prepare", h.moveId, `the session already has a VM on ${hostId}`)
            // Under the earlier move's lock too, as its own operations: a late commit of it may
            // be resuming that VM (never destroyed mid-resume), and is then the guest that runs.
            const earlier = here.moveId
            const left = yield* oneAtATime(earlier)(
              Effect.gen(function* () {
                const now = yield* residents.get(h.sessionId)
                if (now?.moveId === earlier && now.status !== "running") yield* drop(earlier, h.sessionId)
                return yield* residents.get(h.sessionId)
              }),
            )
            if (left !== undefined && left.moveId !== h.moveId) return yield* refuse("prepare", h.moveId, `the session already has a VM on ${hostId}`)
          }
          yield* touch(h.moveId)
          // A note of another move of the session is over (one open move per session); this
          // move's note stays until its commit resumes the guest (the source streams it again).
          const noted = yield* unfinishedOf(h.sessionId)
          if (noted !== undefined && noted.moveId !== h.moveId) yield* residents.forgetUnfinished(h.sessionId)
          // The wait for the source's stream is over (`Agent.resendWaitMs`): the session is booted
          // afresh here, and a stream of the move now would race that boot for the session's VM.
          if (noted?.moveId === h.moveId && noted.expired === true) return yield* refuse("prepare", h.moveId, `the wait for this move's stream ended on ${hostId}: the session is booted afresh here`)
          // Recorded before the runtime starts it: a restarted agent adopts it with its move.
          yield* residents.put({ ...specOf(h), status: "paused", reservationId: null, moveId: h.moveId })
          return yield* runtime.prepareIncoming(specOf(h), h.moveId).pipe(
            Effect.tapError(() => drop(h.moveId, h.sessionId)),
            Effect.catchTag("RuntimeError", (e) => refuse("prepare", h.moveId, `${e.op}: ${e.message}`)),
          )
        }).pipe(oneAtATime(h.moveId), Effect.uninterruptible),
      commit: (h, options) =>
        Effect.gen(function* () {
          if (h.targetHostId !== hostId) return yield* refuse("commit", h.moveId, `this host is ${hostId}, not ${h.targetHostId}`)
          const vm = yield* residents.get(h.sessionId)
          // A repeat of a commit that landed, answered after this host's reconcile cleared the
          // move (the coordinator committed it on this target's report and places the session
          // here): the guest runs here, which is what the source asks. Not a refusal, which
          // would tell the source that the guest does not run here.
          if (vm !== undefined && vm.moveId === null && vm.status === "running") return { resumedForMs: 0 }
          if (vm?.moveId !== h.moveId) {
            // A move whose stream failed here: said so on every ask (the source streams it again).
            if ((yield* unfinishedOf(h.sessionId))?.moveId === h.moveId) return yield* noStream(h, "the move's stream never completed here: no guest of it ran here")
            return yield* refuse("commit", h.moveId, "no incoming VM for this move")
          }
          yield* touch(h.moveId)
          const adopt = options?.adopt
          const adopted = (v: ResidentVm): ResidentVm => (adopt === undefined ? v : { ...v, reservationId: adopt.reservationId, moveId: null })
          if (vm.status === "running") {
            if (adopt !== undefined) yield* residents.update(h.sessionId, adopted)
            return { resumedForMs: 0 }
          }
          // A stream sent again (its first never completed here): the coordinator says first.
          if (coordinator !== undefined && (yield* unfinishedOf(h.sessionId))?.moveId === h.moveId) yield* mayResumeResent(h, coordinator)
          // The runtime destroys the incoming VM when its stream failed; so does the agent's record.
          // No guest of the move ran here: the guest's memory is on the source alone (`noStream`).
          yield* runtime.commitIncoming(h.sessionId).pipe(
            Effect.catchTag("RuntimeError", (e) => drop(h.moveId, h.sessionId).pipe(Effect.andThen(noStream(h, `${e.op}: ${e.message}`)))),
          )
          // The guest runs: what follows (the state file's write and fsync) is not a part of its pause.
          const resumedAt = yield* Clock.currentTimeMillis
          yield* residents.update(h.sessionId, (v) => adopted({ ...v, status: "running" }))
          yield* residents.forgetUnfinished(h.sessionId)
          return { resumedForMs: Math.max(0, (yield* Clock.currentTimeMillis) - resumedAt) }
        }).pipe(oneAtATime(h.moveId), Effect.uninterruptible),
      abort: (moveId, options) =>
        Effect.gen(function* () {
          let done: Aborted = "none"
          for (const vm of yield* residents.all) {
            if (vm.moveId !== moveId) continue
            // Decided on a VM seen incoming: a commit that resumed it since (this turn waited for
            // it) made it a guest that runs here, which goes only on an explicit word.
            if (options?.incomingOnly === true && vm.status === "running") {
              done = "kept-running"
              continue
            }
            yield* drop(moveId, vm.vmId)
            done = "dropped"
          }
          yield* end(moveId)
          return done
        }).pipe(oneAtATime(moveId), Effect.uninterruptible),
      incoming: Effect.map(residents.all, (vms) => vms.filter((v) => v.moveId !== null && v.status === "paused").map((v) => ({ moveId: v.moveId!, vmId: v.vmId }))),
      unfinished: unfinishedOf,
      endWait: (sessionId, moveId) =>
        Effect.gen(function* () {
          if ((yield* residents.get(sessionId)) !== undefined) return false
          const noted = yield* unfinishedOf(sessionId)
          if (noted?.moveId === moveId && noted.expired !== true) yield* residents.noteUnfinished({ ...noted, expired: true })
          return true
        }).pipe(oneAtATime(moveId), Effect.uninterruptible),
      lastActivity: (moveId) =>
        Effect.gen(function* () {
          const at = (yield* Ref.get(activity)).get(moveId)
          if (at !== undefined) return at
          yield* touch(moveId)
          return yield* Clock.currentTimeMillis
        }),
    }
    return target
  })
