/**
 * Placement (SPEC §2): which hosts are candidates, which fit, how they rank, and why a
 * budget fits nowhere. Stores call `pick` inside their placement transaction and `noFit`
 * when they queue; nothing else ranks hosts.
 */
import * as Headroom from "./Headroom.js"
import type { Budget, HostHeadroom } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import { compareIds } from "./Order.js"

/**
 * Host states that matter to placement; only `ready` hosts take new sessions (a `cordoned` or
 * `draining` one still takes back a guest it holds: `fitsReturn`).
 */
export type HostState = "ready" | "draining" | "cordoned"

/** A host as placement sees it. */
export interface Candidate {
  readonly id: string
  readonly headroom: HostHeadroom
  /** Defaults to `ready`. */
  readonly state?: HostState
  /** Reservations the host holds now; defaults to 0. */
  readonly entries?: number
  /**
   * Whether the host reported its RAM. Defaults to "its capacity is known"; pass `true`
   * for a measured host without a RAM cap (`memOvercommitRatio = 0`).
   */
  readonly measured?: boolean
  /**
   * Whether the host has sent its first report. Defaults to true. Registration is not
   * readiness (SPEC §12): a host that has not reported takes no placements (creates, resumes,
   * queue drains, move targets), whatever its state.
   */
  readonly reported?: boolean
  /**
   * When the host's agent last reported (ms), null or missing when unknown. A host whose last
   * report is older than the stale window at a placement's `now` (`isSilent`) takes no new
   * placements: its agent is gone, and what is placed there is lost a window later.
   */
  readonly reportedAt?: number | null | undefined
  /** The templates the host holds (a ranking signal only: a host without the session's template fits as well). */
  readonly templates?: readonly HeldTemplate[] | undefined
  /**
   * Whether a moved session can land here: the host's agent advertises where its peers reach it
   * (`Move.takesMoves`). Defaults to true. A host that cannot is never a make-room move's target
   * (`MakeRoom.plan`) nor the store's pick for a move without a named target (`takesMovesOnly`);
   * it still takes placements, and sessions still move off it.
   */
  readonly takesMoves?: boolean
}

/** A template a host holds: its name and the size of the guest it starts. */
export interface HeldTemplate {
  readonly name: string
  readonly memMib: number
  readonly vcpus: number
}

/** A placement request: a budget, an optional list of preferred hosts (best first), and a host it must not go to. */
export interface Request {
  readonly budget: Budget
  readonly affinity?: readonly string[]
  /** A host never chosen (a move's source). */
  readonly exclude?: string | undefined
  /** The deciding replica's share of the hosts, ranked before the rest (see {@link Spread}); missing: no preference. */
  readonly spread?: Spread | undefined
  /** The template the session starts from: hosts that hold it (same name and size) rank first among those that fit. */
  readonly template?: string | null | undefined
  /**
   * The host holding the session's descent image (`Session.Record.imageHostId`): ranked before
   * every other host that fits, affinity hosts included (a restore there keeps the guest's
   * memory; elsewhere it boots). A ranking signal only: without room there, the rest rank as usual.
   */
  readonly imageHost?: string | null | undefined
  /**
   * Only hosts that take moves (`Candidate.takesMoves` not false): a move's target the store
   * picks. Unset for every other placement, which pays nothing for it (`admits`).
   */
  readonly takesMovesOnly?: boolean | undefined
  /**
   * When the placement is decided (ms): hosts silent then (`isSilent`) are not admitted. Missing:
   * silence is not judged (a caller without a clock, a test).
   */
  readonly now?: number | undefined
}

/** A session as placement sees it (any record with a budget and, optionally, its preferences). */
export interface Wanting {
  readonly budget: Budget
  readonly affinity?: readonly string[] | undefined
  readonly template?: string | null | undefined
  /** The host holding its descent image (`Session.Record.imageHostId`). */
  readonly imageHostId?: string | null | undefined
}

/**
 * A session's placement request (a create, a cold resume, a queue drain): its budget, affinity,
 * template and image host. Both stores and the queue walk build a session's request here.
 */
export const requestOf = (w: Wanting, spread?: Spread, now?: number): Request => ({
  budget: w.budget,
  affinity: w.affinity ?? [],
  template: w.template,
  imageHost: w.imageHostId,
  spread,
  now,
})

