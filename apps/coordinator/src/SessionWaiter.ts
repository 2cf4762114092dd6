/**
 * The wait of `GET /v1/sessions/{id}/wait`: long-polls until the session is in the wanted
 * state, or that state can no longer come (core's `Session.canReach`: an ended session reaches
 * nothing, a lost one only its end), or the time runs out. The waiter is woken by the change
 * itself (every write of a session notifies the session's topic; on PostgreSQL through any
 * replica): it reads the store when it begins and after each wake-up, never on a timer. At the deadline it answers the state it read last, which no notice has
 * changed since. Waiters that read in the same tick share one read of their sessions
 * (`GroupedReads`: a possible miss of notices wakes every waiter at once); a session gone from
 * the store is `NotFound` as a read of it alone.
 */
import { Session } from "@engram/core"
import type { SessionState } from "@engram/core"
import { Store } from "@engram/store"
import type { NotFound, Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import * as GroupedReads from "./GroupedReads.js"
import { Notifier, sessionTopic } from "./Notifier.js"

/** How a wait ended. */
export type WaitOutcome =
  | { readonly _tag: "Reached"; readonly session: Session.Record }
  /** The wanted state can no longer come from the state the session is in. */
  | { readonly _tag: "Unreachable"; readonly session: Session.Record }
  | { readonly _tag: "TimedOut"; readonly session: Session.Record }

export interface SessionWaiterShape {
  /** Waits up to `timeoutMs` for session `id` to be in `state`. */
  readonly until: (id: string, state: SessionState, timeoutMs: number) => Effect.Effect<WaitOutcome, NotFound | Unavailable>
}

const judge = (s: Session.Record, state: SessionState): WaitOutcome | null =>
  s.state === state ? { _tag: "Reached", session: s } : Session.canReach(s.state, state) ? null : { _tag: "Unreachable", session: s }

export class SessionWaiter extends Context.Service<SessionWaiter, SessionWaiterShape>()("@engram/coordinator/SessionWaiter") {
  static readonly layer: Layer.Layer<SessionWaiter, never, Store | Notifier> = Layer.effect(
    SessionWaiter,
    Effect.gen(function* () {
      const store = yield* Store
      const notifier = yield* Notifier
      const read = GroupedReads.make({ entity: "session", one: (id) => store.getSession(id), many: (ids) => store.getSessions(ids) })
      const until: SessionWaiterShape["until"] = (id, state, timeoutMs) =>
        // Watching before the read: a change made while it runs wakes the wait below.
        notifier.withWatch([sessionTopic(id) as string], (watch) =>
          Effect.gen(function* () {
            const deadline = (yield* Clock.currentTimeMillis) + timeoutMs
            let s = yield* read(id)
            for (;;) {
              const verdict = judge(s, state)
              if (verdict !== null) return verdict
              const remaining = deadline - (yield* Clock.currentTimeMillis)
              if (remaining <= 0) return { _tag: "TimedOut", session: s } as const
              const why = yield* watch.next(remaining)
              // Ended (its credential revoked): the caller answers 401 in its place.
              if (why === "timeout" || why === "ended") return { _tag: "TimedOut", session: s } as const
              s = yield* read(id)
            }
          }),
        )
      return SessionWaiter.of({ until })
    }),
  )
}
