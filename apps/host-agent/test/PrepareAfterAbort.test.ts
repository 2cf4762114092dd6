/**
 * A move's prepare that reaches its target after the move was aborted there (delayed on the wire,
 * or replayed by whoever saw it). Before, it started an incoming VM that nothing would commit,
 * holding its RAM until the staging grace dropped it. Now the target remembers the moves it
 * aborted lately and refuses their prepares; the memory is bounded in number and in time.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { ENDED_KEPT, ENDED_KEPT_MS, makeMoveTarget } from "../src/MoveTarget.js"
import { makeResidents } from "../src/Residents.js"
import { effect } from "./support/PatientClock.js"

const header = (moveId: string, sessionId = "s1") => ({ moveId, sessionId, sourceHostId: "b", targetHostId: "a", memMib: 1024, vcpus: 1 })

const target = Effect.gen(function* () {
  const runtime = yield* SimRuntime.make({ startMs: 50 })
  const residents = yield* makeResidents("a", null, () => Effect.void)
  return { runtime, residents, target: yield* makeMoveTarget("a", runtime, residents) }
})

describe("a prepare after its move's abort", () => {
  effect("is refused, and starts no incoming VM, whether the abort found the move's VM or came first", () =>
    Effect.gen(function* () {
      const { runtime, residents, target: t } = yield* target
      yield* t.prepare(header("m1"))
      assert.strictEqual(yield* t.abort("m1"), "dropped")
      const replayed = yield* Effect.flip(t.prepare(header("m1")))
      assert.include(replayed.message, "aborted here")
      // An abort that overtook its move's prepare on the wire.
      assert.strictEqual(yield* t.abort("m2", { incomingOnly: true }), "none")
      const late = yield* Effect.flip(t.prepare(header("m2", "s2")))
      assert.include(late.message, "aborted here")
      assert.deepStrictEqual(yield* residents.all, [])
      assert.deepStrictEqual(yield* runtime.list, [])
      // Another move of the session is prepared as ever.
      yield* t.prepare(header("m3"))
      assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "paused", "m3"]])
    }),
  )

  effect("the memory of aborted moves is bounded: past ENDED_KEPT_MS, or past ENDED_KEPT newer aborts, a move's prepare is taken again", () =>
    Effect.gen(function* () {
      const { target: t } = yield* target
      yield* t.abort("old")
      yield* TestClock.adjust(ENDED_KEPT_MS + 1)
      // Forgotten at the next abort: the memory is pruned as it grows.
      yield* t.abort("newer")
      yield* t.prepare(header("old"))
      assert.include((yield* Effect.flip(t.prepare(header("newer", "s2")))).message, "aborted here")

      for (let i = 0; i < ENDED_KEPT; i++) yield* t.abort(`m-${i}`)
      // "newer" is the oldest of ENDED_KEPT + 1: forgotten; the newest are still refused.
      yield* t.prepare(header("newer", "s2"))
      assert.include((yield* Effect.flip(t.prepare(header(`m-${ENDED_KEPT - 1}`, "s3")))).message, "aborted here")
    }),
  )
})
