/**
 * The one database handle every part of the store runs through, whichever driver opened it
 * (`PostgresJs.ts`, `Pglite.ts`): a drizzle query surface, a transaction and a single-statement
 * runner, and what a driver error means. Transient conflicts (40001, 40P01) are retried by the
 * runner (`Transaction.ts`); a lost connection, a timeout or a full disk is `Unavailable`; a unique
 * violation is a `UniqueViolation` the operation turns into its `Conflict`; anything else is
 * a defect.
 */
import { Unavailable } from "@engram/store"
import { Data } from "effect"
import type { Effect } from "effect"
import { sql } from "drizzle-orm"
import type { SQL, SQLWrapper } from "drizzle-orm"
import type { PgDatabase, PgQueryResultHKT } from "drizzle-orm/pg-core"

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
  /** The transient conflicts this handle met (and retried) so far, by kind. */
  readonly conflicts: () => Conflicts
  /**
   * A hot statement compiled once (its values as drizzle placeholders): the function runs it
   * outside a transaction with the given values, without building the statement again. Only
   * on postgres.js; elsewhere the caller builds the statement per call.
   */
  readonly compile?: (statement: SQL) => (values: Record<string, unknown>) => Promise<Record<string, unknown>[]>
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
  "25P03", // idle_in_transaction_session_timeout
  "57P05", // idle_session_timeout
  "55P03", // lock_not_available (lock_timeout)
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
  if (code !== undefined && (unavailableCodes.has(code) || code.startsWith("08")))
    return { _tag: "Fail", error: new Unavailable({ reason: `${code}: ${message}`, retryAfterMs }) }
  // PGlite after close, or postgres.js after end(): no code, but the handle is gone.
  if (/closed|terminat|not connected|connection/i.test(message))
    return { _tag: "Fail", error: new Unavailable({ reason: message, retryAfterMs }) }
  return { _tag: "Defect", error }
}

/** The statements pipelined on one connection: sent in one write, run in order, one round trip. */
type Pipeline = (statements: readonly SQL[]) => Promise<Record<string, unknown>[][]>
const pipelines = new WeakMap<object, Pipeline>()

/** Registers how a driver pipelines statements on a transaction's connection. */
export const registerPipeline = (exec: Exec, run: Pipeline): void => {
  pipelines.set(exec, run)
}

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

/** The rows of a raw `execute`: postgres.js answers an array, PGlite `{ rows }`. */
export const rowsOf = <R>(result: unknown): R[] =>
  (Array.isArray(result) ? result : (result as { rows: R[] }).rows) as R[]

/** Runs a raw statement and answers its rows, the same on both drivers. */
export const query = async <R>(exec: Exec, statement: SQL): Promise<R[]> => rowsOf<R>(await exec.execute(statement))

/**
 * `column in (…ids)` with the ids as one jsonb parameter: the statement text stays the same
 * whatever the number of ids, so it is prepared once per connection.
 */
export const inJson = (column: SQLWrapper, ids: readonly string[]): SQL =>
  sql`${column} in (select jsonb_array_elements_text(${JSON.stringify(ids)}::jsonb))`
