/**
 * A move an operator committed while its source was frozen (the coordinator heard nothing from
 * it past the stale window, so it took the commit: SPEC §13), whose source then thawed and went
 * on with its pre-copy rounds, and whose downtime guard then refuses it: over budget before the
 * pause, or at the post-capture check. The coordinator places the session on the target, which
 * holds only pre-copy rounds.
 *
 * Before, the refusal abandoned the move: the abort was refused (409), the move read committed,
 * the target refused to commit its incomplete stream, and the coordinator's record won: the
 * source's copy was destroyed and the target booted the session afresh, its memory lost. Now,
 * before the pause, the commit (read while the guest still runs) overrides the budget: the source
 * pauses and sends the final round (a warning names the estimate and the budget), and the target
 * resumes the guest from a complete stream. After the capture nothing is read with the guest
 * paused (SPEC §5: the pause is given back at once): the abort is refused, the move read
 * committed, the target refuses the commit of its incomplete stream saying so (`noStream`), and
 * the source keeps its copy and streams it again (`resend`): the target resumes the guest from
 * that stream.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { effect } from "./support/PatientClock.js"
import { makeFleet, moveBegunAToB, operatorCommitsAtIntent } from "./support/InProcess.js"
import { capture } from "./support/Logs.js"

const cases = [
  // The coordinator's allowance of 600 ms makes the seed's rounds' estimate 686 ms > 600 ms.
  { stage: "pre-pause", source: {}, commitAllowanceMs: 600, pauses: 1, overridden: true },
  // A slow final capture overruns the budget with the guest paused: given back, then parked again
  // (the agent's own park) to be streamed again: that stream pauses it no further (one move's pause).
  { stage: "post-capture", source: { finalCaptureExtraMs: 300 }, commitAllowanceMs: null, pauses: 1, overridden: false },
] as const

describe("a committed move its guard refuses", () => {
  for (const c of cases)
    effect(`${c.stage}: ${c.overridden ? "the commit overrides the budget; the final round is sent" : "the pause given back at once, the copy kept and streamed again"}, and the guest resumes on the target from a stream, never booted afresh`, () => {
      const warnings = capture("Warn")
      return Effect.gen(function* () {
        const operator = operatorCommitsAtIntent()
        const fleet = yield* makeFleet(
          [
            { hostId: "a", sim: { ...SimRuntime.defaultSimConfig, ...c.source } },
            { hostId: "b", sim: SimRuntime.defaultSimConfig },
          ],
          {
            // As QEMU: the intent is taken before the first round; then the operator commits (the source frozen, unheard).
            intentFirst: operator.intentFirst,
          },
        )
        if (c.commitAllowanceMs !== null) yield* fleet.coordinator.setCommitAllowance(c.commitAllowanceMs)
        const { a, b, copies } = yield* moveBegunAToB(fleet)
        assert.deepStrictEqual(operator.seen.committedAt, ["intent"], "the operator's commit landed with only the intent recorded")
        yield* fleet.settle()
        // Before: { a: [], b: [["s1", "running"]] } with the target's guest booted afresh (starts 1).
        assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "one running copy, where the coordinator places the session")
        assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from its stream, not booted: its memory kept")
        assert.strictEqual(yield* Ref.get(a.runtime.pauses), c.pauses, c.overridden ? "the source paused once, for the final round" : "given back at once; the copy parked again is streamed paused, no pause of the stream's own")
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
        assert.deepStrictEqual((yield* b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
        const overridden = warnings.lines.find((l) => l.message.startsWith("the downtime guard refused the move, but it is committed on the coordinator"))
        if (!c.overridden) {
          assert.isUndefined(overridden, "nothing read, nothing overridden, with the guest paused")
          assert.isTrue(warnings.lines.some((l) => l.message.startsWith("move m1: streaming the paused source copy again")), "streamed again")
          return
        }
        assert.isDefined(overridden, "a warning says the commit overrode the guard")
        assert.strictEqual(overridden?.fields["moveId"], "m1")
        assert.strictEqual(overridden?.fields["stage"], c.stage)
        assert.strictEqual(overridden?.fields["maxDowntimeMs"], 600)
        assert.isTrue(Number(overridden?.fields["estimateMs"]) > 600, `the estimate over the budget: ${String(overridden?.fields["estimateMs"])}`)
      }).pipe(Effect.provide(warnings.layer))
    })
})
