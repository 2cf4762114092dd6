// The retention statements' plans on a database holding a large history beside a live fleet: a
// prune reads its chunk of ended rows by the end-time indexes of migration 0013, never the whole
// sessions, moves or pairs tables, and never the live rows; the reaper's read of the recent
// aborts reads the cooldown window's, not every abort kept; when sessions moved twice or more and
// the moves' chunks run behind, the sessions' walk stays bounded. And a row another transaction
// holds (a commit writing its pair, a writer of a session) is skipped, not waited on nor deleted
// under it; a commit paused between its pair's upsert and its read keeps its pair and its commit.
import { Limits } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { PgDialect } from "drizzle-orm/pg-core"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { Exec } from "../src/Db.js"
import { migrate } from "../src/index.js"
import { listMovesQuery } from "../src/Moves.js"
import { drizzleOn } from "../src/PostgresJs.js"
import { pruneMovesSql, prunePairsSql, pruneSessionsSql } from "../src/Prune.js"
import { openUrl } from "./open.js"
import { explainAnalyze, fillHosts, fillSessions, rowsRead, seqRowsRead } from "./plans.js"

describe("the retention statements", () => {
  it("delete a chunk of ended history by index, reading neither the live rows nor the rest of the backlog", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const hosts = 200
      const perHost = 50
      const history = 20_000
      const limit = 500
      const cut = history / 2
      // 10,000 live sessions (each host's first moving), 20,000 ended ones (ended at 1…20,000)
      // with 3 events each, 20,000 ended moves of the live sessions (ended at 1…20,000, a third
      // aborted) and each host's pending move, 20,000 host pairs (last commit at 1…20,000).
      await fillHosts(sql, hosts, perHost)
      await fillSessions(sql, hosts, perHost)
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, created_at, updated_at)
        select 'e' || n, 'ended', 1, 1, '{}', 0, n from generate_series(1, ${history}) n`
      await sql`insert into session_events (session_id, seq, at, event)
        select 'e' || n, k, n, '{"_tag":"Created"}'::jsonb from generate_series(1, ${history}) n, generate_series(1, 3) k`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        select 'old-' || n, 's' || (n % ${hosts} + 1) || '-2', 'h' || (n % ${hosts} + 1), 'h' || ((n + 1) % ${hosts} + 1), 'x', 600,
          case when n % 3 = 0 then 'aborted' else 'committed' end, n, n
        from generate_series(1, ${history}) n`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
        select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${hosts} + 1), 'x', 600, 'pending', ${history} + h from generate_series(1, ${hosts}) h`
      await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, recorded_at_ms, updated_at)
        select 'a' || n, 'b' || n, '[300]'::jsonb, jsonb_build_array(n), n from generate_series(1, ${history}) n`
      await sql`analyze`

      // The moves first (as the store runs them): its chunk, the oldest, by `moves_ended_idx`.
      const moves = await explainAnalyze(sql, pruneMovesSql(cut, limit))
      expect(seqRowsRead(moves, "moves")).toBe(0)
      expect(rowsRead(moves, "moves")).toBeLessThan(3 * limit)
      const sessions = await explainAnalyze(sql, pruneSessionsSql(cut, limit))
      expect(seqRowsRead(sessions, "sessions")).toBe(0)
      expect(seqRowsRead(sessions, "moves")).toBe(0)
      expect(seqRowsRead(sessions, "session_events")).toBe(0)
      // Its chunk of ended sessions and their events; not the 10,000 live sessions nor the rest of the 20,000 ended.
      expect(rowsRead(sessions, "sessions")).toBeLessThan(3 * limit)
      expect(rowsRead(sessions, "session_events")).toBeLessThan(3 * 3 * limit)
      const pairs = await explainAnalyze(sql, prunePairsSql(cut, limit))
      expect(seqRowsRead(pairs, "move_pairs")).toBe(0)
      expect(rowsRead(pairs, "move_pairs")).toBeLessThan(3 * limit)

      // What they deleted: the oldest of each kind, nothing live.
      const [left] = await sql`select
        (select count(*)::int from sessions where state = 'ended') as ended,
        (select min(updated_at)::int from sessions where state = 'ended') as "oldestEnded",
        (select count(*)::int from sessions where state <> 'ended') as live,
        (select count(*)::int from session_events) as events,
        (select count(*)::int from moves where state <> 'pending') as "endedMoves",
        (select min(ended_at)::int from moves where state <> 'pending') as "oldestMove",
        (select count(*)::int from moves where state = 'pending') as pending,
        (select count(*)::int from move_pairs) as pairs`
      expect(left).toStrictEqual({
        ended: history - limit,
        oldestEnded: limit + 1,
        live: hosts * perHost,
        events: 3 * (history - limit),
        endedMoves: history - limit,
        oldestMove: limit + 1,
        pending: hosts,
        pairs: history - limit,
      })

      // A new leader's read of the aborts within a cooldown: the window's, by `moves_aborted_idx`.
      const recent = listMovesQuery(drizzleOn(sql) as unknown as Exec, { state: "aborted", endedSince: history - 300 }).getSQL()
      const read = await explainAnalyze(sql, recent)
      expect(seqRowsRead(read, "moves")).toBe(0)
      expect(rowsRead(read, "moves")).toBeLessThan(300)
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 600_000)

  it("read a bounded chunk of sessions when the moves run behind (ended sessions moved twice or more), pass after pass", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      const history = 20_000
      const limit = 500
      // 20,000 ended sessions (ended at 10, 20, … 200,000), each moved twice before its end (its
      // moves ended at 10n - 2 and 10n - 1): twice as many ended moves as sessions, all before the
      // cutoff, so a chunk of 500 moves frees only 250 sessions and the moves never catch up.
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, created_at, updated_at)
        select 'e' || n, 'ended', 1, 1, '{}', 0, 10 * n from generate_series(1, ${history}) n`
      await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        select 'm' || n || '-' || k, 'e' || n, 'h1', 'h2', 'x', 600, 'committed', 10 * n - 3 + k, 10 * n - 3 + k
        from generate_series(1, ${history}) n, generate_series(1, 2) k`
      await sql`analyze`
      const cut = 10 * history + 1
      for (let pass = 1; pass <= 3; pass++) {
        const moves = await explainAnalyze(sql, pruneMovesSql(cut, limit))
        // Its chunk by `moves_ended_idx`, then deleted by the primary key (here a bitmap scan: the index entries and the rows).
        expect(seqRowsRead(moves, "moves"), `pass ${pass}: the moves' statement scanned moves`).toBe(0)
        expect(rowsRead(moves, "moves"), `pass ${pass}: the moves' statement read moves`).toBeLessThan(4 * limit)
        const sessions = await explainAnalyze(sql, pruneSessionsSql(cut, limit))
        // The sessions whose moves went, not the 19,000-odd behind them that still have moves (nor a probe of each).
        expect(seqRowsRead(sessions, "sessions"), `pass ${pass}: the sessions' statement scanned sessions`).toBe(0)
        expect(seqRowsRead(sessions, "moves"), `pass ${pass}: the sessions' statement scanned moves`).toBe(0)
        expect(rowsRead(sessions, "sessions"), `pass ${pass}: the sessions' statement read sessions`).toBeLessThan(3 * limit)
        expect(rowsRead(sessions, "moves"), `pass ${pass}: the sessions' statement read moves`).toBeLessThan(3 * limit)
      }
      // Three passes: 1,500 moves went, and the 750 sessions whose moves all went, the oldest.
      const [left] = await sql`select (select count(*)::int from sessions) as sessions, (select min(updated_at)::int from sessions) as "oldestSession",
        (select count(*)::int from moves) as moves`
      expect(left).toStrictEqual({ sessions: history - 750, oldestSession: 10 * 751, moves: 2 * history - 1500 })
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 600_000)

  it("skip the rows another transaction holds (a commit writing its pair, a session's writer): the next call takes them", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    const other = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await migrate(db.url)
      await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, created_at, updated_at) values ('e1', 'ended', 1, 1, '{}', 0, 1), ('e2', 'ended', 1, 1, '{}', 0, 2)`
      await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, recorded_at_ms, updated_at) values ('a', 'b', '[300]', '[1]', 1), ('a', 'c', '[300]', '[2]', 2)`
      const run = async (statement: ReturnType<typeof prunePairsSql>) => {
        const q = new PgDialect().sqlToQuery(statement)
        return (await sql.unsafe(q.sql, q.params as never[]))[0]
      }
      let release!: () => void
      const released = new Promise<void>((r) => (release = r))
      let locked!: () => void
      const held = new Promise<void>((r) => (locked = r))
      // Another transaction holds the pair a→b (as a commit's upsert does) and the session e1.
      const holder = other.begin(async (tx) => {
        await tx`select 1 from move_pairs where source_host_id = 'a' and target_host_id = 'b' for update`
        await tx`select 1 from sessions where id = 'e1' for update`
        locked()
        await released
      })
      await held
      expect(await run(prunePairsSql(10, 10))).toStrictEqual({ pairs: 1 })
      expect(await run(pruneSessionsSql(10, 10))).toStrictEqual({ sessions: 1, events: 0 })
      expect((await sql`select source_host_id || target_host_id as pair from move_pairs`).map((r) => r["pair"])).toStrictEqual(["ab"])
      expect((await sql`select id from sessions`).map((r) => r["id"])).toStrictEqual(["e1"])
      release()
      await holder
      expect(await run(prunePairsSql(10, 10))).toStrictEqual({ pairs: 1 })
      expect(await run(pruneSessionsSql(10, 10))).toStrictEqual({ sessions: 1, events: 0 })
    } finally {
      await other.end()
      await sql.end()
      await db.drop()
    }
  }, 600_000)

  it("never delete a pair under a commit: a prune between the commit's upsert and its read skips the pair, and the commit is kept", async () => {
    const db = await freshDatabase()
    const other = postgres(db.url, { max: 1, onnotice: () => undefined })
    const { pair, close } = await openUrl(db.url, { limits: { ...Limits.defaults, heartbeatStaleWindowMs: 60_000 } })
    const s = pair.store
    const run = <A, E>(effect: Effect.Effect<A, E>) => Effect.runPromise(effect)
    const final = { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 } as const
    const phases = { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 380 }
    try {
      for (const id of ["a", "b"]) {
        await run(s.registerHost({ id }))
        await run(s.reportHost(id, { totalMib: 1 << 20, allocatableMib: 1 << 19, totalVcpus: 64 }))
      }
      await run(s.createSession({ id: "s1", budget: { memMib: 256, vcpus: 1 }, affinity: ["a"] }))
      await run(s.markRunning("s1"))
      // A first move a → b makes the pair's row; a move back; then a second move a → b to commit under the prune.
      const moveTo = async (target: string) => {
        const m = await run(s.beginMove({ sessionId: "s1", targetHostId: target, maxDowntimeMs: 600 }))
        await run(s.recordRound(m.id, final))
        return m.id
      }
      await run(s.commitMove(await moveTo("b"), phases))
      await run(s.commitMove(await moveTo("a"), phases))
      const second = await moveTo("b")
      // Pause every statement that writes a pair (after it, before the commit reads the pair) on
      // an advisory lock this test holds.
      await other`create function pause_pair_write() returns trigger language plpgsql as $$ begin perform pg_advisory_xact_lock(4242); return null; end $$`
      await other`create trigger pause_pair_write after insert on move_pairs for each statement execute function pause_pair_write()`
      await other`select pg_advisory_lock(4242)`
      const commit = run(s.commitMove(second, phases))
      for (let i = 0; ; i++) {
        const [w] = await other`select count(*)::int as n from pg_locks where locktype = 'advisory' and objid = 4242 and not granted`
        if (w?.["n"] === 1) break
        if (i > 2_000) throw new Error("the commit never reached its pair")
        await new Promise((r) => setTimeout(r, 10))
      }
      // A prune of every pair now: b → a goes; a → b, which the commit holds, is skipped.
      const q = new PgDialect().sqlToQuery(prunePairsSql(Number.MAX_SAFE_INTEGER, 10))
      const pruned = (await other.unsafe(q.sql, q.params as never[]))[0]
      await other`select pg_advisory_unlock(4242)`
      await commit
      // The pair a → b with both its commits (deleted under the commit, it would be gone with this one).
      const kept = await run(s.listPairCommits({ sourceHostId: "a", targetHostId: "b" }))
      expect(kept.map((p) => p.commitsMs)).toStrictEqual([[phases.commitMs, phases.commitMs]])
      expect(pruned).toStrictEqual({ pairs: 1 })
      expect(await run(s.listPairCommits({ sourceHostId: "b", targetHostId: "a" }))).toStrictEqual([])
    } finally {
      await close()
      await other.end()
      await db.drop()
    }
  }, 600_000)
})
