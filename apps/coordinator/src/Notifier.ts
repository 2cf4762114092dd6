/**
 * The one registry of this process's waiters, keyed by topic: an agent's long-poll waits on
 * its host (`host:<id>`), a wait for a session's state on the session and its host, a move
 * request on its move and its hosts, a long-poll of a host token on its credential. Handlers
 * and the reaper notify after they change something; the notice goes through `@engram/store`'s
 * `Changes` (in this process at once; on PostgreSQL also to every other replica, by
 * LISTEN/NOTIFY), and the registry wakes the waiters of its topics. Nothing here reads the
 * store: a waiter re-reads only when its topics changed, or when the backend says notices may
 * have been missed (then every waiter is woken once).
 *
 * A watch is level-triggered: a change that arrives while its waiter is busy re-reading is kept
 * and answers the waiter's next `next` at once, so no change between two waits is lost.
 */
import { Changes, Topic } from "@engram/store"
import { Context, Deferred, Duration, Effect, Exit, Layer } from "effect"
import type { Scope } from "effect"
import { addTo, removeFrom } from "./SetsByKey.js"

/** Why a watch's `next` answered. */
export type Woken = "changed" | "missed" | "timeout"

/** A watch on some topics, open until its scope closes. */
export interface Watch {
  /**
   * Waits until one of the watch's topics changed since the watch opened or since the last
   * `next` answered, or notices may have been missed, or `timeoutMs` passes (Effect Clock).
   */
  readonly next: (timeoutMs: number) => Effect.Effect<Woken>
}

export interface NotifierShape {
  /** Announces that these topics changed: wakes their waiters here and on every replica. */
  readonly notify: (...topics: readonly (string | null | undefined)[]) => Effect.Effect<void>
  /** Opens a watch on `topics` until the scope closes. */
  readonly watch: (topics: readonly string[]) => Effect.Effect<Watch, never, Scope.Scope>
  /** Waits once on `topics` up to `timeoutMs`; answers whether one of them changed (or notices were missed). */
  readonly wait: (topics: readonly string[], timeoutMs: number) => Effect.Effect<boolean>
  /** How many watches are open now. */
  readonly watching: () => number
}

interface Entry {
  /** What happened since the last `next` answered: nothing, a possible miss, a change. */
  pending: Woken | null
  waiting: Deferred.Deferred<void> | null
}

const topicsOf = (topics: readonly (string | null | undefined)[]): string[] => topics.filter((t): t is string => t !== null && t !== undefined && t !== "")

/** The registry over `changes`: subscribes for as long as `scope` lives. */
const make = Effect.gen(function* () {
  const changes = yield* Changes
  const byTopic = new Map<string, Set<Entry>>()
  const all = new Set<Entry>()
  const fire = (e: Entry, why: "changed" | "missed") => {
    if (e.pending !== "changed") e.pending = why
    const w = e.waiting
    if (w !== null) {
      e.waiting = null
      Deferred.doneUnsafe(w, Exit.void)
    }
  }
  // Woken after every subscriber heard the notice (a microtask later): a woken fiber may run at
  // once, and must find the copies in memory the notice drops (assignments, credentials) gone.
  const changedLater = new Set<Entry>()
  let missedLater = false
  let scheduled = false
  const later = () => {
    if (scheduled) return
    scheduled = true
    queueMicrotask(() => {
      scheduled = false
      for (const e of changedLater) fire(e, "changed")
      changedLater.clear()
      if (missedLater) for (const e of all) fire(e, "missed")
      missedLater = false
    })
  }
  yield* changes.subscribe({
    changed: (topics) => {
      for (const t of [...topics, anyTopic]) {
        const set = byTopic.get(t)
        if (set === undefined) continue
        for (const e of set) changedLater.add(e)
        later()
      }
    },
    missed: () => {
      missedLater = true
      later()
    },
  })

  const watch: NotifierShape["watch"] = (topics) =>
    Effect.acquireRelease(
      Effect.sync(() => {
        const e: Entry = { pending: null, waiting: null }
        all.add(e)
        for (const t of topics) addTo(byTopic, t, e)
        return e
      }),
      (e) =>
        Effect.sync(() => {
          all.delete(e)
          for (const t of topics) removeFrom(byTopic, t, e)
        }),
    ).pipe(
      Effect.map((e): Watch => {
        const take = (): Woken | null => {
          const p = e.pending
          e.pending = null
          return p
        }
        return {
          next: (timeoutMs) =>
            Effect.suspend(() => {
              const already = take()
              if (already !== null) return Effect.succeed(already)
              const d = Deferred.makeUnsafe<void>()
              e.waiting = d
              return Deferred.await(d).pipe(
                Effect.timeoutOption(Duration.millis(Math.max(0, timeoutMs))),
                Effect.map(() => take() ?? "timeout"),
                Effect.ensuring(
                  Effect.sync(() => {
                    if (e.waiting === d) e.waiting = null
                  }),
                ),
              )
            }),
        }
      }),
    )

  return Notifier.of({
    notify: (...topics) => changes.publish(topicsOf(topics)),
    watch,
    wait: (topics, timeoutMs) =>
      Effect.scoped(Effect.flatMap(watch(topics), (w) => w.next(timeoutMs))).pipe(Effect.map((w) => w !== "timeout")),
    watching: () => all.size,
  })
})

export class Notifier extends Context.Service<Notifier, NotifierShape>()("@engram/coordinator/Notifier") {
  /** The registry over the `Changes` of the store the coordinator runs on. */
  static readonly layer: Layer.Layer<Notifier, never, Changes> = Layer.effect(Notifier, make)
}

/** The topic a watch names to hear every change (the dashboard's long-poll). */
export const anyTopic = "*"

/** Topic of the queue: a session was queued. */
export const queueTopic = Topic.queue

/** Topic of the fleet's room as a whole: a host's report, an external reservation. */
export const fleetTopic = Topic.fleet

/** Topic of a host's assignments. */
export const hostTopic = (hostId: string | null | undefined): string | null => (hostId ? Topic.host(hostId) : null)
/** Topic of a move's outcome. */
export const moveTopic = (moveId: string): string => Topic.move(moveId)
/** Topic of a session's state (its waiters, `GET /v1/sessions/{id}/wait`). */
export const sessionTopic = (sessionId: string | null | undefined): string | null => (sessionId ? Topic.session(sessionId) : null)
/** Topic of a host's credential (rotated, or the host removed): its open long-polls end with 401. */
export const credentialTopic = (hostId: string): string => Topic.credential(hostId)
