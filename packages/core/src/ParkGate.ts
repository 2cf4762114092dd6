/**
 * The park gate (SPEC §4.1, §12): a park holds until a queued session has no room. Given one
 * fleet read it decides which parks yield (descend) this pass. Pure: the reaper reads the fleet,
 * calls `evaluate` (or a `ParkPolicy`), and acts on the answer. Whether an idle session parks is
 * `ParkPolicy.mayPark`, asked by the session's step; it reads `anyWithoutRoom`.
 *
 * The gate is a composition of steps, each exported so every `ParkPolicy` builds on the same
 * pieces instead of a copy of them:
 * 1. `unplaceable`: queued sessions too big for every ready measured host even when empty
 *    (`too_big`): no descent can help them, so they never count as waiting for room;
 * 2. `withoutRoom`: the other queued sessions that fit on no candidate host, each judged alone;
 * 3. `descentsRunning`: one running descent counts for one waiting session;
 * 4. `mayYield`: the yields that do not depend on the queue (over-reserved hosts, parks past
 *    the hard TTL) and the hosts whose oldest park may yield for demand;
 * 5. `nearestToFit`: the demand yields, on the hosts nearest to a fit;
 * 6. `serve`: one host held for each session it makes room for, every park it needs there
 *    yielding at once: a starving session always (see below), every waiting session under a
 *    fitting policy (`Steps.fit`, `demand-reserve`); `DescentPlanner` plans the descents.
 * `decide` composes them, with seams for the policies (`Steps`).
 *
 * **Silent hosts.** Every step judges room as placement does at the decision's time: a host
 * whose agent has not reported within the stale window (`Placement.isSilent`, `gives`) takes no
 * placement, so its room is no room for the queue, its parks do not yield for demand (their room
 * could not take the queue) and no host is held there. The yields that do not wait for demand
 * (over-reserved, hard TTL) still apply to it, and it still counts in sizing the fleet (`too_big`):
 * its agent may come back.
 *
 * **The starvation bound.** The queue lets a later, smaller session place past a big one
 * (SPEC §2), and demand yields one park per host on the hosts with the most free RAM, so a big
 * session can wait for ever while small ones take each hole as it opens. A queued session
 * without room that has waited longer than `starvationLimitMs` is *starving*: the gate holds one
 * host for it (the one that needs the fewest MiB of parks descended to fit it, else the nearest
 * to fitting it), yields on that host every park it takes to fit (oldest first; more than one
 * per pass), and while the hold lasts no idle session parks there (it descends, adding its
 * room: while its session waits without room no idle session parks anywhere). The hold is part of the gate's answer and comes back as an input at the next pass, so
 * the room gathers on one host instead of being spread over many. The queue drains in FIFO
 * order, so the starving session (the oldest waiting) takes the room when it is whole. Where
 * descents alone cannot make the room, the gate holds the host placement claims for it
 * (`QueueWalk.claims`): every placement but the holder's skips that host, so smaller sessions
 * cannot take its holes, and the wait is bounded by the time its sessions take to leave.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import { byId, compareIds } from "./Order.js"
import * as Placement from "./Placement.js"
import type { Candidate } from "./Placement.js"
import { Index } from "./PlacementIndex.js"
import * as QueueWalk from "./QueueWalk.js"

/** A parked session on a host. */
export interface Park {
  readonly sessionId: string
  readonly parkedAt: number
  readonly budget: Budget
}

/** A queued session waiting for room. */
export interface Queued {
  readonly sessionId: string
  readonly budget: Budget
  readonly queuedAt: number
}

/** A host in the fleet view: its placement view, the descents running on it and its parks. */
export interface FleetHost extends Candidate {
  readonly descentsRunning: number
  readonly parks: readonly Park[]
}

/** The fleet view of SPEC §4.1, read once per reaper pass. */
export interface FleetView {
  readonly hosts: readonly FleetHost[]
  readonly queue: readonly Queued[]
}

