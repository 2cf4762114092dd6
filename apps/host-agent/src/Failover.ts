/**
 * Several coordinator replicas behind one agent, without a proxy: which URLs it takes
 * (`ENGRAM_COORDINATOR_URL`, comma-separated), how long one call may take before the replica
 * counts as hung, which failures say "this replica is unreachable" (the agent moves to the next)
 * and which are the coordinator's answer (it stays), and the replica in use: one at a time
 * (sticky), the next in the list (round robin) when it is unreachable, switched once however
 * many calls fail on it at the same time.
 *
 * Why: a replica that hangs (SIGSTOP, a stuck VM, a network black hole) instead of dying keeps
 * every retry of an agent that knows only it; past the new leader's failover grace the host
 * looks dead and its sessions become `lost` although its guests run.
 */
import { Replicas } from "@engram/client"
import { Deferred, Effect, Ref } from "effect"

// The rules shared with the `engram` CLI (`ENGRAM_URL`) live in `@engram/client`'s `Replicas`:
// which URLs a list takes, and which failures say "this replica is unreachable".
export type ParsedUrls = Replicas.ParsedUrls
export const { baseUrlOf, parseUrls, redactUrl, storeStalled, unreachable } = Replicas

/** The shortest bound of one ordinary call, ms: below it a live coordinator on a busy machine (a GC pause, a slow store round trip) would be taken for a hung one. */
export const minCallTimeoutMs = 1_000

/** The longest bound of one ordinary call, ms: the agent's bound before replicas (a longer heartbeat interval does not lengthen it). */
export const maxCallTimeoutMs = 30_000

/**
 * How long one ordinary call (a heartbeat, a report, an acknowledgement) may take before its
 * replica counts as hung: the heartbeat interval, within [`minCallTimeoutMs`, `maxCallTimeoutMs`].
 * Why the interval: the last heartbeat answered at t, the next is sent by t + interval, times out
 * by t + 2 × interval and is tried at once on the next replica, so with the default interval (a
 * third of the stale window) a live replica has it a third of the window before the host is stale.
 */
export const callTimeoutMs = (heartbeatIntervalMs: number): number => Math.min(maxCallTimeoutMs, Math.max(minCallTimeoutMs, heartbeatIntervalMs))

/**
 * How long an assignments long-poll of `waitMs` may take: the wait, plus one ordinary call's bound
 * and at least 15 s (the margin before replicas) for the answer to arrive: the coordinator reads the
 * store before it starts to wait and may read again after a late wake-up, so a live but busy
 * replica answers a little past the wait. A hung replica is found by the heartbeat's shorter bound.
 * With one URL (`urlCount` 1) the margin is 15 s, as before replicas.
 */
export const pollTimeoutMs = (waitMs: number, callMs: number, urlCount = 2): number => waitMs + (urlCount > 1 ? Math.max(callMs, pollMarginMs) : pollMarginMs)

/** The least margin of a long-poll past its wait, ms (`pollTimeoutMs`). */
export const pollMarginMs = 15_000

/**
 * The bound of one ordinary call for an agent given `urlCount` URLs: with one there is nowhere
 * else to go, so a shorter bound would only fail slow answers (the 30 s before replicas); with
 * several, `callTimeoutMs` of the heartbeat interval.
 */
export const callTimeoutFor = (urlCount: number, heartbeatIntervalMs: number): number =>
  urlCount > 1 ? callTimeoutMs(heartbeatIntervalMs) : maxCallTimeoutMs

/**
 * The replica an agent starts on: one drawn from its host id (FNV-1a), so a fleet given the same
 * list spreads over the replicas instead of all starting on the first.
 */
export const startIndex = (hostId: string, count: number): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < hostId.length; i++) h = Math.imul(h ^ hostId.charCodeAt(i), 0x01000193)
  return (h >>> 0) % Math.max(1, count)
}

/** The replica in use: its index in the list, and the move to the next. */
export interface Sticky {
  /**
   * The replica in use, and `movedAway`: done, with the index switched to, once the agent leaves
   * it (any call found it unreachable). A call still open on a replica left (a long-poll above
   * all) is interrupted by it and tried at once on the next, instead of waiting out its own bound.
   */
  readonly use: Effect.Effect<{ readonly index: number; readonly movedAway: Effect.Effect<number> }>
  /**
   * Leaves replica `index` for the next in the list (round robin) if it is still the one in use
   * (compare-and-set): calls that failed on it at the same time switch once, and a call that
   * failed on a replica already left does not skip over the next. The index switched to, or
   * undefined when another call already switched.
   */
  readonly leave: (index: number) => Effect.Effect<number | undefined>
}

/** The replica in use, and what is done when the agent leaves it (the index switched to). */
type InUse = { readonly index: number; readonly moved: Deferred.Deferred<number> }
/** A move made: to where, and the replica's `moved` to complete. */
type Move = { readonly to: number; readonly left: Deferred.Deferred<number> }

/** A sticky choice among `count` replicas, starting with replica `start`. */
export const makeSticky = (count: number, start = 0): Effect.Effect<Sticky> =>
  Effect.map(Ref.make<InUse>({ index: start, moved: Deferred.makeUnsafe<number>() }), (ref) => ({
    use: Effect.map(Ref.get(ref), (now) => ({ index: now.index, movedAway: Deferred.await(now.moved) })),
    leave: (index) =>
      Effect.gen(function* () {
        const moved = yield* Ref.modify(ref, (now): readonly [Move | undefined, InUse] => {
          if (now.index !== index) return [undefined, now]
          const to = (index + 1) % count
          return [{ to, left: now.moved }, { index: to, moved: Deferred.makeUnsafe<number>() }]
        })
        if (moved === undefined) return undefined
        yield* Deferred.succeed(moved.left, moved.to)
        return moved.to
      }),
  }))
