/**
 * A store backend of its own, as an outsider writes one: a `Layer` of `Store` (and of
 * `StoreTesting`, the reset the conformance suite calls before each case). This one keeps a
 * journal of every change that succeeded (the operation and when, on the Effect `Clock`) and
 * leaves the decisions to `@engram/store-sim`, the in-memory reference; replace the delegate
 * with your database and the suite tells you where yours differs.
 */
import { readOperations, Store, StoreTesting } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Clock, Effect, Layer } from "effect"

/** One change the store made. */
export interface Entry {
  readonly op: string
  readonly at: number
}

/** A journaling store over a fresh in-memory delegate. */
export const make = (): { readonly store: StoreShape; readonly journal: Entry[]; readonly reset: (limits?: Parameters<ReturnType<typeof StoreSim.make>["reset"]>[0]) => void } => {
  const delegate = StoreSim.make()
  const journal: Entry[] = []
  const store = Object.fromEntries(
    Object.entries(delegate.store).map(([op, value]) => {
      if (typeof value !== "function" || readOperations.has(op)) return [op, value]
      const call = value as (...args: unknown[]) => unknown
      return [
        op,
        (...args: unknown[]) => {
          const out = call(...args)
          if (!Effect.isEffect(out)) return out
          return Effect.tap(out as Effect.Effect<unknown, unknown>, () => Effect.map(Clock.currentTimeMillis, (at) => void journal.push({ op, at })))
        },
      ]
    }),
  ) as unknown as StoreShape
  return {
    store,
    journal,
    reset: (limits) => {
      delegate.reset(limits)
      journal.length = 0
    },
  }
}

/** The store as a layer. */
export const layer = (): Layer.Layer<Store> => Layer.sync(Store, () => make().store)

/** The store and its reset, for `runStoreConformance`. */
export const layerTesting = (): Layer.Layer<Store | StoreTesting> =>
  Layer.unwrap(
    Effect.sync(() => {
      const s = make()
      return Layer.mergeAll(Layer.succeed(Store, s.store), Layer.succeed(StoreTesting, StoreTesting.of({ reset: (limits) => Effect.sync(() => s.reset(limits)) })))
    }),
  )
