// The apply statement's plan on a database holding many sessions: a group of creates checks
// each new session and numbers its events by primary-key probes, never by reading the whole
// sessions or session_events table (which made every group's statement cost grow with the
// sessions stored: 4.5 and 8.3 ms of a 25 ms statement at 11,000 sessions).
import { Session } from "@engram/core"
import type { Plan } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { describe, expect, it } from "vitest"
import { applySql, docOf } from "../src/Apply.js"
import { migrate } from "../src/index.js"
import { explainAnalyze, fillHosts, nodes, seqRowsRead } from "./plans.js"

describe("the apply statement", () => {
  it("a group of creates reads no whole sessions or session_events table, however many sessions are stored", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const hosts = 2000
      const perHost = 10
      await fillHosts(sql, hosts, perHost)
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, created_at, updated_at)
        select 's' || h || '-' || k, 'running', 1, 1, '{}', 'h' || h, 'r' || h || '-' || k, 0, 0 from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
      await sql`insert into session_events (session_id, seq, at, event)
        select id, n, 0, '{"_tag":"created"}'::jsonb from sessions, generate_series(1, 2) n`
      await sql`analyze`
      const [host] = await sql`select version from hosts where id = 'h1'`
      const plans = Array.from({ length: 64 }, (_, k) => {
        const answer = Session.step(
          null,
          { _tag: "create", id: `new-${k}`, budget: { memMib: 512, vcpus: 1 }, affinity: [], placement: { hostId: "h1", version: Number(host?.["version"]), reservationId: `nr-${k}` } },
          1,
        )
        expect(answer._tag).toBe("Plan")
        return answer as Plan.Plan
      })
      // Run under EXPLAIN ANALYZE: the rows each scan of each table read.
      const plan = await explainAnalyze(sql, applySql(docOf(plans)))
      const readWhole = (table: string) => seqRowsRead(plan, table)
      // 20,000 sessions and 40,000 events are stored on 2,000 hosts: a probe per new session reads none of them.
      expect(readWhole("sessions")).toBeLessThan(100)
      expect(readWhole("session_events")).toBeLessThan(100)
      // 2,000 hosts: the one host the group placed on is updated by its key.
      expect(readWhole("hosts")).toBeLessThan(100)
      // The hosts it updates are locked in id order (`lk`: rows locked after sorting by id), all of
      // them before the update's first row: its scan's key array is an InitPlan over `lk`.
      const lockRows = nodes(plan).filter((n) => n["Node Type"] === "LockRows")
      expect(lockRows.map((n) => n.Plans?.find((c) => c["Parent Relationship"] === "Outer")?.["Node Type"])).toContain("Sort")
      const update = nodes(plan).find((n) => n["Node Type"] === "ModifyTable" && n.Operation === "Update" && n["Relation Name"] === "hosts")
      expect(update?.Plans?.some((c) => c["Parent Relationship"] === "InitPlan" && c["Node Type"] === "CTE Scan" && c["CTE Name"] === "lk")).toBe(true)
      // And it writes what it planned: 64 sessions placed, each with its events numbered from 1.
      const [written] = await sql`select count(*)::int as n, min(seq)::int as lo from session_events where session_id like 'new-%'`
      expect(written?.["n"]).toBe(64 * plans[0]!.events.length)
      expect(written?.["lo"]).toBe(1)
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)
})
