/**
 * The brief retry of a move's coordinator calls (`MoveSource.retrying`): its waits are drawn as
 * `Pacing`'s are, so the sources of moves that failed together do not retry in lock-step. On the
 * TestClock with a fixed `Random`. And a round recorded at its position (`recordRound`): a retry
 * of one whose answer was lost is recorded once.
 */
import { assert, describe } from "@effect/vitest"
import { Move as CoreMove } from "@engram/core"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { Conflict, CoordinatorError } from "../src/Coordinator.js"
import type { CoordinatorShape, MoveView, NumberedRound, RoundReport } from "../src/Coordinator.js"
import { recordRound, retrying } from "../src/MoveSource.js"
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

/**
 * A coordinator that records rounds as core's `Move` does (`placeRound`: a round after the final
 * one is refused, 409; a round at a recorded position with the same figures changes nothing) and
 * loses its answer to the first try of each round it records (`lost`): the round is recorded, the
 * agent sees a failure and tries again, as when a replica hangs after its write. It cannot be read
 * (`getMove` fails): the agent needs no read to tell its own round from the move's end.
 */
const losingAnswers = (state: MoveView["state"] = "pending") => {
  const rounds: RoundReport[] = []
  let lost = 0
  const port = {
    round: (_id: string, round: NumberedRound) =>
      Effect.suspend((): Effect.Effect<void, Conflict | CoordinatorError> => {
        const placed = CoreMove.placeRound({ id: "m1", state, rounds }, round)
        if (typeof placed !== "string") return Effect.fail(new Conflict({ op: "round", message: `move m1: ${placed.reason}` }))
        if (placed === "held") return Effect.void
        const { kind, wireBytes, apparentBytes, sendMs, captureMs } = round
        rounds.push({ kind, wireBytes, apparentBytes, sendMs, captureMs })
        lost++
        return lost % 2 === 1 ? Effect.fail(new CoordinatorError({ op: "round", status: null, message: "timed out" })) : Effect.void
      }),
    getMove: () => Effect.fail(new CoordinatorError({ op: "getMove", status: 503, message: "the store is away" })),
  } as unknown as CoordinatorShape
  return { port, rounds }
}

const finalRound: RoundReport = { kind: "final", wireBytes: 10, apparentBytes: 10, sendMs: 1, captureMs: 1 }
const delta: RoundReport = { ...finalRound, kind: "delta" }

describe("MoveSource.recordRound", () => {
  effect("a round whose answer was lost is tried again at its position and recorded once, the final round too; a 409 is the move's end", () =>
    Effect.gen(function* () {
      const { port, rounds } = losingAnswers()
      for (const [seq, round] of [delta, delta, finalRound].entries()) {
        const fiber = yield* Effect.forkChild(Effect.result(recordRound(port, "m1", { ...round, seq })))
        yield* TestClock.adjust("10 seconds")
        assert.strictEqual((yield* Fiber.join(fiber))._tag, "Success")
      }
      assert.deepStrictEqual(rounds, [delta, delta, finalRound])
      // A round refused is the move's end: after the final round, or on a move that ended (aborted).
      const r3 = yield* Effect.result(recordRound(port, "m1", { ...delta, seq: 3 }))
      assert.strictEqual(r3._tag === "Failure" && r3.failure._tag, "Conflict")
      const ended = losingAnswers("aborted")
      const r2 = yield* Effect.result(recordRound(ended.port, "m1", { ...finalRound, seq: 0 }))
      assert.strictEqual(r2._tag === "Failure" && r2.failure._tag, "Conflict")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))),
  )
})