/** Why a park yields. `starving`: room made for a session waiting past the starvation limit. */
export type YieldReason = "demand" | "over_reserved" | "hard_ttl" | "starving"

/** One park to descend this pass. */
export interface Yield<R extends string = YieldReason> {
  readonly hostId: string
  readonly sessionId: string
  readonly reason: R
}

/**
 * A host held for one queued session: the room gathers there until the session places.
 * `starving`: it waited past the starvation limit; `fit`: a fitting policy chose the host.
 */
export interface Hold {
  readonly sessionId: string
  readonly hostId: string
  readonly reason: "starving" | "fit"
}

/** The gate's knobs beyond the limits. */
export interface Options {
  /** A queued session without room that has waited this long is starving (room is made for it). */
  readonly starvationLimitMs: number
  /**
   * How many sessions get a newly chosen host held for them in one pass (default
   * {@link defaultMaxNewHoldsPerPass}); holds kept from the last pass do not count. Choosing a
   * host searches every host, so this bounds a pass in an overloaded fleet where thousands
   * starve at once; the oldest are served first and the rest in the next passes.
   */
  readonly maxNewHoldsPerPass?: number | undefined
}

/** Sixteen new holds a pass: at 10,000 hosts a pass stays well under a second however many starve. */
export const defaultMaxNewHoldsPerPass = 16

/**
 * Seven and a half minutes: a session without room waits about this long, plus the descents (and,
 * with make-room moves, the moves) its held host needs. The goal of issue 22 bounds the longest
 * wait at 10 minutes past the 30 % floor's: a limit of 10 minutes would spend the whole allowance
 * before any room is made, so the limit leaves 150 s for it (a 128 GiB session's moves at 1 GiB/s
 * take about 130 s). The simulator README's "The default over every workload" has the sweep.
 */
export const defaultOptions: Options = Object.freeze({ starvationLimitMs: 450 * 1000 })

/** What the gate remembers from one pass to the next (the reaper keeps it; empty at start). */
export interface Memory {
  readonly holds: readonly Hold[]
}

/** Nothing remembered. */
export const noMemory: Memory = Object.freeze({ holds: Object.freeze([]) as readonly Hold[] })

/** The gate's answer for one pass (`R`: the reasons a yield may give). */
export interface Decision<R extends string = YieldReason> {
  /** Parks to descend now: none on a host where a descent runs; one per host but for a hold. */
  readonly yields: readonly Yield<R>[]
  /** Queued sessions that fit on no candidate host, each judged alone (too-big ones excluded). */
  readonly withoutRoom: number
  /** Queued sessions that fit on no ready measured host even when empty (`too_big`). */
  readonly unplaceable: number
  /** Descents running in the fleet (each counts for one waiting session). */
  readonly descentsRunning: number
  /** Hosts held for starving sessions: the memory for the next pass. */
  readonly holds: readonly Hold[]
}

// ---- orders --------------------------------------------------------------------------------

/** Park order: oldest first, ties by session id. */
export const byParkAge = (a: Park, b: Park): number => a.parkedAt - b.parkedAt || compareIds(a.sessionId, b.sessionId)

/** The park that yields first on a host: the oldest. */
export const oldestPark = (parks: readonly Park[]): Park | undefined => {
  let oldest: Park | undefined
  for (const p of parks) if (oldest === undefined || byParkAge(p, oldest) < 0) oldest = p
  return oldest
}

/** Host order for demand (SPEC §4.1): the most unreserved RAM first (the nearest to a fit), ties by id. */
export const byNearestToFit = (a: FleetHost, b: FleetHost): number => {
  const fa = Headroom.freeMib(a.headroom) ?? Number.POSITIVE_INFINITY
  const fb = Headroom.freeMib(b.headroom) ?? Number.POSITIVE_INFINITY
  return fa !== fb ? (fb > fa ? 1 : -1) : byId(a, b)
}

// ---- step 1: unplaceable (too_big) ---------------------------------------------------------

