/**
 * The brief retry of a move's coordinator calls (`MoveSource.retrying`): its waits are drawn as
 * `Pacing`'s are, so the sources of moves that failed together do not retry in lock-step. On the
 * TestClock with a fixed `Random`.
 */
import { assert, describe } from "@effect/vitest"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { Conflict, CoordinatorError } from "../src/Coordinator.js"
import type { CoordinatorShape, MoveView, RoundReport } from "../src/Coordinator.js"
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
 * A coordinator that records rounds as core's `Move` does (a round after the final one is
 * refused, 409) and loses its answer to the first try of each round (`lostAnswers`): the round is
 * recorded, the agent sees a failure and tries again, as when a replica hangs after its write.
 */
const losingAnswers = (state: MoveView["state"] = "pending", readable = true) => {
  const rounds: RoundReport[] = []
  let lost = 0
  const move = (): MoveView => ({ id: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", maxDowntimeMs: 500, state, abortReason: null, rounds })
  const port = {
    round: (_id: string, round: RoundReport) =>
      Effect.suspend((): Effect.Effect<void, Conflict | CoordinatorError> => {
        if (rounds.some((r) => r.kind === "final")) return Effect.fail(new Conflict({ op: "round", message: "move m1: the final round is recorded: no round follows it" }))
        rounds.push(round)
        lost++
        return lost % 2 === 1 ? Effect.fail(new CoordinatorError({ op: "round", status: null, message: "timed out" })) : Effect.void
      }),
    getMove: () => (readable ? Effect.succeed(move()) : Effect.fail(new CoordinatorError({ op: "getMove", status: 503, message: "the store is away" }))),
  } as unknown as CoordinatorShape
  return { port, rounds }
}

const finalRound: RoundReport = { kind: "final", wireBytes: 10, apparentBytes: 10, sendMs: 1, captureMs: 1 }

describe("MoveSource.recordRound", () => {
  effect("a final round whose answer was lost is refused when tried again (409): the move pending with its final round recorded holds ours, so it is recorded", () =>
    Effect.gen(function* () {
      const { port, rounds } = losingAnswers()
      const fiber = yield* Effect.forkChild(Effect.result(recordRound(port, "m1", finalRound)))
      yield* TestClock.adjust("10 seconds")
      const r = yield* Fiber.join(fiber)
      assert.strictEqual(r._tag, "Success")
      assert.deepStrictEqual(rounds.map((x) => x.kind), ["final"])
      // The same refusal on a move that ended (aborted) is its end: a Conflict, as before.
      const ended = losingAnswers("aborted")
      const f2 = yield* Effect.forkChild(Effect.result(recordRound(ended.port, "m1", finalRound)))
      yield* TestClock.adjust("10 seconds")
      const r2 = yield* Fiber.join(f2)
      assert.strictEqual(r2._tag === "Failure" && r2.failure._tag, "Conflict")
      // The move unreadable: its end is not known, so the read's failure is the answer (the caller abandons the move), not a Conflict.
      const unread = losingAnswers("pending", false)
      const f4 = yield* Effect.forkChild(Effect.result(recordRound(unread.port, "m1", finalRound)))
      yield* TestClock.adjust("10 seconds")
      const r4 = yield* Fiber.join(f4)
      assert.strictEqual(r4._tag === "Failure" && r4.failure._tag, "CoordinatorError")
      // A pre-copy round refused is the move's end too (no final round of ours can be behind it).
      const delta = losingAnswers()
      yield* delta.port.round("m1", finalRound).pipe(Effect.ignore)
      const r3 = yield* Effect.result(recordRound(delta.port, "m1", { ...finalRound, kind: "delta" }))
      assert.strictEqual(r3._tag === "Failure" && r3.failure._tag, "Conflict")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))),
  )
})
