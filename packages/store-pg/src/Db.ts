/**
 * The one database handle every part of the store runs through, whichever driver opened it
 * (`PostgresJs.ts`, `Pglite.ts`): a connection whose every query is an Effect (so interruption
 * and tracing reach it), transactions whose bodies are Effects, and what a driver error means.
 * Transient conflicts (40001, 40P01) retry the statement, or the whole transaction, with backoff
 * (`Transaction.ts`); a lost connection, a timeout or a full disk is `Unavailable`; a unique
 * violation is a `UniqueViolation` the operation turns into its `Conflict`; anything else is a
 * defect.
 */
import { Unavailable } from "@engram/store"
import { Data, Effect } from "effect"
import { sql } from "drizzle-orm"
import type { SQL, SQLWrapper } from "drizzle-orm"
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core"

/** The drizzle query surface both drivers share (a database or a transaction). */
export type Exec = PgDatabase<PgQueryResultHKT>

/** A unique constraint refused a write: the operation maps it to its `Conflict`. */
export class UniqueViolation extends Data.TaggedError("UniqueViolation")<{ readonly constraint: string }> {}

/** A transient conflict (serialization failure, deadlock) inside a transaction: the transaction runs again. */
export class Transient extends Data.TaggedError("Transient")<{ readonly code: "40001" | "40P01"; readonly message: string }> {}

/** A transaction body saw a lost race under its locks (room changed between its read and its locks): run it again. */
export class RunAgain extends Data.TaggedError("RunAgain")<{ readonly why: string }> {}

/** The errors of a query. */
export type DbError = Unavailable | UniqueViolation

/**
 * A connection: the pool (each query a statement of its own) or an open transaction (its
 * queries see each other's writes and commit together).
 */
export interface Conn<E = DbError> {
  /** Runs a driver call (a drizzle query) on this connection. */
  readonly use: <A>(f: (exec: Exec) => Promise<A>) => Effect.Effect<A, E>
  /** Runs a raw statement and answers its rows. */
  readonly query: <R = Record<string, unknown>>(statement: SQL) => Effect.Effect<R[], E>
  /**
   * Runs statements in order and answers their rows: on postgres.js pipelined (one round trip;
   * the server runs them strictly in order, each with its own snapshot), elsewhere one after another.
   */
  readonly pipeline: (statements: readonly SQL[]) => Effect.Effect<Record<string, unknown>[][], E>
  /** Runs `f` once the transaction has committed (at once on the pool): what a cache may learn only from committed rows. */
  readonly afterCommit: (f: () => void) => void
  /** Whether this is an open transaction (its row locks last until it commits). */
  readonly inTransaction: boolean
  /**
   * Whether every transaction runs alone (PGlite's one connection): then no other transaction
   * ever holds a row lock, and none is ever waited on.
   */
  readonly alone: boolean
}

/** An open transaction: its queries may also fail with `Transient` (the transaction then runs again). */
export type Tx = Conn<DbError | Transient>

/** An open database. */
export interface Db {
  readonly driver: "postgres" | "pglite"
  /** The pool: each query is a statement of its own, retried on transient conflicts. */
  readonly pool: Conn
  /**
   * Runs `body` in one transaction (READ COMMITTED): committed when it succeeds, rolled back
   * when it fails or is interrupted, run again on a transient conflict.
   */
  readonly transaction: <A, E, R>(body: (tx: Tx) => Effect.Effect<A, E, R>) => Effect.Effect<A, Exclude<E, Transient | RunAgain> | DbError, R>
  /** The transient conflicts this handle met (and retried) so far, by kind. */
  readonly conflicts: () => Conflicts
}

/** Transient conflicts met so far: deadlocks (40P01) and serialization failures (40001). */
export interface Conflicts {
  readonly deadlocks: number
  readonly serializationFailures: number
}

/** How long a caller should wait before retrying an `Unavailable`. */
export const retryAfterMs = 1000

/** How long a caller should wait before retrying a write refused for a full disk (room takes an operator). */
export const diskFullRetryAfterMs = 30_000

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
  // No SQLSTATE: the driver's own words (drizzle's wrapper names only the statement).
  const driver = (error as { cause?: unknown } | null)?.cause ?? error
  return { code: undefined, message: stripParams(driver instanceof Error ? driver.message : String(driver)), constraint: undefined }
}

/** drizzle's message of a failed query ends with the statement's parameters: dropped. */
const stripParams = (message: string) => message.replace(/\nparams: [\s\S]*$/, "")

/**
 * A driver error without its statement's parameters, for logs and answers: drizzle writes them
 * into its message (`params: …`) and PGlite onto its error (`params`), and they hold token
 * hashes and ids. The same error when it carries none; else a plain one with the statement,
 * the driver's message and its SQLSTATE.
 */