/** Queued sessions no descent can help: too big for every ready measured host, in queue order. */
export const unplaceable = (fleet: FleetView, limits: Limits = defaults): Queued[] => {
  if (fleet.queue.length === 0) return []
  const tooBig = Placement.tooBigFor(fleet.hosts, limits)
  return fleet.queue.filter((q) => tooBig(q.budget))
}

/** The largest unplaceable budget, per dimension: the size of host the fleet lacks. */
export const largestOf = (queue: readonly Queued[]): Budget => {
  let memMib = 0
  let vcpus = 0
  for (const q of queue) {
    memMib = Math.max(memMib, q.budget.memMib)
    vcpus = Math.max(vcpus, q.budget.vcpus)
  }
  return { memMib, vcpus }
}

// ---- step 2: without room ------------------------------------------------------------------

/**
 * Whether the host's room can take the queue at `now`: its agent is not silent then
 * (`Placement.isSilent`). The gate's one reading of silence; without a `now`, not judged.
 */
export const gives = (h: Placement.Candidate, now: number | undefined, limits: Limits): boolean =>
  now === undefined || !Placement.isSilent(h, now, limits)

/**
 * Queued sessions that fit on no candidate host, each judged alone against the current
 * headroom, in queue order; sessions too big for every host are left out (no descent helps them).
 * With `now`, a host silent then (`Placement.isSilent`: its agent has not reported within the
 * stale window) is no room: nothing is placed there (what the fleet's autoscaling cue reads).
 * A host in `claimed` (held by placement for a starving session, `claimedHosts`) is no room
 * either: placement puts nobody else there, so a session that fits only there waits as surely as
 * one that fits nowhere (its holder fits on no other host, so it is without room too).
 */
export const withoutRoom = (fleet: FleetView, limits: Limits = defaults, now?: number, claimed?: ReadonlySet<string>): Queued[] => {
  if (fleet.queue.length === 0) return []
  const index = Placement.roomIndex(
    now === undefined && claimed === undefined ? fleet.hosts : fleet.hosts.filter((h) => gives(h, now, limits) && claimed?.has(h.id) !== true),
    limits,
  )
  const waiting = fleet.queue.filter((q) => !index.anyFits(q.budget))
  if (waiting.length === 0) return waiting
  const tooBig = Placement.tooBigFor(fleet.hosts, limits)
  return waiting.filter((q) => !tooBig(q.budget))
}

/**
 * Whether any queued budget fits on no candidate host (`fits` answers that, e.g. a store's
 * placement index), too-big ones left out: what the idle decision reads of the queue. Each
 * budget is judged once however many sessions ask for it.
 */
export const anyWithoutRoom = (queued: Iterable<Budget>, fits: (b: Budget) => boolean, tooBig: (b: Budget) => boolean): boolean => {
  const judged = new Set<string>()
  for (const b of queued) {
    const key = `${b.memMib}/${b.vcpus}`
    if (judged.has(key)) continue
    judged.add(key)
    if (!fits(b) && !tooBig(b)) return true
  }
  return false
}

/**
 * How many queued sessions are without room (`withoutRoom(...).length`). With `now` and the
 * gate's `options`, a host placement claims then for a starving session (`claimsAt`) is no room
 * either, as the gate counts it (`decide`): what the fleet's autoscaling cue reads.
 */
export const countWithoutRoom = (fleet: FleetView, limits: Limits = defaults, now?: number, options?: Options): number =>
  withoutRoom(fleet, limits, now, now === undefined || options === undefined ? undefined : claimsAt(fleet, now, limits, options).hostIds).length

// ---- step 3: descents running ---------------------------------------------------------------

/** Descents running in the fleet. */
export const descentsRunning = (fleet: FleetView): number => {
  let n = 0
  for (const h of fleet.hosts) n += Math.max(0, h.descentsRunning)
  return n
}

// ---- step 4: which parks may yield ---------------------------------------------------------

