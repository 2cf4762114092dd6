/**
 * An operator commits a move (`engram moves commit`, the coordinator's resolve) while its source
 * is still in its pre-copy rounds. With the intent on and a runtime that takes it before the first
 * round (QEMU: it may stop the guest at any pass), the move is past its point of no return from
 * the start, and a resolution's commit needs only that (SPEC §13, core's `refuseCommit` without
 * phases): the coordinator accepts it, places the session on the target, and refuses (409) the
 * source's next round records. The target holds only pre-copy rounds: no complete stream.
 *
 * Before, the source took the refused round for "the move is gone": it gave the pause back, told
 * the target to drop what it got, and its reconcile then destroyed its running copy as no longer
 * this host's; the target booted the session afresh. One copy, its memory lost. Guard: a refused
 * pre-copy round is read back; a move read committed goes on (the final round is sent, the target
 * commits from a complete stream where the coordinator places the session, the source's copy goes
 * once the target runs the guest), so the guest keeps its memory.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { CoordinatorError } from "../src/Coordinator.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet, moveBegunAToB, operatorCommitsAtIntent } from "./support/InProcess.js"
import { capture } from "./support/Logs.js"

describe("an operator's commit of a move still in its pre-copy rounds", () => {
  effect("the source goes on and sends the final round: the guest resumes on the target from its stream, never booted afresh", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const operator = operatorCommitsAtIntent()
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          // As QEMU: the intent is taken before the first round; then the operator commits (the source frozen, unheard).
          intentFirst: operator.intentFirst,
        },
      )
      const { a, b, copies } = yield* moveBegunAToB(fleet)
      assert.deepStrictEqual(operator.seen.committedAt, ["intent"], "the operator's commit landed with only the intent recorded, before any pre-copy round")
      yield* fleet.settle()
      // Before: { a: [], b: [["s1", "running"]] } with the target's guest booted afresh (starts 1).
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "one running copy, where the coordinator places the session")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from its stream, not booted: its memory kept")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual((yield* b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
      assert.isTrue(warnings.lines.some((l) => l.message.startsWith("a pre-copy round was refused: the move was committed") && l.fields["moveId"] === "m1"), "the source read the refused round back")
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("a refused round whose move cannot be read gives the pause back, as an abort: nothing reaches the target's commit, the guest runs on here", () =>
    Effect.gen(function* () {
      // An admin aborts the move during its pre-copy rounds, and the coordinator then cannot be
      // read by the source. A refusal is far more often an abort than an operator's commit: going
      // on would run the guest on the target from the paused copy, then roll it back here.
      let unreadable = false
      const commitsAsked: string[] = []
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          intentFirst: (coordinator, hostId) =>
            hostId !== "a"
              ? Effect.void
              : Ref.update(coordinator.ref, (s) => {
                  unreadable = true
                  const m = s.moves.get("m1")!
                  return { ...s, moves: new Map(s.moves).set("m1", { ...m, state: "aborted" }) }
                }),
          wrapCoordinator: (client, hostId) =>
            hostId !== "a"
              ? client
              : {
                  ...client,
                  getMove: (id) =>
                    unreadable ? Effect.fail(new CoordinatorError({ op: "getMove", status: null, message: "the coordinator does not answer (test)" })) : client.getMove(id),
                },
          wrapLink: (link) => ({ ...link, commit: (h) => Effect.andThen(Effect.sync(() => void commitsAsked.push(h.moveId)), link.commit(h)) }),
        },
      )
      const { a, copies } = yield* moveBegunAToB(fleet)
      assert.isTrue(unreadable, "the move was aborted after its intent")
      unreadable = false
      yield* fleet.settle()
      assert.deepStrictEqual(commitsAsked, [], "the target was never asked to commit")
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the guest runs on here, its only copy")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }),
  )
})
