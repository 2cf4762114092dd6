/**
 * The commits a source host's allowances may count (`listAllowanceCommits`), bounded in one
 * statement: core's `Downtime.allowanceCommits` in SQL. The guard's allowance of a pair ranks its
 * own commits, its target's pool and the fleet's (core's `Downtime.pairAllowance`) and reads at
 * most `limit` of each; reading every pair with a commit within the horizon (`listPairCommits`)
 * grew with the fleet. Here the asked pairs come by primary key, the others into an asked target
 * by `move_pairs_target_idx`, and the rest of the fleet by `move_pairs_updated_at_idx`, only the
 * `limit` pairs with the latest last commits, ties included (a pair's commit times never
 * decrease and its last is `updated_at`, as core's `Downtime.recordTimedCommit` records them in
 * `Moves.ts`, so no pair outside them holds one of the `limit` most recent).
 */
import { Validate } from "@engram/store"
import type { AllowanceCommitsQuery, PairCommits, StoreShape } from "@engram/store"
import { sql } from "drizzle-orm"
import { Effect } from "effect"
import { dieOnUnique } from "./Db.js"
import type { Deps } from "./Deps.js"
import { json } from "./HostRows.js"

/** `recordedSince` as a bound on the bigint `updated_at` (whole ms: at or after `x` is at or after `ceil(x)`). */
const sinceMs = (x: number): number => Math.min(Number.MAX_SAFE_INTEGER, Math.max(Number.MIN_SAFE_INTEGER, Math.ceil(x)))

/**
 * The statement. Groups as core's: `p<target>` an asked pair, `t<target>` the others into an
 * asked target, `f` the rest; in each, the `limit` most recent commits (a tie by time goes by
 * source, target, then place in the pair's history, as core's), answered per pair by source then
 * target (`collate "C"`: by UTF-8 bytes, which is core's order by UTF-16 code units for host ids,
 * `[A-Za-z0-9._-]`), commits oldest first.
 */
export const allowanceCommitsSql = (q: AllowanceCommitsQuery) => {
  const targets = JSON.stringify([...new Set(q.targetHostIds)])
  const since = sinceMs(q.recordedSince)
  // The asked targets as an array the planner probes the indexes with (`= any`), not a join.
  const asked = sql`array(select jsonb_array_elements_text(${targets}::jsonb))`
  return sql`with chosen as (
    select p.*, 'p' || p.target_host_id as grp from move_pairs p
      where p.source_host_id = ${q.sourceHostId} and p.target_host_id = any(${asked}) and p.updated_at >= ${since}
    union all
    select p.*, 't' || p.target_host_id from move_pairs p
      where p.target_host_id = any(${asked}) and p.source_host_id <> ${q.sourceHostId} and p.updated_at >= ${since}
    union all
    select f.*, 'f' from (select * from move_pairs p
      where p.target_host_id <> all(${asked}) and p.updated_at >= ${since} and jsonb_array_length(p.commits_ms) > 0
      order by p.updated_at desc fetch first (${q.limit}::int) rows with ties) f),
  samples as (
    select c.source_host_id, c.target_host_id, c.updated_at, c.grp, e.i, (e.v #>> '{}')::float8 as commit_ms,
      coalesce((c.recorded_at_ms -> (e.i::int - 1)) #>> '{}', c.updated_at::text)::float8 as at_ms
    from chosen c, jsonb_array_elements(c.commits_ms) with ordinality e(v, i)
    where jsonb_typeof(e.v) = 'number'),
  ranked as (
    select s.*, row_number() over (partition by s.grp
        order by s.at_ms desc, s.source_host_id collate "C" desc, s.target_host_id collate "C" desc, s.i desc) as r
    from samples s where s.commit_ms >= 0 and s.at_ms >= ${q.recordedSince}::float8)
  select source_host_id as "sourceHostId", target_host_id as "targetHostId", updated_at::float8 as "updatedAt",
    jsonb_agg(commit_ms order by i) as "commitsMs", jsonb_agg(at_ms order by i) as "recordedAtMs"
  from ranked where r <= ${q.limit}
  group by source_host_id, target_host_id, updated_at
  order by source_host_id collate "C", target_host_id collate "C"`
}

/** The allowance commits operation of the store. */
export const make = ({ db }: Deps): Pick<StoreShape, "listAllowanceCommits"> => ({
  listAllowanceCommits: (query) =>
    Effect.gen(function* () {
      const bad = Validate.allowanceCommitsQuery(query)
      if (bad) return yield* bad
      const rows = yield* db.pool.query(allowanceCommitsSql(query))
      return rows.map(
        (r): PairCommits => ({
          sourceHostId: r["sourceHostId"] as string,
          targetHostId: r["targetHostId"] as string,
          commitsMs: json<number[]>(r["commitsMs"]),
          recordedAtMs: json<number[]>(r["recordedAtMs"]),
          updatedAt: Number(r["updatedAt"]),
        }),
      )
    }).pipe(dieOnUnique),
})
