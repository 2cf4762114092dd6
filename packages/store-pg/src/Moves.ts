/**
 * Live moves (SPEC §5, the store's part): beginning one (core's host choice for the target,
 * then `Session.step`), its rounds, and its commit or abort (`Session.step` under the move's
 * and the session's row locks). Reads of moves.
 */
import { randomUUID } from "node:crypto"
import { Move as MoveRules, Placement, Session as SessionRules } from "@engram/core"
import { Conflict, Cursor, fromMoveRefusal, fromRefusal, fromTargetChoice, NotFound, Validate } from "@engram/store"
import type { IllegalTransition, InvalidInput, Move, MoveFilter, MoveRound, Refused, StepRefusal, StoreShape, Unavailable } from "@engram/store"
import { and, asc, eq, or, sql } from "drizzle-orm"
import { Effect } from "effect"
import type { Deps } from "./Deps.js"
import type { Exec } from "./Db.js"
import { lockHosts, lockMove, lockOpenMove, lockSession, pickAndLock } from "./Locks.js"
import * as Pages from "./Pages.js"
import { readRoom, toCandidate } from "./Room.js"
import { toMove, toSession } from "./Rows.js"
import type { MoveRow } from "./Rows.js"
import { moves } from "./schema.js"
import { err, ok } from "./Transaction.js"
import type { Out } from "./Transaction.js"
import { applyStep } from "./Writes.js"

type MoveOps = Pick<StoreShape, "beginMove" | "recordRound" | "commitMove" | "abortMove" | "getMove" | "listMoves" | "pageMoves" | "openMove">

const moveNotFound = (id: string) => new NotFound({ entity: "move", id })

/** The SQL of a move filter: its state, and its source or target. */
const filterOf = (filter: MoveFilter) =>
  and(
    filter.state === undefined ? undefined : eq(moves.state, filter.state),
    filter.hostId === undefined ? undefined : or(eq(moves.sourceHostId, filter.hostId), eq(moves.targetHostId, filter.hostId)),
  )
const finished = (r: MoveRules.Refusal) => new Conflict({ entity: "move", id: r.moveId, reason: r.reason })

