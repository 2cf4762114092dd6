/**
 * The drainer: the one place that, after anything that frees or adds room (a release, a
 * finished descent, a move's end, a new, reported or uncordoned host, an ended session), wakes
 * the agents whose assignments changed and drains the queue into the room (waking the hosts
 * of what it placed). Concurrent calls share drains: a call that arrives while a drain runs
 * waits for the next one, which starts when that one ends and so sees the caller's change;
 * every caller that arrived meanwhile shares that next drain.
 *
 * While the queue is known to be empty (the last drain left nothing queued, and no session has
 * been queued since, through any replica: the `queue` notice), there is nothing to drain and no
 * drain runs: a fleet of agents reporting every 30 s costs no drain while nothing waits.
 */
import { Changes, Topic } from "@engram/store"
import type { DrainResult, Store } from "@engram/store"
import { Context, Deferred, Effect, Exit, Layer, Scope } from "effect"
import type { Metrics } from "./Metrics.js"
import { Notifier, sessionTopic } from "./Notifier.js"
import { drainQueue } from "./Reaper.js"
import * as Tracing from "./Tracing.js"

export interface DrainerShape {
  /**
   * Room appeared: wakes the waiters of `topics` (the changed hosts and moves), then drains the
   * queue. Answers the drain that started after this call. Never fails: a failed drain is logged
   * and placed nothing; the caller's own change stands.
   */
  readonly roomAppeared: (...topics: readonly (string | null | undefined)[]) => Effect.Effect<DrainResult>
}

const nothing: DrainResult = { placed: [], unapplied: [], remaining: -1 }

export class Drainer extends Context.Service<Drainer, DrainerShape>()("@engram/coordinator/Drainer") {
  static readonly layer: Layer.Layer<Drainer, never, Store | Metrics | Notifier | Changes> = Layer.effect(
    Drainer,
    Effect.gen(function* () {
      const context = yield* Effect.context<Store | Metrics | Notifier>()
      const notifier = yield* Notifier
      const changes = yield* Changes
      // Whether the queue is known empty, and how many `queue` notices (or possible misses) came so far.
      let queueEmpty = false
      let queueNotices = 0
      yield* changes.subscribe({
        changed: (topics) => {
          if (!topics.includes(Topic.queue)) return
          queueEmpty = false
          queueNotices++
        },
        missed: () => {
          queueEmpty = false
          queueNotices++
        },
      })
      const scope = yield* Scope.Scope
      const span = yield* Tracing.spans
      let running: Deferred.Deferred<DrainResult> | null = null
      let next: Deferred.Deferred<DrainResult> | null = null

      // One drain at a time, in a fiber of the service's own: a caller that goes away does not
      // interrupt a drain other callers wait for.
      const start = (done: Deferred.Deferred<DrainResult>): Effect.Effect<void> => {
        const noticesBefore = queueNotices
        return drainQueue.pipe(
          Effect.provideContext(context),
          Effect.catchCause((cause) => Effect.logError("queue drain failed", cause).pipe(Effect.as(nothing))),
          // The waiters of the sessions it placed (their hosts' agents were woken by the drain),
          // told in the drain's own step: a shutdown that closes this fiber's scope waits for them.
          Effect.tap((result) => notifier.notify(...result.placed.map((p) => sessionTopic(p.sessionId)))),
          Effect.uninterruptible,
          Effect.tap((result) => Tracing.annotate(span, { "engram.queue.placed": result.placed.length, "engram.queue.remaining": result.remaining })),
          // Nothing left queued, and nothing queued since the drain began: known empty until a `queue` notice.
          Effect.tap((result) =>
            Effect.sync(() => {
              if (result.remaining === 0 && queueNotices === noticesBefore) queueEmpty = true
            }),
          ),
          span("engram.queue.drain"),
          Effect.flatMap((result) => Deferred.done(done, Exit.succeed(result))),
          Effect.andThen(
            Effect.suspend(() => {
              running = next
              next = null
              return running === null ? Effect.void : start(running)
            }),
          ),
          Effect.forkIn(scope),
          Effect.asVoid,
        )
      }

      const roomAppeared: DrainerShape["roomAppeared"] = (...topics) =>
        Effect.gen(function* () {
          yield* notifier.notify(...topics)
          if (queueEmpty && changes.live()) return { ...nothing, remaining: 0 }
          if (running === null) {
            const d = Deferred.makeUnsafe<DrainResult>()
            running = d
            yield* start(d)
            // The notice is sent and the drain begun: waiting for its result is cut by the
            // caller's interruption even inside a handler's `withNotices` (shutdown is not held).
            return yield* Effect.interruptible(Deferred.await(d))
          }
          next ??= Deferred.makeUnsafe<DrainResult>()
          return yield* Effect.interruptible(Deferred.await(next))
        })
      return Drainer.of({ roomAppeared })
    }),
  )
}
