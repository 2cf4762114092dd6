/**
 * The in-memory store: deterministic, single-threaded, its time from the Effect Clock.
 * Every operation runs to completion synchronously inside one Effect, so it is atomic by
 * construction. Every operation that changes state reads the maps, asks core for a `Plan`, and
 * hands it to `apply`, the one function that writes sessions, reservations, moves and history.
 * It keeps per-host reserved sums, a placement index, the queue's budgets and the ledger's
 * reclaim deadlines incrementally, so a fleet of 10,000 hosts stays fast; every decision about
 * room still goes through @engram/core.
 */
import { Downtime, Headroom, Ledger, Lifetime, Limits, Move, Order, ParkGate, ParkPolicy, Placement, PlacementIndex, Plan, QueueWalk, Reclaim, Session } from "@engram/core"
import type { Budget, Candidate, FleetHost, LedgerEntry, NoFitDetail, Park, Queued, SessionState } from "@engram/core"
import {
  assignedStates,
  Conflict,
  Cursor,
  fromMoveRefusal,
  fromRefusal,
  fromTargetChoice,
  NoRoom,
  NotFound,
  Refused,
  reportChanges,
  tokenHashTaken,
  reportIsOutdated,
  unchangedByReport,
  reportedTemplates,
  sessionCountsOf,
  Store,
  StoreTesting,
  Validate,
} from "@engram/store"
import type {
  DrainResult,
  EndResult,
  FleetRead,
  Host,
  HostReport,
  HostView,
  MovePhases,
  MoveFilter,
  MoveRound,
  Page,
  PageRequest,
  PlaceOutcome,
  QueueStanding,
  ReclaimResult,
  ReserveInput,
  SessionEvent,
  SessionFilter,
  StoreShape,
  IllegalTransition,
  InvalidInput,
} from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"

interface HostRec {
  id: string
  labels: Readonly<Record<string, string>>
  state: Placement.HostState
  report: HostReport | null
  reportedAt: number | null
  createdAt: number
  /** Where its agent serves its peers, as its last report said. */
  peerUrl: string | null
  tokenHash: string | null
  reserved: { memMib: number; vcpus: number }
  entries: Set<string>
  parks: Map<string, Park>
  descents: Set<string>
  /** Bumped whenever the report, state or reservations change: a plan decided on an older one is stale. */
  version: number
  /** Rebuilt whenever the report, state or reservations change. */
  candidate: Candidate
  /** The host as the fleet read carries it; null once anything it shows changed (rebuilt on the next read). */
  fleet: FleetHost | null
  /** The host's parks as the fleet read carries them; null once a park came or went (kept across other changes). */
  parkList: Park[] | null
}

interface SessionRec {
  id: string
  state: SessionState
  budget: Budget
  affinity: readonly string[]
  hostId: string | null
  reservationId: string | null
  queuedAt: number | null
  parkedAt: number | null
  idleTimeoutMs: number | null
  lastActiveAt: number
  endsAt: number | null
  template: string | null
  imageHostId: string | null
  createdAt: number
  updatedAt: number
}

interface MoveRec {
  id: string
  sessionId: string
  sourceHostId: string
  targetHostId: string
  reservationId: string
  maxDowntimeMs: number
  state: Move.Record["state"]
  rounds: MoveRound[]
  phases: MovePhases | null
  abortReason: string | null
  abortEstimateMs: number | null
  guard: Move.Guard | null
  /** Who committed it (`Move.committedBy`); null while not committed. */
  committedBy?: Move.CommittedBy | null | undefined
  createdAt: number
  endedAt: number | null
}

interface Counters {
  totalReservedMib: number
  totalReleasedMib: number
  totalReclaimedMib: number
  reserveFailures: number
}

const { byId } = Order
const assigned: ReadonlySet<SessionState> = new Set(assignedStates)

/** Options of the in-memory store. */
export interface Options {
  readonly limits?: Limits.Limits | undefined
  /** The park policy an idle session's step decides with (default `ParkPolicy.defaultRule`). */
  readonly park?: ParkPolicy.Rule | undefined
  /**
   * Compute the no-fit details of a queued create or resume (default true). The fleet
   * simulator turns them off: they cost one pass over every host per queued session.
   */
  readonly noFitDetails?: boolean | undefined
}

/**
 * The ledger's entries by the time after which each is reclaimable (`Ledger.reclaimableAfter`):
 * a min-heap whose keys may be older than the entry's (a heartbeat moves the time later, and is
 * not told here), so a key is a lower bound; `due` checks each candidate's real time.
 */
class Deadlines {
  private readonly at: number[] = []
  private readonly ids: string[] = []

  push(at: number, id: string): void {
    let i = this.at.length
    this.at.push(at)
    this.ids.push(id)
    while (i > 0) {
      const parent = (i - 1) >> 1
      if ((this.at[parent] as number) <= at) break
      this.at[i] = this.at[parent] as number
      this.ids[i] = this.ids[parent] as string
      i = parent
    }
    this.at[i] = at
    this.ids[i] = id
  }

  private pop(): void {
    const lastAt = this.at.pop() as number
    const lastId = this.ids.pop() as string
    const n = this.at.length
    if (n === 0) return
    let i = 0
    for (;;) {
      let child = 2 * i + 1
      if (child >= n) break
      if (child + 1 < n && (this.at[child + 1] as number) < (this.at[child] as number)) child++
      if ((this.at[child] as number) >= lastAt) break
      this.at[i] = this.at[child] as number
      this.ids[i] = this.ids[child] as string
      i = child
    }
    this.at[i] = lastAt
    this.ids[i] = lastId
  }

  /** The entries reclaimable at `now` (each once), as `deadlineOf` judges them now; later ones stay. */
  due<E>(now: number, find: (id: string) => E | undefined, deadlineOf: (e: E) => number): E[] {
    const out = new Set<E>()
    while (this.at.length > 0 && (this.at[0] as number) < now) {
      const id = this.ids[0] as string
      this.pop()
      const e = find(id)
      if (e === undefined) continue
      const at = deadlineOf(e)
      if (at < now) out.add(e)
      else this.push(at, id)
    }
    // Entries the pass leaves (none, while the store is consistent) are judged again next time.
    for (const e of out) this.push(deadlineOf(e), (e as { readonly id: string }).id)
    return [...out]
  }
}

const noClaims: ReadonlyMap<string, unknown> = new Map()

/** The records of `ids` that `table` holds, each once, as `of` shows them (`getSessions`, `getMoves`: an unknown id left out). */
const foundIn = <R, A>(table: ReadonlyMap<string, R>, ids: readonly string[], of: (r: R) => A): A[] => {
  const out: A[] = []
  for (const id of new Set(ids)) {
    const r = table.get(id)
    if (r !== undefined) out.push(of(r))
  }
  return out
}

