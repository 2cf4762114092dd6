/**
 * Live moves (SPEC §5, the store's part): beginning one (core's host choice for the target,
 * then `Session.step`), its rounds (`Move.recordRound`), and its commit or abort
 * (`Session.step` under the move's and the session's row locks), each a plan the apply writes.
 * Reads of moves.
 */
import { randomUUID } from "node:crypto"
import { Downtime, Move, Placement, Plan, Session } from "@engram/core"
import { Conflict, Cursor, fromMoveRefusal, fromRefusal, fromTargetChoice, NotFound, Validate } from "@engram/store"
import type { IllegalTransition, InvalidInput, MoveFilter, PairFilter, Refused, StoreShape, Unavailable } from "@engram/store"
import { and, asc, eq, gte, or, sql } from "drizzle-orm"
import { Effect } from "effect"
import { apply } from "./Apply.js"
import { anyJson, dieOnUnique, RunAgain } from "./Db.js"
import type { DbError, Transient } from "./Db.js"
import type { Exec, Tx } from "./Db.js"
import type { Deps } from "./Deps.js"
import { readHostRows, toCandidate } from "./HostRows.js"
import { lockHostReported, lockHosts, lockMove, lockOpenMove, lockSession, pickAndLock } from "./Locks.js"
import * as Pages from "./Pages.js"
import { toMove, toSession } from "./Rows.js"
import { movePairs, moves } from "./schema.js"

type MoveOps = Pick<StoreShape, "beginMove" | "recordRound" | "commitMove" | "commitMoveByOperator" | "abortMove" | "markResendOwed" | "getMove" | "latestMove" | "getMoves" | "listMoves" | "pageMoves" | "openMove" | "listPairCommits">

const moveNotFound = (id: string) => new NotFound({ entity: "move", id })

/**
 * The SQL of a move filter: its state, its source or target, and its end. `endedSince` as a bound
 * on the bigint `ended_at`: a whole-ms time is at or after `x` exactly when it is at or after
 * `ceil(x)`; the state `<> 'pending'` beside it lets the planner use the ended moves' indexes.
 */
const filterOf = (filter: MoveFilter) =>
  and(
    filter.state === undefined ? undefined : eq(moves.state, filter.state),
    filter.hostId === undefined ? undefined : or(eq(moves.sourceHostId, filter.hostId), eq(moves.targetHostId, filter.hostId)),
    filter.endedSince === undefined ? undefined : and(sql`${moves.state} <> 'pending'`, gte(moves.endedAt, sinceMs(filter.endedSince))),
  )
/**
 * `listMoves`'s statement: oldest first, filtered. A host's pending moves come by the partial
 * indexes `moves_source_pending_idx` and `moves_target_pending_idx`, not its whole history; the
 * aborts since a time (the reaper's cooldown read) by `moves_aborted_idx`.
 */
export const listMovesQuery = (exec: Exec, filter: MoveFilter) =>
  exec
    .select()
    .from(moves)
    .where(filterOf(filter))
    .orderBy(asc(moves.createdAt), asc(moves.id))

/**
 * `recordedSince` as a bound on the bigint `updated_at`: PostgreSQL refuses a fractional or
 * out-of-range bigint parameter, and a whole-ms time is at or after `x` exactly when it is at or
 * after `ceil(x)`. Clamped to the safe integers (epoch ms are far inside them).
 */
const sinceMs = (x: number): number => Math.min(Number.MAX_SAFE_INTEGER, Math.max(Number.MIN_SAFE_INTEGER, Math.ceil(x)))

/** The SQL of a host pair filter. */
const pairFilterOf = (filter: PairFilter) =>
  and(
    filter.sourceHostId === undefined ? undefined : eq(movePairs.sourceHostId, filter.sourceHostId),
    filter.targetHostId === undefined ? undefined : eq(movePairs.targetHostId, filter.targetHostId),
    filter.recordedSince === undefined ? undefined : gte(movePairs.updatedAt, sinceMs(filter.recordedSince)),
  )

