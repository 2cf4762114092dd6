/**
 * The downtime guard's learned commit allowance per host pair (SPEC §13): core's
 * `Downtime.pairAllowance` over the recent commit phases the store keeps (the pair's own, else
 * pooled with its target's, then the fleet's; none older than the horizon), the configured
 * `commitAllowanceMs` as its prior. The assignments hand it to a move's source, so an agent
 * restart or another replica loses nothing, and `GET /v1/hosts/{id}/allowances` shows it.
 */
import type { Records } from "@engram/api"
import { Downtime } from "@engram/core"
import { nowOf } from "@engram/store"
import type { InvalidInput, PairCommits, StoreShape, Unavailable } from "@engram/store"
import { Effect } from "effect"

/** What the allowance rests on: the prior and the horizon (the coordinator's settings). */
export interface AllowanceSettings {
  readonly priorMs: number
  readonly horizonMs: number
}

/**
 * The commits within the horizon at `nowMs` that the allowances of moves from `sourceHostId` to
 * `targetHostIds` may count, in one bounded read (core's `Downtime.allowanceCommits`, cut to
 * `Downtime.poolLimit`): the answer of `Downtime.pairAllowance` over every recent pair, at a cost
 * that does not grow with the fleet's pairs.
 */
const recentPairs = (store: StoreShape, s: AllowanceSettings, nowMs: number, sourceHostId: string, targetHostIds: readonly string[]) =>
  store.listAllowanceCommits(Downtime.allowanceCommitsQuery(sourceHostId, targetHostIds, nowMs, s))

/** A pair's allowance at `nowMs`, from the recent commits read for it, with its own kept commits. */
export const historyOf = (p: Omit<PairCommits, "updatedAt"> & { readonly updatedAt: number | null }, recent: readonly PairCommits[], s: AllowanceSettings, nowMs: number): Records.PairHistory => {
  const a = Downtime.pairAllowance(recent, p.sourceHostId, p.targetHostId, nowMs, s)
  return {
    sourceHostId: p.sourceHostId,
    targetHostId: p.targetHostId,
    allowanceMs: a.allowanceMs,
    source: a.source,
    samples: a.samples,
    commitsMs: [...p.commitsMs],
    recordedAtMs: [...p.recordedAtMs],
    updatedAt: p.updatedAt,
  }
}

/**
 * The allowances now of moves from `sourceHostId`: to each target it has committed moves to; or,
 * with `targetHostId`, to that one only, listed even without commits of its own (it may learn
 * from its target's or the fleet's).
 */
export const histories = (
  store: StoreShape,
  s: AllowanceSettings,
  sourceHostId: string,
  targetHostId?: string,
): Effect.Effect<readonly Records.PairHistory[], InvalidInput | Unavailable> =>
  Effect.gen(function* () {
    // The store's time: the commits' times were stamped on it.
    const nowMs = yield* nowOf(store)
    const named: readonly PairCommits[] = yield* store.listPairCommits({ sourceHostId, targetHostId })
    const asked = targetHostId === undefined || named.length > 0 ? named : [{ sourceHostId, targetHostId, commitsMs: [], recordedAtMs: [], updatedAt: null }]
    if (asked.length === 0) return []
    const recent = yield* recentPairs(store, s, nowMs, sourceHostId, asked.map((p) => p.targetHostId))
    return asked.map((p) => historyOf(p, recent, s, nowMs))
  })

/**
 * The allowance now of moves from `sourceHostId` to each of `targetHostIds`: one bounded read of
 * the recent commits they may count (no read without a target), then core's rule per target.
 */
export const forTargets = (
  store: StoreShape,
  s: AllowanceSettings,
  sourceHostId: string,
  targetHostIds: readonly string[],
): Effect.Effect<readonly Records.PairAllowance[], InvalidInput | Unavailable> =>
  targetHostIds.length === 0
    ? Effect.succeed([])
    : Effect.gen(function* () {
        const nowMs = yield* nowOf(store)
        const targets = [...new Set(targetHostIds)]
        const recent = yield* recentPairs(store, s, nowMs, sourceHostId, targets)
        return targets.map((targetHostId) => {
          const a = Downtime.pairAllowance(recent, sourceHostId, targetHostId, nowMs, s)
          return { sourceHostId, targetHostId, allowanceMs: a.allowanceMs, source: a.source, samples: a.samples }
        })
      })
