/**
 * An operator commits an in-doubt move (`engram moves commit`) whose target never got the
 * source's commit (the link went down right after the final round was sent). Before, both copies
 * of the guest went: the source's reconcile destroyed its paused copy as "no longer assigned to
 * this host" although it still owed the move (the target had not confirmed it runs the guest),
 * and the target's reconcile cleared the move of its incoming VM, never committed, and tried to
 * unpark it as if it ran. Guards: a source never destroys by reconcile a copy whose move it owes
 * (only settling the debt decides), and a target commits an incoming VM of a move the coordinator
 * holds committed (the guest resumes from its stream) instead of clearing its move.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { PeerError } from "../src/MoveTarget.js"
import { effect } from "./support/PatientClock.js"
import { copiesOn, makeFleet } from "./support/InProcess.js"

describe("an in-doubt move committed by an operator while the target never got the source's commit", () => {
  effect("the target resumes the guest from its stream, the source keeps its paused copy until the target confirms, then drops it", () =>
    Effect.gen(function* () {
      let cut = false
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          onSent: (_c, hostId) => Effect.sync(() => void (hostId === "a" && (cut = true))),
          wrapLink: (link) => ({
            ...link,
            commit: (h) => (cut ? Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message: "link down", refused: false })) : link.commit(h)),
          }),
        },
      )
      const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
      const copies = copiesOn(a, b)
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.settle()
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      yield* fleet.settle(1)
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.phases]), [["m1", null]], "the source owes the move, its commit unconfirmed")
      assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]])
      // The operator resolves the in-doubt move: commit (as `engram moves commit m1`).
      yield* Ref.update(fleet.coordinator.ref, (s) => ({
        ...s,
        moves: new Map(s.moves).set("m1", { ...s.moves.get("m1")!, state: "committed" }),
        sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: "res-move-m1" }),
      }))
      yield* fleet.settle(3)
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [["s1", "running"]] }, "the target runs the guest; the source keeps its paused copy while the link is down")
      assert.deepStrictEqual((yield* b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "resumed from its stream, not booted")
      // The link is back: the target confirms it runs the guest; the source drops its copy.
      cut = false
      yield* fleet.settle(3)
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] })
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0)
    }),
  )
})
