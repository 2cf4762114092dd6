/**
 * A target holds a paused incoming VM of a move that ended without its commit (aborted, or gone
 * from the coordinator: pruned) while the coordinator places the move's session here, pending.
 * Before, the incoming VM was kept and the action failed on every pass ("the move reads aborted;
 * kept paused"): the session never started. Guards: only a move still pending keeps the incoming
 * VM; one aborted or gone is dropped as the target's abort does, and the session then handled
 * like any other (a pending one boots and is reported started).
 */
import { assert, describe } from "@effect/vitest"
import { type ImageStore, SimRuntime } from "@engram/runtime"
import { Effect, Random } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { type FakeCoordinator, makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect } from "./support/PatientClock.js"

/** A `Random` whose every draw is `u` of its range. */
const fixedRandom = (u: number): Random.Random => ({ nextDoubleUnsafe: () => u, nextIntUnsafe: () => 0 })

/** An image store that holds no images and does no I/O (every step is one the TestClock tracks). */
const noImages: ImageStore.ImageStore = {
  root: "/no-images",
  pathFor: (vmId) => `/no-images/${vmId}/image`,
  prepare: (vmId) => Effect.succeed(`/no-images/${vmId}/image`),
  get: () => Effect.succeed(undefined),
  remove: () => Effect.void,
}

/** Steps the clock 100 ms at a time until `done` (at most ten minutes of the clock). */
const until = (what: string, done: () => Effect.Effect<boolean>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 6000; i++) {
      if (yield* done()) return
      yield* TestClock.adjust("100 millis")
    }
    return yield* Effect.die(new Error(`never came: ${what}`))
  })

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
    const agent = yield* makeAgent(defaultAgentConfig("a"), {
      coordinator: fake.client("a"),
      runtime: sim,
      measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
      residents,
      images: noImages,
      link: PeerLink.inMemory(new Map()),
      target,
    })
    yield* Effect.forkChild(agent.run)
    yield* until("s1 started", () => Effect.map(fake.get, (s) => s.sessions.get("s1")!.state === "running"))
    yield* until("the actions done", () => Effect.map(agent.busy, (b) => !b))
    assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
    assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId, v.reservationId]), [["s1", "running", null, "res-s1-a"]])
    assert.deepStrictEqual(yield* target.incoming, [])
  }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))

describe("a paused incoming VM of a move that ended without this target's commit, its session placed here pending", () => {
  effect("the move aborted: the incoming VM is dropped and the session starts here", () => incomingOfEndedMove((fake) => fake.abortMove("m1", "gave up")))
  effect("the move gone (the coordinator's 404): the incoming VM is dropped and the session starts here", () => incomingOfEndedMove((fake) => fake.forgetMove("m1")))
})
