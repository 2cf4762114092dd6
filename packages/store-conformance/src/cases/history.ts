/**
 * A session's history: every event core's `Session.step` (and `Reclaim.decide`)
 * answers is kept by the store, in the same atomic change as the step, numbered from 1 and
 * stamped with the Clock. A failed operation writes none. Read a page at a time.
 */
import type { Session } from "@engram/core"
import type { SessionEvent } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, kase, placed, queued, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }

/** Every event of a session, following the pages (3 at a time, so the cursor is exercised). */
const history = (id: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const all: SessionEvent[] = []
    let cursor: string | undefined
    for (let i = 0; i < 100; i++) {
      const page = yield* s.sessionEvents(id, { limit: 3, cursor })
      all.push(...page.items)
      if (page.nextCursor === null) break
      cursor = page.nextCursor
    }
    return all
  })

const events = (id: string) => Effect.map(history(id), (h) => h.map((e) => e.event))

export const historyGroup: Group = {
  name: "history",
  cases: [
    kase(
      "a session's life is in its history: created, placed on its host, running, parked, resumed warm, yielded with the gate's reason, descended, resumed cold, placed, ended",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", budget)
        yield* TestClock.adjust(10)
        yield* s.markRunning("s1")
        yield* TestClock.adjust(10)
        yield* s.idle("s1")
        yield* s.resume("s1")
        yield* s.idle("s1")
        yield* TestClock.adjust(10)
        yield* s.beginDescent("s1", { reason: "demand" })
        yield* s.finishDescent("s1")
        yield* s.resume("s1")
        yield* TestClock.adjust(10)
        yield* s.endSession("s1")
        const h = yield* history("s1")
        expect(h.map((e) => e.seq)).toStrictEqual(Array.from({ length: h.length }, (_, i) => i + 1))
        expect(h.every((e) => e.sessionId === "s1")).toBe(true)
        expect(h.map((e) => [e.at, e.event])).toStrictEqual([
          [0, { _tag: "Created" }],
          [0, { _tag: "Placed", hostId: "h1" }],
          [10, { _tag: "Running", hostId: "h1" }],
          [20, { _tag: "Parked", hostId: "h1" }],
          [20, { _tag: "Resumed", warm: true, hostId: "h1" }],
          [20, { _tag: "Parked", hostId: "h1" }],
          [30, { _tag: "Descending", hostId: "h1", cause: "yield", reason: "demand" }],
          [30, { _tag: "Descended", hostId: "h1" }],
          [30, { _tag: "Resumed", warm: false, hostId: null }],
          [30, { _tag: "Placed", hostId: "h1" }],
          [40, { _tag: "Ended", hostId: "h1" }],
        ])
      }),
    ),
    kase(
      "a queued create, a drain's placement, an idle descent and a queued cold resume are in the history",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("s1", budget)
        yield* addHost("h1", 1024)
        yield* s.drainQueue()
        yield* s.markRunning("s1")
        // A session waiting without room (h1 is full): the idle session descends at once.
        yield* queued("w", budget)
        yield* s.idle("s1")
        yield* s.finishDescent("s1")
        yield* placed("other", budget)
        yield* s.resume("s1")
        expect(yield* events("s1")).toStrictEqual([
          { _tag: "Created" },
          { _tag: "Queued" },
          { _tag: "Placed", hostId: "h1" },
          { _tag: "Running", hostId: "h1" },
          { _tag: "Descending", hostId: "h1", cause: "idle", reason: null },
          { _tag: "Descended", hostId: "h1" },
          { _tag: "Resumed", warm: false, hostId: null },
          { _tag: "Queued" },
        ])
      }),
    ),
    kase(
      "a committed move is in the history with its phases, a refused one with its estimate",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 4096)
        yield* addHost("b", 16384)
        yield* sessionIn("s1", "running")
        const refused = yield* s.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 600 })
        yield* s.abortMove(refused.id, "ErrMoveDowntime: estimate 812 ms > 600 ms", { estimateMs: 812 })
        const moved = yield* s.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 600 })
        const phases = { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 }
        yield* commitAfterFinal(moved.id, phases)
        const h = (yield* events("s1")).slice(3)
        expect(h).toStrictEqual([
          { _tag: "MoveBegun", moveId: refused.id, hostId: "a", targetHostId: "b" },
          { _tag: "MoveAborted", moveId: refused.id, hostId: "a", reason: "ErrMoveDowntime: estimate 812 ms > 600 ms", estimateMs: 812 },
          { _tag: "MoveBegun", moveId: moved.id, hostId: "a", targetHostId: "b" },
          { _tag: "Moved", moveId: moved.id, fromHostId: "a", toHostId: "b", phases },
        ])
      }),
    ),
    kase(
      "a reclaim writes the history of what it changed: a lost session, and a moving one whose move closed first",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 8192)
        yield* addHost("b", 8192)
        yield* sessionIn("p1", "parked")
        const m = yield* sessionIn("m1", "moving")
        const move = (yield* s.openMove("m1"))!
        yield* TestClock.adjust(s.limits().heartbeatStaleWindowMs + 1)
        yield* s.reclaim()
        const lastOf = (id: string) => Effect.map(events(id), (e) => e.slice(-2))
        expect((yield* lastOf("p1"))[1]).toStrictEqual({ _tag: "Lost", hostId: "a" })
        // Both of m1's entries went stale: whichever the plan judged first (entries go in id order) names why the move closed.
        const [aborted, lost] = yield* lastOf("m1")
        expect(aborted).toMatchObject({ _tag: "MoveAborted", moveId: move.id, hostId: m.hostId, estimateMs: null })
        expect(["session lost: its reservation was reclaimed", "move target's reservation was reclaimed"]).toContain(
          (aborted as Extract<Session.Event, { _tag: "MoveAborted" }>).reason,
        )
        expect(lost).toStrictEqual({ _tag: "Lost", hostId: m.hostId })
        yield* s.endSession("p1")
        expect((yield* lastOf("p1"))[1]).toStrictEqual({ _tag: "Ended", hostId: null })
      }),
    ),
    kase(
      "a failed operation writes no history; a repeated create writes nothing new",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", budget)
        const before = yield* history("s1")
        yield* expectFailure(s.idle("s1"), "IllegalTransition")
        yield* expectFailure(s.finishDescent("s1"), "IllegalTransition")
        yield* expectFailure(s.createSession({ id: "s1", budget: { memMib: 2048, vcpus: 1 } }), "Conflict")
        yield* s.createSession({ id: "s1", budget })
        expect(yield* history("s1")).toStrictEqual(before)
        yield* expectFailure(s.createSession({ id: "big", budget: { memMib: 1 << 20, vcpus: 1 }, onNoRoom: "refuse" }), "NoRoom")
        yield* expectFailure(s.sessionEvents("big"), "NotFound")
      }),
    ),
    kase(
      "a host's agent reports a guest of its own session lost: a GuestLost event with its reason, the session unchanged; another host's, an ended or unknown session, or a bad reason is refused and writes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* sessionIn("s1", "parked")
        const before = yield* s.getSession("s1")
        expect(before.hostId).toBe("h1")
        const other = before.hostId === "h1" ? "h2" : "h1"
        yield* TestClock.adjust(50)
        const after = yield* s.recordGuestLost("h1", "s1", "QEMU exited")
        expect(after).toStrictEqual(before)
        expect(yield* s.getSession("s1")).toStrictEqual(before)
        const h = yield* history("s1")
        expect(h.at(-1)).toMatchObject({ seq: h.length, at: 50, event: { _tag: "GuestLost", hostId: "h1", reason: "QEMU exited" } })
        // Still parked there: it resumes warm as before.
        expect((yield* s.resume("s1")).session.state).toBe("running")
        const kept = yield* history("s1")
        // Refused, and nothing written: another host's agent, a bad reason or host id, an unknown session, an ended one.
        expect((yield* expectFailure(s.recordGuestLost(other, "s1", "QEMU exited"), "Conflict")).reason).toContain(`not on host ${other}`)
        expect((yield* expectFailure(s.recordGuestLost("h1", "s1", ""), "InvalidInput")).field).toBe("reason")
        expect((yield* expectFailure(s.recordGuestLost("h1", "s1", "a\u0000b"), "InvalidInput")).field).toBe("reason")
        expect((yield* expectFailure(s.recordGuestLost("../h1", "s1", "x"), "InvalidInput")).field).toBe("hostId")
        yield* expectFailure(s.recordGuestLost("h1", "nobody", "x"), "NotFound")
        expect(yield* history("s1")).toStrictEqual(kept)
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "h1" })
        yield* s.endSession("s1")
        const ended = yield* history("s1")
        yield* expectFailure(s.recordGuestLost("h1", "s1", "QEMU exited"), "IllegalTransition")
        expect(yield* history("s1")).toStrictEqual(ended)
      }),
    ),
    kase(
      "a lost guest reported after a move took its session away: recorded from the host that move left, with the move and where the session went, the session unchanged; from another host, or from a host left by an earlier move, refused and nothing written",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 4096)
        yield* addHost("b", 16384)
        yield* addHost("c", 8192)
        yield* sessionIn("s1", "running")
        expect((yield* s.getSession("s1")).hostId).toBe("a")
        // No move yet: only its own host reports it.
        expect((yield* expectFailure(s.recordGuestLost("b", "s1", "QEMU exited"), "Conflict")).reason).toContain("not on host b")
        const first = yield* s.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 600 })
        yield* commitAfterFinal(first.id, { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 })
        const before = yield* s.getSession("s1")
        expect(before).toMatchObject({ state: "running", hostId: "b" })
        yield* TestClock.adjust(50)
        // a's report waited while the move committed: the copy lost on a, before the move.
        expect(yield* s.recordGuestLost("a", "s1", "QEMU exited")).toStrictEqual(before)
        expect(yield* s.getSession("s1")).toStrictEqual(before)
        const h = yield* history("s1")
        expect(h.at(-1)).toMatchObject({ seq: h.length, at: 50, event: { _tag: "GuestLost", hostId: "a", reason: "QEMU exited", moveId: first.id, toHostId: "b" } })
        // Told again (its answer lost): that loss is in the history once; refused, nothing written.
        expect((yield* expectFailure(s.recordGuestLost("a", "s1", "QEMU exited"), "Conflict")).reason).toContain("not on host a")
        expect(yield* history("s1")).toStrictEqual(h)
        // The session's own host now: as before, without a move.
        yield* s.recordGuestLost("b", "s1", "not found at start")
        expect((yield* events("s1")).at(-1)).toStrictEqual({ _tag: "GuestLost", hostId: "b", reason: "not found at start" })
        const kept = yield* history("s1")
        // A host the session never left by a move: refused.
        expect((yield* expectFailure(s.recordGuestLost("c", "s1", "QEMU exited"), "Conflict")).reason).toContain("not on host c")
        expect(yield* history("s1")).toStrictEqual(kept)
        // A later move from b to c: a's stint is no longer the latest left, b's is.
        const second = yield* s.beginMove({ sessionId: "s1", targetHostId: "c", maxDowntimeMs: 600 })
        yield* commitAfterFinal(second.id, { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 })
        const moved = yield* history("s1")
        expect((yield* expectFailure(s.recordGuestLost("a", "s1", "QEMU exited"), "Conflict")).reason).toContain("not on host a")
        expect(yield* history("s1")).toStrictEqual(moved)
        // b was the session's host after the first move (its own report above names it): a report
        // of b after the second move is of the copy that move left, told once.
        const beforeB = yield* history("s1")
        yield* s.recordGuestLost("b", "s1", "QEMU exited")
        expect((yield* events("s1")).at(-1)).toStrictEqual({ _tag: "GuestLost", hostId: "b", reason: "QEMU exited", moveId: second.id, toHostId: "c" })
        expect((yield* history("s1")).length).toBe(beforeB.length + 1)
        // An ended session has no guest to lose, whichever host asks.
        yield* s.endSession("s1")
        const ended = yield* history("s1")
        yield* expectFailure(s.recordGuestLost("b", "s1", "QEMU exited"), "IllegalTransition")
        expect(yield* history("s1")).toStrictEqual(ended)
      }),
    ),
    kase(
      "history pages: at most limit events from the cursor on, a null cursor after the last; unknown sessions and bad cursors are refused",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "parked")
        const all = yield* s.sessionEvents("s1")
        expect(all.items.map((e) => e.event._tag)).toStrictEqual(["Created", "Placed", "Running", "Parked"])
        expect(all.nextCursor).toBeNull()
        const first = yield* s.sessionEvents("s1", { limit: 2 })
        expect(first.items.map((e) => e.seq)).toStrictEqual([1, 2])
        const rest = yield* s.sessionEvents("s1", { limit: 2, cursor: first.nextCursor ?? undefined })
        expect(rest.items.map((e) => e.seq)).toStrictEqual([3, 4])
        expect(rest.nextCursor).toBeNull()
        // A cursor stays good as history grows: what came after it is the next page.
        yield* s.resume("s1")
        const grown = yield* s.sessionEvents("s1", { cursor: first.nextCursor ?? undefined })
        expect(grown.items.map((e) => (e.event as Session.Event)._tag)).toStrictEqual(["Running", "Parked", "Resumed"])
        yield* expectFailure(s.sessionEvents("nope"), "NotFound")
        expect((yield* expectFailure(s.sessionEvents("s1", { cursor: "garbage" }), "InvalidInput")).field).toBe("cursor")
        expect((yield* expectFailure(s.sessionEvents("s1", { limit: 0 }), "InvalidInput")).field).toBe("limit")
      }),
    ),
  ],
}
