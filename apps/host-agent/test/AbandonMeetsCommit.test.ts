/**
 * A source abandons a move (it ends it without a commit: the guest runs on the source again) and
 * its abort is refused (409) because the move was committed meanwhile. With the intent off (the
 * default), the final round's record in the pause may land with its answer lost while the send
 * completes: the source gives the pause back and aborts, but the coordinator holds the final round
 * (the move is in doubt), the target holds a complete stream, and an operator's commit of the
 * in-doubt move (`engram moves commit`) can land before the abort. The target then resumes the
 * guest from its stream itself (its reconcile's `commitIncomingHere`), without the source's commit.
 *
 * Before, the source took the 409 for "already aborted": it kept its running copy beside the one
 * the coordinator places on the target (two running copies, until its reconcile destroyed its own
 * as no longer assigned), or, the target not having acted yet, told the target to drop its
 * complete stream, so the guest was booted afresh there (its memory lost). Guard: a refused abort
 * is read; a move read committed is settled with the target's word (the owed-outcome machinery:
 * the source copy paused, the target asked to commit), so exactly one copy runs, where the
 * coordinator says.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { effect } from "./support/PatientClock.js"
import { makeFleet, type TestHost, moveBegunAToB } from "./support/InProcess.js"
import { finalRoundAnswerLost } from "./support/LostAnswers.js"

/**
 * Two hosts with the intent off. Host a's record of move m1's final round lands on the coordinator,
 * but its answer is lost, and every later try of it fails (the coordinator unreachable for it):
 * the source gives the pause back after the send completed. Before host a's abort of m1 arrives,
 * an operator commits m1 (its final round recorded: in doubt) and, with `targetFirst`, the
 * target's agent resumes the guest from its complete stream (as its reconcile does for a move the
 * coordinator holds committed).
 */
const abandonedWhileCommitted = (targetFirst: boolean) =>
  Effect.gen(function* () {
    let committed = false
    /** Set once the fleet is built: the operator's commit of a move, and the hosts. */
    const later: { operatorCommits: (id: string) => Effect.Effect<void>; hosts: readonly TestHost[] } = { operatorCommits: () => Effect.void, hosts: [] }
    const fleet = yield* makeFleet(
      [
        { hostId: "a", sim: SimRuntime.defaultSimConfig },
        { hostId: "b", sim: SimRuntime.defaultSimConfig },
      ],
      {
        moveIntent: false,
        wrapCoordinator: (client, hostId) =>
          hostId !== "a"
            ? client
            : {
                ...client,
                round: finalRoundAnswerLost(client),
                abort: (id, reason, estimateMs) =>
                  Effect.gen(function* () {
                    if (!committed) {
                      committed = true
                      yield* later.operatorCommits(id)
                      if (targetFirst) {
                        const b = later.hosts[1]!
                        const vm = (yield* b.residents.get("s1"))!
                        yield* b.target.commit({ moveId: id, sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: vm.memMib, vcpus: vm.vcpus }, { adopt: { reservationId: `res-move-${id}` } }).pipe(Effect.orDie)
                      }
                    }
                    return yield* client.abort(id, reason, estimateMs)
                  }),
              },
      },
    )
    later.hosts = fleet.hosts
    /** The operator's commit of the in-doubt move (as `engram moves commit`): the session is placed on the target. */
    later.operatorCommits = (id) =>
      Ref.update(fleet.coordinator.ref, (s) => ({
        ...s,
        moves: new Map(s.moves).set(id, { ...s.moves.get(id)!, state: "committed" }),
        sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: `res-move-${id}` }),
      }))
    const { a, b, copies } = yield* moveBegunAToB(fleet)
    assert.isTrue(committed, "the source abandoned the move and its abort met the operator's commit")
    assert.deepStrictEqual((yield* fleet.coordinator.get).moves.get("m1")?.state, "committed")
    return { fleet, a, b, copies }
  })

describe("a source's abort refused because the move was committed meanwhile", () => {
  effect("the target runs the guest already: the source drops its copy, never two running copies", () =>
    Effect.gen(function* () {
      const { fleet, a, b, copies } = yield* abandonedWhileCommitted(true)
      // Before: { a: [["s1", "running"]], b: [["s1", "running"]] } after the move's action.
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "one running copy, where the coordinator places the session")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] })
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from its stream, not booted")
    }),
  )

  effect("the target has not acted yet: it is asked to commit its complete stream, not told to drop it; the source drops its copy", () =>
    Effect.gen(function* () {
      const { fleet, a, b, copies } = yield* abandonedWhileCommitted(false)
      // Before: the target dropped its incoming VM (a complete stream); the source ran on until
      // its reconcile destroyed its copy, and the target booted the session afresh (memory lost).
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] })
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] })
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from its stream, not booted")
      assert.deepStrictEqual((yield* b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
    }),
  )
})
