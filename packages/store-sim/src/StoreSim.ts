/**
 * The in-memory store: deterministic, single-threaded, its time from the Effect Clock.
 * Every operation runs to completion synchronously inside one Effect, so it is atomic by
 * construction. It keeps per-host reserved sums incrementally so a fleet of 10,000 hosts
 * stays fast; every decision about room still goes through @engram/core.
 */
import { Headroom, Ledger, Limits, Placement, PlacementIndex, Session as SessionRules } from "@engram/core"
import type { Budget, Candidate, FleetHost, LedgerEntry, NoFitDetail, Park, Queued, SessionState } from "@engram/core"
import {
  Conflict,
  IllegalTransition,
  InvalidInput,
  NotFound,
  Refused,
  Store,
  StoreTesting,
  Validate,
} from "@engram/store"
import type {
  DrainResult,
  FleetRead,
  Host,
  HostReport,
  HostView,
  Move,
  MovePhases,
  MoveRound,
  PlaceOutcome,
  ReclaimResult,
  ReserveInput,
  Session,
  SessionFilter,
  StoreShape,
} from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"

interface HostRec {
  id: string
  labels: Readonly<Record<string, string>>
  state: Placement.HostState
  report: HostReport | null
  reportedAt: number | null
  createdAt: number
  tokenHash: string | null
  reserved: { memMib: number; vcpus: number }
  entries: Set<string>
  parks: Map<string, Park>
  descents: Set<string>
  /** Rebuilt whenever the report, state or reservations change. */
  candidate: Candidate
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
  state: Move["state"]
  rounds: MoveRound[]
  phases: MovePhases | null
  abortReason: string | null
  abortEstimateMs: number | null
  createdAt: number
  endedAt: number | null
}

interface Counters {
  totalReservedMib: number
  totalReleasedMib: number
  totalReclaimedMib: number
  reserveFailures: number
}

const byId = (a: { id: string }, b: { id: string }): number => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

/** Options of the in-memory store. */
export interface Options {
  readonly limits?: Limits.Limits | undefined
  /**
   * Compute the no-fit details of a queued create or resume (default true). The fleet
   * simulator turns them off: they cost one pass over every host per queued session.
   */
  readonly noFitDetails?: boolean | undefined
}