/** The yields that do not wait for demand, and the hosts that may yield for it. */
export interface Eligible {
  /** Over-reserved hosts and parks past the hard TTL: they yield regardless of the queue. */
  readonly forced: readonly Yield[]
  /** Ready measured hosts with a park, no descent running and no forced yield: the demand pool. */
  readonly pool: readonly FleetHost[]
}

/**
 * SPEC §4.1's per-host rules: a host where a descent runs yields nothing this pass; an
 * over-reserved measured host yields its oldest park; a park past the hard TTL yields, on any
 * host; any other measured ready host with a park may yield for demand, if `eligible` (a
 * policy's extra rule) agrees.
 */
export const mayYield = (
  fleet: FleetView,
  now: number,
  limits: Limits = defaults,
  eligible: (h: FleetHost) => boolean = () => true,
): Eligible => {
  const forced: Yield[] = []
  const pool: FleetHost[] = []
  for (const h of fleet.hosts) {
    if (h.parks.length === 0 || h.descentsRunning > 0) continue
    const oldest = oldestPark(h.parks) as Park
    const measured = Placement.isMeasured(h)
    if (measured && Headroom.isOverReserved(h.headroom)) forced.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "over_reserved" })
    // The hard TTL holds on any host: one whose agent stopped measuring keeps no park for ever.
    else if (now - oldest.parkedAt > limits.parkHardTtlMs) forced.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "hard_ttl" })
    // Only a host that takes placements (measured, ready, its agent not silent) can give its room to the queue.
    else if (measured && (h.state ?? "ready") === "ready" && gives(h, now, limits) && eligible(h)) pool.push(h)
  }
  return { forced, pool }
}

// ---- step 5: demand yields -----------------------------------------------------------------

/** Demand yields (SPEC §4.1): the `wanted` hosts nearest to a fit, the oldest park on each. */
export const nearestToFit = (pool: readonly FleetHost[], wanted: number): Yield[] => {
  if (wanted <= 0 || pool.length === 0) return []
  return [...pool]
    .sort(byNearestToFit)
    .slice(0, wanted)
    .map((h) => ({ hostId: h.id, sessionId: (oldestPark(h.parks) as Park).sessionId, reason: "demand" as const }))
}

// ---- step 6: room for one session on one host (starvation, fitting) ------------------------

/** Queued sessions without room that have waited at least `limitMs`, oldest first. */
export const starving = (waiting: readonly Queued[], now: number, limitMs: number): Queued[] =>
  waiting
    .filter((q) => now - q.queuedAt >= limitMs)
    .sort((a, b) => a.queuedAt - b.queuedAt || compareIds(a.sessionId, b.sessionId))

const parkedMib = (parks: readonly Park[]): number => parks.reduce((a, p) => a + p.budget.memMib, 0)

/** What descending parks on one host would do for one budget. */
export interface Descents {
  /** The parks to descend, oldest first (all the eligible ones when they do not suffice). */
  readonly parks: readonly Park[]
  /** Whether the budget fits once they have descended. */
  readonly fits: boolean
}

/**
 * Plans descents for one budget at a time, over one fleet read: each host's parks sorted once
 * (oldest first), then for a budget the parks whose descents make it fit. Each descent frees
 * its budget and one entry.
 */
export class DescentPlanner {
  private readonly sorted = new Map<string, readonly Park[]>()
  /** `now`: the decision's time; a host silent then could take nothing (`gives`). Missing: silence not judged. */
  constructor(
    readonly limits: Limits = defaults,
    readonly now?: number | undefined,
  ) {}

  /** The host's parks, oldest first. */
  parksOf(h: FleetHost): readonly Park[] {
    let parks = this.sorted.get(h.id)
    if (parks === undefined) {
      parks = [...h.parks].sort(byParkAge)
      this.sorted.set(h.id, parks)
    }
    return parks
  }