/**
 * What a commit keeps beside the plan the apply writes: the guard's figures on the move, and
 * its commit phase in its host pair's history (read under the pair's row lock; its time, the
 * window and the pair's `updatedAt` by core's `Downtime.recordTimedCommit`).
 */
const keepCommit = (tx: Tx, m: Move.Record, t: number) =>
  Effect.gen(function* () {
    if (m.phases === null) return
    const commitMs = m.phases.commitMs
    if (m.guard !== null) {
      const guard = m.guard
      yield* tx.use((exec) => exec.update(moves).set({ guard }).where(eq(moves.id, m.id)))
    }
    const pair = and(eq(movePairs.sourceHostId, m.sourceHostId), eq(movePairs.targetHostId, m.targetHostId))
    // An upsert that locks the pair's row: a prune of the pair (`pruneHistory`, which skips
    // locked rows) cannot delete it between this and the read. `where false` updates nothing
    // (no new row version a commit) but the conflicting row is locked all the same (PostgreSQL's
    // INSERT: "all rows will be locked when the ON CONFLICT DO UPDATE action is taken").
    yield* tx.use((exec) =>
      exec
        .insert(movePairs)
        .values({ sourceHostId: m.sourceHostId, targetHostId: m.targetHostId, commitsMs: [], recordedAtMs: [], updatedAt: t })
        .onConflictDoUpdate({ target: [movePairs.sourceHostId, movePairs.targetHostId], set: { updatedAt: sql`${movePairs.updatedAt}` }, setWhere: sql`false` }),
    )
    const [row] = yield* tx.use((exec) =>
      exec.select({ commitsMs: movePairs.commitsMs, recordedAtMs: movePairs.recordedAtMs, updatedAt: movePairs.updatedAt }).from(movePairs).where(pair).for("update"),
    )
    const before = { commitsMs: (row?.commitsMs ?? []) as number[], recordedAtMs: (row?.recordedAtMs ?? []) as number[], updatedAt: row?.updatedAt ?? t }
    // Core records it no earlier than the pair's last (this replica's clock may be behind) and
    // answers the pair's `updatedAt`, its last commit's time: what the allowance read cuts by.
    const kept = Downtime.recordTimedCommit(before, commitMs, t)
    yield* tx.use((exec) => exec.update(movePairs).set(kept).where(pair))
  })

const finished = (r: Move.Refusal) => new Conflict({ entity: "move", id: r.moveId, reason: r.reason })

