// The assignments statement's plan on a database holding many sessions and moves: a host's
// sessions and pending moves come by index, never by reading the whole sessions or moves table
// (an agent's first poll is this read, thousands at once when a fleet reconnects), nor the
// host's ended moves (kept for the retention period, `pruneHistory`: a host's history grows until then).
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { PgDialect } from "drizzle-orm/pg-core"
import { describe, expect, it } from "vitest"
import { assignmentsSql } from "../src/Assignments.js"
import type { Exec } from "../src/Db.js"
import { migrate } from "../src/index.js"
import { listMovesQuery } from "../src/Moves.js"
import { drizzleOn } from "../src/PostgresJs.js"
import { explainAnalyze, fillHosts, fillSessions, rowsRead, seqRowsRead } from "./plans.js"

describe("the assignments statement", () => {
  it("reads a host's sessions and pending moves by index, however many sessions and moves are stored", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const hosts = 2000
      const perHost = 10
      await fillHosts(sql, hosts, perHost)
      await fillSessions(sql, hosts, perHost)
      // Every session moved once before (committed, to the next host), and each host's first session is moving now.
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        select 'old-' || h || '-' || k, 's' || h || '-' || k, 'h' || (h % ${hosts} + 1), 'h' || h, 'x', 600, 'committed', 0, 0
        from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
        select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${hosts} + 1), 'x', 600, 'pending', h from generate_series(1, ${hosts}) h`
      await sql`analyze`
      const plan = await explainAnalyze(sql, assignmentsSql("h2"))
      const q = new PgDialect().sqlToQuery(assignmentsSql("h2"))
      const readWhole = (table: string) => seqRowsRead(plan, table)
      // 20,000 sessions and 22,000 moves on 2,000 hosts: the host's own are found by index.
      expect(readWhole("sessions")).toBeLessThan(100)
      expect(readWhole("moves")).toBeLessThan(100)
      expect(readWhole("hosts")).toBeLessThan(100)
      // And it answers what the host holds: its 10 sessions, and its move out (of its first
      // session) and in (of h1's first), oldest first.
      const [answer] = await sql.unsafe(q.sql, q.params as never[])
      const sessions = answer?.["sessions"] as { id: string }[]
      const moves = answer?.["moves"] as { id: string }[]
      expect(sessions.map((s) => s.id)).toStrictEqual(Array.from({ length: perHost }, (_, k) => `s2-${k + 1}`))
      expect(moves.map((m) => m.id)).toStrictEqual(["mv-1", "mv-2"])
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)

  it("reads none of a host's ended moves, however long its move history", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const hosts = 20
      const perHost = 10
      const history = 20_000
      await fillHosts(sql, hosts, perHost)
      await fillSessions(sql, hosts, perHost)
      // h1's sessions went back and forth to h2 20,000 times (half out, half in; committed or
      // aborted, as moves are kept for the retention period); each host's first session is moving now.
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        select 'old-' || n, 's1-' || (n % ${perHost} + 1), case when n % 2 = 0 then 'h1' else 'h2' end, case when n % 2 = 0 then 'h2' else 'h1' end,
          'x', 600, case when n % 3 = 0 then 'aborted' else 'committed' end, n, n
        from generate_series(1, ${history}) n`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
        select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${hosts} + 1), 'x', 600, 'pending', ${history} + h from generate_series(1, ${hosts}) h`
      await sql`analyze`
      for (const hostId of ["h1", "h2"]) {
        const plan = await explainAnalyze(sql, assignmentsSql(hostId))
        // Its two pending moves (out and in), not the 20,000 ended ones beside them.
        expect(rowsRead(plan, "moves")).toBeLessThan(100)
        const q = new PgDialect().sqlToQuery(assignmentsSql(hostId))
        const [answer] = await sql.unsafe(q.sql, q.params as never[])
        const moves = answer?.["moves"] as { id: string }[]
        expect(moves.map((m) => m.id)).toStrictEqual(hostId === "h1" ? ["mv-1", "mv-20"] : ["mv-1", "mv-2"])
        // `listMoves` of its pending moves reads as few.
        const list = listMovesQuery(drizzleOn(sql) as unknown as Exec, { hostId, state: "pending" }).getSQL()
        expect(rowsRead(await explainAnalyze(sql, list), "moves")).toBeLessThan(100)
      }
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)
})
