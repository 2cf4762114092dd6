// The VMs a reconcile drops (the incoming VMs of moves no longer pending) go in fibers of their
// own: a destroy that hangs (a QEMU stuck in the kernel, `rm` on a hung disk) or is slow (a QEMU
// that quits slowly: up to 25 s) holds up neither the pass nor the next assignments. Before, they
// ran inside the reconcile, one after the other, while the heartbeats went on: the coordinator
// saw a healthy host that started nothing.
import { assert, describe } from "@effect/vitest"
import { SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Deferred, Effect, Fiber, Ref } from "effect"
import { TestClock } from "effect/testing"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

describe("a destroy that hangs while the reconcile drops stale incoming VMs", () => {
  effect("a session assigned meanwhile starts, and every drop is begun", () =>
    Effect.gen(function* () {
      const coordinator = yield* makeFakeCoordinator
      const sim = yield* SimRuntime.make()
      const destroys = yield* Ref.make<readonly string[]>([])
      const disk = yield* Deferred.make<void>()
      const runtime: VmRuntimeShape = {
        ...sim,
        // Every destroy of an incoming VM hangs until the test lets the disk go (a drop is not
        // interruptible: it would hold the agent's stop).
        destroy: (vmId) => (vmId.startsWith("in") ? Ref.update(destroys, (d) => [...d, vmId]).pipe(Effect.andThen(Deferred.await(disk)), Effect.andThen(sim.destroy(vmId))) : sim.destroy(vmId)),
      }
      const { agent, residents } = yield* quietAgent({ coordinator: coordinator.client("a"), runtime })
      // Four incoming VMs of moves the coordinator no longer holds pending (their sources gave up).
      for (const i of [1, 2, 3, 4]) yield* residents.put({ vmId: `in${i}`, memMib: 256, vcpus: 1, status: "paused", reservationId: null, moveId: `m${i}` })
      const run = yield* Effect.forkChild(agent.run)
      // Past the staging grace: the next pass drops them.
      yield* TestClock.adjust("61 seconds")
      yield* coordinator.addSession("fresh", "a", 256, 1)
      let startedAt: number | null = null
      for (let s = 62; s <= 120 && startedAt === null; s++) {
        yield* TestClock.adjust("1 second")
        if ((yield* coordinator.get).sessions.get("fresh")?.state === "running") startedAt = s
      }
      const begun = [...(yield* Ref.get(destroys))].sort()
      yield* Deferred.succeed(disk, undefined)
      yield* Fiber.interrupt(run)
      // Started within seconds of its assignment (before: never, the pass stuck in the first destroy).
      assert.isNotNull(startedAt)
      assert.isAtMost(startedAt!, 75)
      // Each stale VM's drop was begun, none waiting on another's.
      assert.deepStrictEqual(begun, ["in1", "in2", "in3", "in4"])
    }))
})
