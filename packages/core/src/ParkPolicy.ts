/**
 * Park policies (SPEC §4.2): the default demand gate of §4.1 and the alternatives the fleet
 * simulator compares it with. Each policy is a pure function of one fleet read, the time and
 * the limits, and answers as `ParkGate.evaluate` does: the parks that yield this pass and
 * whether an idle session may park. `demand` is `ParkGate.evaluate` itself; the rest are
 * options for measurement, not for production.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as ParkGate from "./ParkGate.js"
import type { FleetHost, FleetView, Park, Queued } from "./ParkGate.js"
import * as Placement from "./Placement.js"
import * as PlacementIndex from "./PlacementIndex.js"

/** The policies by name. */
export type Name =
  | "demand"
  | "floor30"
  | "never-park"
  | "park-forever"
  | "demand-cumulative"
  | "demand-fitting"
  | "demand-minage"

/** Every policy, the default first. */
export const names: readonly Name[] = [
  "demand",
  "floor30",
  "never-park",
  "park-forever",
  "demand-cumulative",
  "demand-fitting",
  "demand-minage",
]

/** What each policy does, in a line. */
export const summaries: { readonly [N in Name]: string } = {
  demand: "SPEC §4.1: a park holds until a queued session (judged alone) has no room",
  floor30: "seed 000 before #1782: a park holds only while its host keeps ≥ 30 % of its RAM unreserved",
  "never-park": "no parks: every idle session descends at once",
  "park-forever": "every idle session on a measured host parks; a park yields only at the hard TTL",
  "demand-cumulative": "demand, the queue judged cumulatively (first-fit of the whole queue in FIFO order)",
  "demand-fitting": "demand, preferring the park whose descent alone makes a waiting session fit",
  "demand-minage": "demand, but a park younger than the minimum age never yields for demand (anti-thrash)",
}

/** Whether `s` names a policy. */
export const isName = (s: string): s is Name => (names as readonly string[]).includes(s)

/** Why a park yields: the gate's reasons, plus `floor` for the percentage floor. */
export type Reason = ParkGate.YieldReason | "floor"

/** One park to descend this pass. */
export interface PolicyYield {
  readonly hostId: string
  readonly sessionId: string
  readonly reason: Reason
}

/** A policy's answer for one pass: `ParkGate.Decision` with the wider set of reasons. */
export interface Decision {
  readonly yields: readonly PolicyYield[]
  /** Queued sessions without room, as this policy counts them. */
  readonly withoutRoom: number
  readonly descentsRunning: number
  readonly mayPark: (hostId: string) => boolean
}

/** The knobs of the alternative policies. */
export interface Options {
  /** `floor30`: the share of a host's RAM capacity that must stay unreserved for its parks to hold. */
  readonly floorPct: number
  /** `demand-minage`: a park younger than this never yields for demand. */
  readonly minParkAgeMs: number
}

/** Seed 000's floor (30 %) and a five-minute minimum park age. */
export const defaultOptions: Options = Object.freeze({ floorPct: 30, minParkAgeMs: 5 * 60 * 1000 })

// ---- shared pieces --------------------------------------------------------------------------

const { byParkAge, oldestPark } = ParkGate

const byId = (a: { readonly id: string }, b: { readonly id: string }): number => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

const descentsIn = (fleet: FleetView): number => {
  let n = 0
  for (const h of fleet.hosts) n += Math.max(0, h.descentsRunning)
  return n
}

const measuredHosts = (fleet: FleetView): ReadonlySet<string> => {
  const s = new Set<string>()
  for (const h of fleet.hosts) if (Placement.isMeasured(h)) s.add(h.id)
  return s
}

/** The hosts nearest to a fit first: the most unreserved RAM, ties by host id (SPEC §4.1). */
const nearestToFit = (a: FleetHost, b: FleetHost): number => {
  const fa = Headroom.freeMib(a.headroom) ?? Number.POSITIVE_INFINITY
  const fb = Headroom.freeMib(b.headroom) ?? Number.POSITIVE_INFINITY
  return fa !== fb ? (fb > fa ? 1 : -1) : byId(a, b)
}

