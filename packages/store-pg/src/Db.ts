/**
 * The one database handle of the store: a drizzle database over postgres.js (a URL) or over
 * PGlite (embedded), and the runner every operation goes through. The runner decides what a
 * driver error means: transient conflicts (40001, 40P01) are retried with a real-time
 * backoff, a lost connection or a timeout is `Unavailable`, a unique violation is a
 * `UniqueViolation` the operation turns into its `Conflict`. Anything else is a defect.
 */
import { Unavailable } from "@engram/store"
import { Data, Effect, Semaphore } from "effect"
import { fillPlaceholders } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { PgDialect } from "drizzle-orm/pg-core"
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core"
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js"
import type postgres from "postgres"

/** The drizzle query surface both drivers share (a database or a transaction). */
export type Exec = PgDatabase<PgQueryResultHKT>

/** A unique constraint refused a write: the operation maps it to its `Conflict`. */
export class UniqueViolation extends Data.TaggedError("UniqueViolation")<{ readonly constraint: string }> {}

/** The runner's errors. */
export type DbError = Unavailable | UniqueViolation

/** An open database. */
export interface Db {
  readonly driver: "postgres" | "pglite"
  readonly db: Exec
  /** Runs `body` in one transaction (READ COMMITTED), retrying transient conflicts. */
  readonly tx: <A>(body: (tx: Exec) => Promise<A>) => Effect.Effect<A, DbError>
  /** Runs a single statement (or a read that needs no transaction). */
  readonly run: <A>(body: (db: Exec) => Promise<A>) => Effect.Effect<A, DbError>
  /**
   * A hot statement compiled once (its values as drizzle placeholders): the function runs it
   * outside a transaction with the given values, without building the statement again. Only
   * on postgres.js; elsewhere the caller builds the statement per call.
   */
  readonly compile?: (statement: SQL) => (values: Record<string, unknown>) => Promise<Record<string, unknown>[]>
}

/** How long a caller should wait before retrying an `Unavailable`. */
export const retryAfterMs = 1000

const maxAttempts = 8

const sqlStateOf = (error: unknown): { code: string | undefined; message: string; constraint: string | undefined } => {
  // drizzle wraps driver errors in DrizzleQueryError; the driver's error is its cause.
  let e: unknown = error
  for (let depth = 0; depth < 5 && e != null; depth++) {
    const code = (e as { code?: unknown }).code
    if (typeof code === "string") {
      const constraint = (e as { constraint_name?: unknown; constraint?: unknown }).constraint_name ?? (e as { constraint?: unknown }).constraint
      return { code, message: String((e as { message?: unknown }).message ?? e), constraint: typeof constraint === "string" ? constraint : undefined }
    }
    e = (e as { cause?: unknown }).cause
  }
  return { code: undefined, message: error instanceof Error ? error.message : String(error), constraint: undefined }
}

const transientCodes = new Set(["40001", "40P01"])

// Connection loss, a server going away, timeouts and overload: the caller may retry later.
const unavailableCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
  "57P01", // admin_shutdown
  "57P02", // crash_shutdown
  "57P03", // cannot_connect_now
  "57014", // query_canceled (statement_timeout)
  "55P03", // lock_not_available (lock_timeout)
  "53300", // too_many_connections
  "53400", // configuration_limit_exceeded
])

type Classified =
  | { readonly _tag: "Transient"; readonly message: string }
  | { readonly _tag: "Fail"; readonly error: DbError }
  | { readonly _tag: "Defect"; readonly error: unknown }

const classify = (error: unknown): Classified => {
  const { code, message, constraint } = sqlStateOf(error)
  if (code !== undefined && transientCodes.has(code)) return { _tag: "Transient", message }
  if (code === "23505") return { _tag: "Fail", error: new UniqueViolation({ constraint: constraint ?? "unknown" }) }
  if (code !== undefined && (unavailableCodes.has(code) || code.startsWith("08")))
    return { _tag: "Fail", error: new Unavailable({ reason: `${code}: ${message}`, retryAfterMs }) }
  // PGlite after close, or postgres.js after end(): no code, but the handle is gone.
  if (/closed|terminat|not connected|connection/i.test(message))
    return { _tag: "Fail", error: new Unavailable({ reason: message, retryAfterMs }) }
  return { _tag: "Defect", error }
}

// Real time, not the Effect Clock: tests run on a TestClock where Effect.sleep never advances.
const realDelay = (ms: number): Effect.Effect<void> =>
  Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

const backoffMs = (attempt: number): number => Math.min(200, 2 * 2 ** attempt) * (0.5 + Math.random())

/**
 * Wraps a driver promise: maps its error, retries transient conflicts with backoff, and
 * serializes through `lock` (PGlite has one connection).
 */
