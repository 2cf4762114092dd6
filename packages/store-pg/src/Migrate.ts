/**
 * Applies the committed drizzle-kit migrations (`drizzle/`) with drizzle's migrator. Applied
 * migrations are recorded in `drizzle.__drizzle_migrations`, so applying twice changes
 * nothing; on PostgreSQL an advisory lock keeps two replicas starting at once from racing.
 */
import { fileURLToPath } from "node:url"
import type { PGlite } from "@electric-sql/pglite"
import { drizzle as drizzlePglite } from "drizzle-orm/pglite"
import { migrate as migratePglite } from "drizzle-orm/pglite/migrator"
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js"
import { migrate as migratePostgres } from "drizzle-orm/postgres-js/migrator"
import postgres from "@engram/postgres"
import type { Sql as UpstreamSql } from "postgres"
import { sessionAttrsFor } from "./SessionAttrs.js"

/** The folder of the committed migrations (beside `src/` and `dist/`). */
export const migrationsFolder: string = fileURLToPath(new URL("../drizzle", import.meta.url))

// An arbitrary constant: the advisory lock key of engram's migrations.
const MIGRATION_LOCK_KEY = 7_310_452_001

/** How `migrateUrl` waits for the tables its migrations lock. */
export interface MigrateOptions {
  /**
   * How long one try may wait for a table's lock (PostgreSQL's `lock_timeout`, ms; default 2,000).
   * A migration that alters a table needs it alone: while it waits behind another replica's open
   * transaction, every later statement on that table queues behind it, so a replica starting a
   * rolling upgrade would stall the running ones for as long as that transaction lasts. Past this
   * the try gives up its place (its transaction rolls back: nothing half-applied) and waits
   * `pause` before the next.
   */
  readonly lockTimeoutMs?: number | undefined
  /** How many tries before the start fails (default 30). */
  readonly attempts?: number | undefined
  /** The wait between tries, given the try that failed (default: 1 s, 2 s, … up to 5 s). */
  readonly pause?: ((attempt: number) => Promise<void>) | undefined
  /**
   * How long the server keeps this migration's connection while its client sends nothing, ms
   * (PostgreSQL's `idle_in_transaction_session_timeout`, and `idle_session_timeout` on 14 and
   * later; default 60,000). A replica frozen while it holds the migration lock (a stopped
   * process whose kernel keeps its socket open) is then ended by the server, its lock and its
   * transaction released, instead of holding every other replica's start, and the tables its
   * migration altered, for good.
   */
  readonly idleTimeoutMs?: number | undefined
}

/** PostgreSQL's SQLSTATE of a statement that waited past `lock_timeout`. */
const LOCK_NOT_AVAILABLE = "55P03"

const sqlState = (e: unknown): string | undefined => {
  for (let c: unknown = e, depth = 0; c !== null && c !== undefined && depth < 5; depth++) {
    const code = (c as { readonly code?: unknown }).code
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code
    c = (c as { readonly cause?: unknown }).cause
  }
  return undefined
}

/**
 * A migration the database refused (a check of its own, as 0021's shared token hashes, or any
 * failed statement) as an error that says the database's message, not drizzle's "Failed query"
 * with the whole migration's text; the driver's error stays its cause. Answers `e` unchanged
 * when no database error is in it.
 */
export const migrationFailure = (e: unknown): unknown => {
  for (let c: unknown = e, depth = 0; c !== null && c !== undefined && depth < 5; depth++) {
    const { code, message } = c as { readonly code?: unknown; readonly message?: unknown }
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && typeof message === "string")
      return new Error(`a migration failed and nothing of it was applied: ${code}: ${message}`, { cause: e })
    c = (c as { readonly cause?: unknown }).cause
  }
  return e
}

const defaultPause = (attempt: number) => new Promise<void>((ok) => setTimeout(ok, Math.min(5_000, attempt * 1_000)))

/**
 * Applies the migrations to the database at `url` (PostgreSQL). Safe to run concurrently and
 * repeatedly. A migration that cannot have its table's lock within `lockTimeoutMs` is tried
 * again (`MigrateOptions`), so its wait for a lock never holds the running replicas' statements
 * queued behind it for longer than that; after `attempts` tries it fails naming the lock wait.
 * Once taken, a lock is held until the pending migrations' one transaction commits (drizzle's
 * migrator), so a table a migration alters is closed to the running replicas for as long as the
 * later pending migrations take (0017's backfill reads the history of the live sessions).
 */