/** How a demand-style policy picks its demand yields from the eligible hosts. */
type DemandChooser = (pool: FleetHost[], wanted: number, fleet: FleetView, now: number, limits: Limits) => PolicyYield[]

/** The default choice: the `wanted` hosts nearest to a fit, the oldest park on each. */
const nearestHosts: DemandChooser = (pool, wanted) =>
  pool
    .sort(nearestToFit)
    .slice(0, wanted)
    .map((h) => ({ hostId: h.id, sessionId: (oldestPark(h.parks) as Park).sessionId, reason: "demand" as const }))

/**
 * The skeleton of SPEC §4.1 with two seams: how the queue is counted and how demand yields
 * are chosen. With `ParkGate.countWithoutRoom` and `nearestHosts` it answers exactly as
 * `ParkGate.evaluate` (a property test pins this).
 */
const demandGate = (
  fleet: FleetView,
  now: number,
  limits: Limits,
  withoutRoom: number,
  choose: DemandChooser,
  eligible: (h: FleetHost) => boolean = () => true,
): Decision => {
  const descentsRunning = descentsIn(fleet)
  const yields: PolicyYield[] = []
  const pool: FleetHost[] = []
  for (const h of fleet.hosts) {
    if (h.parks.length === 0 || h.descentsRunning > 0 || !Placement.isMeasured(h)) continue
    const oldest = oldestPark(h.parks) as Park
    if (Headroom.isOverReserved(h.headroom)) yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "over_reserved" })
    else if (now - oldest.parkedAt > limits.parkHardTtlMs) yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "hard_ttl" })
    else if ((h.state ?? "ready") === "ready" && eligible(h)) pool.push(h)
  }
  const wanted = Math.max(0, withoutRoom - descentsRunning)
  if (wanted > 0 && pool.length > 0) yields.push(...choose(pool, wanted, fleet, now, limits))
  const measured = measuredHosts(fleet)
  return { yields, withoutRoom, descentsRunning, mayPark: (hostId) => withoutRoom === 0 && measured.has(hostId) }
}

/** Exposed for the property test that pins the skeleton to `ParkGate.evaluate`. */
export const demandSkeleton = (fleet: FleetView, now: number, limits: Limits = defaults): Decision =>
  demandGate(fleet, now, limits, ParkGate.countWithoutRoom(fleet, limits), nearestHosts)

// ---- the policies ---------------------------------------------------------------------------

/** The default gate (SPEC §4.1): `ParkGate.evaluate`. */
export const demand = (fleet: FleetView, now: number, limits: Limits = defaults): Decision =>
  ParkGate.evaluate(fleet, now, limits)

/**
 * Seed 000's percentage floor (before #1782), on the one headroom: a park holds only while
 * its host's unreserved RAM is at least `floorPct` of its capacity, and a session parks only
 * on such a host. It ignores the queue. A host below the floor yields its oldest parks until
 * the descents would lift it back to the floor; a host where a descent runs waits for it.
 */
export const floor = (fleet: FleetView, now: number, limits: Limits = defaults, floorPct = defaultOptions.floorPct): Decision => {
  const share = floorPct / 100
  const yields: PolicyYield[] = []
  const aboveFloor = new Set<string>()
  for (const h of fleet.hosts) {
    if (!Placement.isMeasured(h)) continue
    const capacity = Headroom.gatesRam(h.headroom) ? (h.headroom.allocatableMib as number) : null
    // A measured host without a RAM cap is never below the floor.
    const shortMib = capacity === null ? 0 : share * capacity - (Headroom.freeMib(h.headroom) as number)
    if (shortMib <= 0) aboveFloor.add(h.id)
    if (h.parks.length === 0 || h.descentsRunning > 0) continue
    const parks = [...h.parks].sort(byParkAge)
    if (shortMib > 0) {
      // The first yield of an over-reserved host is named for it; the rest restore the floor.
      let reason: Reason = Headroom.isOverReserved(h.headroom) ? "over_reserved" : "floor"
      let freed = 0
      for (const p of parks) {
        if (freed >= shortMib) break
        yields.push({ hostId: h.id, sessionId: p.sessionId, reason })
        reason = "floor"
        freed += p.budget.memMib
      }
    } else {
      const oldest = parks[0] as Park
      if (now - oldest.parkedAt > limits.parkHardTtlMs) yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "hard_ttl" })
    }
  }
  return {
    yields,
    withoutRoom: ParkGate.countWithoutRoom(fleet, limits),
    descentsRunning: descentsIn(fleet),
    mayPark: (hostId) => aboveFloor.has(hostId),
  }
}

