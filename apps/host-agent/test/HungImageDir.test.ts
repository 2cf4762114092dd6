// An image directory that hangs (a listing or an `rm` that never returns, as on a hung
// filesystem) holds no reconcile pass: the removal of released descent images runs off the pass.
// The hang is an effect that never completes: no sleeps.
import { assert, describe } from "@effect/vitest"
import { type ImageStore, SimRuntime } from "@engram/runtime"
import { Effect, Fiber } from "effect"
import { makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, noImages, stepUntil } from "./support/PatientClock.js"

/** An agent removing released images (grace 0) from `images`, its coordinator holding session s1 pending here. */
const agentOn = (images: ImageStore.ImageStore, imageSessions: readonly string[] = []) =>
  Effect.gen(function* () {
    const runtime = yield* SimRuntime.make()
    const coordinator = yield* makeFakeCoordinator
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const agent = yield* makeAgent({ ...defaultAgentConfig("a"), imageGraceMs: 0 }, {
      coordinator: coordinator.client("a"),
      runtime,
      measure: () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }),
      residents,
      images,
      link: PeerLink.inMemory(new Map()),
      target: yield* makeMoveTarget("a", runtime, residents),
    })
    yield* coordinator.addSession("s1", "a", 512)
    // The image of `gone` is held here for no one (the answers do not list it: its session ended).
    const pass = Effect.flatMap(coordinator.assignmentsOf("a"), (a) => agent.reconcile({ ...a, imageSessions }))
    return { coordinator, pass }
  })

/** Runs `pass` and answers once it has ended (the clock stepped meanwhile; never: the test fails). */
const passEnds = <E>(pass: Effect.Effect<void, E>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(pass, { startImmediately: true })
    yield* stepUntil("the reconcile pass ends", () => Effect.andThen(Effect.yieldNow, Effect.sync(() => fiber.pollUnsafe() !== undefined)))
    yield* Fiber.join(fiber)
  })

const gone = { vmId: "gone", writtenAtMs: 0 }

describe("an image directory that hangs", () => {
  effect("an rm that never returns holds no reconcile pass: the passes end, and a session placed here starts and is reported", () =>
    Effect.gen(function* () {
      let removals = 0
      const f = yield* agentOn({ ...noImages, list: Effect.succeed([gone]), remove: (id) => (id === "gone" ? Effect.sync(() => void removals++).pipe(Effect.andThen(Effect.never)) : Effect.void) })
      yield* passEnds(f.pass)
      yield* passEnds(f.pass)
      yield* stepUntil("s1 reported running", () => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")?.state === "running"))
      assert.strictEqual(removals, 1, "the hung removal is not started again while it hangs")
    }))

  effect("a listing that never returns holds no reconcile pass", () =>
    Effect.gen(function* () {
      const f = yield* agentOn({ ...noImages, list: Effect.never })
      yield* passEnds(f.pass)
      yield* passEnds(f.pass)
      yield* stepUntil("s1 reported running", () => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")?.state === "running"))
    }))

  effect("a released image is still removed (off the pass), one that the coordinator lists as held here is kept", () =>
    Effect.gen(function* () {
      const removed: string[] = []
      const f = yield* agentOn({ ...noImages, list: Effect.succeed([gone, { vmId: "held", writtenAtMs: 0 }]), remove: (id) => Effect.sync(() => void removed.push(id)) }, ["held"])
      yield* passEnds(f.pass)
      yield* stepUntil("gone's image removed", () => Effect.succeed(removed.includes("gone")))
      yield* stepUntil("s1 reported running", () => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")?.state === "running"))
      // s1's own (a pending session's image goes once it runs), never held's.
      assert.deepStrictEqual(removed.filter((id) => id !== "s1"), ["gone"])
    }))
})
