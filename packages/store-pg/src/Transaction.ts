/**
 * The transaction runner: every driver call goes through it. It maps a driver error (see
 * `Db.classify`), retries transient conflicts (serialization failures, deadlocks) with a
 * real-time exponential backoff, and serializes calls on a driver with one connection. Above
 * it, `makeOp` runs an operation's transaction body until the body decides: a value, a typed
 * refusal (nothing written), or "run me again" (a lost race seen under the locks).
 */
import { Unavailable } from "@engram/store"
import { Effect } from "effect"
import type { Semaphore } from "effect"
import { classify, retryAfterMs } from "./Db.js"
import type { Classified, Conflicts, Db, DbError, Exec } from "./Db.js"

const maxAttempts = 8

// Real time, not the Effect Clock: tests run on a TestClock where Effect.sleep never advances.
// Interruptible: an interrupted caller stops waiting at once.
const realDelay = (ms: number): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const timer = setTimeout(() => resume(Effect.void), ms)
    return Effect.sync(() => clearTimeout(timer))
  })

/** The backoff before retry `attempt` (0-based): 2 ms doubling up to 200 ms, with ±50 % jitter. */
export const backoffMs = (attempt: number): number => Math.min(200, 2 * 2 ** attempt) * (0.5 + Math.random())

/** A runner of driver calls, and the transient conflicts it met. */
export interface Runner {
  <A>(thunk: () => Promise<A>): Effect.Effect<A, DbError>
  readonly conflicts: () => Conflicts
}

/**
 * Wraps a driver promise: maps its error, retries transient conflicts with backoff (counting
 * them by kind), and serializes through `lock` (a driver with one connection).
 */
export const makeRunner = (lock: Semaphore.Semaphore | null): Runner => {
  const seen = { deadlocks: 0, serializationFailures: 0 }
  const run = <A>(thunk: () => Promise<A>): Effect.Effect<A, DbError> => {
    const once = Effect.tryPromise({ try: thunk, catch: classify })
    const guarded = lock === null ? once : lock.withPermits(1)(once)
    const loop = (attempt: number): Effect.Effect<A, DbError> =>
      guarded.pipe(
        Effect.catch((c: Classified) => {
          if (c._tag === "Fail") return Effect.fail(c.error)
          if (c._tag === "Defect") return Effect.die(c.error)
          if (c.code === "40P01") seen.deadlocks++
          else seen.serializationFailures++
          if (attempt + 1 >= maxAttempts)
            return Effect.fail(new Unavailable({ reason: `transient conflicts persisted: ${c.message}`, retryAfterMs }))
          return realDelay(backoffMs(attempt)).pipe(Effect.andThen(loop(attempt + 1)))
        }),
      )
    return loop(0)
  }
  return Object.assign(run, { conflicts: () => ({ ...seen }) })
}

/** What a transaction body decided: a value, a typed refusal (nothing written), or "run me again". */
export type Out<A, E> =
  | { readonly _tag: "Ok"; readonly value: A }
  | { readonly _tag: "Err"; readonly error: E }
  | { readonly _tag: "Retry" }

/** The body decided a value. */
export const ok = <A>(value: A): Out<A, never> => ({ _tag: "Ok", value })
/** The body refused: nothing it wrote commits. */
export const err = <E>(error: E): Out<never, E> => ({ _tag: "Err", error })
/** The body lost a race: run it again. */
export const retry: Out<never, never> = { _tag: "Retry" }

const maxRetries = 10

/** Runs a transaction body until it decides. */
export type Op = <A, E>(
  body: (tx: Exec, attempt: number) => Promise<Out<A, E>>,
  onUnique?: (constraint: string) => E,
  keepsRoom?: boolean,
) => Effect.Effect<A, E | Unavailable>

/**
 * Builds the operation runner over `db`. `aroundWrite` wraps every body that may change room
 * (all but those run with `keepsRoom`), so the placement cache can drop what it knows.
 */
export const makeOp =
  (db: Db, aroundWrite: () => void): Op =>
  <A, E>(
    body: (tx: Exec, attempt: number) => Promise<Out<A, E>>,
    onUnique?: (constraint: string) => E,
    keepsRoom = false,
  ): Effect.Effect<A, E | Unavailable> => {
    const body_ = keepsRoom
      ? body
      : async (tx: Exec, attempt: number) => {
          aroundWrite()
          try {
            return await body(tx, attempt)
          } finally {
            aroundWrite()
          }
        }
    const loop = (attempt: number): Effect.Effect<A, E | Unavailable> =>
      db.tx((tx) => body_(tx, attempt)).pipe(
        Effect.catchTag("UniqueViolation", (u): Effect.Effect<never, E | Unavailable> =>
          onUnique === undefined
            ? Effect.die(new Error(`unexpected unique violation of ${u.constraint}`))
            : Effect.fail(onUnique(u.constraint)),
        ),
        Effect.flatMap((out): Effect.Effect<A, E | Unavailable> => {
          if (out._tag === "Ok") return Effect.succeed(out.value)
          if (out._tag === "Err") return Effect.fail(out.error)
          if (attempt + 1 >= maxRetries) return Effect.fail(new Unavailable({ reason: "kept losing races; retry", retryAfterMs }))
          return loop(attempt + 1)
        }),
      )
    return loop(0)
  }
