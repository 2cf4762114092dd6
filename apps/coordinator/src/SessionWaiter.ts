/**
 * The wait of `GET /v1/sessions/{id}/wait`: long-polls until the session is in the wanted
 * state, or that state can no longer come (core's `Session.canReach`: an ended session reaches
 * nothing, a lost one only its end), or the time runs out. A waiter is woken by the notifier
 * (the session's topic, and its host's, which every agent-visible change notifies; on
 * PostgreSQL through any replica, by LISTEN/NOTIFY); it also re-reads the store every second,
 * or every `storePollMs` on a shared store (the fallback for a notification lost with the
 * listening connection), so a change made anywhere is seen within that bound.
 */
import { Session } from "@engram/core"
import type { SessionState } from "@engram/core"
import { Store } from "@engram/store"
import type { NotFound, Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import { hostTopic, Notifier, sessionTopic } from "./Notifier.js"
import { Settings } from "./Settings.js"

/** How a wait ended. */
export type WaitOutcome =
  | { readonly _tag: "Reached"; readonly session: Session.Record }
  /** The wanted state can no longer come from the state the session is in. */
  | { readonly _tag: "Unreachable"; readonly session: Session.Record }
  | { readonly _tag: "TimedOut"; readonly session: Session.Record }

/** The slice between two reads of a store nobody else writes: wake-ups come from this process. */
const ownStoreSliceMs = 1000

export interface SessionWaiterShape {
  /** Waits up to `timeoutMs` for session `id` to be in `state`. */
  readonly until: (id: string, state: SessionState, timeoutMs: number) => Effect.Effect<WaitOutcome, NotFound | Unavailable>
}

export class SessionWaiter extends Context.Service<SessionWaiter, SessionWaiterShape>()("@engram/coordinator/SessionWaiter") {
  static readonly layer: Layer.Layer<SessionWaiter, never, Store | Notifier | Settings> = Layer.effect(
    SessionWaiter,
    Effect.gen(function* () {
      const store = yield* Store
      const notifier = yield* Notifier
      const settings = yield* Settings
      const slice = settings.sharedStore ? settings.config.storePollMs : ownStoreSliceMs
      const judge = (s: Session.Record, state: SessionState): WaitOutcome | null =>
        s.state === state
          ? { _tag: "Reached", session: s }
          : Session.canReach(s.state, state)
            ? null
            : { _tag: "Unreachable", session: s }
      const until: SessionWaiterShape["until"] = (id, state, timeoutMs) =>
        Effect.gen(function* () {
          let s = yield* store.getSession(id)
          const deadline = (yield* Clock.currentTimeMillis) + timeoutMs
          for (;;) {
            const verdict = judge(s, state)
            if (verdict !== null) return verdict
            const remaining = deadline - (yield* Clock.currentTimeMillis)
            if (remaining <= 0) return { _tag: "TimedOut", session: s } as const
            const topics = [sessionTopic(id), hostTopic(s.hostId)].filter((t): t is string => t !== null)
            yield* notifier.wait(topics, Math.min(remaining, slice))
            s = yield* store.getSession(id)
          }
        })
      return SessionWaiter.of({ until })
    }),
  )
}
