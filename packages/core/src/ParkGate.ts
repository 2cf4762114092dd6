/**
 * The park gate (SPEC §4.1): a park holds until a queued session has no room. Given one
 * fleet read it decides which parks yield (descend) this pass and whether an idle session
 * may park. Pure: the reaper reads the fleet, calls `evaluate`, and acts on the answer.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as Placement from "./Placement.js"
import type { Candidate } from "./Placement.js"

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

/** Why a park yields. */
export type YieldReason = "demand" | "over_reserved" | "hard_ttl"

/** One park to descend this pass. */
export interface Yield {
  readonly hostId: string
  readonly sessionId: string
  readonly reason: YieldReason
}

/** The gate's answer for one pass. */
export interface Decision {
  /** Parks to descend now: at most one per host, none on a host where a descent runs. */
  readonly yields: readonly Yield[]
  /** Queued sessions that fit on no candidate host, each judged alone. */
  readonly withoutRoom: number
  /** Descents running in the fleet (each counts for one waiting session). */
  readonly descentsRunning: number
  /** Whether an idle session on this host may park instead of descending. */
  readonly mayPark: (hostId: string) => boolean
}

/** Park order: oldest first, ties by session id. */
export const byParkAge = (a: Park, b: Park): number =>
  a.parkedAt - b.parkedAt || (a.sessionId < b.sessionId ? -1 : a.sessionId > b.sessionId ? 1 : 0)

/** The park that yields first on a host: the oldest. */
export const oldestPark = (parks: readonly Park[]): Park | undefined => {
  let oldest: Park | undefined
  for (const p of parks) if (oldest === undefined || byParkAge(p, oldest) < 0) oldest = p
  return oldest
}

/** Queued sessions that fit on no candidate host, each judged alone against the current headroom. */
export const countWithoutRoom = (fleet: FleetView, limits: Limits = defaults): number => {
  if (fleet.queue.length === 0) return 0
  const index = Placement.roomIndex(fleet.hosts, limits)
  let n = 0
  for (const q of fleet.queue) if (!index.anyFits(q.budget)) n++
  return n
}

/** Runs the gate over one fleet read (SPEC §4.1). */
export const evaluate = (fleet: FleetView, now: number, limits: Limits = defaults): Decision => {
  const withoutRoom = countWithoutRoom(fleet, limits)
  let descentsRunning = 0
  for (const h of fleet.hosts) descentsRunning += Math.max(0, h.descentsRunning)

  const yields: Yield[] = []
  const demandPool: Placement.Candidate[] = []
  for (const h of fleet.hosts) {
    // A host where a descent runs yields nothing this pass; an unmeasured host has no parks to judge.
    if (h.parks.length === 0 || h.descentsRunning > 0 || !Placement.isMeasured(h)) continue
    const oldest = oldestPark(h.parks) as Park
    if (Headroom.isOverReserved(h.headroom)) {
      yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "over_reserved" })
    } else if (now - oldest.parkedAt > limits.parkHardTtlMs) {
      yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "hard_ttl" })
    } else if ((h.state ?? "ready") === "ready") {
      // Only a host that takes placements can give its room to the queue.
      demandPool.push(h)
    }
  }

  const wanted = Math.max(0, withoutRoom - descentsRunning)
  if (wanted > 0 && demandPool.length > 0) {
    // The hosts nearest to a fit: the most unreserved RAM, ties by host id.
    demandPool.sort((a, b) => {
      const fa = Headroom.freeMib(a.headroom) ?? Number.POSITIVE_INFINITY
      const fb = Headroom.freeMib(b.headroom) ?? Number.POSITIVE_INFINITY
      return fa !== fb ? (fb > fa ? 1 : -1) : a.id < b.id ? -1 : a.id > b.id ? 1 : 0
    })
    for (const h of demandPool.slice(0, wanted)) {
      const oldest = oldestPark((h as FleetHost).parks) as Park
      yields.push({ hostId: h.id, sessionId: oldest.sessionId, reason: "demand" })
    }
  }

  const measured = new Map<string, boolean>()
  for (const h of fleet.hosts) measured.set(h.id, Placement.isMeasured(h))
  return {
    yields,
    withoutRoom,
    descentsRunning,
    mayPark: (hostId) => withoutRoom === 0 && measured.get(hostId) === true,
  }
}

/** Whether an idle session on `hostId` may park now: the host is measured and no queued session is without room. */
export const mayPark = (fleet: FleetView, hostId: string, limits: Limits = defaults): boolean => {
  const host = fleet.hosts.find((h) => h.id === hostId)
  return host !== undefined && Placement.isMeasured(host) && countWithoutRoom(fleet, limits) === 0
}
