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
import { retryAfterMs } from "./Db.js"
import type { Db, Exec } from "./Db.js"
import { migratePgliteClient } from "./Migrate.js"
import { makeRunner } from "./Transaction.js"

/** Where the embedded database lives. */
export interface ConnectOptions {
  /** A data directory that survives restarts; in memory when absent. */
  readonly dataDir?: string | undefined
}

/** The `Db` over an open PGlite: its one connection serializes every call. */
export const makeDb = (client: PGlite): Db => {
  const runner = makeRunner(Semaphore.makeUnsafe(1))
  const db = drizzle({ client }) as unknown as Exec
  return {
    driver: "pglite",
    db,
    tx: (body) => runner(() => db.transaction((tx) => body(tx as unknown as Exec))),
    run: (body) => runner(() => body(db)),
    conflicts: runner.conflicts,
  }
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
