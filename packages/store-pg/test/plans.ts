// What the statement-plan tests share: a fleet of hosts with reservations, a statement run under
// EXPLAIN ANALYZE as the store sends it, and the rows each whole-table scan read.
import type postgres from "@engram/postgres"
import type { SQL } from "drizzle-orm"
import { PgDialect } from "drizzle-orm/pg-core"
import { drizzleOn } from "../src/PostgresJs.js"

/** A node of `EXPLAIN (FORMAT JSON)`'s plan (the fields the tests read). */
export interface PlanNode {
  readonly "Node Type": string
  readonly "Relation Name"?: string
  readonly "Index Name"?: string
  readonly "Parent Relationship"?: string
  readonly "CTE Name"?: string
  readonly Operation?: string
  readonly "Actual Rows"?: number
  readonly "Actual Loops"?: number
  readonly "Rows Removed by Filter"?: number
  readonly "Rows Removed by Index Recheck"?: number
  readonly Filter?: string
  readonly "Index Cond"?: string
  readonly Plans?: readonly PlanNode[]
}

/** Every node of a plan, the root first. */
export const nodes = (n: PlanNode): PlanNode[] => [n, ...(n.Plans ?? []).flatMap(nodes)]

/** `hosts` hosts `h1`… each with `perHost` reservations `r<h>-<k>` of 1 MiB and 1 vCPU for sessions `s<h>-<k>`. */
export const fillHosts = async (sql: postgres.Sql, hosts: number, perHost: number): Promise<void> => {
  await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
    select 'h' || g, 'ready', 1048576, 1048576, 4096, 0, 0, ${perHost}, ${perHost}, ${perHost} from generate_series(1, ${hosts}) g`
  await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
    select 'r' || h || '-' || k, 'h' || h, 'session', 's' || h || '-' || k, 1, 1, 0, 0 from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
}

/** `perHost` sessions on each of `hosts` hosts (`s<h>-<k>`, on `fillHosts`'s reservations): each host's first moving, the rest running. */
export const fillSessions = async (sql: postgres.Sql, hosts: number, perHost: number): Promise<void> => {
  await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, created_at, updated_at)
    select 's' || h || '-' || k, case when k = 1 then 'moving' else 'running' end, 1, 1, '{}', 'h' || h, 'r' || h || '-' || k, k, k
    from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
}

/** `statement` as the store sends it (drizzle's driver passes a jsonb parameter's text as it is), under EXPLAIN ANALYZE: its plan. */
export const explainAnalyze = async (sql: postgres.Sql, statement: SQL): Promise<PlanNode> => {
  drizzleOn(sql)
  const q = new PgDialect().sqlToQuery(statement)
  const [row] = await sql.unsafe(`explain (analyze, format json) ${q.sql}`, q.params as never[])
  return (row?.["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode
}

/** The rows the plan's whole-table scans of `table` read, all loops counted. */
export const seqRowsRead = (plan: PlanNode, table: string): number =>
  nodes(plan)
    .filter((n) => n["Node Type"] === "Seq Scan" && n["Relation Name"] === table)
    .reduce((sum, n) => sum + (n["Actual Rows"] ?? 0) * (n["Actual Loops"] ?? 1), 0)

/**
 * The rows the plan read from `table` by any scan, all loops counted: the rows each scan of the
 * table returned and those it read and dropped (by its filter or an index recheck), and the
 * entries each bitmap scan of one of its indexes (named `<table>_…`) read.
 */
export const rowsRead = (plan: PlanNode, table: string): number =>
  nodes(plan)
    .filter((n) => (n["Relation Name"] === table && n["Node Type"].endsWith("Scan")) || (n["Node Type"] === "Bitmap Index Scan" && n["Index Name"]?.startsWith(`${table}_`) === true))
    .reduce((sum, n) => sum + ((n["Actual Rows"] ?? 0) + (n["Rows Removed by Filter"] ?? 0) + (n["Rows Removed by Index Recheck"] ?? 0)) * (n["Actual Loops"] ?? 1), 0)
