// One database per test file: CREATE DATABASE engram_test_<random> on the
// run's server, handed out as a URL, dropped again with drop().
import { randomBytes } from "node:crypto"
import postgres from "postgres"
import { EXTERNAL_URL_ENV, PROVIDE_KEY, SERVER_URL_ENV } from "./provided.js"

export interface TestDatabase {
  /** The database's name, `engram_test_<12 hex digits>` by default. */
  readonly name: string
  /** The server URL with this database as its path. */
  readonly url: string
  /** Drops the database, closing any connections still open on it. Idempotent. */
  drop(): Promise<void>
}

export interface CreateDatabaseOptions {
  /** Name prefix, lowercase letters, digits and `_`. Default `engram_test`. */
  readonly prefix?: string
  /** Create the database as a copy of this one (`CREATE DATABASE ... TEMPLATE`). */
  readonly template?: string
}

/**
 * Creates a fresh database on the test run's server: the one globalSetup
 * started or was given (read with vitest's `inject`), else
 * `$ENGRAM_TEST_PG_URL`, else `$ENGRAM_TEST_DATABASE_URL`.
 */
export async function freshDatabase(options: CreateDatabaseOptions = {}): Promise<TestDatabase> {
  return createDatabase(await testServerUrl(), options)
}

/** The URL of the test run's server; see {@link freshDatabase} for where it comes from. */
export async function testServerUrl(): Promise<string> {
  const url = (await injectedUrl()) ?? nonEmpty(process.env[SERVER_URL_ENV]) ?? nonEmpty(process.env[EXTERNAL_URL_ENV])
  if (url === undefined) {
    throw new Error(
      "@engram/test-pg: no PostgreSQL server for this test run. Add " +
        '`globalSetup: ["@engram/test-pg/global-setup"]` to the vitest config, ' +
        `or set ${EXTERNAL_URL_ENV}.`,
    )
  }
  return url
}

/** Creates a fresh database on the server at `serverUrl` (any database of it works as the URL's path). */
export async function createDatabase(serverUrl: string, options: CreateDatabaseOptions = {}): Promise<TestDatabase> {
  const prefix = options.prefix ?? "engram_test"
  if (!/^[a-z_][a-z0-9_]{0,49}$/.test(prefix)) throw new Error(`@engram/test-pg: bad database name prefix ${JSON.stringify(prefix)}`)
  const name = `${prefix}_${randomBytes(6).toString("hex")}`
  const template = options.template === undefined ? "" : ` TEMPLATE ${quoteIdent(options.template)}`
  await withAdmin(serverUrl, (sql) => sql.unsafe(`CREATE DATABASE ${quoteIdent(name)}${template}`))
  let dropping: Promise<void> | undefined
  return {
    name,
    url: databaseUrl(serverUrl, name),
    drop: () => (dropping ??= withAdmin(serverUrl, (sql) => dropDatabase(sql, name))),
  }
}

/** `url` with its database (the path) replaced by `database`; user, password and query stay. */
export function databaseUrl(url: string, database: string): string {
  const parsed = new URL(url)
  parsed.pathname = `/${encodeURIComponent(database)}`
  return parsed.toString()
}

async function dropDatabase(sql: postgres.Sql, name: string): Promise<void> {
  try {
    await sql.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`)
  } catch (error) {
    // WITH (FORCE) is PostgreSQL 13+; older servers: end the sessions ourselves.
    if ((error as { code?: unknown }).code !== "42601") throw error
    await sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ${name} AND pid <> pg_backend_pid()`
    await sql.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(name)}`)
  }
}

async function withAdmin<T>(serverUrl: string, use: (sql: postgres.Sql) => Promise<T>): Promise<T> {
  const sql = postgres(serverUrl, { max: 1, connect_timeout: 10, onnotice: () => undefined })
  try {
    return await use(sql)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value
}

async function injectedUrl(): Promise<string | undefined> {
  try {
    const { inject } = await import("vitest")
    return nonEmpty(inject(PROVIDE_KEY))
  } catch {
    // Not inside a vitest worker, or nothing provided.
    return undefined
  }
}
