/**
 * The transaction runner, over what a driver provides (`Driver`): every query is an Effect
 * (`Effect.tryPromise`, its error classified by `Db.classify`), a transaction body is an Effect
 * run between BEGIN and COMMIT (rolled back when it fails or is interrupted), a transient
 * conflict retries the statement, or the whole transaction, with a real-time exponential
 * backoff, and a body that saw a lost race under its locks runs again (`RunAgain`). A driver
 * with one connection (PGlite) serializes every statement and every transaction.
 */
import { Unavailable } from "@engram/store"
import { Effect } from "effect"
import type { Semaphore } from "effect"
import type { SQL } from "drizzle-orm"
import { classify, retryAfterMs, rowsOf, RunAgain, Transient } from "./Db.js"
import type { Classified, Conflicts, Conn, Db, DbError, Exec, Tx } from "./Db.js"

/** An open transaction as a driver hands it over. `commit` and `rollback` also give the connection back. */
export interface OpenTx {
  readonly exec: Exec
  readonly pipeline: (statements: readonly SQL[]) => Promise<unknown[][]>
  readonly commit: () => Promise<void>
  readonly rollback: () => Promise<void>
}

/** What a driver provides. */
export interface Driver {
  readonly driver: "postgres" | "pglite"
  /** The pool's query surface. */
  readonly exec: Exec
  /** How the pool runs statements in order (postgres.js: pipelined on one connection). */
  readonly pipeline: (statements: readonly SQL[]) => Promise<unknown[][]>
  readonly begin: () => Promise<OpenTx>
  /** Held around every statement and transaction: a driver with one connection. */
  readonly lock: Semaphore.Semaphore | null
  /**
   * The most pool statements whose callers gave up that may still wait for the database (a
   * driver cannot take back a statement it queued: postgres.js pipelines and queues without
   * bound). Past it a pool statement is refused at once (`Unavailable`), never queued: while the
   * database hangs without refusing connections, callers time out and try again, and their
   * abandoned statements would pile up in memory and all run when it answers, ahead of fresh
   * ones. A burst of callers that wait is no concern of it. Absent: no bound.
   */
  readonly maxWaiting?: number | undefined
}

const maxAttempts = 8
const maxRunsAgain = 10

// Real time, not the Effect Clock: tests run on a TestClock where Effect.sleep never advances.
// Interruptible: an interrupted caller stops waiting at once.
export const realDelay = (ms: number): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const timer = setTimeout(() => resume(Effect.void), ms)
    return Effect.sync(() => clearTimeout(timer))
  })

/** The backoff before retry `attempt` (0-based): 2 ms doubling up to 200 ms, with ±50 % jitter. */
export const backoffMs = (attempt: number): number => Math.min(200, 2 * 2 ** attempt) * (0.5 + Math.random())

/** A classified driver error as the store's: a transient conflict is `Transient`, a typed failure `DbError`, anything else a defect. */
const declassify = (c: Classified): Effect.Effect<never, DbError | Transient> =>
  c._tag === "Transient" ? Effect.fail(new Transient({ code: c.code, message: c.message })) : c._tag === "Fail" ? Effect.fail(c.error) : Effect.die(c.error)

/** A driver promise as an Effect (see `declassify`). */
const attempt = <A>(thunk: () => Promise<A>): Effect.Effect<A, DbError | Transient> =>
  Effect.tryPromise({ try: thunk, catch: classify }).pipe(Effect.catch(declassify))

/**
 * BEGIN, interruptible: a caller interrupted while the driver waits for a connection (the pool
 * busy, the database away) stops waiting at once, and a transaction that opens after that is
 * rolled back at once, its connection given back, never leaked. (An uninterruptible wait here
 * held whatever its caller held, such as a write group's only slot, for as long as the driver
 * took to answer.)
 */
const beginOn = (d: Driver): Effect.Effect<OpenTx, DbError | Transient> =>
  Effect.callback<OpenTx, Classified>((resume) => {
    let abandoned = false
    d.begin().then(
      (t) => (abandoned ? void t.rollback().catch(() => undefined) : resume(Effect.succeed(t))),
      (e: unknown) => abandoned || resume(Effect.fail(classify(e))),
    )
    return Effect.sync(() => {
      abandoned = true
    })
  }).pipe(Effect.catch(declassify))

