/**
 * The reads that grew with history (issue #20), before and after, same server, same run,
 * alternating: a host's assignments (an agent's first poll) on a fleet whose moves are never
 * deleted, and a source's allowances (a move's guard) on a fleet with thousands of host pairs.
 *
 * Two databases of the same fleet: "before" without migration 0012's indexes, read with the
 * statements the store sent before (the assignments with the host's row as json; every pair with
 * a commit within the horizon, then core's rule); "after" with them, read with today's (the
 * assignments without the host's row; the bounded `listAllowanceCommits`, then core's rule).
 * Each round reads before then after for `HISTORY_ROUND_SECONDS` (2) each, `HISTORY_ROUNDS` (4)
 * rounds; figures are the median round, and the load average is printed at the start and end.
 *
 *   pnpm --filter @engram/store-pg exec tsx --conditions=@engram/source bench/history.ts
 */
import { report } from "@engram/bench"
import { assignedStates } from "@engram/store"
import { Downtime } from "@engram/core"
import type { PairCommits } from "@engram/store"
import { createDatabase, startEmbeddedPostgres } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { asc, gte, sql as dsql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { PgDialect } from "drizzle-orm/pg-core"
import { readFileSync } from "node:fs"
import { allowanceCommitsSql } from "../src/AllowanceCommits.js"
import { assignmentsSql } from "../src/Assignments.js"
import { migrate } from "../src/index.js"
import { drizzleOn } from "../src/PostgresJs.js"
import { movePairs } from "../src/schema.js"

const ROUND_MS = Number(process.env["HISTORY_ROUND_SECONDS"] ?? 2) * 1000
const ROUNDS = Number(process.env["HISTORY_ROUNDS"] ?? 4)
const HOSTS = 2000
/** Ended moves per host, half out, half in. */
const ENDED_PER_HOST = 100
/** Each host's pairs: commits to its next `TARGETS_PER_HOST` hosts, a full window each. */
const TARGETS_PER_HOST = 5
const NOW_MS = 10_000_000
const HORIZON_MS = Downtime.defaultRecencyPolicy.horizonMs

const loadavg = (): string => readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ")
const dialect = new PgDialect()
const text = (s: SQL) => dialect.sqlToQuery(s)

/** The assignments statement before this change: the host's row as json beside the lists. */
const assignmentsBeforeSql = (hostId: string) => dsql`select to_jsonb(h) as "host",
    coalesce((select jsonb_agg(to_jsonb(s) order by s.created_at, s.id) from sessions s
      where s.host_id = h.id and s.state in (select jsonb_array_elements_text(${JSON.stringify(assignedStates)}::jsonb))), '[]'::jsonb) as "sessions",
    coalesce((select jsonb_agg(to_jsonb(m) order by m.created_at, m.id) from (
        select * from moves where source_host_id = h.id and state = 'pending'
        union all
        select * from moves where target_host_id = h.id and state = 'pending') m), '[]'::jsonb) as "moves"
  from hosts h where h.id = ${hostId}`

const fill = async (sql: postgres.Sql): Promise<void> => {
  await sql`insert into hosts (id, state, labels, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries, templates)
    select 'h' || g, 'ready', '{"zone":"eu-1","rack":"r12","class":"standard"}'::jsonb, 262144, 262144, 64, ${Date.now()}, 0, 10240, 10, 10,
      (select jsonb_agg(jsonb_build_object('name', 'tpl-' || t, 'sizeBytes', 1073741824)) from generate_series(1, 8) t)
    from generate_series(1, ${HOSTS}) g`
  await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
    select 'r' || h || '-' || k, 'h' || h, 'session', 's' || h || '-' || k, 1024, 1, 0, 0 from generate_series(1, ${HOSTS}) h, generate_series(1, 10) k`
  await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, created_at, updated_at)
    select 's' || h || '-' || k, case when k = 1 then 'moving' else 'running' end, 1024, 1, '{}', 'h' || h, 'r' || h || '-' || k, k, k
    from generate_series(1, ${HOSTS}) h, generate_series(1, 10) k`
  // Every host's history: its sessions moved to the next host and back, committed or aborted.
  await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
    select 'old-' || h || '-' || n, 's' || h || '-' || (n % 10 + 1),
      case when n % 2 = 0 then 'h' || h else 'h' || (h % ${HOSTS} + 1) end, case when n % 2 = 0 then 'h' || (h % ${HOSTS} + 1) else 'h' || h end,
      'x', 600, case when n % 5 = 0 then 'aborted' else 'committed' end, n, n
    from generate_series(1, ${HOSTS}) h, generate_series(1, ${ENDED_PER_HOST}) n`
  await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
    select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${HOSTS} + 1), 'x', 600, 'pending', ${ENDED_PER_HOST} + h from generate_series(1, ${HOSTS}) h`
  // Every pair's window of commits, all within the horizon.
  await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, recorded_at_ms, updated_at)
    select 'h' || h, 'h' || ((h + k - 1) % ${HOSTS} + 1),
      (select jsonb_agg(100 + (h * 7 + k * 13 + i * 31) % 400 order by i) from generate_series(1, 20) i),
      (select jsonb_agg(${NOW_MS} - 1000000 + (h * 5 + k) * 20 + i order by i) from generate_series(1, 20) i),
      ${NOW_MS} - 1000000 + (h * 5 + k) * 20 + 20
    from generate_series(1, ${HOSTS}) h, generate_series(1, ${TARGETS_PER_HOST}) k`
  await sql`vacuum analyze`
}

type Read = (sql: postgres.Sql, hostId: string) => Promise<unknown>

const send = (sql: postgres.Sql, s: SQL) => {
  const q = text(s)
  return sql.unsafe(q.sql, q.params as never[], { prepare: true })
}

const assignmentsBefore: Read = (sql, hostId) => send(sql, assignmentsBeforeSql(hostId))
const assignmentsAfter: Read = (sql, hostId) => send(sql, assignmentsSql(hostId))

const targetOf = (hostId: string) => `h${(Number(hostId.slice(1)) % HOSTS) + 1}`
const pairOf = (r: Record<string, unknown>): PairCommits => ({
  sourceHostId: r["source_host_id"] as string,
  targetHostId: r["target_host_id"] as string,
  commitsMs: r["commits_ms"] as number[],
  recordedAtMs: r["recorded_at_ms"] as number[],
  updatedAt: Number(r["updated_at"]),
})
const recordedSince = NOW_MS - HORIZON_MS + 1

/** Before: every pair with a commit within the horizon (`listPairCommits({ recordedSince })`), then core per target. */
const allowanceBefore: Read = async (sql, hostId) => {
  const statement = drizzleOn(sql).select().from(movePairs).where(gte(movePairs.updatedAt, recordedSince)).orderBy(asc(movePairs.sourceHostId), asc(movePairs.targetHostId)).getSQL()
  const rows = await send(sql, statement)
  return Downtime.pairAllowance(rows.map(pairOf), hostId, targetOf(hostId), NOW_MS)
}

/** After: the bounded read (`listAllowanceCommits`), then core per target. */
const allowanceAfter: Read = async (sql, hostId) => {
  const rows = await send(sql, allowanceCommitsSql({ sourceHostId: hostId, targetHostIds: [targetOf(hostId)], recordedSince, limit: Downtime.poolLimit() }))
  const pairs = rows.map((r): PairCommits => ({
    sourceHostId: r["sourceHostId"] as string,
    targetHostId: r["targetHostId"] as string,
    commitsMs: r["commitsMs"] as number[],
    recordedAtMs: r["recordedAtMs"] as number[],
    updatedAt: Number(r["updatedAt"]),
  }))
  return Downtime.pairAllowance(pairs, hostId, targetOf(hostId), NOW_MS)
}

/** Reads per second of `read` at random hosts, one client, for `ms`. */
const rate = async (sql: postgres.Sql, read: Read, ms: number): Promise<number> => {
  const started = performance.now()
  let n = 0
  while (performance.now() - started < ms) {
    await read(sql, `h${1 + Math.floor(Math.random() * HOSTS)}`)
    n++
  }
  return n / ((performance.now() - started) / 1000)
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 === 1 ? (s[(s.length - 1) / 2] as number) : ((s[s.length / 2 - 1] as number) + (s[s.length / 2] as number)) / 2
}

const server = await startEmbeddedPostgres()
const dbs: { drop: () => Promise<void> }[] = []
try {
  console.log(`history bench: load average ${loadavg()} at the start; ${HOSTS} hosts, ${HOSTS * ENDED_PER_HOST} ended moves, ${HOSTS * TARGETS_PER_HOST} pairs of 20 recent commits`)
  const before = await createDatabase(server.url, { prefix: "engram_history_before" })
  const after = await createDatabase(server.url, { prefix: "engram_history_after" })
  dbs.push(before, after)
  await migrate(before.url)
  await migrate(after.url)
  const b = postgres(before.url, { max: 1, onnotice: () => undefined })
  const a = postgres(after.url, { max: 1, onnotice: () => undefined })
  // As the store's driver: a jsonb parameter's text is sent as it is.
  drizzleOn(b)
  drizzleOn(a)
  try {
    // "before" as it was: without migration 0012's indexes.
    await b`drop index moves_source_pending_idx, moves_target_pending_idx, move_pairs_target_idx`
    await fill(b)
    await fill(a)
    // Each read: before; then, for the assignments, today's statement without the indexes (the
    // host's row alone); then after. In turn, round after round.
    const figures: readonly (readonly [string, readonly (readonly [string, postgres.Sql, Read])[]])[] = [
      ["assignments read", [["before", b, assignmentsBefore], ["without the host row only", b, assignmentsAfter], ["after", a, assignmentsAfter]]],
      ["allowance read", [["before", b, allowanceBefore], ["after", a, allowanceAfter]]],
    ]
    for (const [name, variants] of figures) {
      for (const [, db, read] of variants) await rate(db, read, 300)
      const rates = variants.map((): number[] => [])
      for (let r = 0; r < ROUNDS; r++) for (const [i, [, db, read]] of variants.entries()) rates[i]?.push(await rate(db, read, ROUND_MS))
      const base = median(rates[0] ?? [])
      for (const [i, [variant]] of variants.entries()) {
        const xs = rates[i] ?? []
        console.log(`  ${name}, ${variant}: ${xs.map((x) => x.toFixed(0)).join(", ")}/s`)
        report({ bench: "store-pg", figure: `${name}, large history, ${variant}, 1 client`, value: median(xs), unit: "/s", ...(i === 0 ? {} : { ratio: median(xs) / base, baseline: "before" }) })
      }
    }
  } finally {
    await b.end()
    await a.end()
  }
  console.log(`history bench: load average ${loadavg()} at the end`)
} finally {
  for (const db of dbs) await db.drop().catch(() => undefined)
  await server.stop()
}
