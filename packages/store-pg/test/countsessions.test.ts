// `countSessions`' statement on a database holding a large ended history beside a live fleet:
// the live sessions are counted through their partial index (migration 0018), never by a scan of
// the sessions table, and no ended row is read (every /metrics scrape runs it).
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { describe, expect, it } from "vitest"
import { migrate } from "../src/index.js"
import { countSessionsSql } from "../src/Sessions.js"
import { explainAnalyze, fillHosts, fillSessions, nodes, rowsRead, seqRowsRead } from "./plans.js"

describe("the session count", () => {
  it("counts the live sessions by their partial index, reading no ended row", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      // 10,000 live sessions (each host's first moving, the rest running), 40,000 ended ones.
      await fillHosts(sql, 200, 50)
      await fillSessions(sql, 200, 50)
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, created_at, updated_at)
        select 'e' || n, 'ended', 1, 1, '{}', 0, n from generate_series(1, 40000) n`
      await sql`vacuum analyze sessions`
      const plan = await explainAnalyze(sql, countSessionsSql)
      expect(seqRowsRead(plan, "sessions")).toBe(0)
      expect(nodes(plan).flatMap((n) => n["Index Name"] ?? [])).toStrictEqual(["sessions_live_state_idx"])
      // The 10,000 live ones (their index entries, and their rows for a bitmap scan), none of the 40,000 ended.
      expect(rowsRead(plan, "sessions")).toBeLessThanOrEqual(2 * 10_000)
      // Two groups: moving and running.
      expect(plan["Actual Rows"]).toBe(2)
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)
})
