/**
 * Cascades (SPEC §2, §3, §5): what follows when a move's session ends or is lost, when a
 * move's target reservation is reclaimed, or when both of a moving session's reservations
 * go stale; and that a move in doubt (its final round recorded) is held through every stale
 * window until it is resolved (SPEC §13). Every store decides these through core's `Session.step` and `Reclaim.decide`; these
 * cases pin the answer, the records, the room and the metrics.
 */
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, finalRound, expectInvariants, expectUnchanged, kase, peerUrlOf, reportAll, reportFor, reservationsNow, sessionIn, snapshot, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 2048, vcpus: 2 }
const phases = { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 }
const staleWindowMs = 2 * 60 * 1000

/** A session `s1` running on `src`, moving to `dst`; answers the session and its move. */
const moving = Effect.gen(function* () {
  const s = yield* store
  yield* addHost("src", 4096)
  yield* addHost("dst", 16384)
  const x = yield* sessionIn("s1", "running", budget)
  const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
  return { session: x, move }
})

/** Every entry stale but those listed, renewed now. */
const staleBut = (keep: readonly string[]) =>
  Effect.gen(function* () {
    const s = yield* store
    yield* TestClock.adjust(staleWindowMs + 1)
    for (const id of keep) yield* s.heartbeat(id)
    // The agents still report: only the reservations went stale, no host went silent.
    yield* reportAll
  })

/** `s1` moving from `src` to `dst` with its final round recorded: the move is in doubt. */
const inDoubt = Effect.gen(function* () {
  const s = yield* store
  const begun = yield* moving
  yield* s.recordRound(begun.move.id, finalRound)
  return begun
})

/** The records of an in-doubt move still as they were: session moving on `src` with both reservations, move pending. */
const stillInDoubt = (session: { readonly reservationId: string | null }, move: { readonly id: string; readonly reservationId: string }) =>
  Effect.gen(function* () {
    const s = yield* store
    expect(yield* s.getSession("s1")).toMatchObject({ state: "moving", hostId: "src", reservationId: session.reservationId })
    expect(yield* s.getMove(move.id)).toMatchObject({ state: "pending", endedAt: null })
    expect((yield* reservationsNow(s)).map((r) => r.id).sort()).toStrictEqual([session.reservationId as string, move.reservationId].sort())
    for (const h of ["src", "dst"]) expect((yield* s.getHost(h)).headroom.reserved.memMib).toBe(budget.memMib)
  })

/**
 * The store's `markResendOwed`. Optional in the interface (a store without it keeps no mark, and its
 * reclaim sends no session back): a store without it switches the cases that set a mark off
 * (`skip`, with its reason) rather than passing them unread.
 */
const resendMark = Effect.gen(function* () {
  const mark = (yield* store).markResendOwed
  if (mark === undefined) return expect.fail("the store has no markResendOwed (optional): skip this case, stating why")
  return mark
})

/**
 * The store's `commitMoveByOperator`. Optional in the interface (the coordinator then judges the
 * operator's commit on a read of its own, a step before the commit): a store without it switches
 * these cases off (`skip`, with its reason) rather than passing them unread.
 */
const operatorCommit = Effect.gen(function* () {
  const commit = (yield* store).commitMoveByOperator
  if (commit === undefined) return expect.fail("the store has no commitMoveByOperator (optional): skip this case, stating why")
  return commit
})

/** The source's intent: the next round is the final one (no figures). */
const intent = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 } as const

/**
 * `s1` moved from `src` to `dst`, committed there without the source's phases (an operator's word
 * while the source was not heard, or the target's own resolution), then past the stale window with
 * only `src` reporting (`dst`'s agent gone). `resend`: the source then declared that it owes the
 * target a resend (`markResendOwed`: it holds the guest's only whole copy, the target never got a
 * complete stream); without it, nothing says the target did not run the guest. `sourceHeard`
 * false: `src` silent too.
 */
const committedUnconfirmed = (sourceHeard: boolean, resend = true) =>
  Effect.gen(function* () {
    const s = yield* store
    const { move } = yield* moving
    yield* s.recordRound(move.id, finalRound)
    yield* s.commitMove(move.id, null)
    if (resend) yield* (yield* resendMark)(move.id, true)
    yield* TestClock.adjust(staleWindowMs + 1)
    if (sourceHeard) {
      const src = yield* s.getHost("src")
      yield* s.reportHost("src", { ...src.report!, peerUrl: src.peerUrl })
    }
    return move
  })

