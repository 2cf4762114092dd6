// The downtime guard on a fake QEMU (test/support/fake-qemu.mjs) for a guest paused before its
// stream (parked in RAM): the stream pauses it no further, so core's rule refuses it on no
// estimate, while the same budget refuses the running guest before anything is sent. Before, the
// parked guest was refused too (`ErrMoveDowntime`, before the start) for a pause it did not cause.
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { QemuRuntime } from "../src/index.js"
import * as FakeQemu from "./support/FakeQemu.js"

const spec = { vmId: "p1", memMib: 64, vcpus: 1 }
/** Below the commit allowance alone: no move of a running guest fits it. */
const budget = { maxDowntimeMs: 50, commitAllowanceMs: 100, maxPreCopyRounds: 6 }
/** The fake sends nowhere: the test stops at the switchover and gives the stream back. */
const endpoint = { runtime: "qemu", uri: "tcp:127.0.0.1:1" }

describe("a budget below the commit allowance, on a fake QEMU", () => {
  it.live(
    "refuses the running guest before anything is sent; streams the parked guest to its switchover, its estimate reported, and leaves it paused when given back",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("switchover-stall")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec)
          const refused = yield* rt.migrate(spec.vmId, { moveId: "m1", endpoint, budget, onRound: () => Effect.void })
          assert.strictEqual(refused._tag, "Refused")
          if (refused._tag === "Refused") assert.match(refused.reason, /^ErrMoveDowntime: pre-pause estimate 100 ms > maxDowntimeMs 50 ms/)
          assert.notInclude(fake.lines(), "cmd migrate", "nothing streamed")

          yield* rt.park(spec.vmId)
          const asked: string[] = []
          const at = yield* rt.migrate(spec.vmId, { moveId: "m2", endpoint, budget, onRound: () => Effect.void, overBudget: (r) => Effect.sync(() => (asked.push(r.stage), false)) })
          assert.strictEqual(at._tag, "AtSwitchover", JSON.stringify(at._tag === "AtSwitchover" ? null : at))
          if (at._tag !== "AtSwitchover") return
          assert.deepStrictEqual(asked, [], "nothing to override: the guard refused nothing")
          assert.isTrue(at.alreadyPaused)
          assert.isAbove(at.estimateMs, budget.maxDowntimeMs, "the estimate is made and reported all the same")
          assert.include(fake.lines(), "cmd migrate")
          assert.notInclude(fake.lines(), "cmd migrate_cancel", "no refusal cancelled the stream")
          yield* at.abort
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "paused" }])
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )
})
