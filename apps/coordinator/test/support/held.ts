// A store call held after its commit: the in-memory store, whose `held.name` call commits and
// then waits at the gate before it answers, telling the test the fiber that made it. How the
// shutdown tests interrupt a writer between its commit and what it tells.
import { Store } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer } from "effect"
import type { Fiber } from "effect"

/** The store call held after its commit (by name), the fiber that made it, and the gate that releases its answer. */
export interface Held {
  readonly name: "endSession" | "drainQueue"
  readonly committed: Deferred.Deferred<Fiber.Fiber<unknown, unknown>>
  readonly gate: Deferred.Deferred<void>
}

/** A `Held` for `name`, not yet committed nor released. */
export const held = (name: Held["name"]): Held => ({ name, committed: Deferred.makeUnsafe(), gate: Deferred.makeUnsafe() })

/** The in-memory store, whose `held.name` call commits, then waits at the gate before it answers. */
export const holding = (held: Held): Layer.Layer<Store> =>
  Layer.effect(
    Store,
    Effect.map(Store, (store) => {
      const hold = <A, E>(write: Effect.Effect<A, E>): Effect.Effect<A, E> =>
        Effect.tap(write, () => Effect.flatMap(Effect.fiber, (fiber) => Effect.andThen(Deferred.succeed(held.committed, fiber), Deferred.await(held.gate))))
      const out: StoreShape =
        held.name === "endSession"
          ? { ...store, endSession: (id, options) => hold(store.endSession(id, options)) }
          : { ...store, drainQueue: (options) => hold(store.drainQueue(options)) }
      return Store.of(out)
    }),
  ).pipe(Layer.provide(StoreSim.layer()))

/** Host h1 and session q1 queued on it for want of room, then room reported: a drain places q1 on h1. */
export const queuedUntilRoom = Effect.gen(function* () {
  const store = yield* Store
  yield* store.registerHost({ id: "h1" })
  yield* store.reportHost("h1", { totalMib: 2048, allocatableMib: 1024, totalVcpus: 8 })
  const q = yield* store.createSession({ id: "q1", budget: { memMib: 2048, vcpus: 1 } })
  yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 8 })
  return q
})