/** The move operations of the store. */
export const make = ({ op, read, now, limits }: Deps): MoveOps => {
  /**
   * A commit or an abort: the move and its session under their row locks, core's step, its
   * writes. `early` refuses a finished move before the session is locked (core's rule; the
   * step judges it again).
   */
  const finish = (moveId: string, early: (m: Move) => MoveRules.Refusal | null, stepOf: (m: Move) => SessionRules.Step) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<Move, NotFound | Conflict>(async (tx): Promise<Out<Move, NotFound | Conflict>> => {
        // The one lock order of the store: the session first, then its move (as ending a
        // session does), so an end and a commit or abort of its move never wait on each other
        // in a circle. A move's session never changes: read it without a lock to know which.
        const [seen] = await tx.select({ sessionId: moves.sessionId }).from(moves).where(eq(moves.id, moveId))
        if (seen === undefined) return err(moveNotFound(moveId))
        const s = await lockSession(tx, seen.sessionId)
        const row = await lockMove(tx, moveId)
        if (row === undefined) return err(moveNotFound(moveId))
        const m = toMove(row)
        const refused = early(m)
        if (refused) return err(finished(refused))
        const answer = s === undefined ? ({ _tag: "NotFound" } as const) : SessionRules.step(toSession(s), stepOf(m), t)
        if (answer._tag !== "Applied") return err(fromMoveRefusal(moveId, answer as StepRefusal))
        return ok((await applyStep(tx, answer)).move as Move)
      })
    })

  /** The target of a move: core's host choice, with the asked-for target (or the best ranked) locked. */
  const chooseTarget = async (tx: Exec, req: Placement.Choice): Promise<Placement.Chosen> => {
    if (req.target === undefined) {
      const picked = await pickAndLock(tx, req, limits())
      return picked._tag === "Chosen" ? picked : Placement.choose(picked.hosts, req, limits())
    }
    // Core's rules first (the target must not be the source), then the target under its lock.
    const before = Placement.choose([], req, limits())
    if (before._tag !== "UnknownHost") return before
    if ((await lockHosts(tx, [req.target])).length === 0) return before
    return Placement.choose((await readRoom(tx, { hostIds: [req.target] })).map((r) => toCandidate(r, limits())), req, limits())
  }

  return {
    beginMove: (input) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<Move, NotFound | Conflict | IllegalTransition | Refused | InvalidInput>(
          async (tx) => {
            const row = await lockSession(tx, input.sessionId)
            if (row === undefined) return err(new NotFound({ entity: "session", id: input.sessionId }))
            const s = toSession(row)
            const open = await lockOpenMove(tx, s.id)
            const openMove = open === undefined ? null : toMove(open)
            const refused = SessionRules.refuseBeginMove(s, openMove)
            if (refused) return err(fromRefusal(s.id, refused) as Conflict | IllegalTransition)
            const badDowntime = Validate.maxDowntimeMs(input.maxDowntimeMs)
            if (badDowntime) return err(badDowntime)
            const choice = await chooseTarget(tx, {
              budget: s.budget,
              affinity: s.affinity,
              exclude: s.hostId ?? undefined,
              target: input.targetHostId,
            })
            const refusedTarget = fromTargetChoice(choice)
            if (refusedTarget !== null || choice._tag !== "Chosen") return err(refusedTarget as InvalidInput | NotFound | Refused)
            const move = { id: randomUUID(), targetHostId: choice.hostId, reservationId: randomUUID(), maxDowntimeMs: input.maxDowntimeMs }
            const answer = SessionRules.step(s, { _tag: "beginMove", openMove, move }, t)
            if (answer._tag !== "Applied") return err(fromRefusal(s.id, answer as StepRefusal) as Conflict | IllegalTransition)
            return ok((await applyStep(tx, answer)).move as Move)
          },
          () => new Conflict({ entity: "move", id: input.sessionId, reason: `session ${input.sessionId} already has an open move` }),
        )
      }),

    recordRound: (moveId, round) =>
      op<Move, NotFound | Conflict | InvalidInput>(async (tx) => {
        const row = await lockMove(tx, moveId)
        if (row === undefined) return err(moveNotFound(moveId))
        const refused = MoveRules.refuseRound(toMove(row))
        if (refused) return err(finished(refused))
        const bad = Validate.round(round)
        if (bad) return err(bad)
        const entry: MoveRound = {
          kind: round.kind,
          wireBytes: round.wireBytes,
          apparentBytes: round.apparentBytes,
          sendMs: round.sendMs,
          captureMs: round.captureMs,
        }
        const [updated] = await tx
          .update(moves)
          .set({ rounds: sql`${moves.rounds} || jsonb_build_array(${JSON.stringify(entry)}::jsonb)` })
          .where(eq(moves.id, moveId))
          .returning()
        return ok(toMove(updated as MoveRow))
      }),

    commitMove: (moveId, phases) =>
      Effect.suspend((): Effect.Effect<Move, NotFound | Conflict | InvalidInput | Unavailable> => {
        const bad = Validate.phases(phases)
        if (bad) return Effect.fail(bad)
        return finish(moveId, MoveRules.refuseCommit, (move) => ({ _tag: "commitMove", move, phases }))
      }),

    abortMove: (moveId, reason, options = {}) =>
      Effect.suspend((): Effect.Effect<Move, NotFound | Conflict | InvalidInput | Unavailable> => {
        const bad = Validate.text("reason", reason) ?? Validate.estimateMs(options.estimateMs)
        if (bad) return Effect.fail(bad)
        const onlyBeforeFinalRound = options.onlyBeforeFinalRound === true
        // Decided under the move's row lock: a final round recorded concurrently either
        // committed before this lock (we see it and refuse) or waits for this transaction.
        return finish(
          moveId,
          (m) => MoveRules.refuseAbort(m, onlyBeforeFinalRound),
          (move) => ({ _tag: "abortMove", move, reason, estimateMs: options.estimateMs ?? null, onlyBeforeFinalRound, targetReclaimed: false }),
        )
      }),

    getMove: (id) =>
      Effect.flatMap(
        read((exec) => exec.select().from(moves).where(eq(moves.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(moveNotFound(id)) : Effect.succeed(toMove(rows[0]))),
      ),

    pageMoves: (filter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("moves", page)
        const rows = yield* read((exec) =>
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
      }),

    listMoves: (filter = {}) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(moves)
            .where(filterOf(filter))
            .orderBy(asc(moves.createdAt), asc(moves.id)),
        ),
        (rows) => rows.map(toMove),
      ),

    openMove: (sessionId) =>
      Effect.map(
        read((exec) => exec.select().from(moves).where(and(eq(moves.sessionId, sessionId), eq(moves.state, "pending")))),
        (rows) => (rows[0] === undefined ? null : toMove(rows[0])),
      ),
  }
}
