/**
 * Wake-ups for waiters: a long-polling agent waits on `host:<id>`, a move request on
 * `move:<id>`, a wait for a session's state on `session:<id>`. Handlers and the reaper notify
 * after they change something. On PostgreSQL (`Notifier.postgres`) a notify also reaches the
 * other replicas: its topics go out through `pg_notify` (coalesced: one statement at a time
 * carries every topic notified meanwhile) and each replica `LISTEN`s on a dedicated
 * connection, so a change made through one replica wakes the waiters of every replica at
 * once. Re-reading the store every `storePollMs` remains only the fallback: for a notification
 * lost with the listening connection (logged when it is lost and when it is back; every
 * waiter is woken once it is back, to re-read what it may have missed).
 */
import { Context, Deferred, Duration, Effect, Exit, Layer, Schedule } from "effect"
import { randomUUID } from "node:crypto"
import postgres from "@engram/postgres"

export interface NotifierShape {
  /** Wakes every waiter of these topics (on every replica, when the store is shared through PostgreSQL). */
  readonly notify: (...topics: readonly (string | null | undefined)[]) => Effect.Effect<void>
  /** Waits until one of `topics` is notified or `timeoutMs` passes; answers whether it was notified. */
  readonly wait: (topics: readonly string[], timeoutMs: number) => Effect.Effect<boolean>
}

/** The channel replicas notify each other on. */
export const channel = "engram_wake"

/** The `application_name` of each replica's listening connection. */
export const applicationName = "engram-wakeups"

/** The longest `pg_notify` payload sent (PostgreSQL refuses 8,000 bytes and more). */
const maxPayloadBytes = 7000

/** The waiters of this process: plain callbacks, so a notification from the database can wake them. */
const makeLocal = () => {
  const waiters = new Map<string, Set<Deferred.Deferred<void>>>()
  const wake = (topics: Iterable<string>): void => {
    for (const t of topics) {
      const set = waiters.get(t)
      if (set === undefined) continue
      waiters.delete(t)
      for (const d of set) Deferred.doneUnsafe(d, Exit.void)
    }
  }
  const wakeAll = (): void => wake([...waiters.keys()])
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
  const topicsOf = (topics: readonly (string | null | undefined)[]): string[] => topics.filter((t): t is string => t !== null && t !== undefined && t !== "")
  return { wake, wakeAll, wait, topicsOf }
}

/** Splits topics into `pg_notify` payloads (`<replica> <topic> <topic>…`) under the size limit. */
export const payloadsOf = (replica: string, topics: Iterable<string>): string[] => {
  const out: string[] = []
  let current = replica
  for (const t of topics) {
    if (Buffer.byteLength(current) + 1 + Buffer.byteLength(t) > maxPayloadBytes && current !== replica) {
      out.push(current)
      current = replica
    }
    current += ` ${t}`
  }
  if (current !== replica) out.push(current)
  return out
}

export class Notifier extends Context.Service<Notifier, NotifierShape>()("@engram/coordinator/Notifier") {
  /** Wake-ups within this process only (an embedded store: no other process writes it). */
  static readonly layer: Layer.Layer<Notifier> = Layer.sync(Notifier, () => {
    const local = makeLocal()
    return Notifier.of({
      notify: (...topics) => Effect.sync(() => local.wake(local.topicsOf(topics))),
      wait: local.wait,
    })
  })

