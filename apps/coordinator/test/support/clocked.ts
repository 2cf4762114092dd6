// A whole coordinator (HTTP included) on the test's clock (`@effect/vitest`'s `it.effect`): its
// long-polls' deadlines come only when the test moves the clock (`TestClock.adjust`), so a wait a
// test holds open is still open when its later requests arrive, however slow the machine.
import { Coordinator, CoordinatorInfo } from "@engram/coordinator"
import type { CoordinatorOptions } from "@engram/coordinator"
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import { TestClock } from "effect/testing"
import { setTimeout as delay } from "node:timers/promises"

/** Builds the coordinator in the test's scope (closed when the test ends; logs off unless `logLevel`): its URL, admin token and services. */
export const clockedCoordinator = (options: CoordinatorOptions) =>
  Effect.gen(function* () {
    // Real-looking times, from where the clock stands still until the test moves it.
    yield* TestClock.setTime(Date.now())
    const context = yield* Layer.build(Coordinator.layer(options).pipe(Layer.provide(Coordinator.loggerLayer(options.logLevel ?? "None"))))
    const info = Context.get(context, CoordinatorInfo)
    return { url: info.url, adminToken: info.adminToken, context }
  }) satisfies Effect.Effect<unknown, unknown, Scope.Scope>

/**
 * The answer of `answer` (a request, a held wait's fiber), which must come with the clock standing
 * still (a refusal, or a wait whose deadline the test has passed): one held instead fails the test
 * after a generous real bound (20 s) naming `what`, not at the test's own timeout.
 */
export const answered = <A, E>(what: string, answer: Effect.Effect<A, E>): Effect.Effect<A, E> =>
  Effect.raceFirst(
    answer,
    Effect.andThen(
      Effect.promise((signal) => delay(20_000, undefined, { signal })),
      Effect.die(new Error(`${what}: no answer within 20 s of real time with the clock standing still (held instead?)`)),
    ),
  )