/** Parks age out at the hard TTL (one per host per pass); nothing else yields. */
const ttlOnly = (fleet: FleetView, now: number, limits: Limits): PolicyYield[] => {
  const yields: PolicyYield[] = []
  for (const h of fleet.hosts) {
    if (h.parks.length === 0 || h.descentsRunning > 0) continue
    const oldest = oldestPark(h.parks) as Park
    if (now - oldest.parkedAt > limits.parkHardTtlMs) yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "hard_ttl" })
  }
  return yields
}

/** No parks: every idle session descends at once (a park left from before still ages out). */
export const neverPark = (fleet: FleetView, now: number, limits: Limits = defaults): Decision => ({
  yields: ttlOnly(fleet, now, limits),
  withoutRoom: ParkGate.countWithoutRoom(fleet, limits),
  descentsRunning: descentsIn(fleet),
  mayPark: () => false,
})

/** The other extreme: every idle session on a measured host parks; a park yields only at the hard TTL. */
export const parkForever = (fleet: FleetView, now: number, limits: Limits = defaults): Decision => {
  const measured = measuredHosts(fleet)
  return {
    yields: ttlOnly(fleet, now, limits),
    withoutRoom: ParkGate.countWithoutRoom(fleet, limits),
    descentsRunning: descentsIn(fleet),
    mayPark: (hostId) => measured.has(hostId),
  }
}

/**
 * Queued sessions that do not place when the whole queue is placed in FIFO order, each
 * placement taking its room (best fit, as placement ranks). Two sessions that each fit alone
 * into the one hole count as one without room.
 */
export const countWithoutRoomCumulative = (fleet: FleetView, limits: Limits = defaults): number => {
  if (fleet.queue.length === 0) return 0
  const index = new PlacementIndex.Index(limits)
  for (const h of fleet.hosts) index.upsert(h)
  let n = 0
  for (const q of fleet.queue) {
    const id = index.pick({ budget: q.budget })
    if (id === null) {
      n++
      continue
    }
    const c = index.get(id) as Placement.Candidate
    index.upsert({
      ...c,
      headroom: { ...c.headroom, reserved: Headroom.add(c.headroom.reserved, q.budget) },
      entries: (c.entries ?? 0) + 1,
    })
  }
  return n
}

/** The demand gate with the queue judged cumulatively. */
export const demandCumulative = (fleet: FleetView, now: number, limits: Limits = defaults): Decision =>
  demandGate(fleet, now, limits, countWithoutRoomCumulative(fleet, limits), nearestHosts)

/** The queued sessions that fit on no candidate host, each judged alone, in queue order. */
export const queuedWithoutRoom = (fleet: FleetView, limits: Limits = defaults): Queued[] => {
  if (fleet.queue.length === 0) return []
  const index = Placement.roomIndex(fleet.hosts, limits)
  return fleet.queue.filter((q) => !index.anyFits(q.budget))
}

const minus = (a: Budget, b: Budget): Budget => ({ memMib: a.memMib - b.memMib, vcpus: a.vcpus - b.vcpus })

/**
 * Demand yields that make room where it is wanted: for each waiting session without room, in
 * queue order, the oldest park whose descent alone makes the session fit on its host (best
 * fit among such hosts). A session that no single descent can help gets the default choice
 * (the host nearest to a fit), so a big session still gathers room over several passes.
 */