/** Builds a fresh in-memory store: the `Store` operations and their `reset`. */
export const make = (options: Options = {}): { store: StoreShape; reset: (limits?: Limits.Limits) => void } => {
  let limits: Limits.Limits = options.limits ?? Limits.defaults
  const park = options.park ?? ParkPolicy.defaultRule
  let hosts = new Map<string, HostRec>()
  // The host holding each credential hash: at most one (`tokenHashTaken`), found without a walk of every host.
  let byTokenHash = new Map<string, HostRec>()
  let index = new PlacementIndex.Index(limits)
  const noFitDetails = options.noFitDetails ?? true
  let sessions = new Map<string, SessionRec>()
  /**
   * The sessions not ended, by their host: a host's sessions without a walk of every session the
   * store keeps (the reaper's make-room read of a held host's running sessions each pass, an
   * agent's assignments). Kept by `enter` and `leave`, as the queue and the parks.
   */
  let liveByHost = new Map<string, Set<SessionRec>>()
  // The sessions a lifetime can end or idle (an idle timeout or a TTL), so a pass reads only those.
  let withLifetime = new Set<SessionRec>()
  let queue = new Map<string, SessionRec>()
  let queueSorted: SessionRec[] | null = null
  /** The budgets waiting in the queue, with how many ask for each: what the idle decision reads of the queue. */
  let queuedBudgets = new Map<string, { readonly budget: Budget; count: number }>()
  /** The hosts in id order, null when a host came or went (rebuilt on the next read). */
  let hostsSorted: HostRec[] | null = null
  /** The queue as the fleet read carries it, and the sorted queue it was built from. */
  let fleetQueue: { of: SessionRec[]; list: Queued[] } | null = null
  /**
   * Core's too-big index: it depends on the hosts' capacities and states only (not on what they
   * hold), so it is built once, and again only after a host came, went, reported or changed state.
   */
  let tooBigIndex: ((b: Budget) => boolean) | null = null
  let entries = new Map<string, LedgerEntry>()
  let deadlines = new Deadlines()
  let moves = new Map<string, MoveRec>()
  let openMoves = new Map<string, string>()
  /** The moves whose source owes its target a resend (`markResendOwed`). */
  let resendOwed = new Set<string>()
  /** How many times each move's resend mark was cleared (`Move.resendClears`); absent: none. */
  let resendClears = new Map<string, number>()
  let moveSeq = 0
  let sessionSeq = 0
  let history = new Map<string, SessionEvent[]>()
  /** Each host pair's recent commit phases, by `source target`. */
  let pairs = new Map<string, Downtime.PairCommits>()
  let counters: Counters = { totalReservedMib: 0, totalReleasedMib: 0, totalReclaimedMib: 0, reserveFailures: 0 }

  const reset = (next: Limits.Limits = Limits.defaults): void => {
    limits = next
    hosts = new Map()
    byTokenHash = new Map()
    index = new PlacementIndex.Index(limits)
    sessions = new Map()
    liveByHost = new Map()
    withLifetime = new Set()
    queue = new Map()
    queueSorted = null
    queuedBudgets = new Map()
    hostsSorted = null
    fleetQueue = null
    tooBigIndex = null
    entries = new Map()
    deadlines = new Deadlines()
    moves = new Map()
    openMoves = new Map()
    resendOwed = new Set()
    resendClears = new Map()
    moveSeq = 0
    sessionSeq = 0
    history = new Map()
    pairs = new Map()
    counters = { totalReservedMib: 0, totalReleasedMib: 0, totalReclaimedMib: 0, reserveFailures: 0 }
  }

  // ---- hosts -------------------------------------------------------------------------------

  const headroomOf = (h: HostRec) =>
    Headroom.fromReport(
      { allocatableMib: h.report?.allocatableMib ?? null, totalVcpus: h.report?.totalVcpus ?? null },
      { memMib: h.reserved.memMib, vcpus: h.reserved.vcpus },
      limits,
    )
  const measuredOf = (h: HostRec): boolean =>
    h.report !== null && Headroom.isMeasuredReport({ allocatableMib: h.report.allocatableMib, totalVcpus: h.report.totalVcpus })
  const refresh = (h: HostRec): void => {
    h.version++
    h.candidate = {
      id: h.id,
      headroom: headroomOf(h),
      state: h.state,
      entries: h.entries.size,
      measured: measuredOf(h),
      reported: h.reportedAt !== null,
      reportedAt: h.reportedAt,
      takesMoves: Move.takesMoves(h.peerUrl),
      // Only a host holding templates names them: most hosts' candidates stay as they were.
      ...(h.report?.templates !== undefined && h.report.templates.length > 0 ? { templates: h.report.templates } : {}),
    }
    h.fleet = null
    index.upsert(h.candidate)
  }
  const candidates = function* (): Iterable<Candidate> {
    for (const h of hosts.values()) yield h.candidate
  }
  const hostOf = (h: HostRec): Host => ({
    id: h.id,
    labels: { ...h.labels },
    state: h.state,
    report: h.report,
    reportedAt: h.reportedAt,
    createdAt: h.createdAt,
    peerUrl: h.peerUrl,
  })
  const viewOf = (h: HostRec): HostView => ({
    ...hostOf(h),
    measured: h.candidate.measured ?? false,
    headroom: h.candidate.headroom,
    entries: h.entries.size,
    parks: h.parks.size,
    descentsRunning: h.descents.size,
  })
  const findHost = (id: string) => {
    const h = hosts.get(id)
    return h === undefined ? Effect.fail(new NotFound({ entity: "host", id })) : Effect.succeed(h)
  }

  // ---- ledger primitives (the apply's) -----------------------------------------------------

  const addEntry = (e: LedgerEntry): void => {
    const h = hosts.get(e.hostId) as HostRec
    entries.set(e.id, e)
    deadlines.push(Ledger.reclaimableAfter(e, limits), e.id)
    h.entries.add(e.id)
    h.reserved.memMib += e.memMib
    h.reserved.vcpus += e.vcpus
    counters.totalReservedMib += e.memMib
    refresh(h)
  }
  const removeEntry = (id: string, how: Plan.Removal): void => {
    const e = entries.get(id)
    if (e === undefined) return
    entries.delete(id)
    const h = hosts.get(e.hostId)
    if (h !== undefined) {
      h.entries.delete(id)
      h.reserved.memMib -= e.memMib
      h.reserved.vcpus -= e.vcpus
      refresh(h)
    }
    if (how === "released") counters.totalReleasedMib += e.memMib
    else counters.totalReclaimedMib += e.memMib
  }
  const ledgerHostView = (h: HostRec): Ledger.HostView => ({
    state: h.state,
    measured: h.candidate.measured ?? false,
    headroom: h.candidate.headroom,
    entries: h.entries.size,
  })

  // ---- sessions ----------------------------------------------------------------------------

  const sessionOf = (s: SessionRec): Session.Record => ({
    id: s.id,
    state: s.state,
    budget: s.budget,
    affinity: s.affinity,
    hostId: s.hostId,
    reservationId: s.reservationId,
    queuedAt: s.queuedAt,
    parkedAt: s.parkedAt,
    idleTimeoutMs: s.idleTimeoutMs,
    lastActiveAt: s.lastActiveAt,
    endsAt: s.endsAt,
    template: s.template,
    imageHostId: s.imageHostId,
    createdAt: s.createdAt,
    updatedAt: s.updatedAt,
  })
  const findSession = (id: string) => {
    const s = sessions.get(id)
    return s === undefined ? Effect.fail(new NotFound({ entity: "session", id })) : Effect.succeed(s)
  }
  const sortedQueue = (): SessionRec[] => {
    if (queueSorted === null) {
      queueSorted = [...queue.values()].sort((a, b) => (a.queuedAt as number) - (b.queuedAt as number) || byId(a, b))
    }
    return queueSorted
  }
  const positionOf = (s: SessionRec): number => {
    if (s.state !== "queued") return 0
    return sortedQueue().indexOf(s) + 1
  }
  const noFitFor = (b: Budget, affinity: readonly string[], t: number): NoFitDetail[] =>
    noFitDetails ? Placement.noFit([...candidates()], { budget: b, affinity, now: t }, limits) : []
  const tooBig = (b: Budget): boolean => (tooBigIndex ??= Placement.tooBigFor(candidates(), limits))(b)
  const standingOf = (s: SessionRec, t: number, position = positionOf(s)): QueueStanding => ({
    position,
    noFit: noFitFor(s.budget, s.affinity, t),
    tooBig: tooBig(s.budget),
  })
  const outcomeOf = (s: SessionRec, t: number): PlaceOutcome =>
    s.hostId !== null ? { _tag: "Placed", session: sessionOf(s) } : { _tag: "Queued", session: sessionOf(s), ...standingOf(s, t) }

  // Ids the store makes keep to the id rule and are never one a client already chose.
  const reservationIdFor = (): string => {
    let id = `res-${++sessionSeq}`
    while (entries.has(id)) id = `res-${++sessionSeq}`
    return id
  }

  /** When a queued session starves (it gets a host claimed for it: core's `QueueWalk.claims`). */
  const starvationAt = (t: number): QueueWalk.Starvation => ({ now: t, limitMs: park.options.starvationLimitMs })
  /** The hosts claimed for starving sessions now; none (and no work) while the queue's head has waited less than the limit. */
  const claimsAt = (t: number): ReadonlyMap<string, unknown> => {
    const head = queue.size === 0 ? undefined : sortedQueue()[0]
    if (head === undefined || t - (head.queuedAt as number) < park.options.starvationLimitMs) return noClaims
    return QueueWalk.claims(index, sortedQueue(), starvationAt(t), limits)
  }

  // The host choice of a create or a resume: the index's pick past the hosts claimed for
  // starving sessions, with a fresh reservation id. `wanting` is core's view of the session (`Placement.requestOf`).
  const placementFor = (wanting: Placement.Wanting, t: number): Session.Placed | null => {
    // Hosts silent at `t` (`Placement.isSilent`) are not admitted.
    const req = Placement.requestOf(wanting, undefined, t)
    const choice = index.choose(req)
    if (choice._tag !== "Chosen") return null
    const claimed = claimsAt(t)
    if (!claimed.has(choice.hostId)) return placedOn(choice.hostId)
    const other = QueueWalk.pickUnclaimed(index, req, claimed)
    return other === null ? null : placedOn(other)
  }
  const placedOn = (hostId: string): Session.Placed => ({ hostId, version: (hosts.get(hostId) as HostRec).version, reservationId: reservationIdFor() })

  /** What an idle step reads: the session's host, and whether a queued session has no room (each budget judged once). */
  const idleViewOf = (s: SessionRec, t: number): ParkPolicy.IdleView => ({
    host: s.hostId === null ? null : (hosts.get(s.hostId)?.candidate ?? null),
    queueWithoutRoom:
      queuedBudgets.size > 0 && ParkGate.anyWithoutRoom(Array.from(queuedBudgets.values(), (q) => q.budget), (b) => index.anyFits(b, t), tooBig),
  })

  /** A page of a list held in memory: the request checked, the cursor decoded, the slice taken. */
  const pageOf = <A, L extends Cursor.List>(
    list: L,
    sorted: () => readonly A[],
    keyOf: (a: A) => Cursor.Keys[L],
    page: PageRequest,
  ): Effect.Effect<Page<A>, InvalidInput> => {
    const bad = Validate.pageLimit(page.limit)
    if (bad) return Effect.fail(bad)
    const after = Cursor.decode(list, page.cursor)
    if (Cursor.isInvalid(after)) return Effect.fail(after)
    return Effect.sync(() => Cursor.slice(list, sorted(), keyOf, after, page.limit))
  }
  const sessionsSorted = (filter: SessionFilter): SessionRec[] =>
    // A host's sessions in a state other than ended: only those the host holds (`liveByHost`).
    (filter.hostId !== undefined && filter.state !== undefined && filter.state !== "ended" ? [...(liveByHost.get(filter.hostId) ?? [])] : [...sessions.values()])
      .filter(
        (s) =>
          (filter.state === undefined || s.state === filter.state) &&
          (filter.hostId === undefined || s.hostId === filter.hostId) &&
          (filter.imageHostId === undefined || s.imageHostId === filter.imageHostId),
      )
      .sort((a, b) => a.createdAt - b.createdAt || byId(a, b))
  const movesSorted = (filter: MoveFilter): MoveRec[] =>
    [...moves.values()]
      .filter(
        (m) =>
          (filter.state === undefined || m.state === filter.state) &&
          (filter.hostId === undefined || m.sourceHostId === filter.hostId || m.targetHostId === filter.hostId) &&
          (filter.endedSince === undefined || (m.endedAt !== null && m.endedAt >= filter.endedSince)),
      )
      .sort((a, b) => a.createdAt - b.createdAt || byId(a, b))
  const reservationsSorted = (filter: { readonly hostId?: string | undefined }): LedgerEntry[] => {
    const all =
      filter.hostId === undefined ? [...entries.values()] : [...(hosts.get(filter.hostId)?.entries ?? [])].map((id) => entries.get(id) as LedgerEntry)
    return all.sort(byId)
  }

  // ---- moves -------------------------------------------------------------------------------

  /** The record of a move, with its source's resend mark (kept apart, as store-pg keeps it beside the record's columns). */
  const moveOf = (m: MoveRec): Move.Record => ({ ...m, rounds: [...m.rounds], resendOwed: resendOwed.has(m.id), resendClears: resendClears.get(m.id) ?? 0, committedBy: m.committedBy ?? null })
  const findMove = (id: string) => {
    const m = moves.get(id)
    return m === undefined ? Effect.fail(new NotFound({ entity: "move", id })) : Effect.succeed(m)
  }
  const openMoveOf = (sessionId: string): MoveRec | null => {
    const id = openMoves.get(sessionId)
    return id === undefined ? null : (moves.get(id) as MoveRec)
  }

  // ---- the apply: the one writer of plans --------------------------------------------------

  // The queue, the queued budgets and the hosts' park and descent sets follow the session
  // records: `leave` takes a record out of them, `enter` puts it in as it is now.
  const leave = (s: SessionRec): void => {
    if (s.hostId !== null && s.state !== "ended") {
      const live = liveByHost.get(s.hostId)
      if (live !== undefined && live.delete(s) && live.size === 0) liveByHost.delete(s.hostId)
    }
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h !== undefined) {
      if (s.state === "parked" && h.parks.delete(s.id)) h.fleet = h.parkList = null
      if (s.state === "descending" && h.descents.delete(s.id)) h.fleet = null
    }
    if (s.state === "queued" && queue.delete(s.id)) {
      queueSorted = null
      const key = `${s.budget.memMib}/${s.budget.vcpus}`
      const q = queuedBudgets.get(key) as { count: number }
      if (--q.count === 0) queuedBudgets.delete(key)
    }
  }
  const enter = (s: SessionRec): void => {
    if (s.hostId !== null && s.state !== "ended") {
      const live = liveByHost.get(s.hostId)
      if (live === undefined) liveByHost.set(s.hostId, new Set([s]))
      else live.add(s)
    }
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h !== undefined) {
      if (s.state === "parked") {
        h.parks.set(s.id, { sessionId: s.id, parkedAt: s.parkedAt as number, budget: s.budget })
        h.fleet = h.parkList = null
      }
      if (s.state === "descending") {
        h.descents.add(s.id)
        h.fleet = null
      }
    }
    if (s.state === "queued") {
      queue.set(s.id, s)
      queueSorted = null
      const key = `${s.budget.memMib}/${s.budget.vcpus}`
      const q = queuedBudgets.get(key)
      if (q === undefined) queuedBudgets.set(key, { budget: s.budget, count: 1 })
      else q.count++
    }
  }
  const record = (sessionId: string, event: Session.Event, t: number): void => {
    let list = history.get(sessionId)
    if (list === undefined) history.set(sessionId, (list = []))
    list.push({ sessionId, seq: list.length + 1, at: t, event })
  }

  const applied: Plan.Outcome = { _tag: "Applied" }
  const staleSession: Plan.Outcome = { _tag: "Stale", stale: "session" }
  const staleHost: Plan.Outcome = { _tag: "Stale", stale: "host" }

  /** A plan's checks against the store as it is: its sessions still in the states decided on, its host at the version decided on. */
  const check = (p: Plan.Plan): Plan.Outcome => {
    for (const w of p.sessions) {
      const current = sessions.get(w.record.id)
      if (w.from === null ? current !== undefined : current?.state !== w.from) return staleSession
    }
    if (p.host !== null && hosts.get(p.host.hostId)?.version !== p.host.version) return staleHost
    return applied
  }

  /** Writes a plan that passed its checks: the ledger, the moves, the session records, the history. */
  const write = (p: Plan.Plan): void => {
    for (const c of p.ledger) {
      if (c._tag === "Reserve") addEntry(c.entry)
      else if (c._tag === "Release") removeEntry(c.id, c.how)
      else {
        const e = entries.get(c.id) as LedgerEntry
        const renewed: LedgerEntry = { ...e, ownerKind: "session", ownerId: c.ownerId, lastHeartbeatAt: Ledger.renewedAt(e.lastHeartbeatAt, c.heartbeatAt) }
        entries.set(c.id, renewed)
        deadlines.push(Ledger.reclaimableAfter(renewed, limits), c.id)
      }
    }
    for (const { move: m } of p.moves) {
      const found = moves.get(m.id)
      if (found === undefined) moves.set(m.id, { ...m, rounds: [...m.rounds] })
      else Object.assign(found, m, { rounds: [...m.rounds] })
      if (m.state === "pending") openMoves.set(m.sessionId, m.id)
      else if (openMoves.get(m.sessionId) === m.id) openMoves.delete(m.sessionId)
    }
    for (const { record: next } of p.sessions) {
      const s = sessions.get(next.id)
      if (s === undefined) {
        // Core built this record for the store alone: it becomes the store's record as it is.
        const created = next as SessionRec
        sessions.set(created.id, created)
        enter(created)
        if (created.idleTimeoutMs !== null || created.endsAt !== null) withLifetime.add(created)
      } else {
        leave(s)
        // Activity recorded since the step's read stands: the idle clock never runs backwards.
        const lastActiveAt = Math.max(s.lastActiveAt, next.lastActiveAt)
        Object.assign(s, next, { lastActiveAt })
        enter(s)
        if (s.idleTimeoutMs !== null || s.endsAt !== null) withLifetime.add(s)
        if (s.state === "ended") withLifetime.delete(s)
      }
    }
    for (const { sessionId, event } of p.events) record(sessionId, event, p.at)
  }

  /**
   * The one apply: each plan of the group is checked against the store as it was before the
   * group, then those that pass are written, in order (`Plan` states the rule). Synchronous, so
   * a group is one atomic change.
   */
  const apply = (plans: readonly Plan.Plan[]): Plan.Outcome[] => {
    // Every apply, as store-pg's: a plan core's rules would refuse fails here too, not only on PostgreSQL.
    const bad = Plan.checkGroup(plans)
    if (bad !== null) throw new Error(`store-sim: ${bad}`)
    const outcomes = plans.map(check)
    plans.forEach((p, k) => {
      if (outcomes[k] === applied) write(p)
    })
    return outcomes
  }

  /** Applies one plan decided on the store as it is now: it cannot be stale (nothing runs between the read and the write). */
  const applyNow = (p: Plan.Plan): void => {
    const [outcome] = apply([p])
    if (outcome !== applied) throw new Error(`store-sim: a plan decided now was stale (${JSON.stringify(outcome)})`)
  }

  /** Runs a step on a found session and applies its plan, or answers core's refusal. */
  const stepOn = (s: SessionRec, op: Session.Step, t: number): SessionRec | Session.Refusal => {
    const answer = Session.step(s, op, t)
    if (answer._tag === "Plan") {
      applyNow(answer)
      return s
    }
    return answer._tag === "Unchanged" ? s : answer
  }
  const isRefusal = (x: SessionRec | Session.Refusal): x is Session.Refusal => "_tag" in x
  /**
   * A step on a session (not a move's commit or abort): core's refusal is the store's error,
   * of the kinds the operation can answer (`E`: an IllegalTransition unless it says more).
   */
  const stepSession = <E extends IllegalTransition | Conflict = IllegalTransition>(
    s: SessionRec,
    op: Session.Step,
    t: number,
  ): Effect.Effect<SessionRec, E> => {
    const out = stepOn(s, op, t)
    return isRefusal(out) ? Effect.fail(fromRefusal(s.id, out) as E) : Effect.succeed(out)
  }
  /** A commit or an abort of move `m`: core's refusal is a Conflict on the move. */
  const stepMove = (m: MoveRec, op: Session.Step, t: number): Effect.Effect<Move.Record, Conflict> => {
    const s = sessions.get(m.sessionId)
    const out = s === undefined ? ({ _tag: "NotFound" } as const) : stepOn(s, op, t)
    return isRefusal(out) ? Effect.fail(fromMoveRefusal(m.id, out)) : Effect.sync(() => moveOf(m))
  }

  // ---- the store ---------------------------------------------------------------------------

  const now = Clock.currentTimeMillis

  const store: StoreShape = {
    limits: () => limits,

    registerHost: (input) =>
      Effect.gen(function* () {
        const bad = Validate.hostInput(input)
        if (bad) return yield* bad
        if (hosts.has(input.id)) return yield* new Conflict({ entity: "host", id: input.id, reason: "host already registered" })
        if (input.tokenHash !== undefined && byTokenHash.has(input.tokenHash)) return yield* tokenHashTaken(input.id)
        const t = yield* now
        const h: HostRec = {
          id: input.id,
          labels: { ...(input.labels ?? {}) },
          state: "ready",
          report: null,
          reportedAt: null,
          createdAt: t,
          peerUrl: null,
          tokenHash: input.tokenHash ?? null,
          reserved: { memMib: 0, vcpus: 0 },
          entries: new Set(),
          parks: new Map(),
          descents: new Set(),
          version: 0,
          candidate: { id: input.id, headroom: { allocatableMib: null, cpuBudget: null, reserved: Headroom.zero } },
          fleet: null,
          parkList: null,
        }
        refresh(h)
        hosts.set(h.id, h)
        if (h.tokenHash !== null) byTokenHash.set(h.tokenHash, h)
        hostsSorted = null
        tooBigIndex = null
        return hostOf(h)
      }),

    reportHost: (id, report) =>
      Effect.gen(function* () {
        const h = yield* findHost(id)
        const bad = Validate.report(report)
        if (bad) return yield* bad
        const t = yield* now
        // Older than the report the host holds: not written, and it changes nothing.
        if (reportIsOutdated(h, t)) return { ...viewOf(h), ...unchangedByReport }
        const changes = reportChanges(h, report, { now: t, limits })
        h.report = {
          totalMib: report.totalMib,
          allocatableMib: report.allocatableMib,
          totalVcpus: report.totalVcpus,
          templates: reportedTemplates(report),
        }
        h.peerUrl = report.peerUrl ?? null
        h.reportedAt = t
        tooBigIndex = null
        refresh(h)
        return { ...viewOf(h), ...changes }
      }),

    setHostState: (id, state) =>
      Effect.gen(function* () {
        const h = yield* findHost(id)
        h.state = state
        tooBigIndex = null
        refresh(h)
        return viewOf(h)
      }),

    getHost: (id) => Effect.map(findHost(id), viewOf),
    hostAssignments: (hostId) =>
      Effect.map(findHost(hostId), () => {
        const onHost = [...(liveByHost.get(hostId) ?? [])].filter((x) => assigned.has(x.state))
        // An open move is pending: the open ones are all a host's assignments may hold.
        const open = [...openMoves.values()].map((id) => moves.get(id) as MoveRec).filter((m) => m.sourceHostId === hostId || m.targetHostId === hostId)
        const oldestFirst = <T extends { createdAt: number; id: string }>(a: T, b: T) => a.createdAt - b.createdAt || byId(a, b)
        const imageSessionIds = [...sessions.values()].filter((x) => x.imageHostId === hostId).map((x) => x.id).sort(Order.compareIds)
        return { hostId, sessions: onHost.sort(oldestFirst).map(sessionOf), moves: open.sort(oldestFirst).map(moveOf), imageSessionIds }
      }),
    hostByTokenHash: (tokenHash) =>
      Effect.sync(() => {
        const h = byTokenHash.get(tokenHash)
        return h === undefined ? null : hostOf(h)
      }),
    hostTokenHashes: (ids) =>
      Effect.sync(() => {
        const out = new Map<string, string>()
        for (const id of ids) {
          const h = hosts.get(id)
          if (h !== undefined && h.tokenHash !== null) out.set(id, h.tokenHash)
        }
        return out
      }),
    pageHosts: (page = {}) => pageOf("hosts", () => [...hosts.values()].sort(byId).map(viewOf), (h) => [h.id], page),

    setHostTokenHash: (id, tokenHash) =>
      Effect.flatMap(findHost(id), (h) => {
        const holder = byTokenHash.get(tokenHash)
        if (holder !== undefined && holder !== h) return Effect.fail(tokenHashTaken(id))
        if (h.tokenHash !== null) byTokenHash.delete(h.tokenHash)
        h.tokenHash = tokenHash
        byTokenHash.set(tokenHash, h)
        return Effect.succeed(hostOf(h))
      }),

    removeHost: (id) =>
      Effect.gen(function* () {
        const h = yield* findHost(id)
        let onHost = 0
        for (const x of sessions.values()) if (x.hostId === id) onHost++
        const refused = Ledger.refuseHostRemoval(id, { entries: h.entries.size, sessions: onHost })
        if (refused) return yield* new Refused({ check: refused.check, reason: refused.message })
        hosts.delete(id)
        if (h.tokenHash !== null) byTokenHash.delete(h.tokenHash)
        hostsSorted = null
        tooBigIndex = null
        index.remove(id)
        return hostOf(h)
      }),

    fleetView: () =>
      Effect.gen(function* () {
        const readAt = yield* now
        // Incremental: a host whose candidate, parks and descents did not change since the last
        // read is the same (immutable) object as then; only changed hosts are rebuilt.
        hostsSorted ??= [...hosts.values()].sort(byId)
        const fleetHosts: FleetHost[] = hostsSorted.map(
          (h) => (h.fleet ??= { ...h.candidate, descentsRunning: h.descents.size, parks: (h.parkList ??= [...h.parks.values()]) }),
        )
        // The queue's list is rebuilt only when the queue changed (its sorted order is rebuilt then too).
        const sorted = sortedQueue()
        if (fleetQueue === null || fleetQueue.of !== sorted)
          fleetQueue = { of: sorted, list: sorted.map((s) => ({ sessionId: s.id, budget: s.budget, queuedAt: s.queuedAt as number })) }
        const q: readonly Queued[] = fleetQueue.list
        return { hosts: fleetHosts, queue: q, readAt } satisfies FleetRead
      }),

    // The hot path of the simulator and of the bench: one synchronous body under the clock, no
    // generator per create (the decision is core's; this only reads the clock and writes).
    createSession: (input) =>
      Effect.clockWith((clock): Effect.Effect<PlaceOutcome, InvalidInput | Conflict | NoRoom> => {
        const bad = Validate.sessionInput(input)
        if (bad) return Effect.fail(bad)
        const t = clock.currentTimeMillisUnsafe()
        const existing = sessions.get(input.id)
        const affinity = input.affinity ?? []
        const create = (placement: Session.Placed | null): Session.Step => ({
          _tag: "create",
          id: input.id,
          budget: input.budget,
          // As sent: a repeated create compares only what its caller gave.
          affinity: input.affinity,
          placement,
          idleTimeoutMs: input.idleTimeoutMs,
          ttlMs: input.ttlMs,
          template: input.template,
          onNoRoom: input.onNoRoom,
        })
        if (existing !== undefined) {
          // A repeated create: core answers the session as it is, or a Conflict naming what differs.
          const again = Session.step(existing, create(null), t)
          if (again._tag === "Unchanged") return Effect.succeed(outcomeOf(existing, t))
          return Effect.fail(fromRefusal(input.id, again as Session.Refusal) as Conflict)
        }
        const placement = placementFor({ budget: input.budget, affinity, template: input.template ?? null }, t)
        if (placement === null && input.onNoRoom === "refuse")
          return Effect.fail(
            new NoRoom({
              sessionId: input.id,
              noFit: Placement.noFit([...candidates()], { budget: input.budget, affinity, now: t }, limits),
              tooBig: tooBig(input.budget),
            }),
          )
        const answer = Session.step(null, create(placement), t)
        if (answer._tag !== "Plan") return Effect.fail(fromRefusal(input.id, answer as Session.Refusal) as Conflict)
        applyNow(answer)
        return Effect.succeed(outcomeOf(sessions.get(input.id) as SessionRec, t))
      }),

    getSession: (id) => Effect.map(findSession(id), sessionOf),
    getSessions: (ids) => Effect.sync(() => foundIn(sessions, ids, sessionOf)),

    listSessions: (filter: SessionFilter = {}) => Effect.sync(() => sessionsSorted(filter).map(sessionOf)),
    countSessions: () => Effect.sync(() => sessionCountsOf(Array.from(sessions.values(), (s) => ({ state: s.state, n: 1 })))),
    pageSessions: (filter: SessionFilter = {}, page = {}) =>
      Effect.suspend(() => {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return Effect.fail(bad)
        return pageOf("sessions", () => sessionsSorted(filter).map(sessionOf), (x) => [x.createdAt, x.id], page)
      }),
    sessionEvents: (id, page = {}) =>
      Effect.flatMap(findSession(id), () => pageOf("events", () => history.get(id) ?? [], (e) => [e.seq], page)),

    markRunning: (id) => stepById(id, { _tag: "markRunning" }),
    unpark: (id) => stepById(id, { _tag: "unpark" }),
    beginDescent: (id, options = {}) => stepById(id, { _tag: "beginDescent", reason: options.reason ?? null }),
    // Parked or descending: core's step decides with the store's park policy on what it reads here.
    idle: (id, options = {}) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        const t = yield* now
        return sessionOf(yield* stepSession(s, { _tag: "idle", policy: park, view: idleViewOf(s, t), onlyIfDue: options.onlyIfDue }, t))
      }),
    finishDescent: (id, options = {}) => stepById(id, { _tag: "finishDescent", imageless: options.imageless }),

    resume: (id) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        // Judged before the host choice, so a refused resume takes no reservation id; a park resumes warm, placed nowhere.
        const bad = Session.judgeResume(s)
        if (bad) return yield* (fromRefusal(id, bad) as IllegalTransition)
        const t = yield* now
        const placement = Session.resumesWarm(s.state) ? null : placementFor(s, t)
        const resumed = yield* stepSession(s, { _tag: "resume", placement }, t)
        return outcomeOf(resumed, t)
      }),

    endSession: (id, options = {}) =>
      Effect.gen(function* () {
        const bad = options.reason === undefined ? null : Validate.reason(options.reason)
        if (bad) return yield* bad
        const s = yield* findSession(id)
        const before = sessionOf(s)
        const open = openMoveOf(id)
        // The records change in place: the move as the end closed it is read after the step.
        const ended = sessionOf(yield* stepSession(s, { _tag: "end", openMove: open === null ? null : moveOf(open), reason: options.reason ?? null, onlyIfDue: options.onlyIfDue }, yield* now))
        return { session: ended, before, closedMove: open === null ? null : moveOf(open) } satisfies EndResult
      }),
    setTtl: (id, ttlMs) =>
      Effect.gen(function* () {
        const bad = Validate.ttl(ttlMs)
        if (bad) return yield* bad
        const s = yield* findSession(id)
        return sessionOf(yield* stepSession(s, { _tag: "setTtl", ttlMs }, yield* now))
      }),
    recordGuestLost: (hostId, sessionId, reason) =>
      Effect.gen(function* () {
        const bad = Validate.guestLost(hostId, reason)
        if (bad) return yield* bad
        const s = yield* findSession(sessionId)
        // A session no longer on the host: judged on its latest committed move (a report of a copy lost before it).
        const lastMove = s.hostId === hostId ? null : Session.lastMoveOf((history.get(sessionId) ?? []).map((e) => e.event), hostId)
        return sessionOf(yield* stepSession<IllegalTransition | Conflict>(s, { _tag: "guestLost", hostId, reason, lastMove }, yield* now))
      }),
    recordActivity: (hostId, sessionIds) =>
      Effect.gen(function* () {
        const bad = Validate.id("hostId", hostId) ?? Validate.activity(sessionIds)
        if (bad) return yield* bad
        const t = yield* now
        let moved = 0
        for (const id of sessionIds) {
          const s = sessions.get(id)
          if (s === undefined || s.state !== "running" || s.hostId !== hostId || s.lastActiveAt >= t) continue
          s.lastActiveAt = t
          moved++
        }
        return moved
      }),
    lifetimesDue: (options = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        const limit = options.limit ?? 1000
        const idle: SessionRec[] = []
        const expired: SessionRec[] = []
        for (const s of withLifetime) {
          if (Lifetime.isExpired(s, t)) expired.push(s)
          else if (Lifetime.isIdle(s, s.lastActiveAt, t)) idle.push(s)
        }
        const idleAt = (s: SessionRec) => Lifetime.idleAt(s, s.lastActiveAt) as number
        idle.sort((a, b) => idleAt(a) - idleAt(b) || Order.compareIds(a.id, b.id))
        expired.sort((a, b) => (a.endsAt as number) - (b.endsAt as number) || Order.compareIds(a.id, b.id))
        return { idle: idle.slice(0, limit).map(sessionOf), expired: expired.slice(0, limit).map(sessionOf) }
      }),

    pageQueue: (page = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        const p = yield* pageOf("queue", () => sortedQueue().map((x, i) => ({ x, position: i + 1 })), ({ x }) => [x.queuedAt as number, x.id], page)
        return { items: p.items.map(({ x, position }) => ({ session: sessionOf(x), standing: standingOf(x, t, position) })), nextCursor: p.nextCursor }
      }),
    queueStanding: (id) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        return s.state === "queued" ? standingOf(s, yield* now) : null
      }),

    drainQueue: (options = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        // Core's queue walk over the live index (it takes each placement's room from it), core's
        // step for each placement, and the group applied at once: one synchronous change.
        const walk = QueueWalk.walkOn(index, [...sortedQueue()], { limit: options.limit, starvation: starvationAt(t), now: t })
        const group: Plan.Plan[] = []
        const unapplied: { sessionId: string; reason: "refused" | "stale" }[] = []
        for (const p of walk.placed) {
          const answer = Session.step(p.waiting, { _tag: "place", placement: placedOn(p.hostId) }, t)
          if (answer._tag === "Plan") group.push(answer)
          else unapplied.push({ sessionId: p.waiting.id, reason: "refused" })
        }
        const outcomes = apply(group)
        // The walk took room from the index for every placement; the written ones gave it back
        // as it is now, the rest must too.
        for (const p of walk.placed) index.upsert((hosts.get(p.hostId) as HostRec).candidate)
        const placed: { sessionId: string; hostId: string }[] = []
        group.forEach((plan, k) => {
          const s = Plan.sessionOf(plan) as Session.Record
          if (outcomes[k] === applied) placed.push({ sessionId: s.id, hostId: s.hostId as string })
          else unapplied.push({ sessionId: s.id, reason: "stale" })
        })
        return { placed, unapplied, remaining: queue.size } satisfies DrainResult
      }),

    reserve: (input: ReserveInput) =>
      Effect.gen(function* () {
        const t = yield* now
        const bad = Validate.ownerKind(input.ownerKind) ?? Validate.reserveExtras(input, t)
        if (bad) return yield* bad
        const host = input.hostId == null ? undefined : hosts.get(input.hostId)
        const admission = Ledger.admit(
          input,
          { duplicate: input.id != null && entries.has(input.id), host: host === undefined ? undefined : ledgerHostView(host) },
          limits,
        )
        if (admission._tag === "Refuse") {
          if (admission.check === "duplicate")
            return yield* new Conflict({ entity: "reservation", id: String(input.id), reason: admission.message })
          counters.reserveFailures++
          return yield* new Refused({ check: admission.check, reason: admission.message })
        }
        const plan = Ledger.reservePlan({ ...input, id: input.id as string, hostId: input.hostId as string }, (host as HostRec).version, t)
        applyNow(plan)
        return entries.get(input.id as string) as LedgerEntry
      }),

    release: (id) =>
      Effect.gen(function* () {
        const e = entries.get(id)
        if (e === undefined) return yield* new NotFound({ entity: "reservation", id })
        const owned = Ledger.refuseRelease(e)
        if (owned) return yield* new Refused({ check: owned.check, reason: owned.message })
        applyNow(Ledger.releasePlan(e, yield* now))
        return e
      }),

    heartbeat: (id) =>
      Effect.gen(function* () {
        const e = entries.get(id)
        if (e === undefined) return yield* new NotFound({ entity: "reservation", id })
        const renewed = { ...e, lastHeartbeatAt: Ledger.renewedAt(e.lastHeartbeatAt, yield* now) }
        entries.set(id, renewed)
        return renewed
      }),

    heartbeatHost: (hostId) =>
      Effect.gen(function* () {
        const h = yield* findHost(hostId)
        const t = yield* now
        let n = 0
        for (const id of h.entries) {
          const e = entries.get(id) as LedgerEntry
          if (!Ledger.renewedByHost.includes(e.ownerKind)) continue
          entries.set(id, { ...e, lastHeartbeatAt: Ledger.renewedAt(e.lastHeartbeatAt, t) })
          n++
        }
        return n
      }),

    getReservation: (id) =>
      Effect.suspend(() => {
        const e = entries.get(id)
        return e === undefined ? Effect.fail(new NotFound({ entity: "reservation", id })) : Effect.succeed(e)
      }),

    pageReservations: (filter = {}, page = {}) =>
      Effect.suspend(() => {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return Effect.fail(bad)
        return pageOf("reservations", () => reservationsSorted(filter), (e) => [e.id], page)
      }),

    reclaim: (options = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        // Core decides what goes and what follows; the store reads what it asks for (only the
        // entries whose reclaim time has come; with `stale` false core keeps the stale ones, and
        // `due` puts every candidate back) and applies the plan.
        const wanted = Reclaim.wanted(
          deadlines.due(t, (id) => entries.get(id), (e) => Ledger.reclaimableAfter(e, limits)),
          t,
          limits,
          options,
        )
        if (wanted.doomed.length === 0) return { reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] } satisfies ReclaimResult
        const involved = new Map<string, SessionRec>()
        const open: MoveRec[] = []
        for (const id of wanted.moveIds) {
          const m = moves.get(id)
          if (m !== undefined && m.state === "pending") open.push(m)
        }
        for (const id of wanted.sessionIds) {
          const m = openMoveOf(id)
          if (m !== null) open.push(m)
        }
        for (const id of [...wanted.sessionIds, ...open.map((m) => m.sessionId)]) {
          const s = sessions.get(id)
          if (s !== undefined) involved.set(id, s)
        }
        // The ways back to a move's source core names (`Reclaim.wayBackOf`), with the source's row.
        const ways: Reclaim.Way[] = []
        for (const e of wanted.doomed) {
          const s = e.ownerKind === "session" ? involved.get(e.ownerId) : undefined
          const lastEvent = s === undefined ? undefined : history.get(s.id)?.at(-1)?.event
          const lastMove = lastEvent?._tag === "Moved" ? { id: lastEvent.moveId, resendOwed: resendOwed.has(lastEvent.moveId) } : undefined
          const sourceId = s === undefined ? null : Reclaim.wayBackOf(sessionOf(s), e, lastEvent, lastMove)
          const source = sourceId === null ? undefined : hosts.get(sourceId)
          if (s !== undefined && lastEvent !== undefined && lastMove !== undefined && source !== undefined)
            ways.push({ sessionId: s.id, lastEvent, lastMove, source: source.candidate, version: source.version, reservationId: reservationIdFor() })
        }
        const decided = Reclaim.decide({ entries: wanted.doomed, sessions: [...involved.values()].map(sessionOf), openMoves: open.map(moveOf), ways }, t, limits, options)
        for (const outcome of apply([decided.plan, ...decided.returned.map((r) => r.plan)]))
          if (outcome !== applied) throw new Error(`store-sim: a reclaim decided now was stale (${JSON.stringify(outcome)})`)
        return {
          reclaimed: [...decided.reclaimed],
          lostSessions: [...decided.lostSessions],
          closedMoves: [...decided.closedMoves],
          imageHostIds: [...decided.imageHostIds],
          ...(decided.returned.length === 0 ? {} : { returned: decided.returned.map((r) => ({ sessionId: r.sessionId, hostId: r.hostId })) }),
        } satisfies ReclaimResult
      }),

    clusterSummary: () =>
      Effect.gen(function* () {
        const t = yield* now
        return Ledger.summarizeCluster([...hosts.values()].map((h) => summaryOf(h, t)))
      }),

    metrics: () => Effect.sync(() => ({ ...counters, activeEntries: entries.size })),

    beginMove: (input) =>
      Effect.gen(function* () {
        const s = yield* findSession(input.sessionId)
        const open = openMoveOf(s.id)
        const openMove = open === null ? null : moveOf(open)
        const refused = Session.refuseBeginMove(s, openMove)
        if (refused) return yield* (fromRefusal(s.id, refused) as IllegalTransition | Conflict)
        const bad = Validate.maxDowntimeMs(input.maxDowntimeMs)
        if (bad) return yield* bad
        // Without a named target, only a host that takes moves (its agent advertises a peer URL) is picked; never a silent one.
        const choice = index.choose({
          budget: s.budget,
          affinity: s.affinity,
          exclude: s.hostId ?? undefined,
          target: input.targetHostId,
          takesMovesOnly: true,
          now: yield* now,
        })
        const refusedTarget = fromTargetChoice(choice)
        if (refusedTarget !== null || choice._tag !== "Chosen") return yield* (refusedTarget as InvalidInput | NotFound | Refused)
        let moveId = `move-${++moveSeq}`
        while (moves.has(moveId)) moveId = `move-${++moveSeq}`
        const target = placedOn(choice.hostId)
        const move = { id: moveId, targetHostId: choice.hostId, targetVersion: target.version, reservationId: target.reservationId, maxDowntimeMs: input.maxDowntimeMs }
        yield* stepSession<IllegalTransition | Conflict>(s, { _tag: "beginMove", openMove, move }, yield* now)
        return moveOf(moves.get(moveId) as MoveRec)
      }),

    recordRound: (moveId, round) =>
      Effect.gen(function* () {
        const m = yield* findMove(moveId)
        // A finished move answers 409 before its input is judged; the rest is `Move.placeRound`'s (after the final round, a position).
        const refused = Move.refuseUnlessPending(m)
        if (refused) return yield* new Conflict({ entity: "move", id: m.id, reason: refused.reason })
        const bad = Validate.round(round)
        if (bad) return yield* bad
        const recorded = Move.recordRound(moveOf(m), round, yield* now)
        if (recorded._tag === "Conflict") return yield* new Conflict({ entity: "move", id: m.id, reason: recorded.reason })
        applyNow(recorded)
        return moveOf(m)
      }),

    commitMove: (moveId, phases, guard, by) =>
      Effect.gen(function* () {
        const bad = Validate.committedBy(by) ?? (phases === null ? null : (Validate.phases(phases) ?? (guard == null ? null : Validate.guard(guard))))
        if (bad) return yield* bad
        const m = yield* findMove(moveId)
        const t = yield* now
        const done = yield* stepMove(m, { _tag: "commitMove", move: moveOf(m), phases, guard: guard ?? null, by }, t)
        if (done.phases !== null) {
          const key = `${done.sourceHostId} ${done.targetHostId}`
          const kept = Downtime.recordTimedCommit(pairs.get(key) ?? { commitsMs: [], recordedAtMs: [] }, done.phases.commitMs, t)
          pairs.set(key, { sourceHostId: done.sourceHostId, targetHostId: done.targetHostId, ...kept })
        }
        return done
      }),

    // The source host's read, core's judgement and the commit's step run in one synchronous stretch
    // (`stepMove` steps when called; nothing between yields to another fiber): no report lands
    // between the judgement and the commit.
    commitMoveByOperator: (moveId) =>
      Effect.gen(function* () {
        const m = yield* findMove(moveId)
        const t = yield* now
        const refused = Move.refuseOperatorCommit(m, hosts.get(m.sourceHostId) ?? null, t, limits)
        if (refused) return yield* new Conflict({ entity: "move", id: m.id, reason: refused.reason })
        return yield* stepMove(m, { _tag: "commitMove", move: moveOf(m), phases: null, guard: null, by: "operator" }, t)
      }),

    listPairCommits: (filter = {}) =>
      Effect.suspend(() => {
        const bad = Validate.pairFilter(filter)
        if (bad) return Effect.fail(bad)
        return Effect.succeed(
          [...pairs.values()]
            .filter(
              (p) =>
                (filter.sourceHostId === undefined || p.sourceHostId === filter.sourceHostId) &&
                (filter.targetHostId === undefined || p.targetHostId === filter.targetHostId) &&
                (filter.recordedSince === undefined || p.updatedAt >= filter.recordedSince),
            )
            .sort((a, b) => (a.sourceHostId === b.sourceHostId ? (a.targetHostId < b.targetHostId ? -1 : 1) : a.sourceHostId < b.sourceHostId ? -1 : 1))
            .map((p) => ({ ...p, commitsMs: [...p.commitsMs], recordedAtMs: [...p.recordedAtMs] })),
        )
      }),

    listAllowanceCommits: (query) =>
      Effect.suspend(() => {
        const bad = Validate.allowanceCommitsQuery(query)
        return bad ? Effect.fail(bad) : Effect.succeed(Downtime.allowanceCommits([...pairs.values()], query))
      }),

    abortMove: (moveId, reason, options = {}) =>
      Effect.gen(function* () {
        const bad = Validate.reason(reason) ?? Validate.estimateMs(options.estimateMs)
        if (bad) return yield* bad
        const m = yield* findMove(moveId)
        const abort: Session.Step = {
          _tag: "abortMove",
          move: moveOf(m),
          reason,
          estimateMs: options.estimateMs ?? null,
          onlyBeforeFinalRound: options.onlyBeforeFinalRound === true,
          targetReclaimed: false,
        }
        return yield* stepMove(m, abort, yield* now)
      }),

    // One synchronous stretch: the stale check and the write see the same clears.
    markResendOwed: (moveId, owed, seenClears) =>
      Effect.gen(function* () {
        const bad = Validate.seenClears(seenClears)
        if (bad) return yield* bad
        const m = yield* findMove(moveId)
        const refused = Move.refuseResendMark(m, owed)
        if (refused) return yield* new Conflict({ entity: "move", id: m.id, reason: refused.reason })
        const next = Move.resendMarkStep(moveOf(m), owed, seenClears)
        if (next === null) return moveOf(m)
        if (next.resendOwed) resendOwed.add(m.id)
        else resendOwed.delete(m.id)
        resendClears.set(m.id, next.resendClears)
        return moveOf(m)
      }),

    getMove: (id) => Effect.map(findMove(id), moveOf),
    latestMove: (sessionId) =>
      Effect.sync(() => {
        const id = Session.latestMoveIdOf((history.get(sessionId) ?? []).map((e) => e.event))
        const m = id === null ? undefined : moves.get(id)
        return m === undefined ? null : moveOf(m)
      }),
    getMoves: (ids) => Effect.sync(() => foundIn(moves, ids, moveOf)),
    listMoves: (filter = {}) =>
      Effect.suspend(() => {
        const bad = Validate.moveFilter(filter)
        return bad ? Effect.fail(bad) : Effect.succeed(movesSorted(filter).map(moveOf))
      }),
    pageMoves: (filter = {}, page = {}) =>
      Effect.suspend(() => {
        const bad = Validate.moveFilter(filter)
        if (bad) return Effect.fail(bad)
        return pageOf("moves", () => movesSorted(filter).map(moveOf), (m) => [m.createdAt, m.id], page)
      }),
    openMove: (sessionId) =>
      Effect.sync(() => {
        const id = openMoves.get(sessionId)
        return id === undefined ? null : moveOf(moves.get(id) as MoveRec)
      }),

    pruneHistory: (request) =>
      Effect.gen(function* () {
        const bad = Validate.pruneRequest(request, yield* now)
        if (bad) return yield* bad
        return prune(request.endedBefore, request.limit)
      }),
  }

  /**
   * The history that ended before `cut`, at most `limit` of each kind, oldest first (as
   * store-pg's indexes walk it): the ended moves first, so a session whose moves went in this
   * call may go too; then the ended sessions with no move left that ended before every ended
   * move still kept, with their events; then the host pairs with no commit since. A scan of the
   * maps: the simulator never prunes in a run.
   */
  function prune(cut: number, limit: number) {
    const oldest = <A>(xs: A[], at: (x: A) => number, id: (x: A) => string): A[] =>
      xs.sort((a, b) => at(a) - at(b) || (id(a) < id(b) ? -1 : id(a) > id(b) ? 1 : 0)).slice(0, limit)
    const endedMoves = oldest([...moves.values()].filter((m) => m.state !== "pending" && m.endedAt !== null && m.endedAt < cut), (m) => m.endedAt as number, (m) => m.id)
    for (const m of endedMoves) {
      moves.delete(m.id)
      resendOwed.delete(m.id)
      resendClears.delete(m.id)
    }
    const withMoves = new Set([...moves.values()].map((m) => m.sessionId))
    // Only the sessions that ended before every ended move still kept (store-pg's bound on its walk).
    let before = cut
    for (const m of moves.values()) if (m.state !== "pending" && m.endedAt !== null && m.endedAt < before) before = m.endedAt
    const endedSessions = oldest([...sessions.values()].filter((x) => x.state === "ended" && x.updatedAt < before && !withMoves.has(x.id)), (x) => x.updatedAt, (x) => x.id)
    let events = 0
    for (const x of endedSessions) {
      sessions.delete(x.id)
      withLifetime.delete(x)
      events += history.get(x.id)?.length ?? 0
      history.delete(x.id)
    }
    const stalePairs = oldest([...pairs.entries()].filter(([, p]) => p.updatedAt < cut), ([, p]) => p.updatedAt, ([k]) => k)
    for (const [key] of stalePairs) pairs.delete(key)
    return { sessions: endedSessions.length, events, moves: endedMoves.length, pairs: stalePairs.length }
  }

  function stepById(id: string, op: Session.Step) {
    return Effect.gen(function* () {
      const s = yield* findSession(id)
      return sessionOf(yield* stepSession(s, op, yield* now))
    })
  }

  function summaryOf(h: HostRec, t: number): Ledger.HostSummary {
    return Ledger.summarizeHost(
      h.id,
      h.candidate.headroom.allocatableMib,
      [...h.entries].map((id) => entries.get(id) as LedgerEntry),
      t,
      limits,
    )
  }

  return { store, reset }
}

/** The in-memory store as a layer. */
export const layer = (options: Options = {}): Layer.Layer<Store> => Layer.sync(Store, () => make(options).store)

/** The in-memory store with its `StoreTesting` reset, for the conformance suite. */
export const layerTesting = (options: Options = {}): Layer.Layer<Store | StoreTesting> =>
  Layer.syncContext(() => {
    const { store, reset } = make(options)
    return Context.add(Context.make(Store, store), StoreTesting, { reset: (limits) => Effect.sync(() => reset(limits)) })
  })
