// The bounded read of a source's allowances (`listAllowanceCommits`) on a fleet of thousands of
// host pairs, each with a full window of recent commits: it reads the asked pair, the pairs into
// its target and a window's worth of the fleet's latest pairs, never every recent pair (what the
// allowance read before, `listPairCommits({ recordedSince })`), and answers what core's
// `Downtime.allowanceCommits` answers over every pair.
import { Downtime } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { allowanceCommitsSql } from "../src/AllowanceCommits.js"
import { migrate, StorePg } from "../src/index.js"
import { explainAnalyze, nodes, rowsRead } from "./plans.js"
import type { PlanNode } from "./plans.js"

describe("the allowance commits statement", () => {
  it("reads a bounded number of pairs, however many pairs have recent commits", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      // 1,000 hosts, each with commits to its next 5 (5,000 pairs), 20 commits each, one ms apart.
      const hosts = 1000
      await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, recorded_at_ms, updated_at)
        select 'h' || h, 'h' || ((h + k - 1) % ${hosts} + 1),
          (select jsonb_agg(100 + (h * 7 + k * 13 + i * 31) % 400 order by i) from generate_series(1, 20) i),
          (select jsonb_agg(1000000 + (h * 5 + k) * 20 + i order by i) from generate_series(1, 20) i),
          1000000 + (h * 5 + k) * 20 + 20
        from generate_series(1, ${hosts}) h, generate_series(1, 5) k`
      await sql`analyze`
      const limit = Downtime.poolLimit()
      const query = { sourceHostId: "h500", targetHostIds: ["h501", "h503"], recordedSince: 0, limit }
      const plan = await explainAnalyze(sql, allowanceCommitsSql(query))
      // 5,000 pairs (100,000 commits) stored: the two asked pairs, the 8 others into their
      // targets and about 20 of the fleet's latest pairs are read.
      expect(rowsRead(plan, "move_pairs")).toBeLessThan(200)
      // The others into the asked targets come by `move_pairs_target_idx`, not by the primary key
      // (source, target) searched on its second column: what the planner picks without that index,
      // fetching as few rows (so the count above cannot tell) but searching every pair's entry.
      const intoTargets = nodes(plan).filter((n) => n["Relation Name"] === "move_pairs" && [n.Filter, n["Index Cond"]].some((c) => c?.includes("source_host_id <>")))
      expect(intoTargets.map((n) => n["Node Type"])).toHaveLength(1)
      expect(nodes(intoTargets[0] as PlanNode).flatMap((n) => n["Index Name"] ?? [])).toStrictEqual(["move_pairs_target_idx"])
      const answer = await Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(StorePg.openUrl({ url: db.url }), ({ store }) => Effect.all([store.listAllowanceCommits(query), store.listPairCommits({ recordedSince: 0 })])),
        ),
      )
      const [bounded, every] = answer
      expect(every.length).toBe(5000)
      expect(bounded).toStrictEqual(Downtime.allowanceCommits(every, query))
      expect(bounded.reduce((n, p) => n + p.commitsMs.length, 0)).toBeLessThanOrEqual(limit * 5)
      for (const t of query.targetHostIds) {
        const nowMs = 1_000_000 + 5020 * 20
        expect(Downtime.pairAllowance(bounded, "h500", t, nowMs)).toStrictEqual(Downtime.pairAllowance(every, "h500", t, nowMs))
      }
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)

  it("answers core's `allowanceCommits` when many commits and pairs share a time", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      // 30 hosts, each with commits to its next 3; each pair's commits at a few whole seconds,
      // so times tie within a pair, across pairs, and at every group's cut.
      const hosts = 30
      await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, recorded_at_ms, updated_at)
        select 'h' || h, 'h' || ((h + k - 1) % ${hosts} + 1),
          (select jsonb_agg((h * 7 + k * 13 + i * 31) % 90 order by i) from generate_series(1, 6) i),
          (select jsonb_agg(1000 * ((h + k + i) / 4) order by i) from generate_series(1, 6) i),
          1000 * ((h + k + 6) / 4)
        from generate_series(1, ${hosts}) h, generate_series(1, 3) k`
      const queries = [1, 2, 5, 17].flatMap((s) =>
        [[], [`h${(s % hosts) + 1}`], [`h${(s % hosts) + 1}`, `h${((s + 2) % hosts) + 1}`, "nowhere"]].flatMap((targetHostIds) =>
          [1, 2, 3, 7].flatMap((limit) => [0, 5000, 8000].map((recordedSince) => ({ sourceHostId: `h${s}`, targetHostIds, recordedSince, limit }))),
        ),
      )
      const [answers, every] = await Effect.runPromise(
        Effect.scoped(
          Effect.flatMap(StorePg.openUrl({ url: db.url }), ({ store }) => Effect.all([Effect.forEach(queries, (q) => store.listAllowanceCommits(q)), store.listPairCommits()])),
        ),
      )
      queries.forEach((q, i) => expect(answers[i], JSON.stringify(q)).toStrictEqual(Downtime.allowanceCommits(every, q)))
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)
})