/**
 * A replica's share of the hosts. Replicas that place at once on one database, each from its
 * own read of the fleet, would all choose the same best-fit host and lose each other's version
 * checks. With a spread, among the hosts that fit, those of the replica's own share (`shareOf`)
 * rank before the others, best fit within each: the replicas fill different hosts until a
 * share has no room left, then fall back to the rest. It only orders the hosts that fit: a
 * budget that fits somewhere is placed with or without it, and one replica decides as without.
 */
export interface Spread {
  /** This replica's position among the replicas, 0-based. */
  readonly replica: number
  /** How many replicas place on these hosts. */
  readonly replicas: number
}

/** The share a host belongs to among `replicas`: the FNV-1a hash of its id, modulo `replicas`. */
export const shareOf = (hostId: string, replicas: number): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < hostId.length; i++) {
    h ^= hostId.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  return (h >>> 0) % Math.max(1, replicas)
}

/** Whether the host is in the spread's own share: every host is without a spread, or with one replica. */
export const isOwn = (spread: Spread | undefined, hostId: string): boolean =>
  spread === undefined || spread.replicas <= 1 || shareOf(hostId, spread.replicas) === spread.replica

/** Why a host cannot take a budget. `fits_now` means it could (a race with a release). */
export type NoFitReason = "unmeasured" | "silent" | "ram_full" | "cpu_full" | "entries_full" | "cordoned" | "draining" | "fits_now"

/** One host's answer in the no-fit details. */
export interface NoFitDetail {
  readonly hostId: string
  readonly reason: NoFitReason
  readonly freeMib: number | null
  readonly freeVcpus: number | null
}

/** Whether the host has reported its RAM. */
export const isMeasured = (c: Candidate): boolean => c.measured ?? c.headroom.allocatableMib !== null

/**
 * Whether the host takes new placements at all: ready, and open to one more entry
 * (`takesEntry`: reported at least once, under the entries cap, measured if required).
 */
export const isOpen = (c: Candidate, limits: Limits = defaults): boolean => (c.state ?? "ready") === "ready" && takesEntry(c, limits)

/**
 * Whether the host may hold one more entry, whatever its state: reported at least once, under
 * the entries cap, measured if required. `isOpen` adds readiness (a new placement); `fitsReturn`
 * does not (a guest the host already holds).
 */
export const takesEntry = (c: Candidate, limits: Limits = defaults): boolean =>
  c.reported !== false && (c.entries ?? 0) < limits.maxEntriesPerNode && (!limits.requireMeasured || isMeasured(c))

/**
 * Whether the host's agent has gone silent at `now`: its last report (`reportedAt`) is older than
 * the reservation stale window (`now - reportedAt > heartbeatStaleWindowMs`; exactly the window is
 * not silent). A silent host takes no new placements (creates, resumes, queue drains, move
 * targets) until it reports again; a host with no report time is judged by `reported` alone.
 * The one rule: both stores and the simulator judge silence here.
 */
export const isSilent = (c: Pick<Candidate, "reportedAt">, now: number, limits: Limits): boolean =>
  c.reportedAt != null && now - c.reportedAt > limits.heartbeatStaleWindowMs

/** Whether a move without a named target may pick this host (`Candidate.takesMoves` not false). */
export const acceptsMoves = (c: Pick<Candidate, "takesMoves">): boolean => c.takesMoves !== false

/**
 * Whether the request may go to this host at all, its room aside: not the excluded host (a
 * move's source), one that takes moves when the request asks for one (`takesMovesOnly`), and
 * not silent at the request's `now` (`isSilent`).
 */
export const admits = (c: Candidate, req: Request, limits: Limits): boolean =>
  c.id !== req.exclude && (req.takesMovesOnly !== true || acceptsMoves(c)) && (req.now === undefined || !isSilent(c, req.now, limits))

/** Whether the budget fits on this candidate now (SPEC §2). */
export const fitsOn = (c: Candidate, budget: Budget, limits: Limits = defaults): boolean =>
  isOpen(c, limits) && Headroom.fits(c.headroom, budget)