export const withoutParams = (error: unknown): unknown => {
  const chain: object[] = []
  for (let e: unknown = error; chain.length < 5 && typeof e === "object" && e !== null; e = (e as { cause?: unknown }).cause) chain.push(e)
  const carries = chain.some((e) => "params" in e || "parameters" in e || (e instanceof Error && /\nparams: /.test(e.message)))
  if (!carries) return error
  const query = chain.map((e) => (e as { query?: unknown }).query).find((q) => typeof q === "string")
  const driver = chain.find((e) => typeof (e as { code?: unknown }).code === "string") ?? chain.at(-1)
  const message = stripParams(driver instanceof Error ? driver.message : String((driver as { message?: unknown } | undefined)?.message ?? error))
  const clean = new Error(query === undefined || message.startsWith("Failed query") ? message : `Failed query: ${query}: ${message}`)
  clean.name = error instanceof Error ? error.name : "Error"
  const code = (driver as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? Object.assign(clean, { code }) : clean
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
  "CONNECTION_UNANSWERED", // nothing heard past the statement bound: the link is dead (`PostgresJs.unansweredAfterMs`)
  "57P01", // admin_shutdown
  "57P02", // crash_shutdown
  "57P03", // cannot_connect_now
  "57014", // query_canceled (statement_timeout)
  "25P03", // idle_in_transaction_session_timeout
  "57P05", // idle_session_timeout
  "53300", // too_many_connections
  "53400", // configuration_limit_exceeded
])

/** What a driver error means. */
export type Classified =
  | { readonly _tag: "Transient"; readonly code: "40001" | "40P01"; readonly message: string }
  | { readonly _tag: "Fail"; readonly error: DbError }
  | { readonly _tag: "Defect"; readonly error: unknown }

/** Classifies a driver error (postgres.js or PGlite, possibly wrapped by drizzle). */
export const classify = (error: unknown): Classified => {
  const { code, message, constraint } = sqlStateOf(error)
  if (code !== undefined && transientCodes.has(code)) return { _tag: "Transient", code: code as "40001" | "40P01", message }
  if (code === "23505") return { _tag: "Fail", error: new UniqueViolation({ constraint: constraint ?? "unknown" }) }
  // Disk full (53100 `could not extend file … No space left on device`, or ENOSPC from a write
  // elsewhere): the statement rolled back; reads go on, writes fail until room is freed.
  if (code === "53100" || code === "ENOSPC" || /no space left on device|ENOSPC/i.test(message))
    return { _tag: "Fail", error: new Unavailable({ reason: `disk full: ${message}`, retryAfterMs: diskFullRetryAfterMs, kind: "disk_full" }) }
  // A database that only reads (25006 read_only_sql_transaction: a hot standby the connection
  // reached after a failover, or `default_transaction_read_only` set): the write rolled back;
  // reads go on, writes fail until the connection reaches a primary again.
  if (code === "25006")
    return { _tag: "Fail", error: new Unavailable({ reason: `the database refuses writes (read-only): ${code}: ${message}`, retryAfterMs, kind: "read_only" }) }
  // The server's `statement_timeout` (57014, not a cancel by hand): the database did not answer
  // in time, the same cause as the caller's own bound, so the same kind (one wording upstream).
  if (code === "57014" && /statement timeout/i.test(message))
    return { _tag: "Fail", error: new Unavailable({ reason: `${code}: ${message}`, retryAfterMs, kind: "timed_out" }) }
  // A lock wait past `lock_timeout` (55P03 lock_not_available): the database answered; the
  // statement lost to concurrent work on it, no sign of an unhealthy store.
  if (code === "55P03") return { _tag: "Fail", error: new Unavailable({ reason: `${code}: ${message}`, retryAfterMs, kind: "contended" }) }
  if (code !== undefined && (unavailableCodes.has(code) || code.startsWith("08")))
    return { _tag: "Fail", error: new Unavailable({ reason: `${code}: ${message}`, retryAfterMs }) }
  // PGlite after close, or postgres.js after end(): no code, but the handle is gone.
  if (/closed|terminat|not connected|connection/i.test(message))
    return { _tag: "Fail", error: new Unavailable({ reason: message, retryAfterMs }) }
  return { _tag: "Defect", error: withoutParams(error) }
}

/** The rows of a raw `execute`: postgres.js answers an array, PGlite `{ rows }`. */
export const rowsOf = <R>(result: unknown): R[] =>
  (Array.isArray(result) ? result : (result as { rows: R[] }).rows) as R[]

/**
 * `column = any(…keys)` with the keys as one jsonb parameter: the statement text stays the same
 * whatever the number of keys, so it is prepared once per connection; the keys are probed in the
 * column's index. The store's one form of a key list: `column in (select
 * jsonb_array_elements_text(…))` is planned for the 100 rows PostgreSQL assumes of a
 * set-returning function, and from about 10,000 rows a table (hosts, moves; sessions and
 * reservations below about 25,000) that is a hash join over a scan of the whole table, whatever
 * the number of keys (1.5 to 3 ms a statement, for 1 or 8 keys). An array from the same elements
 * is one value the planner probes the index with (0.03 to 0.1 ms; 500 keys about 1 ms).
 */
export const anyJson = (column: SQLWrapper, keys: readonly string[]): SQL =>
  sql`${column} = any(array(select jsonb_array_elements_text(${JSON.stringify(keys)}::jsonb)))`

/**
 * A unique violation as a defect: for reads, and writes whose every unique key the store chose
 * itself (a violation there is a bug, not a caller's conflict).
 */
export const dieOnUnique = <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, Exclude<E, UniqueViolation>, R> =>
  Effect.catch(self, (e) => (e instanceof UniqueViolation ? Effect.die(e) : Effect.fail(e as Exclude<E, UniqueViolation>)))
