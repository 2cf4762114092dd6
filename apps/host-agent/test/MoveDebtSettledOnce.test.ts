/**
 * A source's debt (a move whose outcome it owes) is settled by one settle at a time. Two paths
 * settle a debt: the session's own action (its move, or its settle while the session is on this
 * host) and the pass's settle of a debt whose session is no longer on this host. Before, the
 * second ran beside the first when the session left this host while the first was in flight (an
 * operator's commit of the in-doubt move): both asked the target and the coordinator, both went on
 * to drop the local copy. Guard: the pass's settle runs in the session's own slot, so it waits
 * for (is skipped while) the session's action, and finds the debt settled after it.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Deferred, Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { PeerError } from "../src/MoveTarget.js"
import { effect, stepUntil } from "./support/PatientClock.js"
import { makeFleet, moveBegunAToB } from "./support/InProcess.js"

describe("a debt whose session leaves this host while its settle is in flight", () => {
  effect("is settled once: the pass's settle waits for the session's own, one commit asked, one copy left", () =>
    Effect.gen(function* () {
      let cut = false
      let commits = 0
      const held = yield* Deferred.make<void>()
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
          // Host a's first commit of the move waits until the test lets it go.
          wrapCoordinator: (client, hostId) =>
            hostId !== "a"
              ? client
              : { ...client, commit: (id, p, g) => Effect.suspend(() => (commits++ === 0 ? Deferred.await(held) : Effect.void)).pipe(Effect.andThen(client.commit(id, p, g))) },
        },
      )
      const { a, b, copies } = yield* moveBegunAToB(fleet)
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.phases]), [["m1", null]], "the source owes the move, its commit unconfirmed")
      // The link is back: the session's action settles the debt (the target runs the guest), its
      // commit held by the coordinator.
      cut = false
      yield* fleet.pass
      yield* stepUntil("the source's commit of the move", () => Effect.sync(() => commits === 1))
      // The operator commits the in-doubt move meanwhile: the session is placed on the target.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({
        ...s,
        moves: new Map(s.moves).set("m1", { ...s.moves.get("m1")!, state: "committed" }),
        sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: "res-move-m1" }),
      }))
      // A pass while the first settle is held: the session is no longer on host a.
      yield* fleet.pass
      yield* TestClock.adjust("10 seconds")
      // Before: 2 (a second settle of the same debt asked the coordinator again).
      assert.strictEqual(commits, 1, "no second settle of the debt while the first is in flight")
      yield* Deferred.succeed(held, undefined)
      yield* fleet.settle(3)
      assert.strictEqual(commits, 1, "the debt was settled once")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] })
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "resumed from its stream, not booted")
    }),
  )
})