/** The move operations of the store. */
export const make = ({ db, now, limits, cache }: Deps): MoveOps => {
  /** Applies a plan decided under the caller's locks: it cannot be stale, or the locks were not held. */
  const applyLocked = (tx: Tx, plan: Plan.Plan) =>
    Effect.flatMap(apply(tx, cache, [plan]), ([o]) => (o?._tag === "Applied" ? Effect.void : Effect.fail(new RunAgain({ why: "a row changed under its lock" }))))

  /**
   * A commit or an abort: the move and its session under their row locks, core's step, its
   * plan applied. `early` refuses the move under those locks before the step (core's rule; the
   * step judges a finished move again); it may lock and read what comes after the move in the
   * store's lock order (an operator's commit: the source host).
   */
  const finish = (
    moveId: string,
    early: (tx: Tx, m: Move.Record, t: number) => Effect.Effect<Move.Refusal | null, DbError | Transient>,
    stepOf: (m: Move.Record) => Session.Step,
    after?: (tx: Tx, m: Move.Record, t: number) => Effect.Effect<void, DbError | Transient>,
  ) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          // The one lock order of the store: the session first, then its move (as ending a
          // session does), so an end and a commit or abort of its move never wait on each other
          // in a circle. A move's session never changes: read it without a lock to know which.
          const [seen] = yield* tx.use((exec) => exec.select({ sessionId: moves.sessionId }).from(moves).where(eq(moves.id, moveId)))
          if (seen === undefined) return yield* moveNotFound(moveId)
          const s = yield* lockSession(tx, seen.sessionId)
          const row = yield* lockMove(tx, moveId)
          if (row === undefined) return yield* moveNotFound(moveId)
          const m = toMove(row)
          const refused = yield* early(tx, m, t)
          if (refused) return yield* finished(refused)
          const answer = s === undefined ? ({ _tag: "NotFound" } as const) : Session.step(toSession(s), stepOf(m), t)
          if (answer._tag !== "Plan") return yield* fromMoveRefusal(moveId, answer as Session.Refusal)
          yield* applyLocked(tx, answer)
          const m2 = Plan.moveOf(answer) as Move.Record
          if (after !== undefined) yield* after(tx, m2, t)
          return m2
        }),
      )
    }).pipe(dieOnUnique)

  /**
   * The target of a move: core's host choice, with the asked-for target (or the best ranked, among
   * the hosts that take moves when the request says so) locked, at its version.
   */
  const chooseTarget = (tx: Tx, req: Placement.Choice) =>
    Effect.gen(function* () {
      if (req.target === undefined) {
        const picked = yield* pickAndLock(tx, req, limits(), cache.candidates())
        return picked._tag === "Chosen" ? picked : Placement.choose(picked.hosts, req, limits())
      }
      // Core's rules first (the target must not be the source), then the target under its lock.
      const before = Placement.choose([], req, limits())
      if (before._tag !== "UnknownHost") return before
      if ((yield* lockHosts(tx, [req.target])).length === 0) return before
      const rows = yield* readHostRows(tx, { hostIds: [req.target], columns: "room" })
      const chosen = Placement.choose(rows.map((r) => toCandidate(r, limits())), req, limits())
      return chosen._tag === "Chosen" ? { ...chosen, version: (rows[0] as { readonly version: number }).version } : chosen
    })

  return {
    beginMove: (input) =>
      Effect.gen(function* () {
        const t = yield* now
        yield* cache.refresh(performance.now())
        return yield* db.transaction((tx) =>
          Effect.gen(function* () {
            const row = yield* lockSession(tx, input.sessionId)
            if (row === undefined) return yield* new NotFound({ entity: "session", id: input.sessionId })
            const s = toSession(row)
            const open = yield* lockOpenMove(tx, s.id)
            const openMove = open === undefined ? null : toMove(open)
            const refused = Session.refuseBeginMove(s, openMove)
            if (refused) return yield* (fromRefusal(s.id, refused) as Conflict | IllegalTransition)
            const badDowntime = Validate.maxDowntimeMs(input.maxDowntimeMs)
            if (badDowntime) return yield* badDowntime
            // Without a named target, only a host that takes moves (its agent advertises a peer URL) is picked.
            const choice = yield* chooseTarget(tx, {
              budget: s.budget,
              affinity: s.affinity,
              exclude: s.hostId ?? undefined,
              target: input.targetHostId,
              takesMovesOnly: true,
              now: t,
            })
            const refusedTarget = fromTargetChoice(choice)
            if (refusedTarget !== null || choice._tag !== "Chosen") return yield* (refusedTarget as InvalidInput | NotFound | Refused)
            const move = {
              id: randomUUID(),
              targetHostId: choice.hostId,
              targetVersion: (choice as { readonly version: number }).version,
              reservationId: randomUUID(),
              maxDowntimeMs: input.maxDowntimeMs,
            }
            const answer = Session.step(s, { _tag: "beginMove", openMove, move }, t)
            if (answer._tag !== "Plan") return yield* (fromRefusal(s.id, answer as Session.Refusal) as Conflict | IllegalTransition)
            yield* applyLocked(tx, answer)
            return Plan.moveOf(answer) as Move.Record
          }),
        )
      }).pipe(
        Effect.catchTag("UniqueViolation", () =>
          Effect.fail(new Conflict({ entity: "move", id: input.sessionId, reason: `session ${input.sessionId} already has an open move` })),
        ),
      ),

    recordRound: (moveId, round) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* db.transaction((tx) =>
          Effect.gen(function* () {
            const row = yield* lockMove(tx, moveId)
            if (row === undefined) return yield* moveNotFound(moveId)
            const m = toMove(row)
            // A finished move answers 409 before its input is judged; the rest is `Move.placeRound`'s (after the final round, a position).
            const refused = Move.refuseUnlessPending(m)
            if (refused) return yield* finished(refused)
            const bad = Validate.round(round)
            if (bad) return yield* bad
            const plan = Move.recordRound(m, round, t)
            if (plan._tag === "Conflict") return yield* finished(plan)
            yield* applyLocked(tx, plan)
            return Plan.moveOf(plan) as Move.Record
          }),
        )
      }).pipe(dieOnUnique),

    commitMove: (moveId, phases, guard, by) =>
      Effect.suspend((): Effect.Effect<Move.Record, NotFound | Conflict | InvalidInput | Unavailable> => {
        const bad = Validate.committedBy(by) ?? (phases === null ? null : (Validate.phases(phases) ?? (guard == null ? null : Validate.guard(guard))))
        if (bad) return Effect.fail(bad)
        return finish(moveId, (_, m) => Effect.succeed(Move.refuseCommit(m, phases !== null)), (move) => ({ _tag: "commitMove", move, phases, guard: guard ?? null, by }), keepCommit)
      }),

    // Judged under the session's and the move's row locks and, before the final round, the source
    // host's, taken next (the store's lock order: hosts after moves; the commit's apply then
    // writes that host's row, already held). A report of the source holds that lock while it
    // writes (and takes no session's nor move's): it either committed before our lock, and its
    // time is read, or waits for this commit. A check before this transaction would let a report
    // land between it and the commit.
    commitMoveByOperator: (moveId) =>
      finish(
        moveId,
        (tx, m, t) =>
          Effect.gen(function* () {
            const refused = Move.refuseCommit(m, false)
            if (refused !== null || Move.finalRoundRecorded(m)) return refused
            const source = yield* lockHostReported(tx, m.sourceHostId)
            return Move.refuseOperatorCommit(m, source ?? null, t, limits())
          }),
        (move) => ({ _tag: "commitMove", move, phases: null, guard: null, by: "operator" }),
      ),

    abortMove: (moveId, reason, options = {}) =>
      Effect.suspend((): Effect.Effect<Move.Record, NotFound | Conflict | InvalidInput | Unavailable> => {
        const bad = Validate.reason(reason) ?? Validate.estimateMs(options.estimateMs)
        if (bad) return Effect.fail(bad)
        const onlyBeforeFinalRound = options.onlyBeforeFinalRound === true
        // Decided under the move's row lock: a final round recorded concurrently either
        // committed before this lock (we see it and refuse) or waits for this transaction.
        return finish(
          moveId,
          (_, m) => Effect.succeed(Move.refuseAbort(m, onlyBeforeFinalRound)),
          (move) => ({ _tag: "abortMove", move, reason, estimateMs: options.estimateMs ?? null, onlyBeforeFinalRound, targetReclaimed: false }),
        )
      }),

    // Under the session's row lock, then the move's (the store's lock order): a reclaim, which
    // reads the mark with the session locked, sees it set or cleared, never half; the stale check
    // of a tell (`Move.resendTellStale`) reads the clears under the move's row lock, and a clear
    // counts in the same update, so a tell and a clear are judged one after the other.
    markResendOwed: (moveId, owed, seenClears) =>
      db
        .transaction((tx) =>
          Effect.gen(function* () {
            const bad = Validate.seenClears(seenClears)
            if (bad) return yield* bad
            const [seen] = yield* tx.use((exec) => exec.select({ sessionId: moves.sessionId }).from(moves).where(eq(moves.id, moveId)))
            if (seen === undefined) return yield* moveNotFound(moveId)
            yield* lockSession(tx, seen.sessionId)
            const row = yield* lockMove(tx, moveId)
            if (row === undefined) return yield* moveNotFound(moveId)
            const m = toMove(row)
            const refused = Move.refuseResendMark(m, owed)
            if (refused) return yield* finished(refused)
            const next = Move.resendMarkStep(m, owed, seenClears)
            if (next === null) return m
            if (next.resendOwed !== row.resendOwed || next.resendClears !== row.resendClears) yield* tx.use((exec) => exec.update(moves).set(next).where(eq(moves.id, moveId)))
            return { ...m, ...next }
          }),
        )
        .pipe(dieOnUnique),

    listPairCommits: (filter = {}) =>
      Effect.gen(function* () {
        const bad = Validate.pairFilter(filter)
        if (bad) return yield* bad
        const rows = yield* db.pool.use((exec) =>
          exec.select().from(movePairs).where(pairFilterOf(filter)).orderBy(asc(movePairs.sourceHostId), asc(movePairs.targetHostId)),
        )
        return rows.map((r) => ({
          sourceHostId: r.sourceHostId,
          targetHostId: r.targetHostId,
          commitsMs: r.commitsMs as number[],
          recordedAtMs: r.recordedAtMs as number[],
          updatedAt: r.updatedAt,
        }))
      }).pipe(dieOnUnique),

    getMove: (id) =>
      Effect.flatMap(
        db.pool.use((exec) => exec.select().from(moves).where(eq(moves.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(moveNotFound(id)) : Effect.succeed(toMove(rows[0]))),
      ).pipe(dieOnUnique),

    // The move the session's newest `MoveBegun` event names (core's `Session.latestMoveIdOf`): one
    // statement, the session's events read newest first by their primary key until that event,
    // then the move by its own; a pruned move is null.
    latestMove: (sessionId) =>
      Effect.map(
        db.pool.use((exec) =>
          exec
            .select()
            .from(moves)
            .where(
              and(
                eq(moves.sessionId, sessionId),
                eq(
                  moves.id,
                  sql`(select e.event->>'moveId' from session_events e where e.session_id = ${sessionId} and e.event->>'_tag' = 'MoveBegun' order by e.seq desc limit 1)`,
                ),
              ),
            ),
        ),
        (rows) => (rows[0] === undefined ? null : toMove(rows[0])),
      ).pipe(dieOnUnique),

    // One statement whatever the number of ids, as `getSessions`.
    getMoves: (ids) => {
      const unique = [...new Set(ids)]
      if (unique.length === 0) return Effect.succeed([])
      return Effect.map(
        db.pool.use((exec) => exec.select().from(moves).where(anyJson(moves.id, unique))),
        (rows) => rows.map(toMove),
      ).pipe(dieOnUnique)
    },

    pageMoves: (filter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.moveFilter(filter)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("moves", page)
        const rows = yield* db.pool.use((exec) =>
          exec
            .select()
            .from(moves)
            .where(
              and(
                filterOf(filter),
                after === undefined ? undefined : sql`(${moves.createdAt}, ${moves.id}) > (${after[0]}, ${after[1]})`,
              ),
            )
            .orderBy(asc(moves.createdAt), asc(moves.id))
            .limit(limit + 1),
        )
        return Cursor.pageOf("moves", rows.map(toMove), (m) => [m.createdAt, m.id], limit)
      }).pipe(dieOnUnique),

    listMoves: (filter = {}) =>
      Effect.gen(function* () {
        const bad = Validate.moveFilter(filter)
        if (bad) return yield* bad
        const rows = yield* db.pool.use((exec) => listMovesQuery(exec, filter))
        return rows.map(toMove)
      }).pipe(dieOnUnique),

    openMove: (sessionId) =>
      Effect.map(
        db.pool.use((exec) => exec.select().from(moves).where(and(eq(moves.sessionId, sessionId), eq(moves.state, "pending")))),
        (rows) => (rows[0] === undefined ? null : toMove(rows[0])),
      ).pipe(dieOnUnique),
  }
}
