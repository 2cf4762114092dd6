/**
 * Every store call answers within a bound. The store is wrapped so that a call the database
 * has not answered after `timeoutMs` (real time) is interrupted and fails `Unavailable`, which
 * the API answers `503` with `Retry-After`: a request never hangs on a database that is away or
 * a link to it that went silent. Timing out never reports success, and the caller is told that
 * a write's outcome is unknown until read back (on PostgreSQL the server's own
 * `statement_timeout`, set to the same bound, rolls such a write back).
 */
import { Unavailable } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { Effect } from "effect"

/** How long a caller should wait before retrying after a store call timed out. */
export const retryAfterMs = 1000

// Real time, not the Effect Clock: tests drive the reaper on a TestClock, where a bound
// on the Effect Clock would fire when the test moves time, not when the database is slow.
const realTimeout = (ms: number, name: string): Effect.Effect<never, Unavailable> =>
  Effect.callback<never, Unavailable>((resume) => {
    const timer = setTimeout(
      () =>
        resume(
          Effect.fail(
            new Unavailable({
              reason: `the database did not answer ${name} within ${ms} ms (ENGRAM_STORE_TIMEOUT_MS); a write's outcome is unknown until read back`,
              retryAfterMs,
            }),
          ),
        ),
      ms,
    )
    return Effect.sync(() => clearTimeout(timer))
  })

/** Bounds one effect: its own answer, or `Unavailable` after `ms` (the effect is interrupted). */
export const bounded = <A, E, R>(effect: Effect.Effect<A, E, R>, ms: number, name: string): Effect.Effect<A, E | Unavailable, R> =>
  Effect.raceFirst(effect, realTimeout(ms, name))

/** The store with every call that answers an effect bounded by `timeoutMs`. */
export const boundStore = (store: StoreShape, timeoutMs: number): StoreShape => {
  const out: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(store)) {
    out[name] =
      typeof value === "function"
        ? (...args: unknown[]) => {
            const result: unknown = (value as (...a: unknown[]) => unknown).apply(store, args)
            return Effect.isEffect(result) ? bounded(result, timeoutMs, name) : result
          }
        : value
  }
  return out as unknown as StoreShape
}
