/**
 * The PGlite driver: embedded PostgreSQL in this process (in memory, or in a data directory),
 * behind the store's `Db`. It has one connection, so every call runs alone, in turn. The
 * migrations are applied at open; the database closes with the scope.
 */
import { PGlite } from "@electric-sql/pglite"
import { Unavailable } from "@engram/store"
import { drizzle } from "drizzle-orm/pglite"
import { Effect, Semaphore } from "effect"
import type { Scope } from "effect"
import type { SQL } from "drizzle-orm"
import { retryAfterMs, rowsOf } from "./Db.js"
import type { Db, Exec } from "./Db.js"
import { migratePgliteClient } from "./Migrate.js"
import * as Transaction from "./Transaction.js"
import type { OpenTx } from "./Transaction.js"

/** Where the embedded database lives. */
export interface ConnectOptions {
  /** A data directory that survives restarts; in memory when absent. */
  readonly dataDir?: string | undefined
}

/**
 * The `Db` over an open PGlite: its one connection serializes every call, so a transaction
 * holds it from BEGIN to COMMIT and its statements run in turn.
 */
export const makeDb = (client: PGlite): Db => {
  const db = drizzle({ client }) as unknown as Exec
  const inTurn = async (statements: readonly SQL[]): Promise<unknown[][]> => {
    const out: unknown[][] = []
    for (const s of statements) out.push(rowsOf(await db.execute(s)))
    return out
  }
  const begin = async (): Promise<OpenTx> => {
    await client.exec("begin")
    let open = true
    const end = async (statement: "commit" | "rollback"): Promise<void> => {
      if (!open) return
      open = false
      if (statement === "commit") await client.exec("commit")
      else await client.exec("rollback").catch(() => undefined)
    }
    return { exec: db, pipeline: inTurn, commit: () => end("commit"), rollback: () => end("rollback") }
  }
  return Transaction.make({ driver: "pglite", exec: db, pipeline: inTurn, begin, lock: Semaphore.makeUnsafe(1) })
}

const unavailable = (cause: unknown): Unavailable =>
  new Unavailable({ reason: cause instanceof Error ? cause.message : String(cause), retryAfterMs })

/** Opens PGlite (in memory, or in `dataDir`) and applies the migrations; closed with the scope. */
export const open = (options: ConnectOptions = {}): Effect.Effect<Db, Unavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const client = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const c = options.dataDir === undefined ? new PGlite() : new PGlite(options.dataDir)
          await c.waitReady
          return c
        },
        catch: unavailable,
      }),
      (c) => Effect.promise(() => (c.closed ? Promise.resolve() : c.close())),
    )
    yield* Effect.tryPromise({ try: () => migratePgliteClient(client), catch: unavailable })
    return makeDb(client)
  })