/**
 * Whether the host has room to take back a guest it already holds (the reclaim's way back to a
 * move's source, `Reclaim.decide`): `fitsOn`'s room rule (one more entry, `takesEntry`; the
 * budget within its headroom, RAM never over-committed) without its readiness. A `cordoned` or
 * `draining` host takes no new placement, but this is none: the guest's only whole copy is
 * already there, and refusing it would lose the guest's memory on a host that is alive. A
 * draining host's own drain moves the guest off again. Silence is the caller's to judge
 * (`isSilent`), as for `fitsOn`.
 */
export const fitsReturn = (c: Candidate, budget: Budget, limits: Limits = defaults): boolean =>
  takesEntry(c, limits) && Headroom.fits(c.headroom, budget)

const orNever = (n: number | null): number => (n === null ? Number.POSITIVE_INFINITY : n)

/** The template a request asks for, with the size it must start (the request's budget); undefined when none. */
export const wantedTemplate = (req: Request): HeldTemplate | undefined =>
  req.template == null ? undefined : { name: req.template, memMib: req.budget.memMib, vcpus: req.budget.vcpus }

/** Whether the host holds the wanted template: the same name and size. */
export const holdsTemplate = (c: Candidate, wanted: HeldTemplate | undefined): boolean =>
  wanted !== undefined &&
  c.templates !== undefined &&
  c.templates.some((t) => t.name === wanted.name && t.memMib === wanted.memMib && t.vcpus === wanted.vcpus)

/**
 * The ranking order: measured before unmeasured; within each, the image's host, then affinity
 * hosts in the request's order (`affinityIndexOf`), then hosts that hold the wanted template (a start without a boot), then
 * the hosts of the `spread`'s own share, then best fit (smallest free RAM, then fewest free
 * vCPUs), then host id. Negative: `a` ranks first. Exported for indexes that must rank exactly
 * as `rank` does.
 */
export const compare = (a: Candidate, b: Candidate, affinityIndex: ReadonlyMap<string, number>, wanted?: HeldTemplate, spread?: Spread): number => {
  const ma = isMeasured(a) ? 0 : 1
  const mb = isMeasured(b) ? 0 : 1
  if (ma !== mb) return ma - mb
  const ia = affinityIndex.get(a.id) ?? Number.POSITIVE_INFINITY
  const ib = affinityIndex.get(b.id) ?? Number.POSITIVE_INFINITY
  if (ia !== ib) return ia < ib ? -1 : 1
  if (wanted !== undefined) {
    const ta = holdsTemplate(a, wanted) ? 0 : 1
    const tb = holdsTemplate(b, wanted) ? 0 : 1
    if (ta !== tb) return ta - tb
  }
  if (spread !== undefined) {
    const oa = isOwn(spread, a.id)
    if (oa !== isOwn(spread, b.id)) return oa ? -1 : 1
  }
  const fa = orNever(Headroom.freeMib(a.headroom))
  const fb = orNever(Headroom.freeMib(b.headroom))
  if (fa !== fb) return fa < fb ? -1 : 1
  const va = orNever(Headroom.freeVcpus(a.headroom))
  const vb = orNever(Headroom.freeVcpus(b.headroom))
  if (va !== vb) return va < vb ? -1 : 1
  return compareIds(a.id, b.id)
}

/**
 * The position of each preferred host in the request's order: the image's host (`imageHost`)
 * first, then the affinity hosts in the request's order. Every ranking (`compare`, `pick`,
 * `PlacementIndex`) reads preferences from here alone.
 */
export const affinityIndexOf = (req: Request): ReadonlyMap<string, number> => {
  const m = new Map<string, number>()
  if (req.imageHost != null) m.set(req.imageHost, 0)
  req.affinity?.forEach((id) => {
    if (!m.has(id)) m.set(id, m.size)
  })
  return m
}

/** The ids of the hosts that fit the request, best first (SPEC §2). */
export const rank = (hosts: readonly Candidate[], req: Request, limits: Limits = defaults): string[] => {
  const index = affinityIndexOf(req)
  const wanted = wantedTemplate(req)
  return hosts
    .filter((h) => admits(h, req, limits) && fitsOn(h, req.budget, limits))
    .sort((a, b) => compare(a, b, index, wanted, req.spread))
    .map((h) => h.id)
}

