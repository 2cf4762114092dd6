/**
 * Live moves (SPEC §5, the store's part): the target's reservation, one open move per
 * session, recorded rounds, commit handing the target's entry to the session, abort dropping it.
 */
import { type MoveRound, Validate } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, expectInvariants, expectUnchanged, kase, placed, reportFor, reservationsNow, sessionIn, snapshot, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 2048, vcpus: 2 }
const phases = { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 }
const round = (kind: MoveRound["kind"], wireBytes: number): MoveRound => ({
  kind,
  wireBytes,
  apparentBytes: wireBytes * 2,
  sendMs: 10,
  captureMs: 5,
})

/** The source's intent: the next round is the final one (no figures). */
const intent: MoveRound = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }

/** A running session `s1` on `src` (the snug host) and a roomier `dst`. */
const twoHosts = Effect.gen(function* () {
  yield* addHost("src", 4096)
  yield* addHost("dst", 16384)
  const x = yield* sessionIn("s1", "running", budget)
  expect(x.hostId).toBe("src")
  return x
})

export const moves: Group = {
  name: "moves",
  cases: [
    kase(
      "getMoves reads many moves at once: each found once, as getMove reads it; unknown ids left out",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const first = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.abortMove(first.id, "test")
        const second = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        const got = yield* s.getMoves([second.id, "nope", first.id, second.id])
        expect(got.map((m) => m.id).sort()).toStrictEqual([first.id, second.id].sort())
        for (const m of got) expect(m).toStrictEqual(yield* s.getMove(m.id))
        expect(got.find((m) => m.id === first.id)?.state).toBe("aborted")
        expect(got.find((m) => m.id === second.id)?.state).toBe("pending")
        expect(yield* s.getMoves([])).toStrictEqual([])
        expect(yield* s.getMoves(["nope"])).toStrictEqual([])
      }),
    ),
    kase(
      "latestMove reads the session's latest move whatever its state (the one begun last, moves begun within one millisecond included), as getMove reads it; null for a session that never moved or is unknown",
      Effect.gen(function* () {
        const s = yield* store
        // Optional in the interface (the coordinator falls back to the session's history): a store
        // without it switches this case off (`skip`, with its reason) rather than passing it unread.
        const read = s.latestMove
        if (read === undefined) return expect.fail("the store has no latestMove (optional): skip this case, stating why")
        yield* twoHosts
        yield* sessionIn("s2", "running", budget)
        expect(yield* read("s1")).toBeNull()
        // No time passes between the moves: their order is the history's, not a clock's.
        const first = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        expect(yield* read("s1")).toStrictEqual(yield* s.getMove(first.id))
        yield* s.abortMove(first.id, "test")
        expect(yield* read("s1")).toStrictEqual(yield* s.getMove(first.id))
        const second = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* commitAfterFinal(second.id, phases)
        expect(yield* read("s1")).toMatchObject({ id: second.id, state: "committed", sourceHostId: "src", targetHostId: "dst" })
        expect(yield* read("s1")).toStrictEqual(yield* s.getMove(second.id))
        // Back the other way: the latest names the new source and target.
        const third = yield* s.beginMove({ sessionId: "s1", targetHostId: "src", maxDowntimeMs: 600 })
        expect(yield* read("s1")).toMatchObject({ id: third.id, state: "pending", sourceHostId: "dst", targetHostId: "src" })
        expect(yield* read("s2")).toBeNull()
        expect(yield* read("nope")).toBeNull()
      }),
    ),
    kase(
      "a commit whose phases do not fit within the downtime is refused by name and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        const before = yield* snapshot
        const err = yield* expectFailure(s.commitMove(move.id, { downtimeMs: 100, captureMs: 40, sendMs: 80, commitMs: 420 }), "InvalidInput")
        expect([err.field, err.rule]).toStrictEqual(["downtimeMs", "must be >= captureMs + sendMs + commitMs"])
        const neg = yield* expectFailure(s.commitMove(move.id, { downtimeMs: -5, captureMs: 0, sendMs: 0, commitMs: 0 }), "InvalidInput")
        expect(neg.field).toBe("downtimeMs")
        yield* expectUnchanged(before, "a refused commit")
        expect((yield* s.getMove(move.id)).state).toBe("pending")
      }),
    ),
    kase(
      "a commit needs the move's final round recorded: without it, a Conflict and nothing changes",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, round("delta", 100))
        const before = yield* snapshot
        const err = yield* expectFailure(s.commitMove(move.id, phases), "Conflict")
        expect(err).toMatchObject({ entity: "move", id: move.id })
        expect(err.reason).toContain("final round")
        yield* expectUnchanged(before, "a commit without the final round")
        expect((yield* s.getMove(move.id)).state).toBe("pending")
        yield* s.recordRound(move.id, round("final", 10))
        expect((yield* s.commitMove(move.id, phases)).state).toBe("committed")
      }),
    ),
    kase(
      "no round follows the final round: a Conflict, and the rounds stay as they were",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, round("final", 10))
        for (const kind of ["delta", "final", "full"] as const) {
          const err = yield* expectFailure(s.recordRound(move.id, round(kind, 5)), "Conflict")
          expect(err).toMatchObject({ entity: "move", id: move.id })
        }
        expect((yield* s.getMove(move.id)).rounds.map((r) => r.kind)).toStrictEqual(["full", "final"])
      }),
    ),
    kase(
      "every phase of a commit is > 0: a phase of 0 is refused naming it, and nothing changes",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("final", 10))
        const before = yield* snapshot
        for (const field of ["captureMs", "sendMs", "commitMs", "downtimeMs"] as const) {
          const err = yield* expectFailure(s.commitMove(move.id, { ...phases, [field]: 0 }), "InvalidInput")
          expect([err.field, err.rule]).toStrictEqual([field, "must be a finite number > 0"])
        }
        expect((yield* expectFailure(s.commitMove(move.id, { ...phases, downtimeMs: 1e21 }), "InvalidInput")).field).toBe("downtimeMs")
        yield* expectUnchanged(before, "commits with a phase of 0")
        expect((yield* s.getMove(move.id)).state).toBe("pending")
      }),
    ),
    kase(
      "a move's maxDowntimeMs past 2^53 - 1 is refused by name; a fractional one is kept exactly",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const before = yield* snapshot
        expect((yield* expectFailure(s.beginMove({ sessionId: "s1", maxDowntimeMs: 1e21 }), "InvalidInput")).field).toBe("maxDowntimeMs")
        yield* expectUnchanged(before, "a move with a downtime budget past 2^53 - 1")
        expect((yield* s.beginMove({ sessionId: "s1", maxDowntimeMs: 600.5 })).maxDowntimeMs).toBe(600.5)
      }),
    ),
    kase(
      "text the store cannot hold (a NUL character), or a reason over its length, is refused by name, not stored",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        const before = yield* snapshot
        expect((yield* expectFailure(s.abortMove(move.id, "a\u0000b"), "InvalidInput")).field).toBe("reason")
        // A reason is shown in lists and logs: at most Validate.maxReasonLength characters.
        expect(yield* expectFailure(s.abortMove(move.id, "r".repeat(Validate.maxReasonLength + 1)), "InvalidInput")).toMatchObject({ field: "reason", rule: `must be at most ${Validate.maxReasonLength} characters` })
        const r = { ownerKind: "external" as const, ownerId: "x", hostId: "dst", memMib: 64, vcpus: 0 }
        expect((yield* expectFailure(s.reserve({ ...r, id: "r1", description: "a\u0000b" }), "InvalidInput")).field).toBe("description")
        expect((yield* expectFailure(s.reserve({ ...r, id: "r\u00001" }), "InvalidInput")).field).toBe("id")
        expect((yield* expectFailure(s.createSession({ id: "huge", budget: { memMib: 1e19, vcpus: 1 } }), "InvalidInput")).field).toBe("memMib")
        yield* expectUnchanged(before, "refused text and figures")
      }),
    ),
    kase(
      "an abort only before the final round refuses a move whose final round is recorded, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, round("final", 10))
        const before = yield* snapshot
        const err = yield* expectFailure(s.abortMove(move.id, "timeout", { onlyBeforeFinalRound: true }), "Conflict")
        expect(err.entity).toBe("move")
        yield* expectUnchanged(before, "a refused guarded abort")
        expect((yield* s.getMove(move.id)).state).toBe("pending")
        // The commit still lands.
        const done = yield* s.commitMove(move.id, phases)
        expect(done.state).toBe("committed")
        yield* expectInvariants
      }),
    ),
    kase(
      "an abort only before the final round refuses a move whose intent is recorded (its point of no return), and changes nothing; the source's own abort still ends it",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, intent)
        const before = yield* snapshot
        const err = yield* expectFailure(s.abortMove(move.id, "timeout", { onlyBeforeFinalRound: true }), "Conflict")
        expect(err).toMatchObject({ entity: "move", id: move.id })
        expect(err.reason).toContain("intent")
        yield* expectUnchanged(before, "a refused guarded abort")
        // The source's abort (its stream never completed, the target refused its commit) ends it.
        const aborted = yield* s.abortMove(move.id, "move failed: the target refused the commit")
        expect(aborted.state).toBe("aborted")
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src" })
        yield* expectInvariants
      }),
    ),
    kase(
      "an intent carries no figures (InvalidInput by name, nothing changes); a second intent changes nothing; rounds and the final round follow it; a measured commit still needs the final round",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        const before = yield* snapshot
        const bad = yield* expectFailure(s.recordRound(move.id, { ...intent, wireBytes: 5 }), "InvalidInput")
        expect([bad.field, bad.rule]).toStrictEqual(["wireBytes", "must be 0 for an intent (it carries no figures)"])
        yield* expectUnchanged(before, "a refused intent")
        yield* s.recordRound(move.id, intent)
        const again = yield* s.recordRound(move.id, intent)
        expect(again.rounds.map((r) => r.kind)).toStrictEqual(["full", "intent"])
        yield* s.recordRound(move.id, round("delta", 100))
        expect((yield* expectFailure(s.commitMove(move.id, phases), "Conflict")).reason).toContain("final round")
        yield* s.recordRound(move.id, round("final", 10))
        expect((yield* s.getMove(move.id)).rounds.map((r) => r.kind)).toStrictEqual(["full", "intent", "delta", "final"])
        expect((yield* s.commitMove(move.id, phases)).state).toBe("committed")
        yield* expectInvariants
      }),
    ),
    kase(
      "an abort only before the final round aborts a move still in its pre-copy rounds",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("delta", 1000))
        const aborted = yield* s.abortMove(move.id, "timeout", { onlyBeforeFinalRound: true })
        expect(aborted).toMatchObject({ state: "aborted", abortReason: "timeout" })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src" })
        expect(yield* reservationsNow(s, { hostId: "dst" })).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "listMoves lists moves oldest first, by host (source or target) and by state",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        yield* addHost("other", 8192)
        const first = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.abortMove(first.id, "test")
        yield* TestClock.adjust(5)
        const second = yield* s.beginMove({ sessionId: "s1", targetHostId: "other", maxDowntimeMs: 600 })
        expect((yield* s.listMoves()).map((m) => m.id)).toStrictEqual([first.id, second.id])
        expect((yield* s.listMoves({ hostId: "src" })).map((m) => m.id)).toStrictEqual([first.id, second.id])
        expect((yield* s.listMoves({ hostId: "dst" })).map((m) => m.id)).toStrictEqual([first.id])
        expect((yield* s.listMoves({ hostId: "other", state: "pending" })).map((m) => m.id)).toStrictEqual([second.id])
        expect(yield* s.listMoves({ state: "committed" })).toStrictEqual([])
        expect((yield* s.listMoves({ state: "pending" }))[0]).toStrictEqual(yield* s.getMove(second.id))
      }),
    ),
    kase(
      "beginMove with a target reserves it for the move and marks the session moving",
      Effect.gen(function* () {
        const s = yield* store
        const x = yield* twoHosts
        yield* TestClock.adjust(9)
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        expect(move).toMatchObject({
          sessionId: "s1",
          sourceHostId: "src",
          targetHostId: "dst",
          maxDowntimeMs: 600,
          state: "pending",
          rounds: [],
          phases: null,
          abortReason: null,
          abortEstimateMs: null,
          createdAt: 9,
          endedAt: null,
        })
        const target = yield* s.getReservation(move.reservationId)
        expect(target).toMatchObject({ hostId: "dst", ownerKind: "move", ownerId: move.id, memMib: 2048, vcpus: 2 })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "moving", hostId: "src", reservationId: x.reservationId })
        expect(yield* s.openMove("s1")).toStrictEqual(move)
        expect(yield* s.getMove(move.id)).toStrictEqual(move)
        yield* expectInvariants
      }),
    ),
    kase(
      "beginMove without a target picks the best ranked host other than the source",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        yield* addHost("mid", 4096)
        yield* addHost("cordoned", 2048)
        yield* s.setHostState("cordoned", "cordoned")
        const move = yield* s.beginMove({ sessionId: "s1", maxDowntimeMs: 600 })
        expect(move.targetHostId).toBe("mid")
      }),
    ),
    kase(
      "beginMove without a target goes only to a host that takes moves: the only host with room advertising no peer URL is refused as no_fit; one that does is chosen",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("src", 4096)
        yield* sessionIn("s1", "running", budget)
        // The only other host with room advertises no peer URL (its report has none): no source could reach it.
        yield* s.registerHost({ id: "dark" })
        yield* s.reportHost("dark", reportFor(8192, 8, s.limits()))
        expect((yield* s.getHost("dark")).peerUrl).toBeNull()
        const before = yield* snapshot
        const err = yield* expectFailure(s.beginMove({ sessionId: "s1", maxDowntimeMs: 600 }), "Refused")
        expect(err.check).toBe("no_fit")
        expect(err.reason).toBe("no host other than src that takes moves (its agent advertises a peer URL) has room for the session")
        yield* expectUnchanged(before, "a move with no host that takes moves")
        expect(yield* s.openMove("s1")).toBeNull()
        // A roomier host that advertises one: chosen, though the dark host fits tighter.
        yield* addHost("lit", 16384)
        const move = yield* s.beginMove({ sessionId: "s1", maxDowntimeMs: 600 })
        expect(move.targetHostId).toBe("lit")
        yield* expectInvariants
      }),
    ),
    kase(
      "beginMove without a target when no other host fits is refused as no_fit",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("src", 65536)
        yield* addHost("small", 1024)
        yield* sessionIn("s1", "running", budget)
        const before = yield* snapshot
        const err = yield* expectFailure(s.beginMove({ sessionId: "s1", maxDowntimeMs: 600 }), "Refused")
        expect(err.check).toBe("no_fit")
        yield* expectUnchanged(before, "a refused beginMove")
        expect(yield* s.openMove("s1")).toBeNull()
      }),
    ),
    kase(
      "beginMove to a target without room is refused as no_fit and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        yield* addHost("small", 1024)
        yield* addHost("off", 65536)
        yield* s.setHostState("off", "draining")
        const before = yield* snapshot
        expect((yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "small", maxDowntimeMs: 600 }), "Refused")).check).toBe("no_fit")
        expect((yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "off", maxDowntimeMs: 600 }), "Refused")).check).toBe("no_fit")
        yield* expectUnchanged(before, "a beginMove to a full target")
      }),
    ),
    kase(
      "beginMove to the source host is InvalidInput naming targetHostId",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const err = yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "src", maxDowntimeMs: 600 }), "InvalidInput")
        expect([err.field, err.rule]).toStrictEqual(["targetHostId", "must differ from the source host"])
      }),
    ),
    kase(
      "beginMove to an unknown target host is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const err = yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "nope", maxDowntimeMs: 600 }), "NotFound")
        expect(err).toMatchObject({ entity: "host", id: "nope" })
      }),
    ),
    kase(
      "beginMove of an unknown session is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        const err = yield* expectFailure(s.beginMove({ sessionId: "nope", maxDowntimeMs: 600 }), "NotFound")
        expect(err).toMatchObject({ entity: "session", id: "nope" })
      }),
    ),
    kase(
      "maxDowntimeMs must be a finite number > 0",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const before = yield* snapshot
        for (const maxDowntimeMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
          const err = yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs }), "InvalidInput")
          expect(err.field).toBe("maxDowntimeMs")
        }
        yield* expectUnchanged(before, "a bad maxDowntimeMs")
      }),
    ),
    kase(
      "beginMove of a session that is not running is an IllegalTransition to moving",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("src", 4096)
        yield* addHost("dst", 16384)
        yield* placed("p", budget)
        yield* sessionIn("k", "parked", { memMib: 1024, vcpus: 1 })
        for (const [id, from] of [
          ["p", "pending"],
          ["k", "parked"],
        ] as const) {
          const err = yield* expectFailure(s.beginMove({ sessionId: id, targetHostId: "dst", maxDowntimeMs: 600 }), "IllegalTransition")
          expect(err).toMatchObject({ sessionId: id, from, to: "moving" })
        }
        expect(yield* reservationsNow(s)).toHaveLength(2)
      }),
    ),
    kase(
      "a second beginMove while one is open is a Conflict on the move, checked before the state",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        yield* addHost("other", 16384)
        yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        const before = yield* snapshot
        const err = yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "other", maxDowntimeMs: 600 }), "Conflict")
        expect(err.entity).toBe("move")
        yield* expectUnchanged(before, "a second beginMove")
      }),
    ),
    kase(
      "recordRound appends the rounds in order",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, round("delta", 100))
        const after = yield* s.recordRound(move.id, round("delta", 10))
        expect(after.rounds).toStrictEqual([round("full", 1000), round("delta", 100), round("delta", 10)])
        expect((yield* s.getMove(move.id)).rounds).toHaveLength(3)
      }),
    ),
    kase(
      "a round with a position is recorded once: a repeat with the same figures (a retry whose answer was lost) changes nothing, the intent's and the final round's too",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, { ...round("full", 1000), seq: 0 })
        yield* s.recordRound(move.id, { ...round("delta", 100), seq: 1 })
        const before = yield* snapshot
        const again = yield* s.recordRound(move.id, { ...round("delta", 100), seq: 1 })
        expect(again.rounds).toStrictEqual([round("full", 1000), round("delta", 100)])
        yield* s.recordRound(move.id, { ...round("full", 1000), seq: 0 })
        yield* expectUnchanged(before, "a repeated round")
        yield* s.recordRound(move.id, { ...intent, seq: 2 })
        yield* s.recordRound(move.id, { ...intent, seq: 2 })
        yield* s.recordRound(move.id, { ...round("final", 10), seq: 3 })
        const final = yield* s.recordRound(move.id, { ...round("final", 10), seq: 3 })
        // The position is not kept on the round: its index in `rounds` is its position.
        expect(final.rounds).toStrictEqual([round("full", 1000), round("delta", 100), intent, round("final", 10)])
        expect((yield* s.getMove(move.id)).rounds).toStrictEqual(final.rounds)
        // Nothing new follows the final round, with a position or without.
        expect((yield* expectFailure(s.recordRound(move.id, { ...round("delta", 5), seq: 4 }), "Conflict")).reason).toContain("final round")
        expect((yield* s.commitMove(move.id, phases)).state).toBe("committed")
        // A finished move refuses even a repeat (the source learns that its move ended).
        expect((yield* expectFailure(s.recordRound(move.id, { ...round("final", 10), seq: 3 }), "Conflict")).reason).toContain("committed")
        yield* expectInvariants
      }),
    ),
    kase(
      "a round at a recorded position with other figures, or past the next position (a gap), or a second intent at a new position is a Conflict naming the rule, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, { ...round("full", 1000), seq: 0 })
        yield* s.recordRound(move.id, { ...intent, seq: 1 })
        const before = yield* snapshot
        const mismatch = yield* expectFailure(s.recordRound(move.id, { ...round("full", 999), seq: 0 }), "Conflict")
        expect(mismatch).toMatchObject({ entity: "move", id: move.id })
        expect(mismatch.reason).toContain("round 0 is recorded with other figures")
        const kind = yield* expectFailure(s.recordRound(move.id, { ...round("delta", 1000), seq: 0 }), "Conflict")
        expect(kind.reason).toContain("round 0 is recorded with other figures")
        const gap = yield* expectFailure(s.recordRound(move.id, { ...round("delta", 100), seq: 3 }), "Conflict")
        expect(gap.reason).toContain("round 3 leaves a gap: the move holds 2 rounds")
        const second = yield* expectFailure(s.recordRound(move.id, { ...intent, seq: 2 }), "Conflict")
        expect(second.reason).toContain("the intent is recorded")
        yield* expectUnchanged(before, "refused positions")
        // The next position is still open; a source that sends none appends as before.
        yield* s.recordRound(move.id, { ...round("delta", 100), seq: 2 })
        yield* s.recordRound(move.id, round("delta", 10))
        expect((yield* s.getMove(move.id)).rounds).toStrictEqual([round("full", 1000), intent, round("delta", 100), round("delta", 10)])
      }),
    ),
    kase(
      "a position that is not an integer >= 0 is InvalidInput naming seq, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, { ...round("full", 1000), seq: 0 })
        const before = yield* snapshot
        for (const seq of [-1, 0.5, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53]) {
          const err = yield* expectFailure(s.recordRound(move.id, { ...round("delta", 100), seq }), "InvalidInput")
          expect([err.field, err.rule]).toStrictEqual(["seq", "must be an integer >= 0 (the count of the move's records before this one)"])
        }
        yield* expectUnchanged(before, "bad positions")
      }),
    ),
    kase(
      "recordRound refuses negative or non-finite figures and unknown kinds",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        const bad: MoveRound[] = [
          { ...round("full", 1), wireBytes: -1 },
          { ...round("full", 1), apparentBytes: Number.NaN },
          { ...round("full", 1), sendMs: Number.POSITIVE_INFINITY },
          { ...round("full", 1), captureMs: -0.5 },
          { ...round("full", 1), kind: "partial" as unknown as "full" },
        ]
        for (const r of bad) yield* expectFailure(s.recordRound(move.id, r), "InvalidInput")
        expect((yield* s.getMove(move.id)).rounds).toStrictEqual([])
        yield* expectFailure(s.recordRound("nope", round("full", 1)), "NotFound")
      }),
    ),
    kase(
      "commitMove moves the session and its reservation to the target and releases the source",
      Effect.gen(function* () {
        const s = yield* store
        const x = yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.recordRound(move.id, round("full", 1000))
        yield* s.recordRound(move.id, round("final", 10))
        yield* TestClock.adjust(3000)
        const done = yield* s.commitMove(move.id, phases)
        expect(done).toMatchObject({ state: "committed", phases, endedAt: 3000, reservationId: move.reservationId })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
        expect(yield* s.getReservation(move.reservationId)).toMatchObject({ hostId: "dst", ownerKind: "session", ownerId: "s1" })
        yield* expectFailure(s.getReservation(x.reservationId as string), "NotFound")
        expect((yield* s.getHost("src")).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
        expect((yield* s.getHost("dst")).headroom.reserved).toStrictEqual(budget)
        expect(yield* s.openMove("s1")).toBeNull()
        yield* expectInvariants
      }),
    ),
    kase(
      "abortMove drops the target reservation and the session runs on the source",
      Effect.gen(function* () {
        const s = yield* store
        const x = yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* TestClock.adjust(50)
        const done = yield* s.abortMove(move.id, "ErrMoveDowntime: estimate 812 ms > 600 ms")
        expect(done).toMatchObject({ state: "aborted", abortReason: "ErrMoveDowntime: estimate 812 ms > 600 ms", abortEstimateMs: null, endedAt: 50, phases: null })
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: "src", reservationId: x.reservationId })
        yield* expectFailure(s.getReservation(move.reservationId), "NotFound")
        expect((yield* s.getHost("dst")).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
        expect(yield* s.openMove("s1")).toBeNull()
        yield* expectInvariants
      }),
    ),
    kase(
      "abortMove keeps the estimate it was refused on as a typed figure, and refuses a bad one by name",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, 1e21]) {
          expect((yield* expectFailure(s.abortMove(move.id, "ErrMoveDowntime", { estimateMs: bad }), "InvalidInput")).field).toBe("estimateMs")
        }
        expect(yield* s.getMove(move.id)).toMatchObject({ state: "pending", abortEstimateMs: null })
        const done = yield* s.abortMove(move.id, "ErrMoveDowntime", { estimateMs: 812.5 })
        expect(done).toMatchObject({ state: "aborted", abortReason: "ErrMoveDowntime", abortEstimateMs: 812.5 })
        expect((yield* s.getMove(move.id)).abortEstimateMs).toBe(812.5)
        yield* expectInvariants
      }),
    ),
    kase(
      "a finished move refuses rounds, commits and aborts as a Conflict",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const m1 = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.abortMove(m1.id, "test")
        const before = yield* snapshot
        yield* expectFailure(s.recordRound(m1.id, round("delta", 1)), "Conflict")
        yield* expectFailure(s.commitMove(m1.id, phases), "Conflict")
        yield* expectFailure(s.abortMove(m1.id, "again"), "Conflict")
        yield* expectUnchanged(before, "touching a finished move")
        const m2 = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* commitAfterFinal(m2.id, phases)
        yield* expectFailure(s.abortMove(m2.id, "late"), "Conflict")
        yield* expectFailure(s.commitMove(m2.id, phases), "Conflict")
        expect((yield* s.getMove(m2.id)).state).toBe("committed")
      }),
    ),
    kase(
      "commit, abort and getMove of an unknown move are NotFound",
      Effect.gen(function* () {
        const s = yield* store
        yield* expectFailure(s.commitMove("nope", phases), "NotFound")
        yield* expectFailure(s.abortMove("nope", "x"), "NotFound")
        yield* expectFailure(s.getMove("nope"), "NotFound")
        expect(yield* s.openMove("nope")).toBeNull()
      }),
    ),
    kase(
      "after a move ends a new move of the same session may begin",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const m1 = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* commitAfterFinal(m1.id, phases)
        const m2 = yield* s.beginMove({ sessionId: "s1", targetHostId: "src", maxDowntimeMs: 600 })
        expect(m2.id).not.toBe(m1.id)
        expect(m2).toMatchObject({ sourceHostId: "dst", targetHostId: "src", state: "pending" })
      }),
    ),
    kase(
      "ending a moving session aborts its move and releases both reservations",
      Effect.gen(function* () {
        const s = yield* store
        yield* twoHosts
        const move = yield* s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
        yield* s.endSession("s1")
        expect((yield* s.getMove(move.id)).state).toBe("aborted")
        expect(yield* reservationsNow(s)).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "a move's target reservation takes room from the target host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("src", 2048)
        yield* addHost("dst", 2048)
        const x = yield* sessionIn("s1", "running", budget)
        const move = yield* s.beginMove({ sessionId: "s1", maxDowntimeMs: 600 })
        expect(move.targetHostId).not.toBe(x.hostId)
        const outcome = yield* s.createSession({ id: "s2", budget })
        expect(outcome._tag).toBe("Queued")
      }),
    ),
  ],
}
