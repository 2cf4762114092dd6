// Store wrappers for the reaper tests: a fleet read that can be made to fail (the reaper must hold
// every park then), and a process frozen mid-pass (the failover grace must see the gap).
import { Store, Unavailable } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"

/** `inner` with some of its calls replaced by `wrap` (given the store it wraps). */
const wrapped = <E>(inner: Layer.Layer<Store, E>, wrap: (store: StoreShape) => Partial<StoreShape>): Layer.Layer<Store, E> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const store = yield* Store
      return Store.of({ ...store, ...wrap(store) })
    }),
  ).pipe(Layer.provide(inner))

export interface FleetSwitch {
  failFleet: boolean
}

export const failingFleetLayer = <E>(inner: Layer.Layer<Store, E>, sw: FleetSwitch): Layer.Layer<Store, E> =>
  wrapped(inner, (store) => ({
    fleetView: () => (sw.failFleet ? Effect.fail(new Unavailable({ reason: "fleet read failed (test)", retryAfterMs: 1000 })) : store.fleetView()),
  }))

export interface FreezeSwitch {
  /** How long the next call of the wrapped method freezes the process, on the TestClock; 0: none. */
  freezeMs: number
}

/**
 * A store wrapper whose next `method` call (by default the demand sample, `metrics`, after the
 * pass's fleet read and before its reclaim; `drainQueue` after it) moves the TestClock on first:
 * the process frozen (suspended) mid-pass while no heartbeat lands. One wrapped store for every
 * pass: the coordinator keeps the reaper's memory per store.
 */
export const freezingLayer = <E>(inner: Layer.Layer<Store, E>, sw: FreezeSwitch, method: "metrics" | "drainQueue" = "metrics"): Layer.Layer<Store, E> =>
  wrapped(inner, (store) => {
    const call = store[method] as (...args: readonly unknown[]) => Effect.Effect<unknown, unknown>
    return {
      [method]: (...args: readonly unknown[]) =>
        Effect.suspend(() => {
          const ms = sw.freezeMs
          sw.freezeMs = 0
          return ms > 0 ? Effect.andThen(TestClock.adjust(ms), call(...args)) : call(...args)
        }),
    }
  })