  /** The oldest parks (those `eligible` accepts) whose descents make `budget` fit on `h`. */
  descents(h: FleetHost, budget: Budget, eligible: (p: Park) => boolean = () => true): Descents {
    let headroom = h.headroom
    let entries = h.entries ?? 0
    const fitsNow = () => Placement.fitsOn({ ...h, headroom, entries }, budget, this.limits)
    if (fitsNow()) return { parks: [], fits: true }
    const out: Park[] = []
    for (const p of this.parksOf(h)) {
      if (!eligible(p)) continue
      out.push(p)
      headroom = { ...headroom, reserved: Headroom.subtract(headroom.reserved, p.budget) }
      entries = Math.max(0, entries - 1)
      if (fitsNow()) return { parks: out, fits: true }
    }
    return { parks: out, fits: false }
  }

  /** Whether `h` could take `budget` at all: ready, not silent, measured, big enough when empty. */
  could(h: FleetHost, budget: Budget): boolean {
    return (
      (h.state ?? "ready") === "ready" &&
      gives(h, this.now, this.limits) &&
      Placement.isMeasured(h) &&
      Placement.fitsOn(Placement.emptied(h), budget, { ...this.limits, requireMeasured: false })
    )
  }

  /**
   * The cheapest room for `budget` made by descents alone: among hosts that could take it, with
   * no descent running and not `taken`, the one whose eligible parks make it fit with the fewest
   * MiB descended (ties: the most free RAM, then id).
   */
  cheapest(
    budget: Budget,
    hosts: readonly FleetHost[],
    taken: ReadonlySet<string>,
    eligible?: (p: Park) => boolean,
  ): { readonly host: FleetHost; readonly descents: Descents } | undefined {
    let best: { host: FleetHost; descents: Descents; cost: number } | undefined
    for (const h of hosts) {
      if (taken.has(h.id) || h.descentsRunning > 0 || h.parks.length === 0 || Headroom.isOverReserved(h.headroom) || !this.could(h, budget)) continue
      // Quick refusal: even with every park gone the RAM is short.
      const free = Headroom.gatesRam(h.headroom) ? (Headroom.freeMib(h.headroom) as number) : Number.POSITIVE_INFINITY
      if (free + parkedMib(h.parks) < budget.memMib) continue
      const descents = this.descents(h, budget, eligible)
      if (!descents.fits || descents.parks.length === 0) continue
      const cost = parkedMib(descents.parks)
      if (best === undefined || cost < best.cost || (cost === best.cost && byNearestToFit(h, best.host) < 0)) best = { host: h, descents, cost }
    }
    return best
  }
}

/**
 * The host to hold for a starving session: the cheapest room made by descents alone; failing
 * that, the host placement has claimed for it (`QueueWalk.claims`: only it may place there, so
 * the room gathers as sessions end or go idle and its parks descend), else the host nearest to
 * fitting it (the most free RAM once all its parks descend).
 */
export const holdFor = (
  q: Queued,
  hosts: readonly FleetHost[],
  taken: ReadonlySet<string>,
  planner: DescentPlanner,
  claimed?: FleetHost | undefined,
): FleetHost | undefined => {
  const cheapest = planner.cheapest(q.budget, hosts, taken)
  if (cheapest !== undefined) return cheapest.host
  if (claimed !== undefined && !taken.has(claimed.id)) return claimed
  let nearest: { h: FleetHost; freeAfter: number } | undefined
  for (const h of hosts) {
    if (taken.has(h.id) || !planner.could(h, q.budget)) continue
    const freeAfter = (Headroom.freeMib(h.headroom) ?? Number.POSITIVE_INFINITY) + parkedMib(h.parks)
    if (nearest === undefined || freeAfter > nearest.freeAfter || (freeAfter === nearest.freeAfter && byId(h, nearest.h) < 0)) nearest = { h, freeAfter }
  }
  return nearest?.h
}

/** Queue order (SPEC §2): first queued first, ties by id. */
const byQueueOrder = (a: Queued, b: Queued): number => a.queuedAt - b.queuedAt || compareIds(a.sessionId, b.sessionId)

