/**
 * The downtime guard's learned commit allowance per host pair (SPEC §13): core's
 * `Downtime.commitAllowance` over the pair's recent commit phases the store keeps, the
 * configured `commitAllowanceMs` as its prior. The assignments hand it to a move's source, so
 * an agent restart or another replica loses nothing, and `GET /v1/hosts/{id}/allowances` shows it.
 */
import type { Records } from "@engram/api"
import { Downtime } from "@engram/core"
import type { InvalidInput, PairCommits, PairFilter, StoreShape, Unavailable } from "@engram/store"
import { Effect } from "effect"

/** A pair's allowance with the commits it is made of. */
export const historyOf = (p: PairCommits, priorMs: number): Records.PairHistory => {
  const a = Downtime.commitAllowance(p.commitsMs, { priorMs })
  return { sourceHostId: p.sourceHostId, targetHostId: p.targetHostId, allowanceMs: a.allowanceMs, source: a.source, samples: a.samples, commitsMs: [...p.commitsMs], updatedAt: p.updatedAt }
}

/** The allowances of the pairs the filter names that have committed moves. */
export const histories = (store: StoreShape, priorMs: number, filter: PairFilter): Effect.Effect<readonly Records.PairHistory[], InvalidInput | Unavailable> =>
  Effect.map(store.listPairCommits(filter), (pairs) => pairs.map((p) => historyOf(p, priorMs)))

/** The allowance of moves from `sourceHostId` to each of `targetHostIds`: learned, or the prior before any commit. */
export const forTargets = (
  store: StoreShape,
  priorMs: number,
  sourceHostId: string,
  targetHostIds: readonly string[],
): Effect.Effect<readonly Records.PairAllowance[], InvalidInput | Unavailable> =>
  targetHostIds.length === 0
    ? Effect.succeed([])
    : Effect.map(histories(store, priorMs, { sourceHostId }), (known) =>
        [...new Set(targetHostIds)].map((targetHostId) => {
          const h = known.find((k) => k.targetHostId === targetHostId)
          return h === undefined
            ? { sourceHostId, targetHostId, allowanceMs: priorMs, source: "prior" as const, samples: 0 }
            : { sourceHostId, targetHostId, allowanceMs: h.allowanceMs, source: h.source, samples: h.samples }
        }),
      )
