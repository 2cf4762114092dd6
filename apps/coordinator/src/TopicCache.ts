/**
 * What the store answered for a topic (a host's assignments), kept in memory until a change
 * notice of that topic says it may be stale. An idle fleet's long-polls then cost no store read:
 * a poll that finds nothing changed answers from here, and so does its deadline.
 *
 * The copy is used only while the backend's notices are live (`Changes.live`); a possible miss
 * empties it. A load that a notice of its topic overtook is answered to its callers but not
 * kept (it may predate the change), and later callers do not join it. Concurrent loads of one
 * topic are shared, in a fiber of the cache's own, so a caller that goes away does not cut the
 * load short for the others.
 */
import { Changes } from "@engram/store"
import { Deferred, Effect, Exit } from "effect"
import type { Scope } from "effect"

export interface TopicCache<V, E> {
  /** The value of `topic`: kept, or loaded by `load` (shared with concurrent callers). */
  readonly get: (topic: string, load: Effect.Effect<V, E>) => Effect.Effect<V, E>
  /** How many values are kept. */
  readonly size: () => number
}

interface Load<V, E> {
  readonly done: Deferred.Deferred<V, E>
  /** A notice of its topic arrived after it began. */
  overtaken: boolean
}

/** A cache of at most `maxEntries` values (the oldest go first), for the scope's lifetime. */
export const make = <V, E>(options: { readonly maxEntries: number }): Effect.Effect<TopicCache<V, E>, never, Changes | Scope.Scope> =>
  Effect.gen(function* () {
    const changes = yield* Changes
    const scope = yield* Effect.scope
    const kept = new Map<string, V>()
    const loads = new Map<string, Load<V, E>>()
    yield* changes.subscribe({
      changed: (topics) => {
        for (const t of topics) {
          kept.delete(t)
          const l = loads.get(t)
          if (l !== undefined) l.overtaken = true
        }
      },
      missed: () => {
        kept.clear()
        for (const l of loads.values()) l.overtaken = true
      },
    })

    // Uninterruptible: a load registered is always started, so whoever joins it gets an answer.
    const start = (topic: string, load: Effect.Effect<V, E>): Effect.Effect<Load<V, E>> =>
      Effect.uninterruptible(Effect.suspend(() => startNow(topic, load)))
    const startNow = (topic: string, load: Effect.Effect<V, E>): Effect.Effect<Load<V, E>> => {
      const l: Load<V, E> = { done: Deferred.makeUnsafe<V, E>(), overtaken: false }
      loads.set(topic, l)
      const settle = (exit: Exit.Exit<V, E>) =>
        Effect.sync(() => {
          if (loads.get(topic) === l) loads.delete(topic)
          if (Exit.isSuccess(exit) && !l.overtaken && changes.live()) {
            if (kept.size >= options.maxEntries) {
              const oldest = kept.keys().next()
              if (oldest.done !== true) kept.delete(oldest.value)
            }
            kept.set(topic, exit.value)
          }
          Deferred.doneUnsafe(l.done, exit)
        })
      return Effect.as(Effect.forkIn(Effect.flatMap(Effect.exit(load), settle), scope), l)
    }

    return {
      get: (topic, load) =>
        Effect.suspend(() => {
          if (changes.live()) {
            const v = kept.get(topic)
            if (v !== undefined) return Effect.succeed(v)
          }
          const running = loads.get(topic)
          const l = running !== undefined && !running.overtaken ? Effect.succeed(running) : start(topic, load)
          return Effect.flatMap(l, (x) => Deferred.await(x.done))
        }),
      size: () => kept.size,
    }
  })
