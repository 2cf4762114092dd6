/**
 * The postgres.js driver: a pool on a PostgreSQL URL, its transactions and its prepared
 * statements, behind the store's `Db`. Migrations are applied before the pool opens; the pool
 * closes with the scope.
 */
import { Unavailable } from "@engram/store"
import type { SQL } from "drizzle-orm"
import { PgDialect } from "drizzle-orm/pg-core"
import { drizzle } from "drizzle-orm/postgres-js"
import { Effect } from "effect"
import type { Scope } from "effect"
import postgres from "@engram/postgres"
import type { Sql as UpstreamSql } from "postgres"
import { retryAfterMs, withoutParams } from "./Db.js"
import type { Db, Exec } from "./Db.js"
import { migrateUrl } from "./Migrate.js"
import * as Transaction from "./Transaction.js"
import type { OpenTx } from "./Transaction.js"
import { sessionAttrsFor } from "./SessionAttrs.js"

/** How to reach the database. */
export interface ConnectOptions {
  /** `postgres://user:pass@host:port/db` */
  readonly url: string
  /** Connections in the pool (default `defaultPoolSize`, 10); opened as the load needs them. */
  readonly poolSize?: number | undefined
  /** Seconds to wait for a connection before answering `Unavailable` (default 5). */
  readonly connectTimeoutSec?: number | undefined
  /**
   * The server's bound on one statement and on a transaction left idle (`statement_timeout`,
   * `idle_in_transaction_session_timeout`, in ms; default 0: no statement bound, and a
   * transaction left idle ends after `defaultIdleInTransactionMs`). A statement past it is
   * cancelled and its transaction rolled back, so an answer the caller stopped waiting for
   * does not commit later; the store answers it `Unavailable`. With a bound, a connection
   * that hears nothing for `unansweredAfterMs` of it while a statement waits is taken for dead
   * and reconnects.
   */
  readonly statementTimeoutMs?: number | undefined
  /** Apply the migrations at start (default true). */
  readonly migrate?: boolean | undefined
  /** The `application_name` of every connection of the pool (default: none). */
  readonly applicationName?: string | undefined
}

/**
 * drizzle runs every statement through postgres.js `unsafe(…, { prepare: false })`: a
 * statement with parameters then costs two round trips (describe, then execute) and stalls
 * the connection's pipeline. Our statement texts are a fixed set (id lists travel as one
 * jsonb parameter), so we prepare them all, on the pool and inside every transaction: one
 * round trip per statement.
 */
const preparing = (client: postgres.Sql): postgres.Sql => {
  const unsafe = client.unsafe.bind(client)
  const patched = client as unknown as {
    unsafe: (query: string, args?: unknown[], options?: Record<string, unknown>) => unknown
    begin: (...args: unknown[]) => unknown
  }
  patched.unsafe = (query, args = [], options = {}) =>
    (unsafe as (q: string, a: unknown[], o: Record<string, unknown>) => unknown)(query, args, { ...options, prepare: true })
  if (typeof patched.begin === "function") {
    const begin = patched.begin.bind(client)
    patched.begin = (...args: unknown[]) => {
      const body = args[args.length - 1] as (tx: postgres.Sql) => unknown
      return begin(...args.slice(0, -1), (tx: postgres.Sql) => body(preparing(tx)))
    }
  }
  return client
}

const dialect = new PgDialect()

/**
 * drizzle's postgres.js driver on one of our connections. drizzle is typed against upstream
 * `postgres`; `@engram/postgres` is the same API with its fixes, whose types are a copy and so
 * not the same nominal type.
 */
export const drizzleOn = (client: postgres.Sql) => drizzle({ client: client as unknown as UpstreamSql })

/**
 * The `Db` on a postgres.js pool. Transactions are ours, not drizzle's, so that `BEGIN`
 * travels in the same write as the transaction's first statements (postgres.js coalesces the
 * writes of one tick), and the queries of a transaction are drizzle's over the reserved
 * connection, pipelined where the store asks (`Conn.pipeline`).
 */
/**
 * The most pool statements whose callers gave up that a postgres.js pool holds unanswered
 * (`Transaction.Driver.maxWaiting`), per connection: as many as postgres.js pipelines on one
 * connection before it queues.
 */
export const maxWaitingPerConnection = 100