const fittingChooser: DemandChooser = (pool, wanted, fleet, _now, limits) => {
  const waiting = queuedWithoutRoom(fleet, limits)
  const hosts = [...pool].sort(byId)
  const parksOf = new Map<string, Park[]>(hosts.map((h) => [h.id, [...h.parks].sort(byParkAge)]))
  const biggest = new Map<string, Budget>()
  for (const h of hosts) {
    let mem = 0
    let cpu = 0
    for (const p of h.parks) {
      mem = Math.max(mem, p.budget.memMib)
      cpu = Math.max(cpu, p.budget.vcpus)
    }
    biggest.set(h.id, { memMib: mem, vcpus: cpu })
  }
  const taken = new Set<string>()
  const hopeless = new Set<string>()
  const yields: PolicyYield[] = []
  for (let i = 0; yields.length < wanted && taken.size < hosts.length; i++) {
    const q = waiting[i]
    if (q === undefined) break
    const key = `${q.budget.memMib}:${q.budget.vcpus}`
    let best: { host: FleetHost; park: Park; leftMib: number } | undefined
    if (!hopeless.has(key)) {
      for (const h of hosts) {
        if (taken.has(h.id)) continue
        // A descent frees one entry as well as its budget.
        const after = { ...h, entries: Math.max(0, (h.entries ?? 0) - 1) }
        const big = biggest.get(h.id) as Budget
        if (!Placement.fitsOn({ ...after, headroom: { ...h.headroom, reserved: minus(h.headroom.reserved, big) } }, q.budget, limits)) continue
        for (const p of parksOf.get(h.id) as Park[]) {
          const headroom = { ...h.headroom, reserved: minus(h.headroom.reserved, p.budget) }
          if (!Placement.fitsOn({ ...after, headroom }, q.budget, limits)) continue
          const leftMib = (Headroom.freeMib(headroom) ?? Number.POSITIVE_INFINITY) - q.budget.memMib
          if (best === undefined || leftMib < best.leftMib || (leftMib === best.leftMib && byParkAge(p, best.park) < 0))
            best = { host: h, park: p, leftMib }
          break // the oldest park that suffices on this host
        }
      }
    }
    if (best === undefined) {
      hopeless.add(key)
      const fallback = hosts.filter((h) => !taken.has(h.id)).sort(nearestToFit)[0]
      if (fallback === undefined) break
      best = { host: fallback, park: (parksOf.get(fallback.id) as Park[])[0] as Park, leftMib: 0 }
    }
    taken.add(best.host.id)
    yields.push({ hostId: best.host.id, sessionId: best.park.sessionId, reason: "demand" })
  }
  return yields
}

/** The demand gate, preferring the park whose descent actually makes a waiting session fit. */
export const demandFitting = (fleet: FleetView, now: number, limits: Limits = defaults): Decision =>
  demandGate(fleet, now, limits, ParkGate.countWithoutRoom(fleet, limits), fittingChooser)

/**
 * The demand gate with a minimum park age: a host whose oldest park is younger than
 * `minParkAgeMs` yields nothing for demand (a fresh park is the likeliest to resume soon).
 * Over-reservation and the hard TTL still apply.
 */
export const demandMinAge = (
  fleet: FleetView,
  now: number,
  limits: Limits = defaults,
  minParkAgeMs = defaultOptions.minParkAgeMs,
): Decision =>
  demandGate(fleet, now, limits, ParkGate.countWithoutRoom(fleet, limits), nearestHosts, (h) => {
    const oldest = oldestPark(h.parks) as Park
    return now - oldest.parkedAt >= minParkAgeMs
  })

/** Runs the named policy over one fleet read. */
export const evaluate = (
  name: Name,
  fleet: FleetView,
  now: number,
  limits: Limits = defaults,
  options: Options = defaultOptions,
): Decision => {
  switch (name) {
    case "demand":
      return demand(fleet, now, limits)
    case "floor30":
      return floor(fleet, now, limits, options.floorPct)
    case "never-park":
      return neverPark(fleet, now, limits)
    case "park-forever":
      return parkForever(fleet, now, limits)
    case "demand-cumulative":
      return demandCumulative(fleet, now, limits)
    case "demand-fitting":
      return demandFitting(fleet, now, limits)
    case "demand-minage":
      return demandMinAge(fleet, now, limits, options.minParkAgeMs)
  }
}
