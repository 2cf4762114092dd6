// The assignments statement's plan on a database holding many sessions and moves: a host's
// sessions and pending moves come by index, never by reading the whole sessions or moves table
// (an agent's first poll is this read, thousands at once when a fleet reconnects).
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { PgDialect } from "drizzle-orm/pg-core"
import { describe, expect, it } from "vitest"
import { assignmentsSql } from "../src/Assignments.js"
import { migrate } from "../src/index.js"
import { drizzleOn } from "../src/PostgresJs.js"

interface PlanNode {
  readonly "Node Type": string
  readonly "Relation Name"?: string
  readonly "Actual Rows"?: number
  readonly "Actual Loops"?: number
  readonly Plans?: readonly PlanNode[]
}
const nodes = (n: PlanNode): PlanNode[] => [n, ...(n.Plans ?? []).flatMap(nodes)]

describe("the assignments statement", () => {
  it("reads a host's sessions and pending moves by index, however many sessions and moves are stored", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const hosts = 2000
      const perHost = 10
      await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
        select 'h' || g, 'ready', 1048576, 1048576, 4096, 0, 0, ${perHost}, ${perHost}, ${perHost} from generate_series(1, ${hosts}) g`
      await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
        select 'r' || h || '-' || k, 'h' || h, 'session', 's' || h || '-' || k, 1, 1, 0, 0 from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, created_at, updated_at)
        select 's' || h || '-' || k, case when k = 1 then 'moving' else 'running' end, 1, 1, '{}', 'h' || h, 'r' || h || '-' || k, k, k
        from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
      // Every session moved once before (committed, to the next host), and each host's first session is moving now.
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        select 'old-' || h || '-' || k, 's' || h || '-' || k, 'h' || (h % ${hosts} + 1), 'h' || h, 'x', 600, 'committed', 0, 0
        from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
        select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${hosts} + 1), 'x', 600, 'pending', h from generate_series(1, ${hosts}) h`
      await sql`analyze`
      // As the store sends it: drizzle's driver passes the jsonb parameter's text as it is.
      drizzleOn(sql)
      const q = new PgDialect().sqlToQuery(assignmentsSql("h2"))
      const [row] = await sql.unsafe(`explain (analyze, format json) ${q.sql}`, q.params as never[])
      const plan = (row?.["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode
      const readWhole = (table: string) =>
        nodes(plan)
          .filter((n) => n["Node Type"] === "Seq Scan" && n["Relation Name"] === table)
          .reduce((sum, n) => sum + (n["Actual Rows"] ?? 0) * (n["Actual Loops"] ?? 1), 0)
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
})
