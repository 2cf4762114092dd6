/**
 * A session moved A→B (move m1) leaves B by a second move (m2, B→C) before B's agent cleared the
 * first move's id from its VM: the coordinator placed the session on B and moved it on before
 * B's next pass saw it running there. B's VM is then the source copy of m2 while it still reads
 * as "the VM of move m1". Before, B kept that copy after m2 committed: the source drops its paused
 * copy only when it is no move's, and B's reconcile took it for a VM of m1 no longer pending, kept
 * for the staging grace (a minute by default) from B's first look at it, paused and holding its
 * memory, listed as an incoming VM of m1. Guard: a VM that leaves by a move is the session's own
 * (the earlier move is over: one open move per session); its earlier move's id is cleared first.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Random } from "effect"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

const fast = { commitMs: 5, captureFixedMs: 1, startMs: 0 }

describe("a VM that arrived by a move leaves by a second one before its first move's id is cleared", () => {
  effect("once the second move commits, its source drops its paused copy at once; only the new target runs the guest", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      // Host a (B of the story): the guest arrived by m1 and runs here, m1 still on its record.
      const simA = yield* SimRuntime.make(fast)
      yield* simA.start({ vmId: "s1", memMib: 64, vcpus: 1 })
      const residentsA = yield* makeResidents("a", null, () => Effect.void)
      const targetA = yield* makeMoveTarget("a", simA, residentsA)
      yield* residentsA.put({ vmId: "s1", memMib: 64, vcpus: 1, status: "running", reservationId: "res-move-m1", moveId: "m1" })
      // Host c: the second move's target.
      const simC = yield* SimRuntime.make(fast)
      const residentsC = yield* makeResidents("c", null, () => Effect.void)
      const targetC = yield* makeMoveTarget("c", simC, residentsC)
      yield* fake.addSession("s1", "a", 64, 1)
      yield* fake.setState("s1", "running")
      // The coordinator moves the session on (a make-room move) before a's pass saw it running here.
      yield* fake.beginMove("m2", "s1", "c", 5000)
      const { agent } = yield* quietAgent({ coordinator: fake.client("a"), runtime: simA, residents: residentsA, target: targetA, link: PeerLink.inMemory(new Map([["c", targetC]])) })
      yield* Effect.forkChild(agent.run)
      yield* stepUntil("m2 committed", () => Effect.map(fake.get, (s) => s.moves.get("m2")?.state === "committed"))
      yield* stepUntil("a owes nothing of m2", () => Effect.map(residentsA.pendingCommits, (p) => p.length === 0))
      yield* stepUntil("a's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.deepStrictEqual((yield* simC.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* simA.list).map((v) => [v.vmId, v.status]), [], "the source's paused copy is dropped")
      assert.deepStrictEqual(yield* residentsA.all, [])
      assert.deepStrictEqual(yield* targetA.incoming, [], "nothing on a reads as an incoming VM of m1")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )
})
