/**
 * In-process wake-ups for waiters: a long-polling agent waits on `host:<id>`, a move request
 * on `move:<id>`, a wait for a session's state on `session:<id>`. Handlers and the reaper notify after they change something. Only this
 * process's writes notify; with several replicas a waiter also re-reads the store every
 * `storePollMs` (see Settings.sharedStore).
 */
import { Context, Deferred, Duration, Effect, Layer } from "effect"

export interface NotifierShape {
  /** Wakes every waiter of these topics. */
  readonly notify: (...topics: readonly (string | null | undefined)[]) => Effect.Effect<void>
  /** Waits until one of `topics` is notified or `timeoutMs` passes; answers whether it was notified. */
  readonly wait: (topics: readonly string[], timeoutMs: number) => Effect.Effect<boolean>
}

export class Notifier extends Context.Service<Notifier, NotifierShape>()("@engram/coordinator/Notifier") {
  static readonly layer: Layer.Layer<Notifier> = Layer.sync(Notifier, () => {
    const waiters = new Map<string, Set<Deferred.Deferred<void>>>()
    const notify = (...topics: readonly (string | null | undefined)[]) =>
      Effect.forEach(
        topics,
        (t) => {
          if (t === null || t === undefined) return Effect.void
          const set = waiters.get(t)
          if (set === undefined) return Effect.void
          waiters.delete(t)
          return Effect.forEach(set, (d) => Deferred.succeed(d, undefined), { discard: true })
        },
        { discard: true },
      )
    const wait = (topics: readonly string[], timeoutMs: number) =>
      Effect.gen(function* () {
        const d = yield* Deferred.make<void>()
        for (const t of topics) {
          let set = waiters.get(t)
          if (set === undefined) waiters.set(t, (set = new Set()))
          set.add(d)
        }
        const unregister = Effect.sync(() => {
          for (const t of topics) {
            const set = waiters.get(t)
            if (set === undefined) continue
            set.delete(d)
            if (set.size === 0) waiters.delete(t)
          }
        })
        const woke = yield* Deferred.await(d).pipe(Effect.timeoutOption(Duration.millis(Math.max(0, timeoutMs))), Effect.ensuring(unregister))
        return woke._tag === "Some"
      })
    return Notifier.of({ notify, wait })
  })
}

/** Topic of a host's assignments. */
export const hostTopic = (hostId: string | null | undefined): string | null => (hostId ? `host:${hostId}` : null)
/** Topic of a move's outcome. */
export const moveTopic = (moveId: string): string => `move:${moveId}`
/** Topic of a session's state (its waiters, `GET /v1/sessions/{id}/wait`). */
export const sessionTopic = (sessionId: string | null | undefined): string | null => (sessionId ? `session:${sessionId}` : null)