/** `s1` reclaimed from `dst` and lost: no way back was taken. */
const lostNotReturned = Effect.gen(function* () {
  const s = yield* store
  yield* lostBeside(null)
  expect((yield* s.getHost("src")).headroom.reserved.memMib).toBe(0)
})

/** The reclaim loses s1 (never sent back), and the ledger holds only `filler` (when given) after it. */
const lostBeside = (filler: { readonly id: string } | null) =>
  Effect.gen(function* () {
    const s = yield* store
    const result = yield* s.reclaim()
    expect(result.lostSessions).toStrictEqual(["s1"])
    expect(result.returned).toBeUndefined()
    expect(yield* s.getSession("s1")).toMatchObject({ state: "lost", hostId: null })
    if (filler !== null) expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([filler.id])
    yield* expectInvariants
  })

/** A finished move refuses every change as a Conflict on the move, and nothing changes. */
const refusesEverything = (moveId: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const before = yield* snapshot
    expect(yield* expectFailure(s.commitMove(moveId, phases), "Conflict")).toMatchObject({ entity: "move", id: moveId })
    expect(yield* expectFailure(s.abortMove(moveId, "late"), "Conflict")).toMatchObject({ entity: "move", id: moveId })
    yield* expectFailure(s.abortMove(moveId, "late", { onlyBeforeFinalRound: true }), "Conflict")
    yield* expectFailure(s.recordRound(moveId, { kind: "final", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 }), "Conflict")
    yield* expectUnchanged(before, "touching a finished move")
  })