/** The hosts placement claims for the starving sessions of this read, by holder (`QueueWalk.claims`). */
export const claimedHosts = (fleet: FleetView, now: number, limits: Limits, options: Options): Map<string, FleetHost> => {
  const byHostId = new Map(fleet.hosts.map((h) => [h.id, h]))
  const out = new Map<string, FleetHost>()
  const queue = [...fleet.queue].sort(byQueueOrder)
  for (const [hostId, q] of QueueWalk.claims(Index.of(fleet.hosts, limits), queue, { now, limitMs: options.starvationLimitMs }, limits))
    out.set(q.sessionId, byHostId.get(hostId) as FleetHost)
  return out
}

/** The hosts placement claims for starving sessions at one time: by holder, and their ids. */
export interface Claims {
  /** The claimed host of each holder (`claimedHosts`). */
  readonly byHolder: ReadonlyMap<string, FleetHost>
  /** The claimed hosts' ids (undefined when none): no room for the queue but for their holders. */
  readonly hostIds: ReadonlySet<string> | undefined
}

const noClaims: Claims = Object.freeze({ byHolder: new Map<string, FleetHost>(), hostIds: undefined })

/**
 * The hosts placement claims at `now` for the queued sessions starving then (`claimedHosts`):
 * none, and no work, while no queued session has waited `starvationLimitMs`. The gate's one
 * reading of claims, for its decision and for the fleet's count of sessions without room.
 */
export const claimsAt = (fleet: FleetView, now: number, limits: Limits, options: Options): Claims => {
  if (!fleet.queue.some((q) => now - q.queuedAt >= options.starvationLimitMs)) return noClaims
  const byHolder = claimedHosts(fleet, now, limits, options)
  return byHolder.size === 0 ? noClaims : { byHolder, hostIds: new Set(Array.from(byHolder.values(), (h) => h.id)) }
}

/** The serving step's answer: the holds for the next pass and the yields on held hosts. */
export interface Served {
  readonly holds: readonly Hold[]
  readonly yields: readonly Yield[]
}

/**
 * Holds one host for each session it makes room for, and yields there the parks it takes to
 * fit (several at once; none while descents run on the host: they free room first).
 * - A *starving* session (waited past `starvationLimitMs`, oldest first) always gets a host:
 *   the cheapest room made by descents, else the host placement claims for it, else the nearest
 *   to fitting it. Its hold stays from pass to pass while it starves and the host could take it,
 *   but where the host's parks cannot make the room it moves to room that descents alone make
 *   elsewhere as soon as there is some (or to the host placement claims for it now).
 * - With `fit`, every other session without room (in queue order) gets the host where
 *   descending parks alone makes it fit at the least cost, if there is one; its hold stays
 *   while descents run there or its parks can still make the room.
 * Sessions served here are left out of the demand count; parks yielded here are not yielded again.
 */
