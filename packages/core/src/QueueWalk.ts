/**
 * The one queue walk (SPEC §2): queued sessions in FIFO order against the room of the hosts,
 * each placement taking its room before the next session is judged; a session that fits
 * nowhere keeps its place and a later, smaller one may pass it. Both stores' drains and the
 * cumulative park policy walk the queue with it.
 *
 * **Holds for starving sessions.** A later, smaller session may pass a big one, so a big session
 * could wait for ever while small ones take each hole as it opens. A queued session that has
 * waited `starvation.limitMs` and fits nowhere gets a host *claimed* for it (`claims`): the
 * ready host that could take it when empty with the most free RAM (ties by id; oldest starving
 * session first, at most `maxClaims`). Every placement but the holder's skips a claimed host:
 * the walk, and a store's create and resume (`pickUnclaimed`). The rule is a function of the
 * queue and the hosts alone, so every store and the park gate (which descends the claimed
 * host's parks) find the same hosts without sharing any memory. A claimed host's free RAM only
 * grows (nobody else places there), so it stays the holder's host, or the claim moves to a host
 * with still more room; the wait ends when its sessions have left.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as Placement from "./Placement.js"
import type { Candidate } from "./Placement.js"
import { Index } from "./PlacementIndex.js"

/** A queued session as the walk sees it: its placement wants (`Placement.requestOf`: budget, affinity, template, image host). */
export interface Waiting extends Placement.Wanting {
  /** When it queued (a session that waited the starvation limit gets a host claimed). */
  readonly queuedAt?: number | null | undefined
}

/** When a queued session is starving: it has waited `limitMs` at `now`. */
export interface Starvation {
  readonly now: number
  readonly limitMs: number
}

/** At most this many claims at once: finding a host scans every host, and a claim per starving session could fence off a whole overloaded fleet. */
export const maxClaims = 16

/** A planned placement: the session goes to the host. */
export interface Planned<W extends Waiting = Waiting> {
  readonly waiting: W
  readonly hostId: string
}

/** What a walk decided. */
export interface Walk<W extends Waiting = Waiting> {
  /** The placements, in queue order. */
  readonly placed: readonly Planned<W>[]
  /** The sessions judged that fit nowhere when their turn came, in queue order. */
  readonly unplaced: readonly W[]
}

/** Options of a walk. */
export interface WalkOptions {
  /** Stop once this many are placed (later sessions are neither placed nor judged). */
  readonly limit?: number | undefined
  /** Claim hosts for the starving sessions of the queue (see `claims`); missing: no claims. */
  readonly starvation?: Starvation | undefined
  /** The deciding replica's share of the hosts, ranked first (`Placement.Spread`); missing: none. */
  readonly spread?: Placement.Spread | undefined
  /** When the walk is decided (ms): hosts silent then (`Placement.isSilent`) take nothing; missing: silence not judged. */
  readonly now?: number | undefined
}

/** The candidate with one more reservation of `budget` on it. */
export const withReservation = <C extends Candidate>(c: C, budget: Budget): C => ({
  ...c,
  headroom: { ...c.headroom, reserved: Headroom.add(c.headroom.reserved, budget) },
  entries: (c.entries ?? 0) + 1,
})

/** Whether `w` has waited the starvation limit. */
const isStarving = (w: Waiting, s: Starvation): boolean => w.queuedAt != null && s.now - w.queuedAt >= s.limitMs

/**
 * The hosts claimed for starving sessions, holder by host id: for each queued session (FIFO
 * order) that has waited `starvation.limitMs` and fits on no host left unclaimed, the ready,
 * measured host that could take it when empty with the most free RAM (ties by id), at most
 * `maxClaims`. The queue is in FIFO order, so the starving sessions come first: the scan stops
 * at the first that is not.
 */
export const claims = <W extends Waiting>(index: Index, queue: Iterable<W>, starvation: Starvation, limits: Limits): Map<string, W> => {
  const out = new Map<string, W>()
  const removed: Candidate[] = []
  // A budget no host is left for (too big for every host, or every such host claimed) is
  // judged once: an unplaceable session queues for ever and starves with its like.
  const hopeless = new Set<string>()
  const unmeasured = { ...limits, requireMeasured: false }
  // The hosts that could take a budget when empty, most free RAM first (ties by id), found once
  // per budget in a call: no placement happens meanwhile, so free RAM does not change, and each
  // claim of the same budget takes the next host not claimed yet (a starving queue is mostly a
  // few big budgets: one scan of the hosts each, not one per claim).
  const ranked = new Map<string, { readonly hosts: readonly Candidate[]; next: number }>()
  const rankedFor = (key: string, budget: Budget) => {
    let r = ranked.get(key)
    if (r === undefined) {
      const hosts: { c: Candidate; free: number }[] = []
      for (const c of index.values()) {
        if ((c.state ?? "ready") !== "ready" || Placement.isSilent(c, starvation.now, limits) || !Placement.isMeasured(c) || !Placement.fitsOn(Placement.emptied(c), budget, unmeasured)) continue
        hosts.push({ c, free: Headroom.freeMib(c.headroom) ?? Number.POSITIVE_INFINITY })
      }
      hosts.sort((a, b) => (a.free !== b.free ? b.free - a.free : a.c.id < b.c.id ? -1 : a.c.id > b.c.id ? 1 : 0))
      r = { hosts: hosts.map((h) => h.c), next: 0 }
      ranked.set(key, r)
    }
    return r
  }
  for (const w of queue) {
    if (!isStarving(w, starvation) || out.size >= maxClaims) break
    const key = `${w.budget.memMib}/${w.budget.vcpus}`
    if (hopeless.has(key) || index.anyFits(w.budget, starvation.now)) continue
    // The first ranked host still in the index (a host claimed for another budget has left it).
    const r = rankedFor(key, w.budget)
    while (r.next < r.hosts.length && index.get((r.hosts[r.next] as Candidate).id) === undefined) r.next++
    const best = r.hosts[r.next]
    if (best === undefined) {
      hopeless.add(key)
      continue
    }
    r.next++
    out.set(best.id, w)
    // Later sessions are judged without the claimed host.
    removed.push(best)
    index.remove(best.id)
  }
  for (const c of removed) index.upsert(c)
  return out
}

