import { it } from "@effect/vitest"
import { Effect, Random } from "effect"
import type { Scope } from "effect"
import { TestClock } from "effect/testing"

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