export const makeDb = (pool: postgres.Sql, options: { readonly poolSize?: number | undefined } = {}): Db => {
  const db = drizzleOn(pool) as unknown as Exec
  const send = (conn: postgres.Sql, statement: SQL) => {
    const q = dialect.sqlToQuery(statement)
    return conn.unsafe(q.sql, q.params as never[], { prepare: true }).execute()
  }
  const pipelineOn = (conn: postgres.Sql) => (statements: readonly SQL[]) =>
    Promise.all(statements.map((s) => send(conn, s))) as unknown as Promise<unknown[][]>
  const begin = (): Promise<OpenTx> =>
    pool.reserve().then((reserved) => {
      const conn = preparing(reserved)
      // A reserved connection has no `options`; drizzle reads the pool's (type parsers).
      ;(conn as unknown as { options: unknown }).options ??= pool.options
      // Not awaited: BEGIN leaves with the transaction's first statements.
      const begun = Promise.resolve(conn.unsafe("begin").execute())
      let open = true
      const end = async (statement: "commit" | "rollback"): Promise<void> => {
        if (!open) return
        open = false
        try {
          if (statement === "commit") {
            await begun
            await conn.unsafe("commit")
          } else {
            await begun.catch(() => undefined)
            await conn.unsafe("rollback").catch(() => undefined)
          }
        } finally {
          reserved.release()
        }
      }
      return {
        exec: drizzleOn(conn) as unknown as Exec,
        pipeline: pipelineOn(conn),
        commit: () => end("commit"),
        rollback: () => end("rollback"),
      }
    })
  return Transaction.make({ driver: "postgres", exec: db, pipeline: pipelineOn(pool), begin, lock: null, maxWaiting: (options.poolSize ?? defaultPoolSize) * maxWaitingPerConnection })
}

/**
 * The wait before a closed connection reconnects (seconds, by failures in a row): 50 ms
 * doubling up to 1 s, with jitter. postgres.js's own grows to 20 s and a connection keeps the
 * wait it computed when it closed, even once the database is back: after an outage a request
 * handed to it waited that long.
 */
export const reconnectBackoffSec = (retries: number): number => Math.min(1, 0.05 * 2 ** retries) * (0.5 + Math.random() / 2)

const unavailable = (error: unknown): Unavailable => {
  // The driver's words (drizzle's wrapper of a failed migration names only its statement).
  const cause = withoutParams(error)
  return new Unavailable({ reason: cause instanceof Error ? cause.message : String(cause), retryAfterMs })
}

/**
 * How long a transaction of the pool may sit idle when `statementTimeoutMs` sets no bound: a
 * minute. A process frozen inside a transaction (SIGSTOP, a paused VM) holds its row locks until
 * then; a fenced write holds the lease row (`FOR SHARE`), so without a bound a frozen leader
 * blocked every takeover for as long as it stayed frozen. No store transaction waits on its
 * caller between statements, so a minute idle is a process that stopped.
 */
export const defaultIdleInTransactionMs = 60_000

/**
 * How long a connection of the pool may hear nothing from the server while a statement of it
 * waits, before its link is taken for dead (ms; postgres.js `unanswered_timeout`, an
 * `@engram/postgres` fix): the server's statement bound plus as much again (at least a second).
 * A live server answers every statement within its `statement_timeout`, if only with the
 * cancellation; a link that died silently (a failover to another machine, a black hole) sends
 * no reset, and without this its connection kept its statements, and took a share of the new
 * ones, until the kernel gave up (`tcp_retries2`, about 15 minutes). Its socket is destroyed
 * instead: its statements fail `Unavailable` and it reconnects. None without a statement bound.
 */
export const unansweredAfterMs = (statementTimeoutMs: number): number => statementTimeoutMs + Math.max(1000, statementTimeoutMs)

/** The connections of a pool by default (`ConnectOptions.poolSize`). */
export const defaultPoolSize = 10

/** Opens the database at a URL: applies the migrations, then a postgres.js pool closed with the scope. */
export const open = (options: ConnectOptions): Effect.Effect<Db, Unavailable, Scope.Scope> =>
  Effect.gen(function* () {
    if (options.migrate !== false) yield* Effect.tryPromise({ try: () => migrateUrl(options.url), catch: unavailable })
    const pool = yield* Effect.acquireRelease(
      Effect.sync(() =>
        preparing(
          postgres(options.url, {
            max: options.poolSize ?? defaultPoolSize,
            connect_timeout: options.connectTimeoutSec ?? 5,
            ...(options.statementTimeoutMs === undefined || options.statementTimeoutMs <= 0
              ? {}
              : { unanswered_timeout: unansweredAfterMs(options.statementTimeoutMs) / 1000 }),
            backoff: reconnectBackoffSec,
            onnotice: () => undefined,
            ...sessionAttrsFor(options.url),
            connection: {
              ...(options.applicationName === undefined ? {} : { application_name: options.applicationName }),
              ...(options.statementTimeoutMs === undefined || options.statementTimeoutMs <= 0
                ? { idle_in_transaction_session_timeout: defaultIdleInTransactionMs }
                : { statement_timeout: options.statementTimeoutMs, idle_in_transaction_session_timeout: options.statementTimeoutMs }),
            },
          }),
        ),
      ),
      (c) => Effect.promise(() => c.end({ timeout: 5 })),
    )
    return makeDb(pool, { poolSize: options.poolSize })
  })