export const serve = (
  fleet: FleetView,
  waiting: readonly Queued[],
  ctx: {
    readonly now: number
    readonly limits: Limits
    readonly options: Options
    readonly memory: Memory
    /** The pass's claimed hosts by holder (`claimedHosts`), when already computed. */
    readonly claimed?: ReadonlyMap<string, FleetHost> | undefined
  },
  fit: boolean,
  planner: DescentPlanner = new DescentPlanner(ctx.limits, ctx.now),
): Served => {
  const starvingNow = starving(waiting, ctx.now, ctx.options.starvationLimitMs)
  // Nobody to serve (the common pass): no host is looked at.
  if (starvingNow.length === 0 && (!fit || waiting.length === 0)) return { holds: [], yields: [] }
  const byHostId = new Map(fleet.hosts.map((h) => [h.id, h]))
  const previous = new Map(ctx.memory.holds.map((hold) => [hold.sessionId, hold.hostId]))
  const starvingIds = new Set(starvingNow.map((q) => q.sessionId))
  const order = fit ? [...starvingNow, ...waiting.filter((q) => !starvingIds.has(q.sessionId))] : starvingNow
  const taken = new Set<string>()
  const holds: Hold[] = []
  const yields: Yield[] = []
  const maxNew = ctx.options.maxNewHoldsPerPass ?? defaultMaxNewHoldsPerPass
  let chosen = 0
  let looked = 0
  // Computed once, when a starving session needs it (`decide` passes the pass's own).
  let claimed: ReadonlyMap<string, FleetHost> | undefined = ctx.claimed
  for (const q of order) {
    const isStarving = starvingIds.has(q.sessionId)
    const kept = byHostId.get(previous.get(q.sessionId) ?? "")
    const keptUsable = kept !== undefined && !taken.has(kept.id) && planner.could(kept, q.budget)
    let h: FleetHost | undefined
    // A hold lasts while its descents run or its parks can still make the room.
    if (keptUsable && (kept.descentsRunning > 0 || planner.descents(kept, q.budget).fits)) h = kept
    if (h === undefined && isStarving) {
      // A starving session held where its parks cannot make the room (a host claimed for it,
      // waiting for sessions to end) looks again for room descents alone make, elsewhere: room
      // may have appeared since the hold was chosen. A look scans every host, so a pass takes
      // as many such looks as it chooses new holds at most (the oldest first), apart from them;
      // beyond them (or with no such room) the hold stays unless placement now claims another
      // host for it.
      if (keptUsable) {
        if (looked < maxNew) {
          looked += 1
          h = planner.cheapest(q.budget, fleet.hosts, taken)?.host
        }
        if (h === undefined) {
          claimed ??= claimedHosts(fleet, ctx.now, ctx.limits, ctx.options)
          const claim = claimed.get(q.sessionId)
          if (claim === undefined || claim.id === kept.id) h = kept
        }
      }
      if (h === undefined) {
        // A new hold searches every host: a bounded number per pass (the queue's oldest first).
        if (chosen >= maxNew) continue
        chosen += 1
        claimed ??= claimedHosts(fleet, ctx.now, ctx.limits, ctx.options)
        h = holdFor(q, fleet.hosts, taken, planner, claimed.get(q.sessionId))
      }
    } else if (h === undefined) {
      // A new hold searches every host: a bounded number per pass (the queue's oldest first).
      if (chosen >= maxNew) continue
      chosen += 1
      h = planner.cheapest(q.budget, fleet.hosts, taken)?.host
    }
    if (h === undefined) continue
    taken.add(h.id)
    holds.push({ sessionId: q.sessionId, hostId: h.id, reason: isStarving ? "starving" : "fit" })
    // Descents already running on the held host free room: wait for them.
    if (h.descentsRunning > 0 || Headroom.isOverReserved(h.headroom)) continue
    const reason = isStarving ? ("starving" as const) : ("demand" as const)
    for (const p of planner.descents(h, q.budget).parks) yields.push({ hostId: h.id, sessionId: p.sessionId, reason })
  }
  return { holds, yields }
}

// ---- the composition -----------------------------------------------------------------------

/** The seams a demand-style policy may change (`X`: the reason its extra yields give). */
export interface Steps<X extends string = never> {
  /** Serve every session without room on a held host where descents alone make it fit (`serve` with `fit`). */
  readonly fit?: boolean
  /**
   * The queued sessions without room at `now` (silent hosts are no room, nor the hosts in
   * `claimed`, held by placement for starving sessions), in the order they count (default: `withoutRoom`).
   */
  readonly waiting?: (fleet: FleetView, limits: Limits, now: number, claimed?: ReadonlySet<string>) => readonly Queued[]
  /** Extra rule for the demand pool (default: every eligible host). */
  readonly eligible?: (h: FleetHost, now: number) => boolean
  /** How the demand yields are chosen from the pool (default: `nearestToFit`). */
  readonly choose?: (pool: readonly FleetHost[], wanted: number, waiting: readonly Queued[], fleet: FleetView, limits: Limits) => Yield[]
  /** Extra yields beyond demand, from what is left of the pool after demand (e.g. a reserve of free room). */
  readonly extra?: (pool: readonly FleetHost[], at: ExtraContext) => Yield<X>[]
}

