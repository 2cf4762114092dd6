/**
 * What a reaper pass tells the app around it, step by step: the coordinator turns these into
 * metrics, log lines and wake-ups of host agents; the fleet simulator into its own books. The
 * pass runs without a listener (every event is dropped); an app provides `ReaperEvents` to hear.
 */
import type { MakeRoom, ParkPolicy } from "@engram/core"
import type { DrainResult, FleetRead, Move, PruneResult, ReclaimResult, Unavailable } from "@engram/store"
import { Context, Effect, Layer } from "effect"

/**
 * A failed store call's kind (`Unavailable.kind`; undefined: none named). A listener judges
 * with it whether the store is unhealthy (`@engram/store`'s `storeUnhealthy`) or only contended.
 */
export type FailureKind = Unavailable["kind"]

/** Which entry point decided: the periodic pass or the immediate reaction to a session that queued. */
export type Source = "pass" | "react"

/** One step of a pass (or of a reaction), as it happens. */
export type Event =
  | { readonly _tag: "FleetRead"; readonly source: Source; readonly fleet: FleetRead }
  | { readonly _tag: "FleetReadFailed"; readonly source: Source; readonly reason: string; readonly kind?: FailureKind }
  | { readonly _tag: "Reclaimed"; readonly result: ReclaimResult }
  | { readonly _tag: "ReclaimFailed"; readonly reason: string; readonly kind?: FailureKind }
  /**
   * The failover grace started (`Reaper.Options.reclaimGraceMs`): the first pass of a leadership,
   * or a gap in the leader's contacts with the store (failed reads, a frozen process, a call that
   * hung, a clock step). No stale reservation is reclaimed (nor session idled) before `until`
   * (the store's time, `nowOf`, ms), so hosts that could not heartbeat while the coordinator side was down renew first.
   */
  | { readonly _tag: "ReclaimHeld"; readonly until: number }
  /** Sessions a lifetime changed this pass: made idle (then parked or descending), or ended by their TTL. */
  | {
      readonly _tag: "LifetimesApplied"
      readonly idled: readonly { readonly sessionId: string; readonly hostId: string | null; readonly state: string }[]
      /** With what else each end changed (`Reaper.ExpiredStep`): its image's host, its open move (aborted). */
      readonly expired: readonly {
        readonly sessionId: string
        readonly hostId: string | null
        readonly state: string
        readonly imageHostId: string | null
        readonly openMove: { readonly id: string; readonly targetHostId: string } | null
      }[]
    }
  | { readonly _tag: "LifetimesFailed"; readonly reason: string; readonly kind?: FailureKind }
  | { readonly _tag: "Decided"; readonly source: Source; readonly decision: ParkPolicy.Decision }
  | { readonly _tag: "DescentStarted"; readonly source: Source; readonly yield: ParkPolicy.PolicyYield }
  /** The park changed first (resumed, ended): the CAS `parked → descending` lost; skipped. */
  | { readonly _tag: "DescentLostRace"; readonly source: Source; readonly yield: ParkPolicy.PolicyYield }
  | { readonly _tag: "DescentFailed"; readonly source: Source; readonly yield: ParkPolicy.PolicyYield; readonly reason: string }
  | { readonly _tag: "Drained"; readonly result: DrainResult }
  | { readonly _tag: "DrainFailed"; readonly reason: string; readonly kind?: FailureKind }
  /** A move begun to make room for a starving session (`Reaper.Options.moves`): the agents run it. */
  | { readonly _tag: "MoveBegun"; readonly move: Move; readonly planned: MakeRoom.Planned }
  /**
   * A pending move no agent took past its point of no return in time: aborted, the session runs
   * on at its source. `own`: this replica's passes began it (else the leader's safety net at
   * twice the timeout: begun by another replica or the API).
   */
  | { readonly _tag: "MoveTimedOut"; readonly move: Move; readonly own: boolean }
  /** A move this replica's passes began left pending (committed, or aborted by its agents); a timeout is `MoveTimedOut`. */
  | { readonly _tag: "MoveEnded"; readonly move: Move }
  /**
   * The moves step could not read what it needs (the pending moves, read every pass for their
   * timeouts; when a session starves, the aborted moves, the fleet, a held host's sessions or pair
   * allowances): the rest of the step is skipped this pass (no timeout enforced after a failed
   * read of the pending moves, no move begun).
   */
  | { readonly _tag: "MovesFailed"; readonly reason: string; readonly kind?: FailureKind }
  /**
   * A planned move the store refused (its session or target changed first) or could not begin
   * (`unavailable`: the store was down, or the write was fenced off by a newer leader).
   */
  | { readonly _tag: "MoveNotBegun"; readonly planned: MakeRoom.Planned; readonly unavailable: boolean; readonly reason: string }
  /** The retention step deleted this much old history (`Reaper.Options.retention`; every count may be 0). */
  | { readonly _tag: "Pruned"; readonly result: PruneResult }
  /** The retention step's call failed (the store was down, the write fenced off): the next pass tries again. */
  | { readonly _tag: "PruneFailed"; readonly reason: string; readonly kind?: FailureKind }
  /** The leader lock was lost between two steps: the pass stops there. */
  | { readonly _tag: "LeadershipLost"; readonly source: Source; readonly step: string }

/** A listener of the reaper's steps. */
export interface ReaperEventsShape {
  readonly emit: (event: Event) => Effect.Effect<void>
}

/** The listener service; optional (without it the pass emits nothing). */
export class ReaperEvents extends Context.Service<ReaperEvents, ReaperEventsShape>()("@engram/reaper/ReaperEvents") {
  /** A listener from a function (synchronous or effectful). */
  static readonly layer = (emit: (event: Event) => Effect.Effect<void> | void): Layer.Layer<ReaperEvents> =>
    Layer.succeed(
      ReaperEvents,
      ReaperEvents.of({
        emit: (event) =>
          Effect.suspend(() => {
            const out = emit(event)
            return Effect.isEffect(out) ? out : Effect.void
          }),
      }),
    )
}

/** Emits to the listener in context, if any. */
export const emit = (event: Event): Effect.Effect<void> =>
  Effect.flatMap(Effect.serviceOption(ReaperEvents), (listener) => (listener._tag === "Some" ? listener.value.emit(event) : Effect.void))