/** Builds a fresh in-memory store: the `Store` operations and their `reset`. */
export const make = (options: Options = {}): { store: StoreShape; reset: (limits?: Limits.Limits) => void } => {
  let limits: Limits.Limits = options.limits ?? Limits.defaults
  let hosts = new Map<string, HostRec>()
  let index = new PlacementIndex.Index(limits)
  const noFitDetails = options.noFitDetails ?? true
  let sessions = new Map<string, SessionRec>()
  let queue = new Map<string, SessionRec>()
  let queueSorted: SessionRec[] | null = null
  let entries = new Map<string, LedgerEntry>()
  let moves = new Map<string, MoveRec>()
  let openMoves = new Map<string, string>()
  let moveSeq = 0
  let sessionSeq = 0
  let counters: Counters = { totalReservedMib: 0, totalReleasedMib: 0, totalReclaimedMib: 0, reserveFailures: 0 }

  const reset = (next: Limits.Limits = Limits.defaults): void => {
    limits = next
    hosts = new Map()
    index = new PlacementIndex.Index(limits)
    sessions = new Map()
    queue = new Map()
    queueSorted = null
    entries = new Map()
    moves = new Map()
    openMoves = new Map()
    moveSeq = 0
    sessionSeq = 0
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
    h.candidate = { id: h.id, headroom: headroomOf(h), state: h.state, entries: h.entries.size, measured: measuredOf(h) }
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

  // ---- ledger primitives -------------------------------------------------------------------

  // Adds an admitted entry and keeps the host's sums; callers ran Ledger.admit first.
  const addEntry = (e: LedgerEntry): void => {
    const h = hosts.get(e.hostId) as HostRec
    entries.set(e.id, e)
    h.entries.add(e.id)
    h.reserved.memMib += e.memMib
    h.reserved.vcpus += e.vcpus
    counters.totalReservedMib += e.memMib
    refresh(h)
  }
  const removeEntry = (id: string, how: "release" | "reclaim"): LedgerEntry | undefined => {
    const e = entries.get(id)
    if (e === undefined) return undefined
    entries.delete(id)
    const h = hosts.get(e.hostId)
    if (h !== undefined) {
      h.entries.delete(id)
      h.reserved.memMib -= e.memMib
      h.reserved.vcpus -= e.vcpus
      refresh(h)
    }
    if (how === "release") counters.totalReleasedMib += e.memMib
    else counters.totalReclaimedMib += e.memMib
    return e
  }
  const ledgerHostView = (h: HostRec): Ledger.HostView => ({
    measured: h.candidate.measured ?? false,
    headroom: h.candidate.headroom,
    entries: h.entries.size,
  })
  const entryFor = (
    id: string,
    hostId: string,
    ownerKind: LedgerEntry["ownerKind"],
    ownerId: string,
    b: Budget,
    now: number,
  ): LedgerEntry => ({
    id,
    hostId,
    ownerKind,
    ownerId,
    memMib: b.memMib,
    vcpus: b.vcpus,
    vramMib: null,
    createdAt: now,
    lastHeartbeatAt: now,
    expiresAt: null,
    description: null,
  })

  // ---- sessions ----------------------------------------------------------------------------

  const sessionOf = (s: SessionRec): Session => ({
    id: s.id,
    state: s.state,
    budget: s.budget,
    affinity: s.affinity,
    hostId: s.hostId,
    reservationId: s.reservationId,
    queuedAt: s.queuedAt,
    parkedAt: s.parkedAt,
    createdAt: s.createdAt,
    updatedAt: s.updatedAt,
  })
  const findSession = (id: string) => {
    const s = sessions.get(id)
    return s === undefined ? Effect.fail(new NotFound({ entity: "session", id })) : Effect.succeed(s)
  }
  // Every state change goes through core: the operation's own start states, then the life cycle.
  const guard = (s: SessionRec, op: SessionRules.Operation, to: SessionState) => {
    const t = SessionRules.apply(op, s.state, to)
    return t._tag === "Legal"
      ? Effect.void
      : Effect.fail(new IllegalTransition({ sessionId: s.id, from: s.state, to, reason: t.message }))
  }
  const sortedQueue = (): SessionRec[] => {
    if (queueSorted === null) {
      queueSorted = [...queue.values()].sort((a, b) => (a.queuedAt as number) - (b.queuedAt as number) || byId(a, b))
    }
    return queueSorted
  }
  const enqueue = (s: SessionRec, now: number): void => {
    s.state = "queued"
    s.queuedAt = now
    s.hostId = null
    s.reservationId = null
    queue.set(s.id, s)
    queueSorted = null
  }
  const dequeue = (s: SessionRec): void => {
    if (queue.delete(s.id)) queueSorted = null
  }
  // Leaves the host's park and descent sets consistent with the session's state.
  const setState = (s: SessionRec, to: SessionState, now: number): void => {
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h !== undefined) {
      if (s.state === "parked") h.parks.delete(s.id)
      if (s.state === "descending") h.descents.delete(s.id)
    }
    if (s.state === "queued") dequeue(s)
    s.state = to
    s.updatedAt = now
    if (to !== "parked") s.parkedAt = null
    if (h !== undefined) {
      if (to === "parked") {
        s.parkedAt = now
        h.parks.set(s.id, { sessionId: s.id, parkedAt: now, budget: s.budget })
      }
      if (to === "descending") h.descents.add(s.id)
    }
  }
  // Releases whatever reservation the session holds.
  const releaseSessionEntry = (s: SessionRec, how: "release" | "reclaim"): void => {
    if (s.reservationId !== null) removeEntry(s.reservationId, how)
    s.reservationId = null
  }
  // Places a session on the best host now, or answers null. Atomic: pick and reserve in one step.
  const tryPlace = (s: SessionRec, now: number): string | null => {
    const hostId = index.pick({ budget: s.budget, affinity: s.affinity })
    if (hostId === null) return null
    const h = hosts.get(hostId) as HostRec
    const entryId = `session:${s.id}:${++sessionSeq}`
    // Placement picked a host that fits; the ledger's admission is the same rule, checked once more.
    const admission = Ledger.admit(
      { id: entryId, hostId, memMib: s.budget.memMib, vcpus: s.budget.vcpus },
      { duplicate: false, host: ledgerHostView(h) },
      limits,
    )
    if (admission._tag === "Refuse") return null
    addEntry(entryFor(entryId, hostId, "session", s.id, s.budget, now))
    if (s.state === "queued") dequeue(s)
    s.state = "pending"
    s.hostId = hostId
    s.reservationId = entryId
    s.queuedAt = null
    s.updatedAt = now
    return hostId
  }
  const positionOf = (s: SessionRec): number => {
    if (s.state !== "queued") return 0
    return sortedQueue().indexOf(s) + 1
  }
  const noFitFor = (b: Budget, affinity: readonly string[]): NoFitDetail[] =>
    noFitDetails ? Placement.noFit([...candidates()], { budget: b, affinity }, limits) : []
  const outcomeOf = (s: SessionRec): PlaceOutcome =>
    s.hostId !== null
      ? { _tag: "Placed", session: sessionOf(s) }
      : { _tag: "Queued", session: sessionOf(s), position: positionOf(s), noFit: noFitFor(s.budget, s.affinity) }

  // ---- moves -------------------------------------------------------------------------------

  const moveOf = (m: MoveRec): Move => ({ ...m, rounds: [...m.rounds] })
  const findMove = (id: string) => {
    const m = moves.get(id)
    return m === undefined ? Effect.fail(new NotFound({ entity: "move", id })) : Effect.succeed(m)
  }
  const pendingMove = (m: MoveRec) =>
    m.state === "pending" ? Effect.succeed(m) : Effect.fail(new Conflict({ entity: "move", id: m.id, reason: `move is ${m.state}` }))
  // Ends a pending move without committing: drops the target reservation.
  const closeMove = (m: MoveRec, reason: string, now: number, how: "release" | "reclaim", estimateMs: number | null = null): void => {
    removeEntry(m.reservationId, how)
    m.state = "aborted"
    m.abortReason = reason
    m.abortEstimateMs = estimateMs
    m.endedAt = now
    openMoves.delete(m.sessionId)
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
        const t = yield* now
        const h: HostRec = {
          id: input.id,
          labels: { ...(input.labels ?? {}) },
          state: "ready",
          report: null,
          reportedAt: null,
          createdAt: t,
          tokenHash: input.tokenHash ?? null,
          reserved: { memMib: 0, vcpus: 0 },
          entries: new Set(),
          parks: new Map(),
          descents: new Set(),
          candidate: { id: input.id, headroom: { allocatableMib: null, cpuBudget: null, reserved: Headroom.zero } },
        }
        refresh(h)
        hosts.set(h.id, h)
        return hostOf(h)
      }),

    reportHost: (id, report) =>
      Effect.gen(function* () {
        const h = yield* findHost(id)
        const bad = Validate.report(report)
        if (bad) return yield* bad
        h.report = { totalMib: report.totalMib, allocatableMib: report.allocatableMib, totalVcpus: report.totalVcpus }
        h.reportedAt = yield* now
        refresh(h)
        return viewOf(h)
      }),

    setHostState: (id, state) =>
      Effect.gen(function* () {
        const h = yield* findHost(id)
        h.state = state
        refresh(h)
        return viewOf(h)
      }),

    getHost: (id) => Effect.map(findHost(id), viewOf),
    hostTokenHash: (id) => Effect.map(findHost(id), (h) => h.tokenHash),
    hostByTokenHash: (tokenHash) =>
      Effect.sync(() => {
        for (const h of hosts.values()) if (h.tokenHash !== null && h.tokenHash === tokenHash) return hostOf(h)
        return null
      }),
    listHosts: () => Effect.sync(() => [...hosts.values()].sort(byId).map(viewOf)),

    fleetView: () =>
      Effect.gen(function* () {
        const readAt = yield* now
        const fleetHosts: FleetHost[] = [...hosts.values()].sort(byId).map((h) => ({
          ...h.candidate,
          descentsRunning: h.descents.size,
          parks: [...h.parks.values()],
        }))
        const q: Queued[] = sortedQueue().map((s) => ({ sessionId: s.id, budget: s.budget, queuedAt: s.queuedAt as number }))
        return { hosts: fleetHosts, queue: q, readAt } satisfies FleetRead
      }),

    createSession: (input) =>
      Effect.gen(function* () {
        const bad = Validate.sessionInput(input)
        if (bad) return yield* bad
        const existing = sessions.get(input.id)
        if (existing !== undefined) {
          if (existing.budget.memMib !== input.budget.memMib || existing.budget.vcpus !== input.budget.vcpus)
            return yield* new Conflict({ entity: "session", id: input.id, reason: "session exists with another budget" })
          return outcomeOf(existing)
        }
        const t = yield* now
        const s: SessionRec = {
          id: input.id,
          state: "queued",
          budget: { memMib: input.budget.memMib, vcpus: input.budget.vcpus },
          affinity: [...(input.affinity ?? [])],
          hostId: null,
          reservationId: null,
          queuedAt: null,
          parkedAt: null,
          createdAt: t,
          updatedAt: t,
        }
        sessions.set(s.id, s)
        if (tryPlace(s, t) === null) enqueue(s, t)
        return outcomeOf(s)
      }),

    getSession: (id) => Effect.map(findSession(id), sessionOf),

    listSessions: (filter: SessionFilter = {}) =>
      Effect.sync(() =>
        [...sessions.values()]
          .filter((s) => (filter.state === undefined || s.state === filter.state) && (filter.hostId === undefined || s.hostId === filter.hostId))
          .sort((a, b) => a.createdAt - b.createdAt || byId(a, b))
          .map(sessionOf),
      ),

    markRunning: (id) => transitionOnly(id, "markRunning", "running"),
    unpark: (id) => transitionOnly(id, "unpark", "running"),
    beginDescent: (id) => transitionOnly(id, "beginDescent", "descending"),

    // Idle applies only to a running session; the gate's answer picks parked or descending.
    idle: (id, mayPark) => transitionOnly(id, "idle", mayPark ? "parked" : "descending"),

    finishDescent: (id) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        yield* guard(s, "finishDescent", "descended")
        const t = yield* now
        setState(s, "descended", t)
        releaseSessionEntry(s, "release")
        s.hostId = null
        return sessionOf(s)
      }),

    resume: (id) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        yield* guard(s, "resume", "pending")
        const t = yield* now
        if (tryPlace(s, t) === null) enqueue(s, t)
        return outcomeOf(s)
      }),

    endSession: (id) =>
      Effect.gen(function* () {
        const s = yield* findSession(id)
        yield* guard(s, "end", "ended")
        const t = yield* now
        const moveId = openMoves.get(id)
        if (moveId !== undefined) closeMove(moves.get(moveId) as MoveRec, "session ended", t, "release")
        setState(s, "ended", t)
        releaseSessionEntry(s, "release")
        s.hostId = null
        s.queuedAt = null
        return sessionOf(s)
      }),

    listQueue: () => Effect.sync(() => sortedQueue().map(sessionOf)),

    drainQueue: (options = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        const limit = options.limit ?? Number.POSITIVE_INFINITY
        const placed: { sessionId: string; hostId: string }[] = []
        for (const s of [...sortedQueue()]) {
          if (placed.length >= limit) break
          if (s.state !== "queued") continue
          const hostId = tryPlace(s, t)
          if (hostId !== null) placed.push({ sessionId: s.id, hostId })
        }
        return { placed, remaining: queue.size } satisfies DrainResult
      }),

    reserve: (input: ReserveInput) =>
      Effect.gen(function* () {
        const bad = Validate.ownerKind(input.ownerKind) ?? Validate.reserveExtras(input)
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
        const t = yield* now
        const e: LedgerEntry = {
          ...entryFor(input.id as string, input.hostId as string, input.ownerKind, input.ownerId, input, t),
          vramMib: input.vramMib ?? null,
          expiresAt: input.expiresAt ?? null,
          description: input.description ?? null,
        }
        addEntry(e)
        return e
      }),

    release: (id) =>
      Effect.gen(function* () {
        const e = entries.get(id)
        if (e === undefined) return yield* new NotFound({ entity: "reservation", id })
        if (e.ownerKind === "session" || e.ownerKind === "move")
          return yield* new Refused({ check: "owned", reason: `reservation ${id} is held by ${e.ownerKind} ${e.ownerId}: end the session or abort the move` })
        return removeEntry(id, "release") as LedgerEntry
      }),

    heartbeat: (id) =>
      Effect.gen(function* () {
        const e = entries.get(id)
        if (e === undefined) return yield* new NotFound({ entity: "reservation", id })
        const renewed = { ...e, lastHeartbeatAt: yield* now }
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
          if (e.ownerKind === "external") continue
          entries.set(id, { ...e, lastHeartbeatAt: t })
          n++
        }
        return n
      }),

    getReservation: (id) =>
      Effect.suspend(() => {
        const e = entries.get(id)
        return e === undefined ? Effect.fail(new NotFound({ entity: "reservation", id })) : Effect.succeed(e)
      }),

    listReservations: (filter = {}) =>
      Effect.sync(() => {
        const all =
          filter.hostId === undefined
            ? [...entries.values()]
            : [...(hosts.get(filter.hostId)?.entries ?? [])].map((id) => entries.get(id) as LedgerEntry)
        return all.sort(byId)
      }),

    reclaim: () =>
      Effect.gen(function* () {
        const t = yield* now
        const doomed = Ledger.reclaimable(entries.values(), t, limits).sort(byId)
        const reclaimed: LedgerEntry[] = []
        const lost: string[] = []
        for (const e of doomed) {
          if (!entries.has(e.id)) continue // already removed with its session or move
          if (e.ownerKind === "session") {
            const s = sessions.get(e.ownerId)
            if (s !== undefined && s.reservationId === e.id) {
              const moveId = openMoves.get(s.id)
              if (moveId !== undefined) {
                // The move's target entry goes with it: reclaimed if it is itself stale, else released.
                const m = moves.get(moveId) as MoveRec
                const target = entries.get(m.reservationId)
                const stale = target !== undefined && Ledger.isReclaimable(target, t, limits)
                closeMove(m, "session lost: its reservation was reclaimed", t, stale ? "reclaim" : "release")
                if (stale) reclaimed.push(target)
              }
              removeEntry(e.id, "reclaim")
              setState(s, "lost", t)
              s.reservationId = null
              s.hostId = null
              lost.push(s.id)
              reclaimed.push(e)
              continue
            }
          }
          if (e.ownerKind === "move") {
            const m = moves.get(e.ownerId)
            if (m !== undefined && m.state === "pending") {
              closeMove(m, "move target's reservation was reclaimed", t, "reclaim")
              const s = sessions.get(m.sessionId)
              if (s !== undefined && s.state === "moving") setState(s, "running", t)
              reclaimed.push(e)
              continue
            }
          }
          removeEntry(e.id, "reclaim")
          reclaimed.push(e)
        }
        return { reclaimed: reclaimed.sort(byId), lostSessions: lost.sort() } satisfies ReclaimResult
      }),

    hostSummary: (hostId) =>
      Effect.gen(function* () {
        const h = yield* findHost(hostId)
        return summaryOf(h, yield* now)
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
        const open = openMoves.get(s.id)
        if (open !== undefined) return yield* new Conflict({ entity: "move", id: open, reason: `session ${s.id} already has an open move` })
        yield* guard(s, "beginMove", "moving")
        const bad = Validate.maxDowntimeMs(input.maxDowntimeMs)
        if (bad) return yield* bad
        const source = s.hostId as string
        let targetId: string
        if (input.targetHostId !== undefined) {
          if (input.targetHostId === source)
            return yield* new InvalidInput({ field: "targetHostId", rule: "must differ from the source host" })
          const target = yield* findHost(input.targetHostId)
          if (!Placement.fitsOn(target.candidate, s.budget, limits))
            return yield* new Refused({ check: "no_fit", reason: `host ${target.id} cannot take the session: ${Placement.reasonFor(target.candidate, s.budget, limits)}` })
          targetId = target.id
        } else {
          const others = [...hosts.values()].filter((h) => h.id !== source).map((h) => h.candidate)
          const picked = Placement.pick(others, { budget: s.budget, affinity: s.affinity }, limits)
          if (picked === null) return yield* new Refused({ check: "no_fit", reason: `no host other than ${source} can take the session` })
          targetId = picked
        }
        const t = yield* now
        const moveId = `${s.id}:move:${++moveSeq}`
        const reservationId = `move:${moveId}`
        addEntry(entryFor(reservationId, targetId, "move", moveId, s.budget, t))
        const m: MoveRec = {
          id: moveId,
          sessionId: s.id,
          sourceHostId: source,
          targetHostId: targetId,
          reservationId,
          maxDowntimeMs: input.maxDowntimeMs,
          state: "pending",
          rounds: [],
          phases: null,
          abortReason: null,
          abortEstimateMs: null,
          createdAt: t,
          endedAt: null,
        }
        moves.set(moveId, m)
        openMoves.set(s.id, moveId)
        setState(s, "moving", t)
        return moveOf(m)
      }),

    recordRound: (moveId, round) =>
      Effect.gen(function* () {
        const m = yield* Effect.flatMap(findMove(moveId), pendingMove)
        const bad = Validate.round(round)
        if (bad) return yield* bad
        m.rounds.push({ ...round })
        return moveOf(m)
      }),

    commitMove: (moveId, phases) =>
      Effect.gen(function* () {
        const bad = Validate.phases(phases)
        if (bad) return yield* bad
        const m = yield* Effect.flatMap(findMove(moveId), pendingMove)
        const t = yield* now
        const s = sessions.get(m.sessionId) as SessionRec
        // The target's reservation becomes the session's; the source's is released.
        const target = entries.get(m.reservationId) as LedgerEntry
        entries.set(target.id, { ...target, ownerKind: "session", ownerId: s.id, lastHeartbeatAt: t })
        releaseSessionEntry(s, "release")
        s.hostId = m.targetHostId
        s.reservationId = target.id
        setState(s, "running", t)
        m.state = "committed"
        m.phases = { ...phases }
        m.endedAt = t
        openMoves.delete(s.id)
        return moveOf(m)
      }),

    abortMove: (moveId, reason, options = {}) =>
      Effect.gen(function* () {
        const bad = Validate.text("reason", reason) ?? Validate.estimateMs(options.estimateMs)
        if (bad) return yield* bad
        const m = yield* Effect.flatMap(findMove(moveId), pendingMove)
        if (options.onlyBeforeFinalRound === true && m.rounds.some((r) => r.kind === "final"))
          return yield* new Conflict({ entity: "move", id: m.id, reason: "final round recorded: the pause is spent" })
        const t = yield* now
        closeMove(m, reason, t, "release", options.estimateMs ?? null)
        const s = sessions.get(m.sessionId) as SessionRec
        if (s.state === "moving") setState(s, "running", t)
        return moveOf(m)
      }),

    getMove: (id) => Effect.map(findMove(id), moveOf),
    listMoves: (filter = {}) =>
      Effect.sync(() =>
        [...moves.values()]
          .filter(
            (m) =>
              (filter.state === undefined || m.state === filter.state) &&
              (filter.hostId === undefined || m.sourceHostId === filter.hostId || m.targetHostId === filter.hostId),
          )
          .sort((a, b) => a.createdAt - b.createdAt || byId(a, b))
          .map(moveOf),
      ),
    openMove: (sessionId) =>
      Effect.sync(() => {
        const id = openMoves.get(sessionId)
        return id === undefined ? null : moveOf(moves.get(id) as MoveRec)
      }),
  }

  function transitionOnly(id: string, op: SessionRules.Operation, to: SessionState) {
    return Effect.gen(function* () {
      const s = yield* findSession(id)
      yield* guard(s, op, to)
      setState(s, to, yield* now)
      return sessionOf(s)
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
