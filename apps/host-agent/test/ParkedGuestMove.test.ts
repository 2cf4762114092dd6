/**
 * A move of a guest paused before it began: parked in RAM, then resumed and moved by the
 * coordinator before this agent's pass unparked it, so the source's runtime streams a guest that
 * is paused already. Its stream pauses it no further (it stays paused until the target's
 * commit), so the downtime guard (core's `Downtime.check`, through the runtime's `MoveGuard` and
 * the agent's own check before the target prepares) refuses it on no estimate: a budget that
 * refuses the same move of the running guest (below the commit allowance alone, over the
 * pre-pause estimate, or over the post-capture one after a slow final capture) commits it.
 *
 * Before, the guard held the parked guest to the budget as if the move paused it: the move was
 * refused (`ErrMoveDowntime`, before the start, pre-pause or post-capture) for a pause it did not
 * cause, and the session stayed on its source.
 */
import { assert, describe } from "@effect/vitest"
import { Downtime } from "@engram/core"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { effect } from "./support/PatientClock.js"
import { makeFleet } from "./support/InProcess.js"

const cases = [
  { stage: "before the start", source: {}, maxDowntimeMs: 300 },
  // The parked guest's rounds (an empty delta) estimate a hair over the 400 ms allowance.
  { stage: "pre-pause", source: {}, maxDowntimeMs: 400 },
  { stage: "post-capture", source: { finalCaptureExtraMs: 300 }, maxDowntimeMs: 600 },
] as const

const runMove = (c: (typeof cases)[number], parked: boolean) =>
  Effect.gen(function* () {
    const fleet = yield* makeFleet([
      { hostId: "a", sim: { ...SimRuntime.defaultSimConfig, ...c.source } },
      { hostId: "b", sim: SimRuntime.defaultSimConfig },
    ])
    const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
    yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
    yield* fleet.settle()
    if (parked) {
      yield* fleet.coordinator.setState("s1", "parked")
      yield* fleet.settle()
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "parked in RAM")
      // Resumed, and moved before a pass of this agent unparked it.
      yield* fleet.coordinator.setState("s1", "running")
    }
    yield* fleet.coordinator.beginMove("m1", "s1", "b", c.maxDowntimeMs)
    yield* fleet.settle()
    const state = yield* fleet.coordinator.get
    return { a, b, move: state.moves.get("m1")!, session: state.sessions.get("s1")!, outcome: (yield* a.agent.status).moves[0]! }
  })

describe("a move of a guest parked before it began", () => {
  for (const c of cases)
    effect(`${c.stage} (${c.maxDowntimeMs} ms): the running guest's move is refused; the parked guest's commits, its estimate reported, no pause claimed`, () =>
      Effect.gen(function* () {
        const ran = yield* runMove(c, false)
        assert.strictEqual(ran.move.state, "aborted", "the running guest's move is refused")
        assert.match(ran.move.abortReason ?? "", /^ErrMoveDowntime: /)
        assert.strictEqual(ran.session.hostId, "a")

        const { a, b, move, session, outcome } = yield* runMove(c, true)
        assert.strictEqual(move.state, "committed", `the parked guest's move commits (${move.abortReason ?? ""})`)
        assert.strictEqual(session.hostId, "b")
        assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]], "resumed on the target from its stream")
        assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "never booted afresh")
        assert.deepStrictEqual(yield* a.runtime.list, [])
        assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0, "the move paused the guest no further")
        assert.strictEqual(outcome._tag, "Committed")
        if (outcome._tag !== "Committed") return
        assert.isTrue(outcome.alreadyPaused, "the outcome says the guest was paused before the move")
        assert.isNull(outcome.runtimeDowntimeMs)
        assert.isTrue(outcome.guard.estimateMs > c.maxDowntimeMs, `the estimate is still made and reported: ${outcome.guard.estimateMs}`)
        assert.isTrue(Downtime.phasesConsistent(move.phases!), JSON.stringify(move.phases))
      }))
})
