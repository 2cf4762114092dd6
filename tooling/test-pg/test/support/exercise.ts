// The body of file-a.test.ts and file-b.test.ts: a database of its own, a
// table, rows, and a signature in the ledger.
import postgres from "postgres"
import { afterAll, beforeAll, expect, inject, it } from "vitest"
import { freshDatabase, testServerUrl } from "../../src/index.js"
import type { TestDatabase } from "../../src/index.js"

export function exercise(file: string): void {
  let db: TestDatabase
  let sql: postgres.Sql

  beforeAll(async () => {
    db = await freshDatabase()
    sql = postgres(db.url, { max: 2, onnotice: () => undefined })
  })

  afterAll(async () => {
    await sql.end({ timeout: 5 })
    await db.drop()
  })

  it("gets a database of its own on the run's server", async () => {
    expect(db.name).toMatch(/^engram_test_[0-9a-f]{12}$/)
    expect(await testServerUrl()).toBe(inject("engramTestPgUrl"))
    const [row] = await sql<{ db: string }[]>`SELECT current_database() AS db`
    expect(row?.db).toBe(db.name)
  })

  it("creates a table and inserts into it", async () => {
    // Both files create the same table: they cannot see each other's.
    await sql`CREATE TABLE items (id int PRIMARY KEY, file text NOT NULL, note text NOT NULL)`
    await sql`INSERT INTO items ${sql([1, 2, 3].map((id) => ({ id, file, note: `${file} ✓ ${id}` })))}`
    const rows = await sql<{ id: number; file: string; note: string }[]>`SELECT id, file, note FROM items ORDER BY id`
    expect(rows.map((row) => row.id)).toEqual([1, 2, 3])
    expect(new Set(rows.map((row) => row.file))).toEqual(new Set([file]))
    expect(rows[0]?.note).toBe(`${file} ✓ 1`)
  })

  it("signs the ledger with the server's identity", async () => {
    const [server] = await sql<{ system_identifier: string; postmaster_start: string }[]>`
      SELECT (SELECT system_identifier::text FROM pg_control_system()) AS system_identifier,
             pg_postmaster_start_time()::text AS postmaster_start`
    if (server === undefined) throw new Error("no row")
    const ledger = postgres(inject("engramTestPgLedgerUrl"), { max: 1 })
    try {
      await ledger`INSERT INTO ledger ${ledger({ file, db: db.name, ...server })}`
    } finally {
      await ledger.end({ timeout: 5 })
    }
  })
}