/** The best host for the request, or null when none fits: `rank(...)[0]` in one linear pass. */
export const pick = (hosts: Iterable<Candidate>, req: Request, limits: Limits = defaults): string | null => {
  const index = affinityIndexOf(req)
  const wanted = wantedTemplate(req)
  let best: Candidate | undefined
  for (const h of hosts) {
    if (!admits(h, req, limits) || !fitsOn(h, req.budget, limits)) continue
    if (best === undefined || compare(h, best, index, wanted, req.spread) < 0) best = h
  }
  return best === undefined ? null : best.id
}

/** The best `k` hosts for the request, best first: `rank(...).slice(0, k)` in O(k·n), without sorting every host. */
export const top = (hosts: Iterable<Candidate>, req: Request, k: number, limits: Limits = defaults): string[] => {
  const pool = new Map<string, Candidate>()
  for (const h of hosts) pool.set(h.id, h)
  const out: string[] = []
  while (out.length < k) {
    const next = pick(pool.values(), req, limits)
    if (next === null) break
    out.push(next)
    pool.delete(next)
  }
  return out
}

/** A host-choice request: placement's request, and optionally the one host it must be. */
export interface Choice extends Request {
  /**
   * The host asked for (a move's given target): chosen only if the budget fits there now. It is
   * the operator's choice: `takesMovesOnly` does not refuse it (it only narrows the best-ranked pick).
   */
  readonly target?: string | undefined
}

/** The host choice's answer: the host, or why none. */
export type Chosen =
  | { readonly _tag: "Chosen"; readonly hostId: string }
  /** No host fits (or the asked-for target does not); `message` says which. */
  | { readonly _tag: "NoFit"; readonly message: string }
  /** The asked-for target is the excluded host. */
  | { readonly _tag: "SameHost"; readonly hostId: string }
  /** The asked-for target is not among the candidates. */
  | { readonly _tag: "UnknownHost"; readonly hostId: string }

/**
 * The one host-choice procedure (create, resume, queue drain, move target), over any way of
 * finding a candidate by id and of picking the best: `choose` scans, `PlacementIndex` looks up.
 */
export const chooseWith = (
  req: Choice,
  find: (id: string) => Candidate | undefined,
  best: (req: Request) => string | null,
  limits: Limits = defaults,
): Chosen => {
  if (req.target !== undefined) {
    if (req.target === req.exclude) return { _tag: "SameHost", hostId: req.target }
    const c = find(req.target)
    if (c === undefined) return { _tag: "UnknownHost", hostId: req.target }
    return fitsOn(c, req.budget, limits) && (req.now === undefined || !isSilent(c, req.now, limits))
      ? { _tag: "Chosen", hostId: c.id }
      : { _tag: "NoFit", message: `host ${c.id} cannot take the session: ${reasonFor(c, req.budget, limits, req.now)}` }
  }
  const hostId = best(req)
  if (hostId !== null) return { _tag: "Chosen", hostId }
  const which = `no host${req.exclude === undefined ? "" : ` other than ${req.exclude}`}`
  // Peer URLs named only when a host that takes no moves would have had the room (one more pick, on a refusal only).
  const forMoves = req.takesMovesOnly === true && best({ ...req, takesMovesOnly: false }) !== null
  return {
    _tag: "NoFit",
    message: forMoves ? `${which} that takes moves (its agent advertises a peer URL) has room for the session` : `${which} can take the session`,
  }
}

/** Chooses the host for a request among `hosts` (SPEC §2, §5): the asked-for target if it fits, else the best ranked. */
export const choose = (hosts: Iterable<Candidate>, req: Choice, limits: Limits = defaults): Chosen => {
  const all: readonly Candidate[] = Array.isArray(hosts) ? hosts : [...hosts]
  return chooseWith(req, (id) => all.find((h) => h.id === id), (r) => pick(all, r, limits), limits)
}

/** Why this host does not take the budget, or `fits_now` when it does; `silent` (`isSilent`) is judged only with a `now`. */
export const reasonFor = (c: Candidate, budget: Budget, limits: Limits = defaults, now?: number): NoFitReason => {
  const state = c.state ?? "ready"
  if (state !== "ready") return state
  // A host that has not reported yet has measured nothing: it takes nothing until it does.
  if (c.reported === false) return "unmeasured"
  if (now !== undefined && isSilent(c, now, limits)) return "silent"
  if ((c.entries ?? 0) >= limits.maxEntriesPerNode) return "entries_full"
  if (limits.requireMeasured && !isMeasured(c)) return "unmeasured"
  const short = Headroom.shortfall(c.headroom, budget)
  if (short === "ram") return "ram_full"
  if (short === "cpu") return "cpu_full"
  return "fits_now"
}

