// A store wrapper whose fleet read can be made to fail: the reaper must hold every park then.
import { Store, Unavailable } from "@engram/store"
import { Effect, Layer } from "effect"

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