  /**
   * Wake-ups across every replica sharing the PostgreSQL at `url`: `LISTEN` on a dedicated
   * connection (re-established after a loss, with a log line each way), `pg_notify` for every
   * notify of this replica (coalesced, sent in the background: a notify never waits on the
   * database, and a failed send only leaves the waiters to their `storePollMs` re-read).
   */
  static readonly postgres = (url: string): Layer.Layer<Notifier> =>
    Layer.effect(
      Notifier,
      Effect.gen(function* () {
        const local = makeLocal()
        // Our own notifications come back to us: they are recognised by this id and skipped.
        const replica = randomUUID().slice(0, 8)
        let closing = false
        // Completed when the listening connection closes (a fresh one per connection).
        let lost = Deferred.makeUnsafe<void>()
        // `onnotify` is postgres.js's own option (parsed with the others, used by its `listen`),
        // missing from its types: it hears the notifications of the one connection.
        const options: postgres.Options<Record<string, never>> & { readonly onnotify: (channel: string, payload: string) => void } = {
          max: 1,
          idle_timeout: 0,
          max_lifetime: null,
          connect_timeout: 5,
          fetch_types: false,
          // Named, so an operator (or a test) finds the listening connection in pg_stat_activity.
          connection: { application_name: applicationName },
          onnotice: () => undefined,
          onnotify: (_channel, payload) => {
            const [from, ...topics] = payload.split(" ")
            if (from !== replica) local.wake(topics)
          },
          onclose: () => {
            Deferred.doneUnsafe(lost, Exit.void)
          },
        }
        const sql = yield* Effect.acquireRelease(
          Effect.sync(() => postgres(url, options)),
          (sql) =>
            Effect.promise(async () => {
              closing = true
              await sql.end({ timeout: 2 }).catch(() => undefined)
            }),
        )

        // LISTEN on the connection; `lost` completes when that connection closes.
        const listenOnce = Effect.suspend(() => {
          const current = Deferred.makeUnsafe<void>()
          lost = current
          return Effect.tryPromise({ try: () => sql.unsafe(`listen ${channel}`), catch: (e) => e }).pipe(Effect.as(current))
        })
        const backoff = Schedule.min([Schedule.exponential(Duration.millis(100), 2), Schedule.spaced(Duration.seconds(5))])
        // The first LISTEN is in place before the layer is up, so no notification is missed from the start.
        const first = yield* listenOnce.pipe(
          Effect.timeout(Duration.seconds(10)),
          Effect.tapError((e) =>
            Effect.logWarning("wake-up listener could not start; until it does, waiters re-read the store every storePollMs", { channel, error: String(e) }),
          ),
          Effect.option,
        )
        // Then: wait for the connection to go, say so, LISTEN again (with a backoff), say so, wake every waiter.
        const supervise = Effect.gen(function* () {
          let current = first._tag === "Some" ? first.value : null
          for (;;) {
            if (current !== null) {
              yield* Deferred.await(current)
              if (closing) return
              yield* Effect.logWarning("wake-up listener lost its connection: until it is back, waiters re-read the store every storePollMs", { channel })
            }
            current = yield* Effect.retry(listenOnce, backoff)
            if (closing) return
            yield* Effect.logInfo("wake-up listener re-established: other replicas' changes wake the waiters again", { channel })
            // Whatever was notified while nobody listened is lost: every waiter re-reads now.
            local.wakeAll()
          }
        })
        yield* Effect.forkScoped(supervise.pipe(Effect.catchCause((cause) => Effect.logError("wake-up listener stopped", cause))))

        // Publishing: topics gather while a pg_notify is in flight and leave together with the next.
        const pending = new Set<string>()
        let sending = false
        const flush = Effect.gen(function* () {
          while (pending.size > 0 && !closing) {
            const batch = [...pending]
            pending.clear()
            yield* Effect.forEach(
              payloadsOf(replica, batch),
              (payload) => Effect.tryPromise({ try: () => sql`select pg_notify(${channel}, ${payload})`, catch: (e) => e }),
              { discard: true },
            ).pipe(Effect.catch((e) => Effect.logDebug("pg_notify failed; other replicas fall back on re-reading the store", { error: String(e) })))
          }
        }).pipe(
          Effect.ensuring(
            Effect.sync(() => {
              sending = false
            }),
          ),
        )
        const notify: NotifierShape["notify"] = (...topics) =>
          Effect.suspend(() => {
            const ts = local.topicsOf(topics)
            if (ts.length === 0) return Effect.void
            local.wake(ts)
            for (const t of ts) pending.add(t)
            if (sending || closing) return Effect.void
            sending = true
            return Effect.asVoid(Effect.forkDetach(flush))
          })
        return Notifier.of({ notify, wait: local.wait })
      }),
    )
}

/** Topic of a host's assignments. */
export const hostTopic = (hostId: string | null | undefined): string | null => (hostId ? `host:${hostId}` : null)
/** Topic of a move's outcome. */
export const moveTopic = (moveId: string): string => `move:${moveId}`
/** Topic of a session's state (its waiters, `GET /v1/sessions/{id}/wait`). */
export const sessionTopic = (sessionId: string | null | undefined): string | null => (sessionId ? `session:${sessionId}` : null)
