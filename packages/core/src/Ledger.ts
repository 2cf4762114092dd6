/**
 * The reservation ledger's policy (SPEC §3): admission checks in their order, liveness
 * (expired, stale) and summaries. Both stores keep the entries; this module decides.
 */
import * as Headroom from "./Headroom.js"
import type { Budget, HostHeadroom } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import type { HostState } from "./Placement.js"
import * as Plan from "./Plan.js"

/** Who holds a reservation. */
export type OwnerKind = "session" | "move" | "capture" | "external"

/** The owner kinds, in a stable order. */
export const ownerKinds: readonly OwnerKind[] = ["session", "move", "capture", "external"]

/** A reservation: a budget held on a host by an owner. Times are epoch ms. */
export interface Entry {
  readonly id: string
  readonly hostId: string
  readonly ownerKind: OwnerKind
  readonly ownerId: string
  readonly memMib: number
  readonly vcpus: number
  readonly vramMib: number | null
  readonly createdAt: number
  readonly lastHeartbeatAt: number
  readonly expiresAt: number | null
  readonly description: string | null
}

/** What a caller asks to reserve; `id` and `hostId` may be missing (the first checks refuse it). */
export interface ReserveRequest {
  readonly id?: string | null | undefined
  readonly hostId?: string | null | undefined
  /** Who will hold it; an `external` reservation lands only on a ready host. */
  readonly ownerKind?: OwnerKind | undefined
  readonly memMib: number
  readonly vcpus: number
}

/** The host as the ledger's admission sees it. */
export interface HostView {
  /** The host's administrative state; defaults to `ready`. */
  readonly state?: HostState | undefined
  readonly measured: boolean
  readonly headroom: HostHeadroom
  readonly entries: number
}

/** The admission checks, in the order they run. */
export type Check =
  | "id_missing"
  | "host_missing"
  | "mem_not_positive"
  | "vcpus_invalid"
  | "duplicate"
  | "host_unknown"
  | "host_not_ready"
  | "host_unmeasured"
  | "entries_full"
  | "capacity_exceeded"

/** The admission verdict. A refusal names its check; all but `duplicate` count as a reserve failure. */
export type Admission =
  | { readonly _tag: "Admit" }
  | {
      readonly _tag: "Refuse"
      readonly check: Check
      readonly countsAsFailure: boolean
      readonly message: string
    }

const refuse = (check: Check, message: string): Admission => ({
  _tag: "Refuse",
  check,
  countsAsFailure: check !== "duplicate",
  message,
})

const fmt = (n: number | null): string => (n === null ? "unknown" : Number.isInteger(n) ? String(n) : n.toFixed(2))

/**
 * Runs the admission checks of SPEC §3 in order. `duplicate` says whether the id is
 * already held; `host` is undefined when the host is unknown.
 */
export const admit = (
  req: ReserveRequest,
  ctx: { readonly duplicate: boolean; readonly host: HostView | undefined },
  limits: Limits = defaults,
): Admission => {
  if (req.id == null || req.id === "") return refuse("id_missing", "reservation id is required")
  if (req.hostId == null || req.hostId === "") return refuse("host_missing", "hostId is required")
  if (!(typeof req.memMib === "number" && Number.isFinite(req.memMib) && req.memMib > 0))
    return refuse("mem_not_positive", `memMib must be > 0 (asked=${String(req.memMib)})`)
  if (!(typeof req.vcpus === "number" && Number.isFinite(req.vcpus) && req.vcpus >= 0))
    return refuse("vcpus_invalid", `vcpus must be a number >= 0 (asked=${String(req.vcpus)})`)
  if (ctx.duplicate) return refuse("duplicate", `reservation ${req.id} already exists`)
  const host = ctx.host
  if (host === undefined) return refuse("host_unknown", `host ${req.hostId} is not known`)
  const state = host.state ?? "ready"
  if (req.ownerKind === "external" && state !== "ready")
    return refuse("host_not_ready", `host ${req.hostId} is ${state}: external reservations land only on ready hosts`)
  if (limits.requireMeasured && !host.measured)
    return refuse("host_unmeasured", `host ${req.hostId} has not reported its RAM and requireMeasured is set`)
  if (host.entries >= limits.maxEntriesPerNode)
    return refuse("entries_full", `host ${req.hostId} holds ${host.entries} reservations (max=${limits.maxEntriesPerNode})`)
  const budget: Budget = { memMib: req.memMib, vcpus: req.vcpus }
  const short = Headroom.shortfall(host.headroom, budget)
  if (short === "ram")
    return refuse(
      "capacity_exceeded",
      `would exceed RAM capacity on host ${req.hostId}: reserved=${fmt(host.headroom.reserved.memMib)}, capacity=${fmt(host.headroom.allocatableMib)}, asked=${fmt(req.memMib)}`,
    )
  if (short === "cpu")
    return refuse(
      "capacity_exceeded",
      `would exceed CPU budget on host ${req.hostId}: reserved=${fmt(host.headroom.reserved.vcpus)}, capacity=${fmt(host.headroom.cpuBudget)}, asked=${fmt(req.vcpus)}`,
    )
  return { _tag: "Admit" }
}