/**
 * The host placement picks for a request that is not a claim's holder (a create, a cold
 * resume): `index.pick` with the claimed hosts left out (they are set aside for a moment and
 * put back).
 */
export const pickUnclaimed = (index: Index, req: Placement.Request, claimed: ReadonlyMap<string, unknown>): string | null => {
  const first = index.pick(req)
  if (first === null || !claimed.has(first)) return first
  const aside: Candidate[] = []
  for (const id of claimed.keys()) {
    const c = index.get(id)
    if (c === undefined) continue
    aside.push(c)
    index.remove(id)
  }
  const other = index.pick(req)
  for (const c of aside) index.upsert(c)
  return other
}

/**
 * Walks `queue` (in FIFO order) over `index`, taking each placement's room out of it: the
 * index afterwards holds the room left. For a store that applies every planned placement to
 * the same hosts right away; {@link walk} leaves its input alone. With `starvation`, hosts are
 * claimed for starving sessions first (`claims`): only its holder places on a claimed host.
 */
export const walkOn = <W extends Waiting>(index: Index, queue: Iterable<W>, options: WalkOptions = {}): Walk<W> => {
  const limit = options.limit ?? Number.POSITIVE_INFINITY
  const placed: Planned<W>[] = []
  const unplaced: W[] = []
  const list = options.starvation === undefined ? queue : [...queue]
  const claimed = options.starvation === undefined ? new Map<string, W>() : claims(index, list, options.starvation, index.limits)
  // Claimed hosts leave the index for the walk; their holders are judged on them alone.
  const held = new Map<W, Candidate>()
  for (const [hostId, w] of claimed) {
    held.set(w, index.get(hostId) as Candidate)
    index.remove(hostId)
  }
  // Room only shrinks during a walk: a budget that fit nowhere (whatever its affinity, which
  // only ranks) fits nowhere later.
  const missed = new Set<string>()
  for (const w of list) {
    if (placed.length >= limit) break
    const own = held.get(w)
    if (own !== undefined) {
      if (Placement.fitsOn(own, w.budget, index.limits) && (options.now === undefined || !Placement.isSilent(own, options.now, index.limits))) {
        held.set(w, withReservation(own, w.budget))
        placed.push({ waiting: w, hostId: own.id })
      } else unplaced.push(w)
      continue
    }
    const key = `${w.budget.memMib}/${w.budget.vcpus}`
    const hostId = missed.has(key) ? null : index.pick(Placement.requestOf(w, options.spread, options.now))
    if (hostId === null) {
      missed.add(key)
      unplaced.push(w)
      continue
    }
    index.upsert(withReservation(index.get(hostId) as Candidate, w.budget))
    placed.push({ waiting: w, hostId })
  }
  for (const c of held.values()) index.upsert(c)
  return { placed, unplaced }
}

/** Walks `queue` over the room of `hosts` (SPEC §2): the placements in FIFO order and the sessions that fit nowhere. */
export const walk = <W extends Waiting>(
  queue: Iterable<W>,
  hosts: Iterable<Candidate>,
  options: WalkOptions = {},
  limits: Limits = defaults,
): Walk<W> => walkOn(Index.of(hosts, limits), queue, options)

/** What a replay of a plan against fresh room kept. */
export interface Replay<W extends Waiting = Waiting> {
  /** The placements that still fit, in order, each counting the room of those before it. */
  readonly accepted: readonly Planned<W>[]
  /** Whether any placement no longer fits (room changed since the plan was made). */
  readonly diverged: boolean
}

/**
 * Replays planned placements against fresh figures of their hosts (read under their locks):
 * each must still fit once the placements before it took their room.
 */
export const replay = <W extends Waiting>(
  plan: readonly Planned<W>[],
  fresh: Iterable<Candidate>,
  limits: Limits = defaults,
): Replay<W> => {
  const hosts = new Map<string, Candidate>()
  for (const c of fresh) hosts.set(c.id, c)
  const accepted: Planned<W>[] = []
  let diverged = false
  for (const p of plan) {
    const c = hosts.get(p.hostId)
    if (c !== undefined && Placement.fitsOn(c, p.waiting.budget, limits)) {
      hosts.set(p.hostId, withReservation(c, p.waiting.budget))
      accepted.push(p)
    } else diverged = true
  }
  return { accepted, diverged }
}