/** What an extra step sees. */
export interface ExtraContext {
  readonly fleet: FleetView
  /** The pass's descent planner (each host's parks sorted once). */
  readonly planner: DescentPlanner
  /** Hosts held or yielding this pass. */
  readonly taken: ReadonlySet<string>
  /** The queued sessions without room. */
  readonly waiting: readonly Queued[]
  /** Descents running plus the yields already decided this pass: room on its way. */
  readonly committed: number
  readonly now: number
  readonly limits: Limits
}

/** The gate's full input beside the fleet: time, limits, options and the memory of the last pass. */
export interface Context {
  readonly now: number
  readonly limits?: Limits
  readonly options?: Options
  readonly memory?: Memory
}

/**
 * SPEC §4.1 with its seams: starving sessions first (their held hosts), then the forced
 * yields, then `K = max(0, U − E)` demand yields (U counts the starving sessions too, minus
 * the yields already made for them), then a policy's extra yields. At most one yield per host,
 * but for a held host.
 */
export const decide = <X extends string = never>(fleet: FleetView, ctx: Context, steps: Steps<X> = {}): Decision<YieldReason | X> => {
  const limits = ctx.limits ?? defaults
  const options = ctx.options ?? defaultOptions
  const now = ctx.now
  // Room is judged at the decision's time: a silent host has none (`gives`), as for placement,
  // nor a host placement claims for a starving session (`claimsAt`) but for its holder.
  const claims = claimsAt(fleet, now, limits, options)
  const waiting = (steps.waiting ?? withoutRoom)(fleet, limits, now, claims.hostIds)
  const unplaceableCount = fleet.queue.length === 0 ? 0 : unplaceable(fleet, limits).length
  const descents = descentsRunning(fleet)

  const planner = new DescentPlanner(limits, now)
  const starved = serve(fleet, waiting, { now, limits, options, memory: ctx.memory ?? noMemory, claimed: claims.byHolder }, steps.fit === true, planner)
  const held = new Set(starved.holds.map((h) => h.hostId))
  const eligibleStep = steps.eligible
  const { forced, pool } = mayYield(fleet, now, limits, (h) => !held.has(h.id) && (eligibleStep === undefined || eligibleStep(h, now)))
  const yields: Yield<YieldReason | X>[] = [...starved.yields]
  const yielded = new Set(yields.map((y) => y.sessionId))
  for (const y of forced) if (!yielded.has(y.sessionId)) yields.push(y)

  // A starving session with a held host is served there (its descents and yields count for it
  // alone); the rest of U is met by the descents running elsewhere, then by demand yields.
  let descentsElsewhere = 0
  for (const h of fleet.hosts) if (!held.has(h.id)) descentsElsewhere += Math.max(0, h.descentsRunning)
  const wanted = Math.max(0, waiting.length - starved.holds.length - descentsElsewhere)
  const demand = (steps.choose ?? ((p, w) => nearestToFit(p, w)))(pool, wanted, waiting, fleet, limits)
  yields.push(...demand)
  if (steps.extra !== undefined) {
    const used = new Set(demand.map((y) => y.hostId))
    const rest = pool.filter((h) => !used.has(h.id))
    // What the extra step may count on: every descent running and every yield made so far.
    const taken = new Set([...held, ...yields.map((y) => y.hostId)])
    yields.push(...steps.extra(rest, { fleet, planner, taken, waiting, committed: descents + yields.length, now, limits }))
  }
  return {
    yields,
    withoutRoom: waiting.length,
    unplaceable: unplaceableCount,
    descentsRunning: descents,
    holds: starved.holds,
  }
}

/** Runs the gate over one fleet read (SPEC §4.1, §12). */
export const evaluate = (fleet: FleetView, now: number, limits: Limits = defaults, options: Options = defaultOptions, memory: Memory = noMemory): Decision =>
  decide(fleet, { now, limits, options, memory })