/** The no-fit details (SPEC §2): one reason per host, sorted by host id. */
export const noFit = (hosts: readonly Candidate[], req: Request, limits: Limits = defaults): NoFitDetail[] =>
  hosts
    .map((c) => ({
      hostId: c.id,
      reason: reasonFor(c, req.budget, limits, req.now),
      freeMib: Headroom.shownFreeMib(c.headroom),
      freeVcpus: Headroom.shownFreeVcpus(c.headroom),
    }))
    .sort((a, b) => compareIds(a.hostId, b.hostId))

/** The host as it would be with nothing reserved on it. */
export const emptied = (h: Candidate): Candidate => ({ ...h, entries: 0, headroom: { ...h.headroom, reserved: Headroom.zero } })

/**
 * Whether a budget fits on none of the ready measured hosts even if that host were empty
 * (SPEC §12, `too_big`): no descent can help it. With no ready measured host at all nothing is
 * too big (the fleet is not measured yet, which says nothing about the size of its hosts).
 */
export const tooBigFor = (hosts: Iterable<Candidate>, limits: Limits = defaults): ((budget: Budget) => boolean) => {
  // Each ready measured host's fit limits as if it held nothing: empty, such a host is open
  // once it has reported (`isOpen` of `emptied(h)`, without copying the host).
  const points: Budget[] = []
  let sized = 0
  for (const h of hosts) {
    if ((h.state ?? "ready") !== "ready" || !isMeasured(h)) continue
    sized++
    if (h.reported !== false && limits.maxEntriesPerNode > 0) points.push(Headroom.fitLimit({ ...h.headroom, reserved: Headroom.zero }))
  }
  if (sized === 0) return () => false
  const index = roomIndexOf(points)
  return (budget) => !index.anyFits(budget)
}

/**
 * An index over a fixed set of candidates that answers "does this budget fit on any of
 * them" in O(log n): the Pareto staircase of their `Headroom.fitLimit`s. The park gate
 * judges thousands of queued sessions against one fleet read with it.
 */
export interface RoomIndex {
  readonly anyFits: (budget: Budget) => boolean
}

/** Builds a {@link RoomIndex} over the open candidates. */
export const roomIndex = (hosts: Iterable<Candidate>, limits: Limits = defaults): RoomIndex => {
  const points: Budget[] = []
  for (const h of hosts) if (isOpen(h, limits)) points.push(Headroom.fitLimit(h.headroom))
  return roomIndexOf(points)
}

/**
 * A {@link RoomIndex} over fit limits (`Headroom.fitLimit`s). Built from the distinct RAM limits
 * (each with the most vCPUs seen at it), sorted as plain numbers: a fleet of 50,000 hosts has
 * far fewer distinct limits, and a numeric sort of a typed array costs a fraction of a
 * comparator sort of objects.
 */
export const roomIndexOf = (limits: Iterable<Budget>): RoomIndex => {
  const most = new Map<number, number>()
  for (const p of limits) {
    const v = most.get(p.memMib)
    if (v === undefined || p.vcpus > v) most.set(p.memMib, p.vcpus)
  }
  // RAM limits, largest first; best[i] = the most vCPUs among ram[0..i].
  const ram = Float64Array.from(most.keys()).sort().reverse()
  const best = new Float64Array(ram.length)
  let running = Number.NEGATIVE_INFINITY
  for (let i = 0; i < ram.length; i++) {
    running = Math.max(running, most.get(ram[i] as number) as number)
    best[i] = running
  }
  return {
    anyFits: (budget) => {
      // The last index whose RAM limit still covers the budget.
      let lo = 0
      let hi = ram.length
      while (lo < hi) {
        const mid = (lo + hi) >>> 1
        if ((ram[mid] as number) >= budget.memMib) lo = mid + 1
        else hi = mid
      }
      return lo > 0 && (best[lo - 1] as number) >= budget.vcpus
    },
  }
}
