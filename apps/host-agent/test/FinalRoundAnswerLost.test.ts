/**
 * With the move intent off (the default), a final round recorded whose answer is lost, and an
 * abort the coordinator does not acknowledge, do not leave the move pending past its point of no
 * return for ever. Before, every later pass ran the move again: prepare, the full stream, the
 * guest paused, the final round refused (409: "the final round is recorded"), the guest resumed,
 * `Gone`, the session `moving` for good. Guards: a source that finds its move pending with the
 * final round recorded, no outcome owed and the guest running here aborts the move instead of
 * streaming it (the target never got a commit, so never ran the guest), and an abort not
 * acknowledged is asked again by a later pass, never re-run as a move.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect } from "effect"
import { CoordinatorError } from "../src/Coordinator.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet } from "./support/InProcess.js"

describe("intent off: the final round recorded, its answer lost, the abort unacknowledged", () => {
  effect("the source aborts the move once the coordinator answers, the guest running here and never paused again", () =>
    Effect.gen(function* () {
      let frozen = false
      let pauses = 0
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          moveIntent: false,
          onPause: (_c, hostId) => Effect.sync(() => void (hostId === "a" && pauses++)),
          wrapCoordinator: (client, hostId) =>
            hostId !== "a"
              ? client
              : {
                  ...client,
                  // The final round lands, then the coordinator freezes before answering.
                  round: (id, r) =>
                    r.kind === "final"
                      ? client.round(id, r).pipe(
                          Effect.andThen(Effect.sync(() => (frozen = true))),
                          Effect.andThen(Effect.fail(new CoordinatorError({ op: "round", status: null, message: "timed out (frozen)" }))),
                        )
                      : client.round(id, r),
                  abort: (id, reason, est) => (frozen ? Effect.fail(new CoordinatorError({ op: "abort", status: null, message: "timed out (frozen)" })) : client.abort(id, reason, est)),
                },
        },
      )
      const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.settle()
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      yield* fleet.settle(1)
      const first = (yield* fleet.coordinator.get).moves.get("m1")!
      assert.strictEqual(first.state, "pending")
      assert.isTrue(first.rounds.some((r) => r.kind === "final"), "the final round was recorded, its answer lost")
      assert.strictEqual(pauses, 1)
      // A pass while the coordinator still refuses the abort: the move is not streamed again.
      yield* fleet.settle(1)
      assert.strictEqual(pauses, 1, "the guest is not paused again while the abort is owed")
      // The coordinator thaws: the source's abort lands on a later pass.
      frozen = false
      yield* fleet.settle(3)
      const st = yield* fleet.coordinator.get
      assert.strictEqual(st.moves.get("m1")!.state, "aborted")
      assert.strictEqual(st.sessions.get("s1")!.hostId, "a")
      assert.strictEqual(st.sessions.get("s1")!.state, "running")
      assert.strictEqual(pauses, 1, "paused once, in the first run only")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* b.runtime.list, [])
    }),
  )
})