const makeRunner =
  (lock: Semaphore.Semaphore | null) =>
  <A>(thunk: () => Promise<A>): Effect.Effect<A, DbError> => {
    const once = Effect.tryPromise({ try: thunk, catch: classify })
    const guarded = lock === null ? once : lock.withPermits(1)(once)
    const loop = (attempt: number): Effect.Effect<A, DbError> =>
      guarded.pipe(
        Effect.catch((c: Classified) => {
          if (c._tag === "Fail") return Effect.fail(c.error)
          if (c._tag === "Defect") return Effect.die(c.error)
          if (attempt + 1 >= maxAttempts)
            return Effect.fail(new Unavailable({ reason: `transient conflicts persisted: ${c.message}`, retryAfterMs }))
          return realDelay(backoffMs(attempt)).pipe(Effect.andThen(loop(attempt + 1)))
        }),
      )
    return loop(0)
  }

/** Builds the runner over a drizzle database (PGlite: `serialize`, one connection). */
export const makeDb = (driver: Db["driver"], db: Exec, serialize: boolean): Db => {
  const runner = makeRunner(serialize ? Semaphore.makeUnsafe(1) : null)
  return {
    driver,
    db,
    tx: (body) => runner(() => db.transaction((tx) => body(tx as unknown as Exec))),
    run: (body) => runner(() => body(db)),
  }
}

const dialect = new PgDialect()

/** The statements pipelined on one connection: sent in one write, run in order, one round trip. */
type Pipeline = (statements: readonly SQL[]) => Promise<Record<string, unknown>[][]>
const pipelines = new WeakMap<object, Pipeline>()

/**
 * Runs statements in order and answers their rows. On postgres.js they are pipelined (one
 * round trip, and the server runs them strictly in order, each with its own snapshot);
 * elsewhere they run one after another.
 */
export const pipeline = async (exec: Exec, statements: readonly SQL[]): Promise<Record<string, unknown>[][]> => {
  const run = pipelines.get(exec)
  if (run !== undefined) return run(statements)
  const out: Record<string, unknown>[][] = []
  for (const s of statements) out.push(await query<Record<string, unknown>>(exec, s))
  return out
}

/**
 * The runner on a postgres.js pool. Transactions are ours, not drizzle's, so that `BEGIN`
 * travels in the same write as the transaction's first statements (postgres.js coalesces the
 * writes of one tick), and the queries of a transaction are drizzle's over the reserved
 * connection. Every statement is prepared (see `preparing`).
 */
export const makePostgresDb = (pool: postgres.Sql, db: Exec, prepare: (c: postgres.Sql) => postgres.Sql): Db => {
  const runner = makeRunner(null)
  const send = (conn: postgres.Sql, statement: SQL) => {
    const q = dialect.sqlToQuery(statement)
    return conn.unsafe(q.sql, q.params as never[], { prepare: true }).execute()
  }
  const tx = <A>(body: (tx: Exec) => Promise<A>): Promise<A> =>
    pool.reserve().then(async (reserved) => {
      const conn = prepare(reserved)
      // A reserved connection has no `options`; drizzle reads the pool's (type parsers).
      ;(conn as unknown as { options: unknown }).options ??= pool.options
      const exec = drizzlePostgres({ client: conn }) as unknown as Exec
      pipelines.set(exec, (statements) =>
        Promise.all(statements.map((s) => send(conn, s))) as unknown as Promise<Record<string, unknown>[][]>,
      )
      const begin = conn.unsafe("begin").execute()
      try {
        const value = await body(exec)
        await begin
        await conn.unsafe("commit")
        return value
      } catch (error) {
        await Promise.resolve(begin).catch(() => undefined)
        await conn.unsafe("rollback").catch(() => undefined)
        throw error
      } finally {
        reserved.release()
      }
    })
  return {
    driver: "postgres",
    db,
    tx: (body) => runner(() => tx(body)),
    run: (body) => runner(() => body(db)),
    compile: (statement) => {
      const q = dialect.sqlToQuery(statement)
      return (values) =>
        pool.unsafe(q.sql, fillPlaceholders(q.params, values) as never[], { prepare: true }).execute() as unknown as Promise<
          Record<string, unknown>[]
        >
    },
  }
}

/** The rows of a raw `execute`: postgres.js answers an array, PGlite `{ rows }`. */
export const rowsOf = <R>(result: unknown): R[] =>
  (Array.isArray(result) ? result : (result as { rows: R[] }).rows) as R[]

/** Runs a raw statement and answers its rows, the same on both drivers. */
export const query = async <R>(exec: Exec, statement: SQL): Promise<R[]> => rowsOf<R>(await exec.execute(statement))
