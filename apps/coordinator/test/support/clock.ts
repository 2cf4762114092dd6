// A store whose clock a test can move: every call of the wrapped store runs with the real clock
// shifted by `shift.ms`. Shifted back, a report is written as if made that long ago (a host whose
// agent went silent), with everything else on the real clock: the coordinator's own judgement of
// time (a host's `silent` flag, the fleet read's time) needs no sleep to see it.
import { Store } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { Clock, Effect, Layer } from "effect"

export interface Shift {
  ms: number
}

export const shiftedLayer = <E>(inner: Layer.Layer<Store, E>, shift: Shift): Layer.Layer<Store, E> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const store = yield* Store
      const real = yield* Clock.Clock
      const shifted: Clock.Clock = {
        currentTimeMillisUnsafe: () => real.currentTimeMillisUnsafe() + shift.ms,
        currentTimeMillis: Effect.sync(() => real.currentTimeMillisUnsafe() + shift.ms),
        currentTimeNanosUnsafe: () => real.currentTimeNanosUnsafe() + BigInt(shift.ms) * 1_000_000n,
        currentTimeNanos: Effect.sync(() => real.currentTimeNanosUnsafe() + BigInt(shift.ms) * 1_000_000n),
        monotonicTimeNanosUnsafe: () => real.monotonicTimeNanosUnsafe(),
        monotonicTimeNanos: real.monotonicTimeNanos,
        sleep: (d) => real.sleep(d),
      }
      const wrapped: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(store)) {
        wrapped[name] =
          typeof value === "function"
            ? (...args: readonly unknown[]) => {
                const out = (value as (...a: readonly unknown[]) => unknown)(...args)
                return Effect.isEffect(out) ? Effect.provideService(out, Clock.Clock, shifted) : out
              }
            : value
      }
      return Store.of(wrapped as unknown as StoreShape)
    }),
  ).pipe(Layer.provide(inner))
