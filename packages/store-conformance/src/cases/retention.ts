/**
 * Retention (`pruneHistory`): a store deletes the history that ended before a cutoff, at most a
 * limit of each kind a call, oldest first, and never anything live: sessions in any state but
 * `ended`, pending moves, reservations, host pairs with a commit since the cutoff. A session's
 * events go with it. What the store decides with afterwards (the ledger, the fleet, the
 * allowance's commits within the horizon) is what it was before. And the reaper's bounded read
 * of recent aborts: `listMoves({ endedSince })`.
 */
import type { Move } from "@engram/core"
import type { PruneResult } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, expectInvariants, kase, placed, sessionIn, snapshot, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }
const phases = { downtimeMs: 400, captureMs: 40, sendMs: 50, commitMs: 300 }
const none: PruneResult = { sessions: 0, events: 0, moves: 0, pairs: 0 }

/** A running session `id` on a fresh placement. */
const running = (id: string) =>
  Effect.gen(function* () {
    const s = yield* store
    yield* placed(id, budget)
    return yield* s.markRunning(id)
  })

/** Moves running session `id` (to `to`, or the best other host) and commits the move at the clock's now. */
const committedMove = (id: string, to?: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const m = yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600, targetHostId: to })
    return yield* commitAfterFinal(m.id, phases)
  })

/** Begins a move of running session `id` and aborts it at the clock's now. */
const abortedMove = (id: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const m = yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
    return yield* s.abortMove(m.id, "refused by the guard")
  })

const ids = (ms: readonly Move.Record[]) => ms.map((m) => m.id)