export const cascades: Group = {
  name: "cascades",
  cases: [
    kase(
      "ending a moving session closes its move as 'session ended' and counts both reservations as released",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        yield* TestClock.adjust(30)
        yield* s.endSession("s1")
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "aborted", abortReason: "session ended", abortEstimateMs: null, endedAt: 30, phases: null })
        expect(yield* s.metrics()).toMatchObject({ totalReservedMib: 4096, totalReleasedMib: 4096, totalReclaimedMib: 0, activeEntries: 0 })
        for (const h of ["src", "dst"]) expect((yield* s.getHost(h)).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
        yield* expectInvariants
      }),
    ),
    kase(
      "ending a moving session answers the move it closed, as it ended, and the session as the end found it",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        yield* TestClock.adjust(30)
        // The caller tells the move's target and waiters from this answer, not from a read before the end.
        const ended = yield* s.endSession("s1")
        expect(ended.closedMove).toStrictEqual(yield* s.getMove(move.id))
        expect(ended.closedMove).toMatchObject({ id: move.id, sessionId: "s1", sourceHostId: "src", targetHostId: "dst", state: "aborted", abortReason: "session ended", endedAt: 30 })
        expect(ended.before).toMatchObject({ id: "s1", state: "moving", hostId: "src" })
        expect(ended.session).toMatchObject({ id: "s1", state: "ended", hostId: null })
        // Ended already: nothing more closes.
        expect((yield* s.endSession("s1")).closedMove).toBeNull()
      }),
    ),
    kase(
      "a move whose session ended refuses commit, abort and rounds as a Conflict, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        yield* s.endSession("s1")
        yield* refusesEverything(move.id)
        expect(yield* s.getSession("s1")).toMatchObject({ state: "ended", hostId: null })
      }),
    ),
    kase(
      "a session reclaimed while moving is lost: its move closes, its own entry counts as reclaimed, the fresh target as released",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* moving
        yield* staleBut([move.reservationId])
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([session.reservationId])
        expect(result.lostSessions).toStrictEqual(["s1"])
        // The move it closed is named (its target's entry, released, is not in `reclaimed`): its target and waiters are owed a notice.
        expect(result.closedMoves.map((m) => [m.id, m.targetHostId, m.state])).toStrictEqual([[move.id, "dst", "aborted"]])
        expect(result.imageHostIds).toStrictEqual([])
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "aborted", abortReason: "session lost: its reservation was reclaimed" })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "lost", hostId: null, reservationId: null, parkedAt: null })
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 2048, totalReleasedMib: 2048, activeEntries: 0 })
        expect((yield* s.getHost("dst")).headroom.reserved.memMib).toBe(0)
        yield* expectInvariants
      }),
    ),
    kase(
      "a move whose session was lost refuses commit, abort and rounds as a Conflict, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        yield* staleBut([move.reservationId])
        yield* s.reclaim()
        yield* refusesEverything(move.id)
        // The lost session can only end.
        expect((yield* s.endSession("s1")).session.state).toBe("ended")
        yield* expectInvariants
      }),
    ),
    kase(
      "a reclaimed move target closes the move; the session keeps running on the source, and a new move may begin",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* moving
        yield* staleBut([session.reservationId as string])
        const result = yield* s.reclaim()
        expect(result).toMatchObject({ lostSessions: [], imageHostIds: [] })
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([move.reservationId])
        expect(result.closedMoves.map((m) => [m.id, m.targetHostId, m.state])).toStrictEqual([[move.id, "dst", "aborted"]])
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "aborted", abortReason: "move target's reservation was reclaimed" })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src", reservationId: session.reservationId })
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 2048, totalReleasedMib: 0, activeEntries: 1 })
        yield* refusesEverything(move.id)
        const again = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        expect(again).toMatchObject({ state: "pending", sourceHostId: "src", targetHostId: "dst" })
        yield* commitAfterFinal(again.id, phases)
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: again.reservationId })
        yield* expectInvariants
      }),
    ),
    kase(
      "a moving session whose own and target reservations are both stale ends lost with both counted as reclaimed",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* moving
        yield* staleBut([])
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([session.reservationId as string, move.reservationId].sort())
        expect(result.lostSessions).toStrictEqual(["s1"])
        expect((yield* s.getMove(move.id)).state).toBe("aborted")
        expect(yield* s.getSession("s1")).toMatchObject({ state: "lost", hostId: null, reservationId: null })
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 4096, totalReleasedMib: 0, activeEntries: 0 })
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "two moves crossing between two hosts: a host gone stale loses the session on it and closes the move that targets it",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 8192)
        yield* addHost("b", 8192)
        const x = yield* sessionIn("x", "running", budget)
        const y = yield* sessionIn("y", "running", budget)
        // Both placed on the snug host first; move one to the other host so they sit apart.
        const apart = yield* s.beginMove({ sessionId: "y", maxDowntimeMs: 600 })
        yield* commitAfterFinal(apart.id, phases)
        const yOn = (yield* s.getSession("y")).hostId as string
        const xOn = x.hostId as string
        expect(yOn).not.toBe(xOn)
        const mx = yield* s.beginMove({ sessionId: "x", targetHostId: yOn, maxDowntimeMs: 600 })
        const my = yield* s.beginMove({ sessionId: "y", targetHostId: xOn, maxDowntimeMs: 600 })
        // Every entry on y's host goes stale: y's own, and x's move target.
        const onYHost = (yield* reservationsNow(s, { hostId: yOn })).map((r) => r.id)
        const keep = (yield* reservationsNow(s)).map((r) => r.id).filter((id) => !onYHost.includes(id))
        yield* staleBut(keep)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([...onYHost].sort())
        expect(result.lostSessions).toStrictEqual(["y"])
        expect(yield* s.getSession("y")).toMatchObject({ state: "lost", hostId: null })
        expect(yield* s.getSession("x")).toMatchObject({ state: "running", hostId: xOn, reservationId: x.reservationId })
        expect((yield* s.getMove(mx.id)).abortReason).toBe("move target's reservation was reclaimed")
        expect((yield* s.getMove(my.id)).abortReason).toBe("session lost: its reservation was reclaimed")
        // y's move target on x's host was fresh: released, so x's host holds only x.
        expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([x.reservationId])
        expect(y.id).toBe("y")
        yield* expectInvariants
      }),
    ),
    kase(
      "a commit hands the target's reservation to the session with a fresh heartbeat; a later reclaim of the old source changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        yield* TestClock.adjust(staleWindowMs - 1)
        yield* commitAfterFinal(move.id, phases)
        expect(yield* s.getReservation(move.reservationId)).toMatchObject({ ownerKind: "session", ownerId: "s1", lastHeartbeatAt: staleWindowMs - 1 })
        yield* TestClock.adjust(2)
        // The target entry was renewed at the commit: not stale yet.
        expect(yield* s.reclaim()).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst" })
        yield* expectInvariants
      }),
    ),
    kase(
      "an in-doubt move is never reclaimed: a stale source, a stale target or both leave the session moving, the move pending and both reservations held, pass after pass",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* inDoubt
        for (const keep of [[move.reservationId], [session.reservationId as string], []]) {
          yield* staleBut(keep)
          expect(yield* s.reclaim()).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
          yield* stillInDoubt(session, move)
        }
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 0, totalReleasedMib: 0, activeEntries: 2 })
        yield* expectInvariants
      }),
    ),
    kase(
      "a held in-doubt move resolved as committed (phases null: the target's report or an operator) runs on the target; the stale source entry is released, nothing lost",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* inDoubt
        yield* staleBut([])
        yield* s.reclaim()
        const committed = yield* s.commitMove(move.id, null)
        expect(committed).toMatchObject({ state: "committed", phases: null, abortReason: null })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
        // The target's entry changed hands with a fresh heartbeat: the next pass keeps it.
        expect(yield* s.reclaim()).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
        expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([move.reservationId])
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 0, totalReleasedMib: 2048 })
        yield* expectInvariants
      }),
    ),
    kase(
      "a held in-doubt move resolved as aborted runs on the source; only then may its source's stale entry be reclaimed",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* inDoubt
        yield* staleBut([])
        yield* s.reclaim()
        const aborted = yield* s.abortMove(move.id, "operator: the target has no guest")
        expect(aborted).toMatchObject({ state: "aborted", abortReason: "operator: the target has no guest" })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src", reservationId: session.reservationId })
        // The move no longer holds the source's entry: a silent source is a lost session again.
        const result = yield* s.reclaim()
        expect(result).toStrictEqual({ reclaimed: [expect.objectContaining({ id: session.reservationId })], lostSessions: ["s1"], closedMoves: [], imageHostIds: [] })
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 2048, totalReleasedMib: 2048, activeEntries: 0 })
        yield* expectInvariants
      }),
    ),
    kase(
      "a move whose intent is recorded (no final round yet) is in doubt: never reclaimed, and the target's report (a commit without phases) commits it",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* moving
        yield* s.recordRound(move.id, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
        for (const keep of [[move.reservationId], [session.reservationId as string], []]) {
          yield* staleBut(keep)
          expect(yield* s.reclaim()).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
          yield* stillInDoubt(session, move)
        }
        const committed = yield* s.commitMove(move.id, null)
        expect(committed).toMatchObject({ state: "committed", phases: null })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
        yield* expectInvariants
      }),
    ),
    kase(
      "a commit without phases is refused before the final round (Conflict), and bad phases are still refused by name",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        const before = yield* snapshot
        expect(yield* expectFailure(s.commitMove(move.id, null), "Conflict")).toMatchObject({ entity: "move", id: move.id })
        expect((yield* expectFailure(s.commitMove(move.id, { ...phases, sendMs: 0 }), "InvalidInput")).field).toBe("sendMs")
        yield* expectUnchanged(before, "a refused commit")
      }),
    ),
    kase(
      "an operator's commit (commitMoveByOperator) before the final round is judged on the source as it is at the commit: refused while the source is heard, by a report made after the source fell silent too (a check before the commit would have passed), nothing changed; let through once the source is silent",
      Effect.gen(function* () {
        const s = yield* store
        const commit = yield* operatorCommit
        const { move } = yield* moving
        // Not in doubt yet: refused whatever the source.
        expect((yield* expectFailure(commit(move.id), "Conflict")).reason).toBe("neither an intent nor a final round recorded: the move is not in doubt")
        yield* s.recordRound(move.id, intent)
        // Both agents silent past the window: a check of the source here would let the commit through...
        yield* TestClock.adjust(staleWindowMs + 1)
        // ...but the source reports before the commit (it is still sending): the commit sees it.
        yield* s.reportHost("src", { ...reportFor(4096, 8, s.limits()), peerUrl: peerUrlOf("src") })
        const before = yield* snapshot
        const refused = yield* expectFailure(commit(move.id), "Conflict")
        expect(refused).toMatchObject({ entity: "move", id: move.id })
        expect(refused.reason).toBe(
          "the move's source src is heard (its last report 0 s ago, within the 120 s stale window) and the move's final round is not recorded yet: the target may hold no complete copy; wait for the final round (or the target's own commit) or abort",
        )
        yield* expectUnchanged(before, "a refused operator's commit")
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "pending", endedAt: null })
        // Its last report at the window's edge is still heard; a millisecond past it, silent: the operator's word stands.
        yield* TestClock.adjust(staleWindowMs)
        yield* expectFailure(commit(move.id), "Conflict")
        yield* TestClock.adjust(1)
        expect(yield* commit(move.id)).toMatchObject({ id: move.id, state: "committed", phases: null, abortReason: null })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
        expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([move.reservationId])
        // Finished, or unknown: refused as any commit.
        expect((yield* expectFailure(commit(move.id), "Conflict")).reason).toBe("move is committed")
        yield* expectFailure(commit("nope"), "NotFound")
        yield* expectInvariants
      }),
    ),
    kase(
      "an operator's commit (commitMoveByOperator) of a move whose final round is recorded stands while its source is heard: the target holds the complete stream",
      Effect.gen(function* () {
        const s = yield* store
        const commit = yield* operatorCommit
        const { move } = yield* inDoubt
        yield* reportAll
        expect(yield* commit(move.id)).toMatchObject({ id: move.id, state: "committed", phases: null })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
        yield* expectInvariants
      }),
    ),
    kase(
      "a move's record says who committed it (committedBy) on every read: its source (with phases; also when not said), its target's resolution, an operator (commitMoveByOperator), null when not said without phases, while pending and once aborted; a by outside the list is InvalidInput naming by, nothing changed",
      Effect.gen(function* () {
        const s = yield* store
        const { move: first } = yield* moving
        expect(first.committedBy).toBeNull()
        expect(yield* s.getMove(first.id)).toMatchObject({ state: "pending", committedBy: null })
        yield* s.recordRound(first.id, finalRound)
        const before = yield* snapshot
        const bad = yield* expectFailure(s.commitMove(first.id, phases, null, "agent" as never), "InvalidInput")
        expect(bad.field).toBe("by")
        yield* expectUnchanged(before, "a commit by someone outside the list")
        expect(yield* s.getMove(first.id)).toMatchObject({ state: "pending", committedBy: null })
        // Back and forth between src and dst: one move committed by each path, one aborted.
        const moveTo = (targetHostId: string) => s.beginMove({ sessionId: "s1", targetHostId, maxDowntimeMs: 600 })
        const bySource = yield* s.commitMove(first.id, phases, null, "source")
        const back = yield* moveTo("src")
        yield* s.recordRound(back.id, finalRound)
        const byTarget = yield* s.commitMove(back.id, null, null, "target")
        const third = yield* moveTo("dst")
        yield* s.recordRound(third.id, finalRound)
        const byOperator = s.commitMoveByOperator === undefined ? yield* s.commitMove(third.id, null, null, "operator") : yield* s.commitMoveByOperator(third.id)
        const fourth = yield* moveTo("src")
        yield* s.recordRound(fourth.id, finalRound)
        const unsaid = yield* s.commitMove(fourth.id, null)
        const fifth = yield* moveTo("dst")
        const measured = yield* commitAfterFinal(fifth.id, phases)
        const sixth = yield* moveTo("src")
        const aborted = yield* s.abortMove(sixth.id, "ErrMoveDowntime")
        const want = [
          [bySource, "source"],
          [byTarget, "target"],
          [byOperator, "operator"],
          [unsaid, null],
          [measured, "source"],
          [aborted, null],
        ] as const
        for (const [m, by] of want) expect(m.committedBy, m.id).toBe(by)
        // Every read an operator's view may come by: the move, a batch, the lists and the session's latest.
        for (const [m, by] of want) expect((yield* s.getMove(m.id)).committedBy, m.id).toBe(by)
        const batch = new Map((yield* s.getMoves(want.map(([m]) => m.id))).map((m) => [m.id, m.committedBy]))
        expect(want.map(([m]) => batch.get(m.id))).toStrictEqual(want.map(([, by]) => by))
        const listed = new Map((yield* s.listMoves({})).map((m) => [m.id, m.committedBy]))
        expect(want.map(([m]) => listed.get(m.id))).toStrictEqual(want.map(([, by]) => by))
        const paged = new Map((yield* s.pageMoves({ hostId: "src" }, { limit: 100 })).items.map((m) => [m.id, m.committedBy]))
        expect(want.map(([m]) => paged.get(m.id))).toStrictEqual(want.map(([, by]) => by))
        if (s.latestMove !== undefined) expect((yield* s.latestMove("s1"))?.committedBy).toBeNull()
        yield* expectInvariants
      }),
    ),
    kase(
      "an abort keeps the session's own reservation on the source and drops only the target's",
      Effect.gen(function* () {
        const s = yield* store
        const { session, move } = yield* moving
        yield* TestClock.adjust(5)
        const aborted = yield* s.abortMove(move.id, "ErrMoveDowntime", { estimateMs: 700 })
        expect(aborted).toMatchObject({ state: "aborted", abortEstimateMs: 700, endedAt: 5 })
        expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([session.reservationId])
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src", reservationId: session.reservationId, updatedAt: 5 })
        expect(yield* s.metrics()).toMatchObject({ totalReleasedMib: 2048, totalReclaimedMib: 0 })
        yield* expectInvariants
      }),
    ),
    kase(
      "a session reclaimed from the target of a move committed without the source's phases, whose source owes it a resend (it holds the guest's only whole copy), goes back to the source, heard and with room: running there on a new reservation, not lost",
      Effect.gen(function* () {
        const s = yield* store
        const move = yield* committedUnconfirmed(true)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([move.reservationId])
        expect(result.lostSessions).toStrictEqual([])
        expect(result.returned).toStrictEqual([{ sessionId: "s1", hostId: "src" }])
        const back = yield* s.getSession("s1")
        expect(back).toMatchObject({ state: "running", hostId: "src" })
        expect(back.reservationId).not.toBeNull()
        expect(back.reservationId).not.toBe(move.reservationId)
        expect((yield* reservationsNow(s)).map((r) => [r.id, r.hostId, r.ownerId])).toStrictEqual([[back.reservationId, "src", "s1"]])
        expect((yield* s.getHost("src")).headroom.reserved.memMib).toBe(budget.memMib)
        expect((yield* s.getHost("dst")).headroom.reserved.memMib).toBe(0)
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: budget.memMib, activeEntries: 1 })
        expect((yield* s.sessionEvents("s1")).items.at(-1)?.event).toStrictEqual({ _tag: "Running", hostId: "src" })
        expect(yield* s.reclaim()).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
        yield* expectInvariants
      }),
    ),
    ...(["cordoned", "draining"] as const).map((state) =>
      kase(
        `a session reclaimed from the target of a move committed without phases, whose source owes a resend, goes back to its source while the source is ${state} (no new placement: the guest is already there), heard and with room`,
        Effect.gen(function* () {
          const s = yield* store
          const move = yield* committedUnconfirmed(true)
          yield* s.setHostState("src", state)
          const result = yield* s.reclaim()
          expect(result.reclaimed.map((r) => r.id)).toStrictEqual([move.reservationId])
          expect(result.lostSessions).toStrictEqual([])
          expect(result.returned).toStrictEqual([{ sessionId: "s1", hostId: "src" }])
          const back = yield* s.getSession("s1")
          expect(back).toMatchObject({ state: "running", hostId: "src" })
          expect((yield* reservationsNow(s)).map((r) => [r.id, r.hostId, r.ownerId])).toStrictEqual([[back.reservationId, "src", "s1"]])
          // The source keeps its state: it still takes nothing new.
          expect(yield* s.getHost("src")).toMatchObject({ state, headroom: { reserved: { memMib: budget.memMib } } })
          expect((yield* s.sessionEvents("s1")).items.at(-1)?.event).toStrictEqual({ _tag: "Running", hostId: "src" })
          yield* expectInvariants
        }),
      ),
    ),
    kase(
      "a session reclaimed from the target of a move committed without phases ends lost when its draining source is silent too",
      Effect.gen(function* () {
        const s = yield* store
        yield* committedUnconfirmed(false)
        yield* s.setHostState("src", "draining")
        yield* lostNotReturned
      }),
    ),
    kase(
      "a session reclaimed from the target of a move committed without phases ends lost when its cordoned source has no room",
      Effect.gen(function* () {
        const s = yield* store
        yield* committedUnconfirmed(true)
        // The room taken while it was ready (external reservations land only on ready hosts), then cordoned.
        const filler = yield* s.reserve({ id: "filler", hostId: "src", ownerKind: "external", ownerId: "op", memMib: 3072, vcpus: 1 })
        yield* s.setHostState("src", "cordoned")
        yield* lostBeside(filler)
      }),
    ),
    kase(
      "a session reclaimed from the target of a move committed without phases ends lost when its source was removed (it held nothing: no row to go back to)",
      Effect.gen(function* () {
        const s = yield* store
        yield* committedUnconfirmed(true)
        yield* s.removeHost("src")
        yield* lostBeside(null)
      }),
    ),
    kase(
      "a session reclaimed from the target of a move committed without phases ends lost when its source is silent too",
      Effect.gen(function* () {
        // The source silent too.
        yield* committedUnconfirmed(false)
        yield* lostNotReturned
      }),
    ),
    kase(
      "a session reclaimed from the target of a move committed without phases ends lost when its source has no room",
      Effect.gen(function* () {
        const s = yield* store
        yield* committedUnconfirmed(true)
        // The source's room taken meanwhile (its reservation live): s1 no longer fits there.
        const filler = yield* s.reserve({ id: "filler", hostId: "src", ownerKind: "external", ownerId: "op", memMib: 3072, vcpus: 1 })
        yield* lostBeside(filler)
      }),
    ),
    kase(
      "a session reclaimed from the target of a move its source confirmed (committed with phases) ends lost, its source heard and with room",
      Effect.gen(function* () {
        const { move } = yield* moving
        yield* commitAfterFinal(move.id, phases)
        yield* TestClock.adjust(staleWindowMs + 1)
        yield* reportAll
        yield* lostNotReturned
      }),
    ),
    kase(
      "a session reclaimed from the target that resolved its move itself (committed without phases, no resend owed by the source) ends lost, its source heard and with room: the target ran the guest, the source's copy is older",
      Effect.gen(function* () {
        yield* committedUnconfirmed(true, false)
        yield* lostNotReturned
      }),
    ),
    kase(
      "a session reclaimed from the target of a move whose resend its source owed, then settled (the mark cleared), ends lost: the source destroyed its copy",
      Effect.gen(function* () {
        const s = yield* store
        const move = yield* committedUnconfirmed(true)
        expect(yield* (yield* resendMark)(move.id, false)).toStrictEqual(yield* s.getMove(move.id))
        yield* lostNotReturned
      }),
    ),
    kase(
      "a resend is owed only on a move committed without phases: a pending move, one its source committed with phases, or an unknown one is refused, nothing changed; a repeat and a clear are accepted",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        const before = yield* snapshot
        expect(yield* expectFailure((yield* resendMark)(move.id, true), "Conflict")).toMatchObject({ entity: "move", id: move.id })
        expect(yield* expectFailure((yield* resendMark)("nope", true), "NotFound")).toMatchObject({ entity: "move", id: "nope" })
        expect(yield* (yield* resendMark)(move.id, false)).toStrictEqual(yield* s.getMove(move.id))
        yield* expectUnchanged(before, "a refused resend mark")
        yield* commitAfterFinal(move.id, phases)
        expect(yield* expectFailure((yield* resendMark)(move.id, true), "Conflict")).toMatchObject({ entity: "move", id: move.id })
        // The move as it was: no mark on its record.
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "committed", phases, resendOwed: false })
        yield* expectInvariants
      }),
    ),
    kase(
      "a resend mark on a move committed without phases is kept and repeatable, and every read of the move carries it (resendOwed) until it is cleared; nothing else of the record changes but the count of its clears (resendClears)",
      Effect.gen(function* () {
        const s = yield* store
        const { move } = yield* moving
        expect(move.resendOwed).toBe(false)
        yield* s.recordRound(move.id, finalRound)
        const committed = yield* s.commitMove(move.id, null)
        expect(committed).toMatchObject({ resendOwed: false, resendClears: 0 })
        const marked = { ...committed, resendOwed: true }
        expect(yield* (yield* resendMark)(move.id, true)).toStrictEqual(marked)
        expect(yield* (yield* resendMark)(move.id, true)).toStrictEqual(marked)
        // Every read an operator's view may come by: the move, a batch, the lists and the session's latest.
        expect(yield* s.getMove(move.id)).toStrictEqual(marked)
        expect(yield* s.getMoves([move.id])).toStrictEqual([marked])
        expect((yield* s.listMoves({ state: "committed" })).find((m) => m.id === move.id)).toStrictEqual(marked)
        expect((yield* s.pageMoves({ hostId: "src" })).items.find((m) => m.id === move.id)).toStrictEqual(marked)
        if (s.latestMove !== undefined) expect(yield* s.latestMove("s1")).toStrictEqual(marked)
        const cleared = { ...committed, resendClears: 1 }
        expect(yield* (yield* resendMark)(move.id, false)).toStrictEqual(cleared)
        expect(yield* s.getMove(move.id)).toStrictEqual(cleared)
        yield* expectInvariants
      }),
    ),
    kase(
      "a tell of the resend mark naming fewer clears than the move holds (sent before the target's clear, reaching the store after it) changes nothing, so the target's death then leaves the session lost, never sent back; a tell naming the clears it read sets the mark; one without the count sets it as before; a count that is not an integer >= 0 is InvalidInput naming seenClears",
      Effect.gen(function* () {
        const s = yield* store
        const mark = yield* resendMark
        const { move } = yield* moving
        yield* s.recordRound(move.id, finalRound)
        yield* s.commitMove(move.id, null)
        // The source's tell, naming the clears it read (none): set.
        expect(yield* mark(move.id, true, 0)).toMatchObject({ resendOwed: true, resendClears: 0 })
        // The target clears the mark before it resumes the stream sent again: counted.
        const cleared = yield* mark(move.id, false)
        expect(cleared).toMatchObject({ resendOwed: false, resendClears: 1 })
        // A clear of a mark already clear counts too (a tell in flight from before it is stale after it).
        expect(yield* mark(move.id, false)).toMatchObject({ resendOwed: false, resendClears: 2 })
        // A tell the source's client gave up on, reaching the store now: it names 0 clears, the
        // move holds 2. Nothing changes; the move as it is.
        const before = yield* snapshot
        const late = yield* mark(move.id, true, 0)
        expect(late).toStrictEqual(yield* s.getMove(move.id))
        expect(late).toMatchObject({ resendOwed: false, resendClears: 2 })
        expect(yield* mark(move.id, true, 1)).toMatchObject({ resendOwed: false, resendClears: 2 })
        for (const bad of [-1, 1.5, Number.NaN]) expect(yield* expectFailure(mark(move.id, true, bad), "InvalidInput")).toMatchObject({ field: "seenClears" })
        yield* expectUnchanged(before, "a stale tell of the resend mark, and refused counts")
        // The target dies (its agent silent past the stale window) while the source reports: the
        // mark is not set, so the session is lost there, never sent back to the source's copy.
        yield* TestClock.adjust(staleWindowMs + 1)
        const src = yield* s.getHost("src")
        yield* s.reportHost("src", { ...src.report!, peerUrl: src.peerUrl })
        yield* lostNotReturned
        // A tell naming the clears it read sets the mark; one without the count (an older source's agent) too.
        expect(yield* mark(move.id, true, 2)).toMatchObject({ resendOwed: true, resendClears: 2 })
        expect(yield* mark(move.id, false)).toMatchObject({ resendOwed: false, resendClears: 3 })
        expect(yield* mark(move.id, true)).toMatchObject({ resendOwed: true, resendClears: 3 })
        yield* expectInvariants
      }),
    ),
    kase(
      "a clear of the resend mark on a move that may carry none (pending, or committed with phases) counts nothing: the move as it is",
      Effect.gen(function* () {
        const s = yield* store
        const mark = yield* resendMark
        const { move } = yield* moving
        expect(yield* mark(move.id, false)).toMatchObject({ resendOwed: false, resendClears: 0 })
        yield* commitAfterFinal(move.id, phases)
        expect(yield* mark(move.id, false)).toStrictEqual(yield* s.getMove(move.id))
        expect(yield* s.getMove(move.id)).toMatchObject({ resendOwed: false, resendClears: 0 })
      }),
    ),
  ],
}
