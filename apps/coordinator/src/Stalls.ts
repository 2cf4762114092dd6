/**
 * What the database waits on when store calls time out. A call past its bound (ours, or the
 * server's `statement_timeout`: one cause, one wording) says only that the database did not
 * answer; this reads why (`StorePg.Blockers`: a lock held by pid N of application X, idle in
 * transaction since…) and warns it, at most once per `warnEveryMs` on this replica, off the
 * request (the request's 503 does not wait for it). The same read answers the agent routes,
 * which tell a stalled database from a replica cut off from it (`Hosts` handlers).
 *
 * On PGlite there is nothing to read (one process; a stall there is the process's own).
 */
import { Errors as ApiErrors } from "@engram/api"
import { Blockers } from "@engram/store-pg"
import { Context, Effect } from "effect"

/** How often at most a replica warns what its timed-out store calls wait on, ms. */
export const warnEveryMs = 10_000

/**
 * How long one diagnosis answers every caller that asks, ms (a fleet's timed-out heartbeats read
 * it once): longer than from a slow call's read (`readBeforeMs`) to its timeout.
 */
export const reuseMs = 3_000

/**
 * When a store call bounded by `timeoutMs` that has not answered has what it waits on read: 2 s
 * before its bound (the diagnosis's own bound), at a third of it for a bound under 3 s. At its
 * bound the server cancels it, and a read then would find nothing waiting.
 */
export const readBeforeMs = (timeoutMs: number): number => Math.max(Math.floor(timeoutMs / 3), timeoutMs - 2_000)

/**
 * Whether a diagnosis shows a database stalled for every replica: it answers the read, and this
 * replica's own statements are running on it (waiting on a lock, or slow). A database that answers
 * while none of this replica's statements runs there is not the stall: this replica's own pool
 * or link is (half-open connections, a pool saturated by its own load), and another replica may
 * serve. Null (no diagnosis: PGlite) is not.
 */
export const stalledForEveryReplica = (d: Blockers.Diagnosis | null): d is Extract<Blockers.Diagnosis, { readonly answered: true }> => d !== null && d.answered && d.active > 0

/**
 * The 503 that keeps an agent on its replica (`StoreStalled`): the database answers `d`, but
 * `lead` (what it did not do, and within which bound); what it waits on, and why moving would not help.
 */
export const stalledAnswer = (lead: string, d: Extract<Blockers.Diagnosis, { readonly answered: true }>, retryAfterMs: number): ApiErrors.ServiceUnavailable =>
  new ApiErrors.ServiceUnavailable({
    error: ApiErrors.storeStalledError,
    message: `the coordinator's database answers but ${lead}: ${Blockers.describe(d)}. Every replica shares this database: moving to another would not help`,
    retryAfterMs,
  })

/** What the database waits on, read when store calls time out. */
export interface StallsShape {
  /**
   * A store call has waited `waitedMs`, most of its bound: reads what the database waits on now,
   * for its timeout's warning (shared with the calls that began before the read; a read begun
   * before this call did not see it wait, and is not taken).
   */
  readonly slow: (waitedMs: number) => void
  /** A store call `name` timed out: warns what the database waits on, at most once per `warnEveryMs`. Returns at once. */
  readonly timedOut: (name: string) => Effect.Effect<void>
  /** What the store's connections wait on now (one read shared for `reuseMs`), or null where there is no such read (PGlite). */
  readonly diagnose: Effect.Effect<Blockers.Diagnosis | null>
  /**
   * A mark, now: its effect answers a read begun at or after the mark (the read a timed-out call
   * made while it waited, shared), else a read of its own. Judges what calls made since the mark
   * met, never an older episode's read.
   */
  readonly diagnoseSince: () => Effect.Effect<Blockers.Diagnosis | null>
}

/** The stalls of this replica's store. */
export class Stalls extends Context.Service<Stalls, StallsShape>()("@engram/coordinator/Stalls") {}

/** No diagnosis (PGlite, a custom store): timeouts are only the 503s' own lines. */
export const none: StallsShape = { slow: () => undefined, timedOut: () => Effect.void, diagnose: Effect.succeed(null), diagnoseSince: () => Effect.succeed(null) }

/**
 * The stalls of a store read by `read` (`Blockers.make`). Real time (`now`), as the store bound:
 * a TestClock driving the reaper must not silence or repeat the warning.
 */
export const make = (read: Effect.Effect<Blockers.Diagnosis>, now: () => number = Date.now): StallsShape => {
  let shared: { readonly at: number; readonly answer: Promise<Blockers.Diagnosis> } | null = null
  let warnedAt = Number.NEGATIVE_INFINITY
  /** The read shared by callers from `sinceMs` on (a new one when the last began before it). */
  const readingSince = (sinceMs: number): Promise<Blockers.Diagnosis> => {
    if (shared !== null && shared.at >= sinceMs) return shared.answer
    const answer = Effect.runPromise(read)
    shared = { at: now(), answer }
    return answer
  }
  const reading = (): Promise<Blockers.Diagnosis> => readingSince(now() - reuseMs + 1)
  const diagnose = Effect.promise(reading)
  const diagnoseSince = () => {
    const mark = now()
    return Effect.promise(() => readingSince(mark))
  }
  const timedOut = (name: string) =>
    Effect.suspend(() => {
      if (now() - warnedAt < warnEveryMs) return Effect.void
      warnedAt = now()
      return Effect.asVoid(
        Effect.forkDetach(
          Effect.flatMap(diagnose, (d) =>
            Effect.logWarning(`the database did not answer ${name} in time: ${Blockers.describe(d)}`, {
              operation: name,
              lockHolders: d.answered ? [...new Set(d.lockWaits.map((w) => w.blockerPid))] : [],
            }),
          ),
        ),
      )
    })
  return { slow: (waitedMs) => void readingSince(now() - waitedMs), timedOut, diagnose, diagnoseSince }
}
