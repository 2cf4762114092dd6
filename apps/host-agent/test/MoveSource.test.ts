/**
 * The brief retry of a move's coordinator calls (`MoveSource.retrying`): its waits are drawn as
 * `Pacing`'s are, so the sources of moves that failed together do not retry in lock-step. On the
 * TestClock with a fixed `Random`.
 */
import { assert, describe } from "@effect/vitest"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { CoordinatorError } from "../src/Coordinator.js"
import { retrying } from "../src/MoveSource.js"
import { effect } from "./support/PatientClock.js"

/** A `Random` whose every draw is `u` of its range: 0 the lowest, just under 1 the highest. */
const fixedRandom = (u: number): Random.Random => ({ nextDoubleUnsafe: () => u, nextIntUnsafe: () => 0 })
const highest = 1 - 1e-9

/** A call that always fails as `error` does, and the instants (TestClock ms) of its tries. */
const failingCall = (error: CoordinatorError) => {
  const at: number[] = []
  const call = Effect.flatMap(Clock.currentTimeMillis, (t) => {
    at.push(t)
    return Effect.fail(error)
  })
  return { at, call }
}

const away = (retryAfterMs?: number) => new CoordinatorError({ op: "round", status: 503, message: "the store is away", ...(retryAfterMs === undefined ? {} : { retryAfterMs }) })

/** Runs `retrying(call)` to its end on the TestClock; the tries' instants. */
const tries = (error: CoordinatorError) =>
  Effect.gen(function* () {
    const { at, call } = failingCall(error)
    const fiber = yield* Effect.forkChild(Effect.result(retrying(call)))
    yield* TestClock.adjust("10 seconds")
    const r = yield* Fiber.join(fiber)
    assert.strictEqual(r._tag, "Failure")
    return at
  })

describe("MoveSource.retrying", () => {
  effect("the waits are drawn: the lowest draw retries every 100 ms, the highest after 200, 400, 450, 450 ms (1500 in all, as the fixed waits before)", () =>
    Effect.gen(function* () {
      const low = yield* tries(away()).pipe(Effect.provideService(Random.Random, fixedRandom(0)))
      assert.deepStrictEqual(low, [0, 100, 200, 300, 400])
      const t0 = yield* Clock.currentTimeMillis
      const high = yield* tries(away()).pipe(Effect.provideService(Random.Random, fixedRandom(highest)))
      assert.deepStrictEqual(
        high.map((t) => t - t0),
        [0, 200, 600, 1050, 1500],
      )
    }),
  )

  effect("a 503's retryAfterMs does not stretch the waits (some run in the guest's pause); a 404 naming its record is an answer, tried once", () =>
    Effect.gen(function* () {
      const asked = yield* tries(away(5000)).pipe(Effect.provideService(Random.Random, fixedRandom(0)))
      assert.deepStrictEqual(asked, [0, 100, 200, 300, 400])
      const t0 = yield* Clock.currentTimeMillis
      const gone = new CoordinatorError({ op: "round", status: 404, message: "no such move", notFound: { entity: "move", id: "m1" } })
      assert.deepStrictEqual((yield* tries(gone)).map((t) => t - t0), [0])
    }),
  )
})
