/**
 * The wait of `POST /v1/sessions/{id}/move`: level-triggered, the source agent sees the pending
 * move in its assignments, runs the rounds and commits or aborts it; this waits for that outcome
 * up to `moveTimeoutMs`, woken by the change itself (every write of a move notifies its topic,
 * through any replica), reading the move only when it begins and after each wake-up (waiters
 * that read in the same tick share one read of their moves, `GroupedReads`).
 * On a timeout it aborts the move only while the source has not recorded its final round (SPEC
 * §5: no second check once the final round is sent); the store decides that atomically. The
 * outcome is a figure-carrying verdict; the handler turns it into the HTTP answer.
 */
import type { Move, NotFound, Unavailable } from "@engram/store"
import { Store } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import { Metrics } from "./Metrics.js"
import type { MoveEnd } from "./Metrics.js"
import { hostTopic, moveTopic, Notifier, sessionTopic, withNotices } from "./Notifier.js"
import { Drainer } from "./Drainer.js"
import * as GroupedReads from "./GroupedReads.js"
import { Settings } from "./Settings.js"

/** How a move ended, as far as its waiter knows. */
export type MoveOutcome =
  /**
   * Committed: by its source, with the measured phases of its pause; or on a resolution (the
   * target's report that it runs the guest, or an operator's word), phases null: not measured.
   */
  | { readonly _tag: "Committed"; readonly move: Move; readonly phases: Move["phases"] }
  /** The downtime guard refused it: the record carries the estimate (`abortEstimateMs`). */
  | { readonly _tag: "Refused"; readonly move: Move; readonly estimateMs: number }
  /** Aborted for another reason (the agent's, an operator's, the session ended). */
  | { readonly _tag: "Aborted"; readonly move: Move }
  /** No agent settled it within `moveTimeoutMs`: a waiter aborted it (reason `timeout`). */
  | { readonly _tag: "TimedOut"; readonly move: Move; readonly timeoutMs: number }
  /** The timeout came after the final round was recorded: left pending for the source's commit. */
  | { readonly _tag: "CommitPending"; readonly move: Move; readonly timeoutMs: number }

/** The reason the waiter's own abort records. */
export const timeoutReason = "timeout"

export interface MoveWaiterShape {
  /** Waits for the outcome of `begun` (just begun in the store); counts it in `engram_moves_total`. */
  readonly outcome: (begun: Move) => Effect.Effect<MoveOutcome, NotFound | Unavailable>
}

const verdict = (m: Move, timeoutMs: number): MoveOutcome =>
  // Committed whoever committed it: a resolution's commit carries no phases and is no abort.
  m.state === "committed"
    ? { _tag: "Committed", move: m, phases: m.phases }
    : m.state === "pending"
      ? { _tag: "CommitPending", move: m, timeoutMs }
      : m.abortEstimateMs !== null
        ? { _tag: "Refused", move: m, estimateMs: m.abortEstimateMs }
        : m.abortReason === timeoutReason
          ? { _tag: "TimedOut", move: m, timeoutMs }
          : { _tag: "Aborted", move: m }

const counted: Record<MoveOutcome["_tag"], MoveEnd> = {
  Committed: "committed",
  Refused: "downtime",
  Aborted: "aborted",
  TimedOut: "timeout",
  CommitPending: "commit_pending",
}

export class MoveWaiter extends Context.Service<MoveWaiter, MoveWaiterShape>()("@engram/coordinator/MoveWaiter") {
  static readonly layer: Layer.Layer<MoveWaiter, never, Store | Notifier | Settings | Metrics | Drainer> = Layer.effect(
    MoveWaiter,
    Effect.gen(function* () {
      const store = yield* Store
      const notifier = yield* Notifier
      const settings = yield* Settings
      const metrics = yield* Metrics
      const drainer = yield* Drainer
      const timeoutMs = settings.config.moveTimeoutMs
      const read = GroupedReads.make({ entity: "move", one: (id) => store.getMove(id), many: (ids) => store.getMoves(ids) })

      const settle = (begun: Move) =>
        Effect.gen(function* () {
          const deadline = (yield* Clock.currentTimeMillis) + timeoutMs
          // Watching before the read: a change made while it runs wakes the wait below.
          const watch = yield* notifier.watch([moveTopic(begun.id)])
          for (;;) {
            const m = yield* read(begun.id)
            if (m.state !== "pending") return verdict(m, timeoutMs)
            const remaining = deadline - (yield* Clock.currentTimeMillis)
            if (remaining <= 0) break
            // At the deadline itself, not before it: the timeout aborts the move.
            if ((yield* watch.next(remaining, { exact: true })) === "timeout") break
          }
          // Timed out. The store aborts only before a final round is recorded (`onlyBeforeFinalRound`),
          // so a final round recorded through any replica wins over this abort or loses to it, never
          // both. A Conflict means the move is no longer abortable: a final round is recorded (it
          // stays pending), or the agent settled it meanwhile; the re-read tells which. The abort,
          // its re-read and its notices are one step the client's leaving (or a shutdown) does not
          // cut (`withNotices`): cut after the abort committed, the abort would stand unannounced
          // and every cached assignments would show the move pending for ever.
          const decided = yield* withNotices(
            Effect.gen(function* () {
              const decided = yield* store
                .abortMove(begun.id, timeoutReason, { onlyBeforeFinalRound: true })
                .pipe(Effect.catchTag(["Conflict", "InvalidInput"], () => store.getMove(begun.id)))
              if (decided.state === "aborted" && decided.abortReason === timeoutReason) {
                yield* drainer.roomAppeared(hostTopic(begun.sourceHostId), hostTopic(begun.targetHostId), moveTopic(begun.id), sessionTopic(begun.sessionId))
              }
              return decided
            }),
          )
          const outcome = verdict(decided, timeoutMs)
          if (outcome._tag === "CommitPending") {
            yield* Effect.logWarning("move wait timed out after the final round; left pending for the source's commit", {
              moveId: decided.id,
              sessionId: decided.sessionId,
              from: decided.sourceHostId,
              to: decided.targetHostId,
            })
          }
          return outcome
        })

      return MoveWaiter.of({
        outcome: (begun) => Effect.scoped(settle(begun)).pipe(Effect.tap((o) => Effect.sync(() => metrics.moves.inc({ outcome: counted[o._tag] })))),
      })
    }),
  )
}