/** Builds the store's `Db` over a driver. */
export const make = (d: Driver): Db => {
  const seen = { deadlocks: 0, serializationFailures: 0 }
  const count = (t: Transient): void => {
    if (t.code === "40P01") seen.deadlocks++
    else seen.serializationFailures++
  }
  const locked = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => (d.lock === null ? effect : d.lock.withPermits(1)(effect))

  /** Retries `effect` on `Transient` with backoff; answers `Unavailable` once the conflicts persist. */
  const retrying = <A, E, R>(effect: Effect.Effect<A, E | Transient, R>): Effect.Effect<A, E | Unavailable, R> => {
    const loop = (n: number): Effect.Effect<A, E | Unavailable, R> =>
      effect.pipe(
        Effect.catch((t): Effect.Effect<A, E | Unavailable, R> => {
          if (!(t instanceof Transient)) return Effect.fail(t)
          count(t)
          if (n + 1 >= maxAttempts) return Effect.fail(new Unavailable({ reason: `transient conflicts persisted: ${t.message}`, retryAfterMs, kind: "contended" }))
          return realDelay(backoffMs(n)).pipe(Effect.andThen(loop(n + 1)))
        }),
      )
    return loop(0)
  }

  /** Pool statements sent, not answered yet, whose callers left (`Driver.maxWaiting`). */
  let abandoned = 0
  /**
   * `thunk` as a pool statement, refused at once while `maxWaiting` statements whose callers left
   * are still unanswered. A caller that leaves (interrupted: its bound, its client gone) stops
   * waiting at once; its statement counts until the driver answers it.
   */
  const admitted = <A>(thunk: () => Promise<A>): Effect.Effect<A, DbError | Transient | Unavailable> =>
    Effect.suspend(() => {
      if (d.maxWaiting !== undefined && abandoned >= d.maxWaiting) {
        return Effect.fail(
          new Unavailable({
            reason: `${abandoned} statements whose callers gave up are still waiting for the database (at most ${d.maxWaiting}): it is not answering; refused, not queued`,
            retryAfterMs,
          }),
        )
      }
      return Effect.callback<A, Classified>((resume) => {
        let left = false
        let settled = false
        const answered = (then: () => void) => {
          settled = true
          if (left) abandoned--
          else then()
        }
        let sent: Promise<A>
        try {
          sent = thunk()
        } catch (e) {
          sent = Promise.reject(e)
        }
        sent.then(
          (a) => answered(() => resume(Effect.succeed(a))),
          (e: unknown) => answered(() => resume(Effect.fail(classify(e)))),
        )
        return Effect.sync(() => {
          if (settled) return
          left = true
          abandoned++
        })
      }).pipe(Effect.catch(declassify))
    })

  const pool: Conn = {
    use: (f) => retrying(locked(admitted(() => f(d.exec)))),
    query: <R>(statement: SQL) => retrying(locked(admitted(async () => rowsOf<R>(await d.exec.execute(statement))))),
    pipeline: (statements) => retrying(locked(admitted(() => d.pipeline(statements) as Promise<Record<string, unknown>[][]>))),
    afterCommit: (f) => f(),
    inTransaction: false,
    alone: d.lock !== null,
  }

  /** One run of a transaction body: BEGIN, the body, COMMIT; ROLLBACK when it fails or is interrupted. */
  const once = <A, E, R>(body: (tx: Tx) => Effect.Effect<A, E, R>): Effect.Effect<A, E | DbError | Transient, R> =>
    locked(
      // acquire/use/release with an interruptible acquire (`beginOn`): once BEGIN answered, the
      // rollback on failure or interruption is certain.
      Effect.uninterruptibleMask((restore) =>
        // With one connection (PGlite, `lock`), BEGIN stays uninterruptible: an abandoned BEGIN
        // and its rollback would run outside the lock, inside the next holder's transaction.
        Effect.flatMap(d.lock === null ? restore(beginOn(d)) : attempt(d.begin), (t) => {
          const hooks: (() => void)[] = []
          const tx: Tx = {
            use: (f) => attempt(() => f(t.exec)),
            query: <Row>(statement: SQL) => attempt(async () => rowsOf<Row>(await t.exec.execute(statement))),
            pipeline: (statements) => attempt(() => t.pipeline(statements) as Promise<Record<string, unknown>[][]>),
            afterCommit: (f) => void hooks.push(f),
            inTransaction: true,
            alone: d.lock !== null,
          }
          return restore(
            body(tx).pipe(
              Effect.tap(() => attempt(t.commit)),
              Effect.tap(() => Effect.sync(() => hooks.forEach((f) => f()))),
            ),
          ).pipe(Effect.onExit((exit) => (exit._tag === "Success" ? Effect.void : Effect.promise(() => t.rollback().catch(() => undefined)))))
        }),
      ),
    )

  const transaction: Db["transaction"] = <A, E, R>(body: (tx: Tx) => Effect.Effect<A, E, R>) => {
    type Out = Effect.Effect<A, Exclude<E, Transient | RunAgain> | DbError, R>
    const run = (again: number): Out =>
      retrying(once(body)).pipe(
        Effect.catch((e) => {
          if (!(e instanceof RunAgain)) return Effect.fail(e)
          return again + 1 >= maxRunsAgain ? Effect.fail(new Unavailable({ reason: "kept losing races; retry", retryAfterMs, kind: "contended" })) : run(again + 1)
        }),
      ) as Out
    return run(0)
  }

  return { driver: d.driver, pool, transaction, conflicts: () => ({ ...seen }) satisfies Conflicts }
}
