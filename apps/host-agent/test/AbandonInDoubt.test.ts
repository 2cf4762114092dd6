/**
 * A source abandons a move (it ends it without a commit), its abort is refused (409: the move is
 * no longer pending, so aborted or committed) and the move then cannot be read. Which it was is
 * not known: committed, the coordinator places the session on the target, whose reconcile resumes
 * the guest from its complete stream (`commitIncomingHere`); aborted, the copy here is the only one.
 *
 * Before, the source took the unreadable move as an abort not acknowledged and kept its copy
 * running; on the next pass the move was no longer pending in its assignments, so nothing read it
 * again: a committed move left two running copies until the source's reconcile destroyed its own
 * without asking the target. Guard: the copy is paused and owed (an `abandoned` debt); a later
 * pass reads the move: committed → the target's word decides (one copy, on the target); aborted →
 * the target drops what it got and the guest resumes on the source.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { CoordinatorError } from "../src/Coordinator.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet, type TestHost, moveBegunAToB } from "./support/InProcess.js"
import { finalRoundAnswerLost } from "./support/LostAnswers.js"

/**
 * Two hosts with the intent off. Host a's record of move m1's final round lands, but its answer is
 * lost and every later try fails: the source gives the pause back and aborts. Before its abort
 * arrives the move ends: an operator commits it (in doubt: its final round is recorded) and the
 * target resumes the guest from its complete stream, or the coordinator aborts it. The abort is
 * refused (409), and host a's next read of the move fails (every try of it).
 */
const abandonedUnread = (endsAs: "committed" | "aborted") =>
  Effect.gen(function* () {
    let ended = false
    /** Host a's reads of a move that fail from now on (one read: its first try and 4 retries). */
    let unreadable = 0
    const later: { hosts: readonly TestHost[]; ends: (id: string) => Effect.Effect<void> } = { hosts: [], ends: () => Effect.void }
    /** The moves the source asked the target to commit (answered), over the peer link. */
    const asked: string[] = []
    const fleet = yield* makeFleet(
      [
        { hostId: "a", sim: SimRuntime.defaultSimConfig },
        { hostId: "b", sim: SimRuntime.defaultSimConfig },
      ],
      {
        moveIntent: false,
        wrapLink: (link) => ({ ...link, commit: (h) => link.commit(h).pipe(Effect.tap(() => Effect.sync(() => void asked.push(h.moveId)))) }),
        wrapCoordinator: (client, hostId) =>
          hostId !== "a"
            ? client
            : {
                ...client,
                round: finalRoundAnswerLost(client),
                abort: (id, reason, estimateMs) =>
                  Effect.gen(function* () {
                    if (!ended) {
                      ended = true
                      yield* later.ends(id)
                      const refused = yield* client.abort(id, reason, estimateMs).pipe(Effect.result)
                      if (refused._tag === "Success") return assert.fail("the abort of an ended move was taken")
                      unreadable = 5
                      return yield* Effect.fail(refused.failure)
                    }
                    return yield* client.abort(id, reason, estimateMs)
                  }),
                getMove: (id) =>
                  Effect.suspend(() =>
                    unreadable > 0
                      ? (unreadable--, Effect.fail(new CoordinatorError({ op: "getMove", status: null, message: "timed out" })))
                      : client.getMove(id),
                  ),
              },
      },
    )
    later.hosts = fleet.hosts
    later.ends = (id) =>
      Effect.gen(function* () {
        if (endsAs === "aborted") {
          // As a timeout or an operator's abort: the session runs on the source again.
          yield* Ref.update(fleet.coordinator.ref, (s) => ({
            ...s,
            moves: new Map(s.moves).set(id, { ...s.moves.get(id)!, state: "aborted", abortReason: "an operator's abort" }),
            sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running" }),
          }))
          return
        }
        // The operator's commit of the in-doubt move (as `engram moves commit`): the session is placed on the target,
        yield* Ref.update(fleet.coordinator.ref, (s) => ({
          ...s,
          moves: new Map(s.moves).set(id, { ...s.moves.get(id)!, state: "committed" }),
          sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: `res-move-${id}` }),
        }))
        // and the target's reconcile resumes the guest from its complete stream (`commitIncomingHere`).
        const b = later.hosts[1]!
        const vm = (yield* b.residents.get("s1"))!
        yield* b.target.commit({ moveId: id, sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: vm.memMib, vcpus: vm.vcpus }, { adopt: { reservationId: `res-move-${id}` } }).pipe(Effect.orDie)
      })
    const { a, b, copies } = yield* moveBegunAToB(fleet)
    assert.isTrue(ended, "the source abandoned the move and its abort was refused")
    assert.strictEqual(unreadable, 0, "the read after the refused abort failed")
    assert.deepStrictEqual((yield* fleet.coordinator.get).moves.get("m1")?.state, endsAs)
    return { fleet, a, b, copies, asked }
  })

describe("a source's abort refused and the move then unreadable", () => {
  effect("committed: the source copy is paused, not run beside the target's; a later pass leaves one copy, on the target", () =>
    Effect.gen(function* () {
      const { fleet, a, b, copies, asked } = yield* abandonedUnread("committed")
      // Before: the source's copy ran on beside the target's (the abort taken as not acknowledged),
      // until its retry pass's reconcile destroyed it as no longer assigned, the target never asked.
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [["s1", "running"]] }, "never two running copies")
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.abandoned]), [["m1", true]], "the outcome is owed")
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "one copy, where the coordinator places the session")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual(asked, ["m1"], "the source copy went on the target's word")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from its stream, not booted")
    }),
  )

  effect("aborted: the source copy is paused while unread, then the guest resumes on the source (not destroyed) and the target drops what it got", () =>
    Effect.gen(function* () {
      const { fleet, a, b, copies, asked } = yield* abandonedUnread("aborted")
      const first = yield* copies
      assert.deepStrictEqual(first.a, [["s1", "paused"]], "the source copy waits for the move's read")
      assert.isFalse(first.b.some(([, status]) => status === "running"), "the target never runs the guest of an aborted move")
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the guest runs on the source, its only copy")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual((yield* a.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1, "resumed from its pause, never booted again")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0)
      assert.deepStrictEqual(asked, [], "the target was never asked to commit an aborted move")
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] })
    }),
  )
})
