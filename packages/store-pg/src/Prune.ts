/**
 * Retention (`pruneHistory`): the history that ended before a cutoff, deleted in bounded chunks.
 * One transaction of three statements, each one kind, each at most `limit` rows found by an
 * index on the end time (migration 0013), never by reading the live rows:
 * - moves committed or aborted before the cutoff (`moves_ended_idx`), first, so a session whose
 *   moves go in this call may go too;
 * - sessions `ended` before the cutoff and before the oldest ended move still kept, with no move
 *   left (`sessions_ended_idx`; the moves by `moves_ended_idx` and `moves_session_idx`), with
 *   their events (by the primary key of `session_events`);
 * - host pairs whose last commit was recorded before it (`move_pairs_updated_at_idx`).
 * Rows another transaction holds are skipped (`skip locked`), not waited on: the next call takes
 * them. Under a lease the statements run behind the leader's fence (`Fence.ts`).
 */
import { CurrentFence, Validate } from "@engram/store"
import type { PruneResult, StoreShape } from "@engram/store"
import { sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect } from "effect"
import { dieOnUnique } from "./Db.js"
import type { Deps } from "./Deps.js"
import * as FenceSql from "./Fence.js"

// Each statement locks its chunk in a subquery and deletes it by `= any(array(…))`, which the
// planner probes the primary key with (a join with the chunk would hash the whole table; the
// `::text[]` makes `any` take the chunk as one array, not as a subquery to join).

/** The ended moves' statement: at most `limit` committed or aborted before `cut`, oldest first. */
export const pruneMovesSql = (cut: number, limit: number): SQL => sql`with gone as (
    delete from moves where id = any(array(
      select id from moves where state <> 'pending' and ended_at < ${cut}
      order by ended_at limit ${limit} for update skip locked))
    returning 1)
  select count(*)::int as moves from gone`

/**
 * The ended sessions' statement: at most `limit` ended before `cut` with no move left, oldest
 * first, and their events. An ended session never changes again: its `updated_at` is its end.
 * A session's moves end no later than it does (ending a session aborts its pending move), so
 * only the sessions that ended before the oldest ended move still kept can have none left: the
 * walk stops there (one probe of `moves_ended_idx`), not at the cutoff. Without that bound, when
 * the moves' chunks run behind (sessions moved twice or more), every call walked every ended
 * session whose moves were still kept and probed `moves` for each. The `not exists` stays: a
 * session ended on a replica whose clock is behind the one that ended its move may end before it.
 * `least` ignores a null: with no ended move kept the bound is the cutoff. The `offset 0` keeps
 * the `not exists` a probe of `moves_session_idx` per session walked: the planner cannot estimate
 * the bound (it is known only when the statement runs), and without it it hashed all of `moves`.
 */
export const pruneSessionsSql = (cut: number, limit: number): SQL => sql`with doomed as (
    select array(
      select s.id from sessions s
      where s.state = 'ended'
        and s.updated_at < least(${cut}, (select min(m.ended_at) from moves m where m.state <> 'pending'))
        and not exists (select 1 from moves m where m.session_id = s.id offset 0)
      order by s.updated_at limit ${limit} for update of s skip locked) as ids),
  events as (delete from session_events where session_id = any((select ids from doomed)::text[]) returning 1),
  gone as (delete from sessions where id = any((select ids from doomed)::text[]) returning 1)
  select (select count(*) from gone)::int as sessions, (select count(*) from events)::int as events`

/**
 * The host pairs' statement: at most `limit` whose last commit was recorded before `cut`, oldest
 * first (by their row address: a locked row stays where it is until this transaction ends). A
 * commit locks its pair's row before it reads it (`Moves.ts`), so a pair being written is
 * skipped, never deleted under the commit.
 */
export const prunePairsSql = (cut: number, limit: number): SQL => sql`with gone as (
    delete from move_pairs where ctid = any(array(
      select ctid from move_pairs where updated_at < ${cut}
      order by updated_at limit ${limit} for update skip locked))
    returning 1)
  select count(*)::int as pairs from gone`

const count = (rows: readonly Record<string, unknown>[] | undefined, key: string): number => Number(rows?.[0]?.[key] ?? 0)

/** The retention operation of the store. */
export const make = ({ db, now }: Deps): Pick<StoreShape, "pruneHistory"> => ({
  pruneHistory: (request) =>
    Effect.gen(function* () {
      const bad = Validate.pruneRequest(request, yield* now)
      if (bad) return yield* bad
      const { endedBefore: cut, limit } = request
      const fence = yield* Effect.service(CurrentFence)
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          // The fence (when leading) with the first statement; the others run after it in the same transaction.
          const moves = count(yield* FenceSql.run(tx, fence, [pruneMovesSql(cut, limit)]), "moves")
          const sessions = yield* tx.query(pruneSessionsSql(cut, limit))
          const pairs = count(yield* tx.query(prunePairsSql(cut, limit)), "pairs")
          return { sessions: count(sessions, "sessions"), events: count(sessions, "events"), moves, pairs } satisfies PruneResult
        }),
      )
    }).pipe(dieOnUnique),
})