export const migrateUrl = async (url: string, options: MigrateOptions = {}): Promise<void> => {
  const lockTimeoutMs = options.lockTimeoutMs ?? 2_000
  const attempts = options.attempts ?? 30
  const pause = options.pause ?? defaultPause
  if (!Number.isSafeInteger(lockTimeoutMs) || lockTimeoutMs < 1) throw new Error(`lockTimeoutMs ${lockTimeoutMs}: must be an integer >= 1 (ms)`)
  if (!Number.isSafeInteger(attempts) || attempts < 1) throw new Error(`attempts ${attempts}: must be an integer >= 1`)
  const idleTimeoutMs = options.idleTimeoutMs ?? 60_000
  if (!Number.isSafeInteger(idleTimeoutMs) || idleTimeoutMs < 1) throw new Error(`idleTimeoutMs ${idleTimeoutMs}: must be an integer >= 1 (ms)`)
  const client = await lockedSession(url, idleTimeoutMs)
  try {
    try {
      await client.unsafe(`set lock_timeout = ${lockTimeoutMs}`)
      for (let attempt = 1; ; attempt++) {
        try {
          // drizzle is typed against upstream `postgres`; @engram/postgres is its fixed copy (PostgresJs.drizzleOn).
          await migratePostgres(drizzlePostgres({ client: client as unknown as UpstreamSql }), { migrationsFolder })
          break
        } catch (e) {
          if (sqlState(e) !== LOCK_NOT_AVAILABLE) throw migrationFailure(e)
          if (attempt >= attempts) {
            throw new Error(
              `a migration waited for a table's lock past lock_timeout ${lockTimeoutMs} ms on each of ${attempts} tries (another client holds a long transaction on it); nothing was applied by the last try`,
              { cause: e },
            )
          }
          await pause(attempt)
        }
      }
    } finally {
      // On the same connection only (a lost one holds nothing to give back).
      await client`select pg_advisory_unlock(${MIGRATION_LOCK_KEY})`.catch((e: unknown) => {
        if (!(e instanceof MigrationLockLost)) throw e
      })
    }
  } finally {
    await client.end({ timeout: 5 })
  }
}

/** The migration's connection closed while it held the lock: the lock is gone with it. */
export class MigrationLockLost extends Error {}

/**
 * A connection holding the migration lock (waiting for it as long as another holds it), which
 * the server ends once its client sends nothing for `idleTimeoutMs` (see
 * `MigrateOptions.idleTimeoutMs`). Its caller ends it (or unlocks and ends it).
 *
 * Once that connection closed (ended by the server after a freeze, or dropped), the pool would
 * open another for the next statement, without the lock: this process would then migrate beside
 * the replica that took the lock since. So every statement after the close fails instead
 * (`MigrationLockLost`); the start fails and is tried again, waiting for the lock.
 */
export const lockedSession = async (url: string, idleTimeoutMs: number) => {
  let closed = false
  const client = postgres(url, {
    max: 1,
    onnotice: () => undefined,
    onclose: () => void (closed = true),
    connect_timeout: 10,
    ...sessionAttrsFor(url),
    connection: { idle_in_transaction_session_timeout: idleTimeoutMs },
  })
  const lost = () => new MigrationLockLost("the migration's connection closed while it held the migration lock (the server ends it after its client sent nothing for idleTimeoutMs, or it dropped): the lock is gone; nothing more is run on another connection")
  const guarded = new Proxy(client, {
    apply: (target, self, args) => {
      if (closed) throw lost()
      return Reflect.apply(target, self, args) as unknown
    },
    get: (target, key, receiver) => {
      const value = Reflect.get(target, key, receiver) as unknown
      if ((key !== "unsafe" && key !== "begin") || typeof value !== "function") return value
      return (...args: unknown[]) => {
        if (closed) throw lost()
        return Reflect.apply(value, target, args) as unknown
      }
    },
  })
  try {
    // Before the lock: a holder frozen between its statements is ended by the server. (A server
    // before 14 has no idle_session_timeout: only a frozen transaction is ended there.)
    await client.unsafe(`set idle_session_timeout = ${idleTimeoutMs}`).catch(() => undefined)
    await client`select pg_advisory_lock(${MIGRATION_LOCK_KEY})`
    return guarded
  } catch (e) {
    await client.end({ timeout: 0 }).catch(() => undefined)
    throw e
  }
}

/** Applies the migrations to a PGlite database. */
export const migratePgliteClient = async (client: PGlite): Promise<void> => {
  await migratePglite(drizzlePglite({ client }), { migrationsFolder }).catch((e: unknown) => {
    throw migrationFailure(e)
  })
}

/**
 * Applies engram's migrations: to the PostgreSQL database at a URL, or to an open PGlite.
 * Applying them again is a no-op.
 */
export const migrate = (target: string | PGlite): Promise<void> =>
  typeof target === "string" ? migrateUrl(target) : migratePgliteClient(target)
