/**
 * The edge's hold of a parked long-poll (`Parking.hold`): whatever ends the request while its poll
 * is filed (the client leaving in the stretch between the route's `parked` and the wait), the poll
 * is abandoned, once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import * as Parking from "../src/Parking.js"

describe("Parking.hold", () => {
  it.effect("a client that leaves right after the route parked (before the wait turned interruptible) abandons the poll, once", () =>
    Effect.gen(function* () {
      const request = {}
      let abandoned = 0
      // The route files its poll, the client leaves (an interruption, pending: the request's
      // fiber is uninterruptible outside the route), and the route answers `parked`.
      const route = Effect.withFiber((fiber) => {
        Parking.file(request, { wake: null, due: false, admitted: null, abandon: () => void abandoned++ })
        fiber.interruptUnsafe()
        return Effect.succeed(Parking.parked)
      })
      const exit = yield* Fiber.await(yield* Effect.forkChild(Effect.uninterruptible(Parking.hold(request, route))))
      expect(Exit.hasInterrupts(exit)).toBe(true)
      expect(abandoned).toBe(1)
      expect(Parking.take(request)).toBeUndefined()
    }))

  it.effect("a poll woken while held runs the route again; a client leaving while it waits abandons it once", () =>
    Effect.gen(function* () {
      const request = {}
      let abandoned = 0
      let runs = 0
      const route = Effect.sync(() => {
        runs++
        Parking.file(request, { wake: null, due: false, admitted: null, abandon: () => void abandoned++ })
        return Parking.parked
      })
      const fiber = yield* Effect.forkChild(Effect.uninterruptible(Parking.hold(request, route)))
      yield* Effect.yieldNow
      expect(runs).toBe(1)
      yield* Fiber.interrupt(fiber)
      expect(abandoned).toBe(1)
      expect(Parking.take(request)).toBeUndefined()
    }))
})
