/**
 * A prepare of a move reaches its target after the commit resumed the guest there: a request
 * delayed on the wire, or one replayed by whoever saw the prepare's token (a token for prepare
 * authorizes prepare only). Before, the target recorded the running guest as incoming again and
 * asked its runtime to prepare it, which refuses a VM that runs, and the failure destroyed the
 * guest. Guard: a prepare of a move whose guest runs here is refused and touches nothing.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Effect } from "effect"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { makeResidents } from "../src/Residents.js"
import { effect } from "./support/PatientClock.js"

const h = { moveId: "m1", sessionId: "s1", sourceHostId: "b", targetHostId: "a", memMib: 1024, vcpus: 1 }

describe("a prepare of a move whose guest a commit already resumed on its target", () => {
  effect("is refused, and the guest runs on, still the move's", () =>
    Effect.gen(function* () {
      const sim = yield* SimRuntime.make({ startMs: 0, commitMs: 0 })
      let destroys = 0
      // The resume of a complete stream: the incoming VM becomes a running one (no stream is sent here).
      const runtime: VmRuntimeShape = {
        ...sim,
        commitIncoming: (vmId) => sim.destroy(vmId).pipe(Effect.andThen(sim.start({ vmId, memMib: 1024, vcpus: 1 })), Effect.as({ vmId, memMib: 1024, vcpus: 1, status: "running" as const })),
        destroy: (vmId) => Effect.andThen(Effect.sync(() => destroys++), sim.destroy(vmId)),
      }
      const residents = yield* makeResidents("a", null, () => Effect.void)
      const target = yield* makeMoveTarget("a", runtime, residents)
      yield* target.prepare(h)
      yield* target.commit(h)
      destroys = 0
      const again = yield* Effect.flip(target.prepare(h))
      assert.isTrue(again.refused, again.message)
      assert.strictEqual(destroys, 0, "the guest is not destroyed")
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", "m1"]])
      assert.deepStrictEqual(yield* target.incoming, [])
      // A repeated commit still answers that the guest runs here.
      assert.deepStrictEqual(yield* target.commit(h), { resumedForMs: 0 })
    }),
  )
})