/** Expired: the entry has a hard expiry that has passed. */
export const isExpired = (e: Pick<Entry, "expiresAt">, now: number): boolean => e.expiresAt !== null && now > e.expiresAt

/** Stale: its last heartbeat is older than the window. A heartbeat in the future (clock skew) is not stale. */
export const isStale = (e: Pick<Entry, "lastHeartbeatAt">, now: number, windowMs: number = defaults.heartbeatStaleWindowMs): boolean =>
  now - e.lastHeartbeatAt > windowMs

/**
 * An entry's heartbeat after a beat stamped `t`: never earlier than it was. A beat written late
 * (a grouped write that stalled while a newer one landed) or stamped by a replica whose clock is
 * behind does not make the entry look staler than a beat already recorded.
 */
export const renewedAt = (lastHeartbeatAt: number, t: number): number => Math.max(lastHeartbeatAt, t)

/**
 * Which entries a reclaim takes. `stale` false: only the expired, whose own `expiresAt` passed
 * whatever else happened; a stale heartbeat is left for later (the failover grace, while the
 * hosts may not have been able to heartbeat). Default: expired and stale.
 */
export interface ReclaimOptions {
  /** Whether stale entries go too (default true). */
  readonly stale?: boolean | undefined
}

/** Whether `reclaim(now)` removes the entry: expired, or stale unless `options.stale` is false. */
export const isReclaimable = (
  e: Pick<Entry, "expiresAt" | "lastHeartbeatAt">,
  now: number,
  limits: Limits = defaults,
  options: ReclaimOptions = {},
): boolean => isExpired(e, now) || (options.stale !== false && isStale(e, now, limits.heartbeatStaleWindowMs))

/**
 * The time after which the entry is reclaimable unless heartbeated again (its expiry, or its
 * last heartbeat plus the stale window, whichever comes first): `isReclaimable(e, now)` holds
 * exactly when `now` is past it. A heartbeat only moves it later, so a store may keep entries
 * ordered by it and judge only those whose time has come.
 */
export const reclaimableAfter = (e: Pick<Entry, "expiresAt" | "lastHeartbeatAt">, limits: Limits = defaults): number =>
  Math.min(e.expiresAt ?? Number.POSITIVE_INFINITY, e.lastHeartbeatAt + limits.heartbeatStaleWindowMs)

/**
 * Bounds a store may read the ledger by before it judges (a narrowing, never the judgement): every
 * entry `isReclaimable(e, now, limits, options)` has `expiresAt` below `expiredBefore`, or
 * `lastHeartbeatAt` below `staleBefore` (null: stale entries do not go, `options.stale` false). A
 * store that reads only such entries (`where expires_at < $1 or last_heartbeat_at < $2`) and
 * passes them to `reclaimable` takes exactly what judging the whole ledger would, and no longer
 * ships every live entry on each pass (store-pg: 200,000 reservations read every reaper pass).
 */
export interface ReclaimCutoffs {
  readonly expiredBefore: number
  readonly staleBefore: number | null
}

/** The cutoffs of `reclaim(now, options)`: see `ReclaimCutoffs`. */
export const reclaimCutoffs = (now: number, limits: Limits = defaults, options: ReclaimOptions = {}): ReclaimCutoffs => ({
  expiredBefore: now,
  staleBefore: options.stale === false ? null : now - limits.heartbeatStaleWindowMs,
})

/** The entries `reclaim(now, options)` removes. */
export const reclaimable = <E extends Pick<Entry, "expiresAt" | "lastHeartbeatAt">>(
  entries: Iterable<E>,
  now: number,
  limits: Limits = defaults,
  options: ReclaimOptions = {},
): E[] => {
  const out: E[] = []
  for (const e of entries) if (isReclaimable(e, now, limits, options)) out.push(e)
  return out
}

/** One host's ledger summary. */
export interface HostSummary {
  readonly hostId: string
  /** RAM capacity after policy; null when unmeasured or uncapped. */
  readonly totalMib: number | null
  readonly reservedMib: number
  readonly reservedVramMib: number
  /** Entries neither stale nor expired. */
  readonly activeEntries: number
  /** Entries stale or expired, still held until the next reclaim. */
  readonly staleEntries: number
  /** reserved / capacity × 100; null without a capacity. */
  readonly utilizationPct: number | null
}

/** The cluster's ledger summary: totals and every host, sorted by host id. */
export interface ClusterSummary {
  readonly hosts: readonly HostSummary[]
  readonly totalMib: number
  readonly reservedMib: number
  readonly reservedVramMib: number
  readonly activeEntries: number
  readonly staleEntries: number
  readonly utilizationPct: number | null
}

/** Cumulative ledger metrics (SPEC §3). */
export interface Metrics {
  readonly totalReservedMib: number
  readonly totalReleasedMib: number
  readonly totalReclaimedMib: number
  readonly reserveFailures: number
  readonly activeEntries: number
}