export const retention: Group = {
  name: "retention",
  cases: [
    kase(
      "a prune deletes the sessions that ended before the cutoff with their events, and no live session nor a later end",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        // Live sessions from the start (their last change long before the cutoff): queued, running, parked, descended, lost.
        const live = ["q", "run", "park", "desc", "lost"] as const
        yield* sessionIn("q", "queued")
        yield* sessionIn("run", "running")
        yield* sessionIn("park", "parked")
        yield* sessionIn("desc", "descended")
        yield* sessionIn("lost", "lost")
        const t0 = (yield* s.getSession("lost")).updatedAt
        yield* TestClock.setTime(t0 + 100)
        yield* sessionIn("old", "ended")
        const oldEvents = (yield* s.sessionEvents("old")).items.length
        yield* TestClock.setTime(t0 + 500)
        yield* sessionIn("new", "ended")
        const newEvents = (yield* s.sessionEvents("new")).items
        yield* TestClock.setTime(t0 + 1000)
        const before = yield* snapshot
        const liveBefore = before.sessions.filter((x) => x.id !== "old")
        expect(yield* s.pruneHistory({ endedBefore: t0 + 300, limit: 100 })).toStrictEqual({ ...none, sessions: 1, events: oldEvents })
        yield* expectFailure(s.getSession("old"), "NotFound")
        yield* expectFailure(s.sessionEvents("old"), "NotFound")
        const after = yield* snapshot
        expect(after.sessions).toStrictEqual(liveBefore)
        expect(after.sessions.map((x) => x.id).sort()).toStrictEqual([...live, "new"].sort())
        expect((yield* s.sessionEvents("new")).items).toStrictEqual(newEvents)
        // The ledger and the queue are what they were.
        expect({ hosts: after.hosts, reservations: after.reservations, queue: after.queue }).toStrictEqual({
          hosts: before.hosts,
          reservations: before.reservations,
          queue: before.queue,
        })
        // Nothing more ended before the cutoff: a second call deletes nothing.
        expect(yield* s.pruneHistory({ endedBefore: t0 + 300, limit: 100 })).toStrictEqual(none)
        yield* expectInvariants
      }),
    ),
    kase(
      "a prune deletes at most the limit of each kind, oldest first, and repeated calls finish the backlog",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        for (let i = 1; i <= 5; i++) {
          yield* TestClock.setTime(i * 10)
          yield* placed(`s${i}`, budget)
          yield* s.endSession(`s${i}`)
        }
        yield* TestClock.setTime(1000)
        const remaining = () => Effect.map(s.listSessions(), (xs) => xs.map((x) => x.id))
        expect((yield* s.pruneHistory({ endedBefore: 1000, limit: 2 })).sessions).toBe(2)
        expect(yield* remaining()).toStrictEqual(["s3", "s4", "s5"])
        expect((yield* s.pruneHistory({ endedBefore: 1000, limit: 2 })).sessions).toBe(2)
        expect(yield* remaining()).toStrictEqual(["s5"])
        expect((yield* s.pruneHistory({ endedBefore: 1000, limit: 2 })).sessions).toBe(1)
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 2 })).toStrictEqual(none)
        expect(yield* remaining()).toStrictEqual([])
      }),
    ),
    kase(
      "a prune deletes the committed and aborted moves that ended before the cutoff; a pending move, its reservation and its session survive",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* running("c")
        yield* running("a")
        yield* running("p")
        yield* TestClock.setTime(100)
        const committed = yield* committedMove("c")
        const aborted = yield* abortedMove("a")
        const pending = yield* s.beginMove({ sessionId: "p", maxDowntimeMs: 600 })
        yield* TestClock.setTime(1000)
        const before = yield* snapshot
        const result = yield* s.pruneHistory({ endedBefore: 500, limit: 100 })
        // The committed move's host pair went too: its one commit was recorded at 100.
        expect(result).toStrictEqual({ ...none, moves: 2, pairs: 1 })
        yield* expectFailure(s.getMove(committed.id), "NotFound")
        yield* expectFailure(s.getMove(aborted.id), "NotFound")
        expect(yield* s.getMove(pending.id)).toStrictEqual(pending)
        expect(yield* s.openMove("p")).toStrictEqual(pending)
        expect(ids(yield* s.listMoves())).toStrictEqual([pending.id])
        // Sessions, the ledger (the pending move's target reservation with it) and the queue are unchanged.
        expect(yield* snapshot).toStrictEqual(before)
        yield* expectInvariants
      }),
    ),
    kase(
      "an ended session with a move left is kept until its moves are gone, and the limit holds for moves",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const first = yield* running("s1")
        const back = first.hostId === "h1" ? "h1" : "h2"
        const away = back === "h1" ? "h2" : "h1"
        yield* TestClock.setTime(100)
        yield* committedMove("s1", away)
        yield* TestClock.setTime(200)
        yield* committedMove("s1", back)
        yield* TestClock.setTime(300)
        yield* s.endSession("s1")
        yield* TestClock.setTime(1000)
        // One move a call: the session waits for its second move.
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })).toMatchObject({ sessions: 0, events: 0, moves: 1 })
        expect((yield* s.getSession("s1")).state).toBe("ended")
        expect((yield* s.listMoves()).map((m) => m.endedAt)).toStrictEqual([200])
        const second = yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })
        expect(second).toMatchObject({ sessions: 1, moves: 1 })
        expect(second.events).toBeGreaterThan(0)
        yield* expectFailure(s.getSession("s1"), "NotFound")
        // Both pairs' commits were before the cutoff: one pair a call.
        const pairsLeft = yield* s.listPairCommits()
        expect(pairsLeft.length).toBe(0)
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })).toStrictEqual(none)
      }),
    ),
    kase(
      "a session goes only after every ended move that ended before it, its own or another's: while moves come back full, sessions wait",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const first = yield* running("moved")
        const back = first.hostId === "h1" ? "h1" : "h2"
        const away = back === "h1" ? "h2" : "h1"
        yield* placed("still", budget)
        // "moved" moves at 100 and 200 and ends at 400; "still" never moves and ends at 300.
        yield* TestClock.setTime(100)
        yield* committedMove("moved", away)
        yield* TestClock.setTime(200)
        yield* committedMove("moved", back)
        yield* TestClock.setTime(300)
        yield* s.endSession("still")
        yield* TestClock.setTime(400)
        yield* s.endSession("moved")
        yield* TestClock.setTime(1000)
        const ended = () => Effect.map(s.listSessions(), (xs) => xs.map((x) => x.id).sort())
        // The move of 100 goes; the one of 200 is kept, so "still" (ended at 300, no move) waits for it.
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })).toMatchObject({ sessions: 0, events: 0, moves: 1 })
        expect(yield* ended()).toStrictEqual(["moved", "still"])
        // The move of 200 goes: both sessions may go now, the oldest first.
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })).toMatchObject({ sessions: 1, moves: 1 })
        expect(yield* ended()).toStrictEqual(["moved"])
        expect(yield* s.pruneHistory({ endedBefore: 1000, limit: 1 })).toMatchObject({ sessions: 1, moves: 0 })
        expect(yield* ended()).toStrictEqual([])
      }),
    ),
    kase(
      "a host pair with a commit at or after the cutoff survives, and the allowance's commits within the horizon are unchanged",
      Effect.gen(function* () {
        const s = yield* store
        // Two running sessions on h1 (the only host then); h2 and h3 join after.
        yield* addHost("h1", 8192)
        yield* running("x")
        yield* running("y")
        yield* addHost("h2", 8192)
        yield* addHost("h3", 8192)
        yield* TestClock.setTime(100)
        yield* committedMove("x", "h2")
        yield* TestClock.setTime(900)
        yield* committedMove("y", "h3")
        yield* TestClock.setTime(1000)
        const query = (sourceHostId: string) => ({ sourceHostId, targetHostIds: ["h1", "h2", "h3"].filter((h) => h !== sourceHostId), recordedSince: 500, limit: 20 })
        const allowanceBefore = yield* Effect.forEach(["h1", "h2", "h3"], (h) => s.listAllowanceCommits(query(h)))
        const recentBefore = yield* s.listPairCommits({ recordedSince: 500 })
        const fleetBefore = yield* s.fleetView()
        const metricsBefore = yield* s.metrics()
        const summaryBefore = yield* s.clusterSummary()
        // The move of 100 and its pair go; the move and the pair of 900 stay.
        expect(yield* s.pruneHistory({ endedBefore: 500, limit: 100 })).toStrictEqual({ ...none, moves: 1, pairs: 1 })
        const left = yield* s.listPairCommits()
        expect(left).toStrictEqual(recentBefore)
        expect(left.map((p) => p.updatedAt)).toStrictEqual([900])
        expect(yield* Effect.forEach(["h1", "h2", "h3"], (h) => s.listAllowanceCommits(query(h)))).toStrictEqual(allowanceBefore)
        expect(yield* s.fleetView()).toStrictEqual(fleetBefore)
        expect(yield* s.metrics()).toStrictEqual(metricsBefore)
        expect(yield* s.clusterSummary()).toStrictEqual(summaryBefore)
        yield* expectInvariants
      }),
    ),
    kase(
      "a live reservation survives a prune, whatever its age",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const held = yield* s.reserve({ id: "ext", hostId: "h1", ownerKind: "external", ownerId: "backup", memMib: 512, vcpus: 1 })
        yield* placed("gone", budget)
        yield* s.endSession("gone")
        yield* TestClock.setTime(10_000)
        yield* s.heartbeat("ext")
        const renewed = yield* s.getReservation("ext")
        expect(yield* s.pruneHistory({ endedBefore: 10_000, limit: 100 })).toMatchObject({ sessions: 1 })
        expect(yield* s.getReservation("ext")).toStrictEqual(renewed)
        expect(renewed.createdAt).toBe(held.createdAt)
        yield* expectInvariants
      }),
    ),
    kase(
      "a bad prune request is InvalidInput naming endedBefore or limit, and deletes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", budget)
        yield* s.endSession("s1")
        yield* TestClock.setTime(1000)
        const before = yield* snapshot
        const events = yield* s.sessionEvents("s1")
        const field = (request: unknown) =>
          expectFailure(s.pruneHistory(request as { endedBefore: number; limit: number }), "InvalidInput").pipe(Effect.map((e) => e.field))
        for (const endedBefore of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, "1000", undefined, 1001])
          expect(yield* field({ endedBefore, limit: 10 }), String(endedBefore)).toBe("endedBefore")
        for (const limit of [0, -1, 1.5, 10_001, Number.NaN, "10", undefined]) expect(yield* field({ endedBefore: 1000, limit }), String(limit)).toBe("limit")
        expect(yield* snapshot).toStrictEqual(before)
        expect(yield* s.sessionEvents("s1")).toStrictEqual(events)
        // The same session goes with a good request.
        expect((yield* s.pruneHistory({ endedBefore: 1000, limit: 10_000 })).sessions).toBe(1)
      }),
    ),
    kase(
      "listMoves with endedSince answers the moves that ended at or after it, never a pending one; a bad bound is InvalidInput",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        for (const id of ["a1", "a2", "c", "p"]) yield* running(id)
        yield* TestClock.setTime(100)
        yield* abortedMove("a1")
        yield* TestClock.setTime(500)
        const a2 = yield* abortedMove("a2")
        yield* TestClock.setTime(600)
        const c = yield* committedMove("c")
        const p = yield* s.beginMove({ sessionId: "p", maxDowntimeMs: 600 })
        expect(ids(yield* s.listMoves({ state: "aborted", endedSince: 500 }))).toStrictEqual([a2.id])
        expect(ids(yield* s.listMoves({ endedSince: 500 }))).toStrictEqual([a2.id, c.id])
        expect(ids(yield* s.listMoves({ endedSince: 601 }))).toStrictEqual([])
        expect(ids(yield* s.listMoves({ state: "pending", endedSince: 0 }))).toStrictEqual([])
        expect(ids(yield* s.listMoves({ state: "pending" }))).toStrictEqual([p.id])
        expect((yield* s.pageMoves({ state: "aborted", endedSince: 500 })).items.map((m) => m.id)).toStrictEqual([a2.id])
        expect((yield* expectFailure(s.listMoves({ endedSince: Number.NaN }), "InvalidInput")).field).toBe("endedSince")
        expect((yield* expectFailure(s.pageMoves({ endedSince: Number.POSITIVE_INFINITY }), "InvalidInput")).field).toBe("endedSince")
      }),
    ),
  ],
}
