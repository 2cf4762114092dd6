// A second globalSetup, for this package's own tests: it gives the test files
// a ledger database to sign, and at the end of the run checks that every file
// got a database of its own on one shared server, and dropped it.
import postgres from "postgres"
import type { TestProject } from "vitest/node"
import { createDatabase } from "../../src/index.js"

declare module "vitest" {
  export interface ProvidedContext {
    engramTestPgLedgerUrl: string
  }
}

export default async function checkSharedServer(project: TestProject): Promise<() => Promise<void>> {
  const serverUrl = project.getProvidedContext().engramTestPgUrl
  const ledger = await createDatabase(serverUrl, { prefix: "engram_test_ledger" })
  const sql = postgres(ledger.url, { max: 1, onnotice: () => undefined })
  await sql`CREATE TABLE ledger (file text PRIMARY KEY, db text NOT NULL, system_identifier text NOT NULL, postmaster_start text NOT NULL)`
  project.provide("engramTestPgLedgerUrl", ledger.url)

  return async () => {
    try {
      const rows = await sql<{ file: string; db: string; system_identifier: string; postmaster_start: string }[]>`
        SELECT file, db, system_identifier, postmaster_start FROM ledger ORDER BY file`
      const problems: string[] = []
      // Every file-*.test.ts of this run (all of them, unless filtered) signs.
      const expected = project.vitest.state
        .getFiles()
        .map((task) => /(file-[a-z])\.test\.ts$/.exec(task.filepath)?.[1])
        .filter((file) => file !== undefined)
        .sort()
      const files = rows.map((row) => row.file)
      if (JSON.stringify(files) !== JSON.stringify(expected)) {
        problems.push(`expected ${expected.join(", ") || "no files"} to sign, got ${files.join(", ") || "none"}`)
      }
      if (new Set(rows.map((row) => row.db)).size !== rows.length) problems.push("two files shared a database")
      if (new Set(rows.map((row) => `${row.system_identifier}/${row.postmaster_start}`)).size > 1) {
        problems.push("the files ran on different servers")
      }
      const left =
        rows.length === 0 ? [] : await sql`SELECT datname FROM pg_database WHERE datname IN ${sql(rows.map((row) => row.db))}`
      if (left.length > 0) problems.push(`databases not dropped: ${left.map((row) => String(row["datname"])).join(", ")}`)
      if (problems.length > 0) throw new Error(`@engram/test-pg self-check failed: ${problems.join("; ")}`)
    } finally {
      await sql.end({ timeout: 5 })
      await ledger.drop()
    }
  }
}