const pct = (reserved: number, capacity: number | null): number | null =>
  capacity === null || !(capacity > 0) ? null : (reserved / capacity) * 100

/** Summarizes one host's entries. */
export const summarizeHost = (
  hostId: string,
  capacityMib: number | null,
  entries: Iterable<Pick<Entry, "memMib" | "vramMib" | "expiresAt" | "lastHeartbeatAt">>,
  now: number,
  limits: Limits = defaults,
): HostSummary => {
  let reservedMib = 0
  let reservedVramMib = 0
  let active = 0
  let stale = 0
  for (const e of entries) {
    reservedMib += e.memMib
    reservedVramMib += e.vramMib ?? 0
    if (isReclaimable(e, now, limits)) stale++
    else active++
  }
  // A host whose reserve swallows its RAM has a vanishing capacity (Headroom.ramCapacityOf): shown as 0.
  const totalMib = Headroom.shown(capacityMib)
  return {
    hostId,
    totalMib,
    reservedMib,
    reservedVramMib,
    activeEntries: active,
    staleEntries: stale,
    utilizationPct: pct(reservedMib, totalMib),
  }
}

/** Summarizes the cluster from its host summaries. */
export const summarizeCluster = (hosts: Iterable<HostSummary>): ClusterSummary => {
  const sorted = [...hosts].sort((a, b) => (a.hostId < b.hostId ? -1 : a.hostId > b.hostId ? 1 : 0))
  let totalMib = 0
  let reservedMib = 0
  let reservedVramMib = 0
  let activeEntries = 0
  let staleEntries = 0
  let cappedReserved = 0
  for (const h of sorted) {
    reservedMib += h.reservedMib
    reservedVramMib += h.reservedVramMib
    activeEntries += h.activeEntries
    staleEntries += h.staleEntries
    if (h.totalMib !== null) {
      totalMib += h.totalMib
      cappedReserved += h.reservedMib
    }
  }
  return {
    hosts: sorted,
    totalMib,
    reservedMib,
    reservedVramMib,
    activeEntries,
    staleEntries,
    utilizationPct: pct(cappedReserved, totalMib),
  }
}

/** The owner kinds a host's batch heartbeat renews: everything its agent runs, not external holds. */
export const renewedByHost: readonly OwnerKind[] = ["session", "move", "capture"]

/**
 * Whether `release(id)` may remove the entry: a session's or a move's reservation goes only
 * with its owner (end the session, abort the move). Answers the refusal, or null.
 */
export const refuseRelease = (e: Pick<Entry, "id" | "ownerKind" | "ownerId">): { readonly check: "owned"; readonly message: string } | null =>
  e.ownerKind === "session" || e.ownerKind === "move"
    ? { check: "owned", message: `reservation ${e.id} is held by ${e.ownerKind} ${e.ownerId}: end the session or abort the move` }
    : null

/**
 * Whether a host may be removed: only once it holds nothing — no reservation and no session
 * placed on it. Answers the refusal with the figures, or null.
 */
export const refuseHostRemoval = (
  hostId: string,
  held: { readonly entries: number; readonly sessions: number },
): { readonly check: "host_in_use"; readonly message: string } | null =>
  held.entries > 0 || held.sessions > 0
    ? {
        check: "host_in_use",
        message: `host ${hostId} holds ${held.entries} reservations and ${held.sessions} sessions: end or move them first`,
      }
    : null

/** What a new entry holds beyond its defaults. */
export interface NewEntry {
  readonly id: string
  readonly hostId: string
  readonly ownerKind: OwnerKind
  readonly ownerId: string
  readonly memMib: number
  readonly vcpus: number
  readonly vramMib?: number | null | undefined
  readonly expiresAt?: number | null | undefined
  readonly description?: string | null | undefined
}

/** A new entry made at `now`: created and last heard from now, nulls for what was not given. */
export const entryOf = (e: NewEntry, now: number): Entry => ({
  id: e.id,
  hostId: e.hostId,
  ownerKind: e.ownerKind,
  ownerId: e.ownerId,
  memMib: e.memMib,
  vcpus: e.vcpus,
  vramMib: e.vramMib ?? null,
  createdAt: now,
  lastHeartbeatAt: now,
  expiresAt: e.expiresAt ?? null,
  description: e.description ?? null,
})

/** The plan of an admitted reservation (SPEC §3): the new entry, taking room on its host at the version admission read. */
export const reservePlan = (e: NewEntry, hostVersion: number, now: number): Plan.Plan =>
  Plan.make(now, { ledger: [{ _tag: "Reserve", entry: entryOf(e, now) }], host: { hostId: e.hostId, version: hostVersion } })

/** The plan of a release `refuseRelease` allows: the entry leaves the ledger, counted as released. */
export const releasePlan = (e: Pick<Entry, "id" | "hostId" | "memMib" | "vcpus">, now: number): Plan.Plan =>
  Plan.make(now, { ledger: [Plan.release(e, "released")] })
