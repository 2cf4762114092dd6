// Store wrappers for the reaper tests: a fleet read that can be made to fail (the reaper must hold
// every park then), and a process frozen mid-pass (the failover grace must see the gap).
import { Store, Unavailable } from "@engram/store"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"

export interface FleetSwitch {
  failFleet: boolean
}

export const failingFleetLayer = <E>(inner: Layer.Layer<Store, E>, sw: FleetSwitch): Layer.Layer<Store, E> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const store = yield* Store
      return Store.of({
        ...store,
        fleetView: () =>
          sw.failFleet ? Effect.fail(new Unavailable({ reason: "fleet read failed (test)", retryAfterMs: 1000 })) : store.fleetView(),
      })
    }),
  ).pipe(Layer.provide(inner))

export interface FreezeSwitch {
  /** How long the next demand sample (`Store.metrics`) freezes the process, on the TestClock; 0: none. */
  freezeMs: number
}

/**
 * A store wrapper whose next `metrics` call moves the TestClock on first: the process frozen
 * (suspended) mid-pass, after the pass's fleet read and before its reclaim, while no heartbeat
 * lands. One wrapped store for every pass: the coordinator keeps the reaper's memory per store.
 */
export const freezingLayer = <E>(inner: Layer.Layer<Store, E>, sw: FreezeSwitch): Layer.Layer<Store, E> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const store = yield* Store
      return Store.of({
        ...store,
        metrics: () =>
          Effect.suspend(() => {
            const ms = sw.freezeMs
            sw.freezeMs = 0
            return ms > 0 ? Effect.andThen(TestClock.adjust(ms), store.metrics()) : store.metrics()
          }),
      })
    }),
  ).pipe(Layer.provide(inner))
