/**
 * The one queue walk (SPEC §2): queued sessions in FIFO order against the room of the hosts,
 * each placement taking its room before the next session is judged; a session that fits
 * nowhere keeps its place and a later, smaller one may pass it. Both stores' drains and the
 * cumulative park policy walk the queue with it.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as Placement from "./Placement.js"
import type { Candidate } from "./Placement.js"
import { Index } from "./PlacementIndex.js"

/** A queued session as the walk sees it (any record with a budget and, optionally, an affinity). */
export interface Waiting {
  readonly budget: Budget
  readonly affinity?: readonly string[] | undefined
}

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
}

/** The candidate with one more reservation of `budget` on it. */
export const withReservation = <C extends Candidate>(c: C, budget: Budget): C => ({
  ...c,
  headroom: { ...c.headroom, reserved: Headroom.add(c.headroom.reserved, budget) },
  entries: (c.entries ?? 0) + 1,
})

/**
 * Walks `queue` (in FIFO order) over `index`, taking each placement's room out of it: the
 * index afterwards holds the room left. For a store that applies every planned placement to
 * the same hosts right away; {@link walk} leaves its input alone.
 */
export const walkOn = <W extends Waiting>(index: Index, queue: Iterable<W>, options: WalkOptions = {}): Walk<W> => {
  const limit = options.limit ?? Number.POSITIVE_INFINITY
  const placed: Planned<W>[] = []
  const unplaced: W[] = []
  // Room only shrinks during a walk: a budget that fit nowhere (whatever its affinity, which
  // only ranks) fits nowhere later.
  const missed = new Set<string>()
  for (const w of queue) {
    if (placed.length >= limit) break
    const key = `${w.budget.memMib}/${w.budget.vcpus}`
    const hostId = missed.has(key) ? null : index.pick({ budget: w.budget, affinity: w.affinity ?? [] })
    if (hostId === null) {
      missed.add(key)
      unplaced.push(w)
      continue
    }
    index.upsert(withReservation(index.get(hostId) as Candidate, w.budget))
    placed.push({ waiting: w, hostId })
  }
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
