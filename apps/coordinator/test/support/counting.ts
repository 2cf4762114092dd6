// A store that counts the calls made to it, by operation: how a test tells that a waiter read
// the store (and how often) without looking inside the coordinator.
import { Store } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { Effect, Layer } from "effect"

export interface Counts {
  /** Calls by operation name. */
  readonly byName: Map<string, number>
  /** Every call so far. */
  readonly total: () => number
}

/** `inner` with every call counted in the returned `counts`. */
export const counting = <E>(inner: Layer.Layer<Store, E>): { readonly layer: Layer.Layer<Store, E>; readonly counts: Counts } => {
  const byName = new Map<string, number>()
  const counts: Counts = { byName, total: () => [...byName.values()].reduce((a, b) => a + b, 0) }
  const layer = Layer.effect(
    Store,
    Effect.map(Store, (store) => {
      const out: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(store)) {
        out[name] =
          typeof value === "function" && name !== "limits"
            ? (...args: unknown[]) => {
                byName.set(name, (byName.get(name) ?? 0) + 1)
                return (value as (...a: unknown[]) => unknown).apply(store, args)
              }
            : value
      }
      return out as unknown as StoreShape
    }),
  ).pipe(Layer.provide(inner))
  return { layer, counts }
}
