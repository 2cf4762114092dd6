/**
 * A host's assignments in one read (`hostAssignments`): the same sessions and pending moves as
 * the reads it stands for (`listSessions`, `listMoves`), filtered alike, for a host that exists.
 */
import { assignedStates } from "@engram/store"
import type { SessionState } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, kase, placed, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }
const assigned: ReadonlySet<SessionState> = new Set(assignedStates)
// Queued after the parked ones (a queued session without room keeps a session from parking),
// lost last (reaching it moves the clock past every other reservation's stale window).
const everyState: readonly SessionState[] = ["pending", "running", "parked", "descending", "descended", "moving", "ended", "queued", "lost"]

/** A running session on `hostId` (its affinity), its move to `targetHostId` begun. */
const movingFrom = (id: string, hostId: string, targetHostId: string) =>
  Effect.gen(function* () {
    const s = yield* store
    expect((yield* placed(id, budget, [hostId])).hostId).toBe(hostId)
    yield* s.markRunning(id)
    return yield* s.beginMove({ sessionId: id, targetHostId, maxDowntimeMs: 600 })
  })

/**
 * Two hosts with moves both ways (pending, committed, aborted) and sessions in every state, a
 * third host with nothing.
 */
const fleet = Effect.gen(function* () {
  const s = yield* store
  yield* addHost("a", 65_536)
  yield* addHost("b", 65_536)
  yield* addHost("idle", 65_536)
  const step = TestClock.adjust(1)
  const ab = yield* movingFrom("ab", "a", "b")
  yield* s.recordRound(ab.id, { kind: "full", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 })
  yield* step
  yield* movingFrom("ba", "b", "a")
  yield* step
  const committed = yield* movingFrom("committed", "a", "b")
  yield* commitAfterFinal(committed.id, { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 })
  yield* step
  const aborted = yield* movingFrom("aborted", "b", "a")
  yield* s.abortMove(aborted.id, "refused (test)")
  for (const state of everyState)
    for (const n of [1, 2]) {
      yield* step
      yield* sessionIn(`${state}-${n}`, state)
    }
})

export const assignments: Group = {
  name: "assignments",
  cases: [
    kase(
      "a host's assignments are its id, its sessions in the assigned states and its pending moves, oldest first",
      Effect.gen(function* () {
        const s = yield* store
        yield* fleet
        const seenStates = new Set<SessionState>()
        for (const hostId of ["a", "b", "idle"]) {
          const one = yield* s.hostAssignments(hostId)
          // Only the id of the host's record (the coordinator discards the rest; `getHost` answers it).
          expect(Object.keys(one).sort()).toStrictEqual(["hostId", "imageSessionIds", "moves", "sessions"])
          expect(one.hostId).toBe(hostId)
          const onHost = yield* s.listSessions({ hostId })
          expect(one.sessions).toStrictEqual(onHost.filter((x) => assigned.has(x.state)))
          const moves = yield* s.listMoves({ hostId, state: "pending" })
          expect(one.moves).toStrictEqual(moves)
          one.sessions.forEach((x) => seenStates.add(x.state))
          if (hostId === "idle") continue
          // The fleet holds what the filters must drop, and moves both ways.
          expect((yield* s.listMoves({ hostId })).length).toBeGreaterThan(moves.length)
          expect(one.moves.some((m) => m.sourceHostId === hostId)).toBe(true)
          expect(one.moves.some((m) => m.targetHostId === hostId)).toBe(true)
        }
        expect([...seenStates].sort()).toStrictEqual([...assignedStates].sort())
      }),
    ),
    kase(
      "the assignments of an unknown host are NotFound",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 4096)
        const err = yield* expectFailure(s.hostAssignments("nope"), "NotFound")
        expect(err).toMatchObject({ entity: "host", id: "nope" })
      }),
    ),
  ],
}
