import { it } from "@effect/vitest"
import type { ImageStore } from "@engram/runtime"
import { Effect, Random } from "effect"
import type { Scope } from "effect"
import { TestClock } from "effect/testing"

/** A `Random` whose every draw is `u` of its range. */
export const fixedRandom = (u: number): Random.Random => ({ nextDoubleUnsafe: () => u, nextIntUnsafe: () => 0 })

/**
 * An image store that holds no images and does no I/O: every step of an agent on it is an effect
 * the TestClock tracks, so a test's order does not depend on the machine's speed.
 */
export const noImages: ImageStore.ImageStore = {
  root: "/no-images",
  pathFor: (vmId) => `/no-images/${vmId}/image`,
  prepare: (vmId) => Effect.succeed(`/no-images/${vmId}/image`),
  get: () => Effect.succeed(undefined),
  remove: () => Effect.void,
}

/** Steps the TestClock 100 ms at a time until `done` (at most ten minutes of the clock). */
export const stepUntil = (what: string, done: () => Effect.Effect<boolean>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 6000; i++) {
      if (yield* done()) return
      yield* TestClock.adjust("100 millis")
    }
    return yield* Effect.die(new Error(`never came: ${what}`))
  })

/**
 * `it.effect` on a TestClock that waits up to 60 s of wall time (Effect's default: 1 s) for the
 * fibers a step of the clock woke to suspend, before it goes on without them. On a loaded 2-core
 * machine a woken fiber (an agent's retry, a settle) can take longer than a second to reach its
 * next sleep; a clock that went on without it would make the test's order depend on the
 * machine's speed. The agents' draws (`Pacing`'s jitter) come from a seeded `Random`, so a test's
 * instants are the same on every run (a test may seed its own, or fix it).
 */
export const effect = <A, E>(name: string, self: () => Effect.Effect<A, E, Scope.Scope>, timeout?: number): void =>
  it.effect(name, () => Effect.provide(self().pipe(Random.withSeed("engram-agent-tests")), TestClock.layer({ warningDelay: "60 seconds" })), timeout)
