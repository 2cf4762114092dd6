// The in-memory store with and without its optional `commitMoveByOperator`: the two stores the
// tests of an operator's commit run on (the store that judges it with the commit, and a third
// party's store that predates the method, where the coordinator judges it first).
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"

/** The store of `inner` without its optional `commitMoveByOperator` (a third party's store that predates it). */
export const withoutOperatorCommit = <E>(inner: Layer.Layer<Store, E>): Layer.Layer<Store, E> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const { commitMoveByOperator: _, ...rest } = yield* Store
      return Store.of(rest)
    }),
  ).pipe(Layer.provide(inner))

/** The in-memory store, and the same without `commitMoveByOperator`, each named (`describe.each`). */
export const operatorCommitStores = (withIt: string) =>
  [
    [withIt, StoreSim.layer()],
    ["a store without commitMoveByOperator", withoutOperatorCommit(StoreSim.layer())],
  ] as const
