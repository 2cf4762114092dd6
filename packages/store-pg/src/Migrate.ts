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

/** The folder of the committed migrations (beside `src/` and `dist/`). */
export const migrationsFolder: string = fileURLToPath(new URL("../drizzle", import.meta.url))

// An arbitrary constant: the advisory lock key of engram's migrations.
const MIGRATION_LOCK_KEY = 7_310_452_001

/** Applies the migrations to the database at `url` (PostgreSQL). Safe to run concurrently and repeatedly. */
export const migrateUrl = async (url: string): Promise<void> => {
  const client = postgres(url, { max: 1, onnotice: () => undefined, connect_timeout: 10 })
  try {
    await client`select pg_advisory_lock(${MIGRATION_LOCK_KEY})`
    try {
      // drizzle is typed against upstream `postgres`; @engram/postgres is its fixed copy (PostgresJs.drizzleOn).
      await migratePostgres(drizzlePostgres({ client: client as unknown as UpstreamSql }), { migrationsFolder })
    } finally {
      await client`select pg_advisory_unlock(${MIGRATION_LOCK_KEY})`
    }
  } finally {
    await client.end({ timeout: 5 })
  }
}

/** Applies the migrations to a PGlite database. */
export const migratePgliteClient = async (client: PGlite): Promise<void> => {
  await migratePglite(drizzlePglite({ client }), { migrationsFolder })
}

/**
 * Applies engram's migrations: to the PostgreSQL database at a URL, or to an open PGlite.
 * Applying them again is a no-op.
 */
export const migrate = (target: string | PGlite): Promise<void> =>
  typeof target === "string" ? migrateUrl(target) : migratePgliteClient(target)
