/**
 * A target holds a paused incoming VM of a move that ended without its commit (aborted, or gone
 * from the coordinator: pruned) while the coordinator places the move's session here, pending.
 * Before, the incoming VM was kept and the action failed on every pass ("the move reads aborted;
 * kept paused"): the session never started. Guards: only a move still pending keeps the incoming
 * VM; one aborted or gone is dropped as the target's abort does, and the session then handled
 * like any other (a pending one boots and is reported started). And two commits of one move on
 * its target (the source's, the agent's own) run one after the other.
 */
import { assert, describe } from "@effect/vitest"
import { RuntimeError, SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Deferred, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { makeResidents } from "../src/Residents.js"
import { type FakeCoordinator, makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

/**
 * Host a, the target of move m1 of s1 (from b), holding its paused incoming VM; `end` ends the
 * move; then the coordinator places s1 on a, pending, and a's agent runs.
 */
const incomingOfEndedMove = (end: (fake: FakeCoordinator) => Effect.Effect<void>) =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    const sim = yield* SimRuntime.make({ startMs: 50 })
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const target = yield* makeMoveTarget("a", sim, residents)
    yield* fake.addSession("s1", "b", 1024, 1)
    yield* fake.beginMove("m1", "s1", "a", 600)
    yield* target.prepare({ moveId: "m1", sessionId: "s1", sourceHostId: "b", targetHostId: "a", memMib: 1024, vcpus: 1 })
    assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "paused", "m1"]])
    yield* end(fake)
    yield* fake.place("s1", "a", "pending")
    const { agent } = yield* quietAgent({ coordinator: fake.client("a"), runtime: sim, residents, target })
    yield* Effect.forkChild(agent.run)
    yield* stepUntil("s1 started", () => Effect.map(fake.get, (s) => s.sessions.get("s1")!.state === "running"))
    yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
    assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
    assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId, v.reservationId]), [["s1", "running", null, "res-s1-a"]])
    assert.deepStrictEqual(yield* target.incoming, [])
  }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))

describe("a paused incoming VM of a move that ended without this target's commit, its session placed here pending", () => {
  effect("the move aborted: the incoming VM is dropped and the session starts here", () => incomingOfEndedMove((fake) => fake.abortMove("m1", "gave up")))
  effect("the move gone (the coordinator's 404): the incoming VM is dropped and the session starts here", () => incomingOfEndedMove((fake) => fake.forgetMove("m1")))
})

describe("two commits of one move on its target at once (the source's through the peer server, the agent's own)", () => {
  effect("run one after the other: the second finds the guest running and answers so, never a second resume that fails and drops it", () =>
    Effect.gen(function* () {
      const sim = yield* SimRuntime.make({ startMs: 50 })
      const resumed = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      let resumes = 0
      let destroys = 0
      // The guest resumes from its stream once released (the first call); a second resume of the
      // VM fails, as a runtime's does once the VM is no longer incoming.
      const runtime: VmRuntimeShape = {
        ...sim,
        commitIncoming: (vmId) =>
          Effect.suspend(() =>
            resumes++ === 0
              ? Deferred.succeed(resumed, undefined).pipe(Effect.andThen(Deferred.await(release)), Effect.as({ vmId, memMib: 1024, vcpus: 1, status: "running" as const }))
              : Effect.fail(new RuntimeError({ op: "commitIncoming", vmId, message: "no incoming VM" })),
          ),
        destroy: (vmId) => Effect.andThen(Effect.sync(() => destroys++), sim.destroy(vmId)),
      }
      const residents = yield* makeResidents("a", null, () => Effect.void)
      const target = yield* makeMoveTarget("a", runtime, residents)
      const h = { moveId: "m1", sessionId: "s1", sourceHostId: "b", targetHostId: "a", memMib: 1024, vcpus: 1 }
      yield* target.prepare(h)
      const first = yield* Effect.forkChild(target.commit(h))
      yield* Deferred.await(resumed)
      const second = yield* Effect.forkChild(Effect.result(target.commit(h)))
      // The second waits for the first (a turn of the clock changes nothing) ...
      yield* TestClock.adjust("1 second")
      const resumesWhileFirstOpen = resumes
      yield* Deferred.succeed(release, undefined)
      const firstAnswer = yield* Effect.result(Fiber.join(first))
      const answer = yield* Fiber.join(second)
      assert.strictEqual(resumesWhileFirstOpen, 1, "the second commit did not resume the VM again")
      assert.strictEqual(firstAnswer._tag, "Success")
      assert.strictEqual(answer._tag, "Success", "the second commit answers that the guest runs here")
      assert.strictEqual(resumes, 1)
      assert.strictEqual(destroys, 0)
      assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", "m1"]])
    }),
  )
})
