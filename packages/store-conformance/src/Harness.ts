/**
 * The harness of the conformance suite: what a case is, the prelude every case runs (clock at
 * 0, store reset with the case's limits), and the helpers cases share (fixtures, failure
 * assertions, a whole-store snapshot for "nothing changed", and the store-wide invariants).
 */
import { Headroom, Limits, Order, Session } from "@engram/core"
import type { Budget, Ledger, Move } from "@engram/core"
import { Store, StoreTesting } from "@engram/store"
import type { HostView, MovePhases, Page, PageRequest, Reservation, StoreError, StoreShape, Unavailable } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect, Result } from "effect"
import type { Scope } from "effect"
import { TestClock } from "effect/testing"

/** The services a case runs with. */
export type Env = Store | StoreTesting

/** What a case body may need: the store, its reset, and the scope of `it.effect`. */
export type CaseEffect = Effect.Effect<void, unknown, Env | Scope.Scope>

/** One named case: a behaviour, the limits it runs with, and the body that pins it. */
export interface Case {
  readonly name: string
  readonly limits: Limits.Limits
  readonly run: CaseEffect
  /**
   * Its timeout as a multiple of the suite's `timeoutMs` (1 when absent): a case of many
   * statements (hundreds of reads) gets room on a loaded machine without raising every case's.
   */
  readonly timeoutFactor?: number
}

/** A named group of cases: one `describe` block sharing one store. */
export interface Group {
  readonly name: string
  readonly cases: readonly Case[]
}

/** Builds the limits of a case from overrides of the defaults; a bad override is a bug in the suite. */
export const limitsOf = (overrides: Partial<Limits.Limits> = {}): Limits.Limits => {
  const made = Limits.make(overrides)
  if (made._tag === "Invalid") throw new Error(`conformance: bad limits ${JSON.stringify(made.issues)}`)
  return made.limits
}

/** Declares a case. */
export const kase = (name: string, run: CaseEffect, overrides: Partial<Limits.Limits> = {}, options: { readonly timeoutFactor?: number } = {}): Case => ({
  name,
  limits: limitsOf(overrides),
  run,
  ...(options.timeoutFactor === undefined ? {} : { timeoutFactor: options.timeoutFactor }),
})

/** The prelude of every case: the TestClock back at 0, the store empty with the case's limits. */
export const prelude = (limits: Limits.Limits): Effect.Effect<void, unknown, Env> =>
  Effect.gen(function* () {
    yield* TestClock.setTime(0)
    const testing = yield* StoreTesting
    yield* testing.reset(limits)
  })

/** Every item of a paged list, page after page, as a client reads it. */
export const allPages = <A, E>(page: (request: PageRequest) => Effect.Effect<Page<A>, E>): Effect.Effect<A[], E> =>
  Effect.gen(function* () {
    const out: A[] = []
    let cursor: string | undefined
    do {
      const p = yield* page(cursor === undefined ? { limit: 1000 } : { limit: 1000, cursor })
      out.push(...p.items)
      cursor = p.nextCursor ?? undefined
    } while (cursor !== undefined)
    return out
  })

/** Every host with its room, by id. */
export const hostsNow = (s: StoreShape) => allPages((p) => s.pageHosts(p))

/** Every reservation (of one host), by id. */
export const reservationsNow = (s: StoreShape, filter: { readonly hostId?: string | undefined } = {}) => allPages((p) => s.pageReservations(filter, p))

/** The queued sessions, first in first out. */
export const queueNow = (s: StoreShape) => Effect.map(allPages((p) => s.pageQueue(p)), (entries) => entries.map((e) => e.session))

/** One host's ledger summary, from the cluster's; fails the case for a host the summary does not list. */
export const hostSummaryOf = (s: StoreShape, hostId: string): Effect.Effect<Ledger.HostSummary, Unavailable> =>
  Effect.map(s.clusterSummary(), (c) => c.hosts.find((h) => h.hostId === hostId) ?? expect.fail(`the cluster summary lists no host ${hostId}`))

/** The store of the current case. */
export const store: Effect.Effect<StoreShape, never, Store> = Effect.service(Store)

/** Fails the case unless `self` fails with the tagged error `tag`; answers that error. */
export const expectFailure = <A, E extends { readonly _tag: string }, R, T extends E["_tag"]>(
  self: Effect.Effect<A, E, R>,
  tag: T,
): Effect.Effect<Extract<E, { readonly _tag: T }>, never, R> =>
  Effect.map(Effect.result(self), (result) => {
    if (Result.isSuccess(result)) {
      return expect.fail(`expected a ${tag} failure, got success: ${JSON.stringify(result.success)}`)
    }
    expect(result.failure._tag, `error: ${JSON.stringify(result.failure)}`).toBe(tag)
    return result.failure as Extract<E, { readonly _tag: T }>
  })

/** A host report whose RAM capacity (after the system reserve and ratio 1.0) is `capacityMib`. */
export const reportFor = (
  capacityMib: number | null,
  totalVcpus: number | null,
  limits: Limits.Limits = Limits.defaults,
): { totalMib: number | null; allocatableMib: number | null; totalVcpus: number | null } => {
  const allocatableMib = capacityMib === null ? null : capacityMib + limits.systemReserveMib
  return { totalMib: allocatableMib, allocatableMib, totalVcpus }
}

/** The peer URL `addHost`'s hosts advertise (one per host, as agents do): each takes moves (`Candidate.takesMoves`). */
export const peerUrlOf = (id: string): string => `http://peers.test:7100/${encodeURIComponent(id)}`

/**
 * Registers a host and reports it: so that its RAM capacity under the default limits is
 * `capacityMib` and its CPU budget `4 × totalVcpus`; without `capacityMib` (or with null) it
 * reports no RAM figure (an unmeasured host, which takes placements but ranks last). A host
 * only takes placements after its first report (SPEC §12); `registered` leaves it unreported.
 * Its report advertises a peer URL (`peerUrlOf`), as a fleet that moves does: it takes moves.
 */
export const addHost = (
  id: string,
  capacityMib?: number | null,
  totalVcpus: number | null = 8,
): Effect.Effect<HostView, unknown, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    yield* s.registerHost({ id })
    const peerUrl = peerUrlOf(id)
    if (capacityMib === undefined || capacityMib === null)
      return yield* s.reportHost(id, { totalMib: null, allocatableMib: null, totalVcpus: capacityMib === undefined ? null : totalVcpus, peerUrl })
    return yield* s.reportHost(id, { ...reportFor(capacityMib, totalVcpus, s.limits()), peerUrl })
  })

/**
 * Every reported host reports again, the same figures (as its agent does every report interval):
 * after the clock moved past the stale window, a host that did not report since is silent and
 * takes no placements (`Placement.isSilent`); this brings them all back.
 */
export const reportAll: Effect.Effect<void, unknown, Store> = Effect.gen(function* () {
  const s = yield* store
  for (const h of yield* hostsNow(s)) if (h.report !== null) yield* s.reportHost(h.id, { ...h.report, peerUrl: h.peerUrl })
})

/** Registers a host and leaves it unreported: it takes no placement until its first report. */
export const registered = (id: string): Effect.Effect<HostView, unknown, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    yield* s.registerHost({ id })
    return yield* s.getHost(id)
  })

/** Creates a session and fails the case unless it was placed; answers the session. */
export const placed = (id: string, budget: Budget, affinity?: readonly string[]): Effect.Effect<Session.Record, unknown, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    const outcome = yield* s.createSession(affinity === undefined ? { id, budget } : { id, budget, affinity })
    expect(outcome._tag, `${id} should be placed`).toBe("Placed")
    return outcome.session
  })

/** Creates a session and fails the case unless it was queued; answers the outcome. */
export const queued = (id: string, budget: Budget) =>
  Effect.gen(function* () {
    const s = yield* store
    const outcome = yield* s.createSession({ id, budget })
    if (outcome._tag !== "Queued") return expect.fail(`${id} should be queued, was placed on ${String(outcome.session.hostId)}`)
    return outcome
  })

/**
 * Idles a running session and fails the case unless it parked: what the store's default park
 * policy does on a measured host while no queued session is without room.
 */
export const parkedNow = (id: string): Effect.Effect<Session.Record, unknown, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    const after = yield* s.idle(id)
    expect(after.state, `${id} should park (a measured host, no queued session without room)`).toBe("parked")
    return after
  })

/** Creates a session, places it and walks it to `state` through the interface. */
export const sessionIn = (
  id: string,
  state: Session.State,
  budget?: Budget,
): Effect.Effect<Session.Record, unknown, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    // Unless told otherwise a queued session asks for more than any measured host has.
    if (state === "queued") return (yield* queued(id, budget ?? { memMib: 2 ** 40, vcpus: 1 })).session
    budget ??= { memMib: 1024, vcpus: 1 }
    yield* placed(id, budget)
    if (state === "pending") return yield* s.getSession(id)
    if (state === "ended") return (yield* s.endSession(id)).session
    yield* s.markRunning(id)
    switch (state) {
      case "running":
        return yield* s.getSession(id)
      case "parked":
        return yield* parkedNow(id)
      case "descending":
        // Parked, then yielded: reached the same way whatever waits in the queue.
        yield* parkedNow(id)
        return yield* s.beginDescent(id)
      case "descended":
        yield* parkedNow(id)
        yield* s.beginDescent(id)
        return yield* s.finishDescent(id)
      case "moving": {
        yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
        return yield* s.getSession(id)
      }
      case "lost": {
        // Let its reservation go stale, renewing everything else's; then reclaim.
        const own = (yield* s.getSession(id)).reservationId as string
        const start = (yield* s.getReservation(own)).lastHeartbeatAt
        const window = s.limits().heartbeatStaleWindowMs
        yield* TestClock.setTime(start + window + 1)
        for (const r of yield* reservationsNow(s)) if (r.id !== own) yield* s.heartbeat(r.id)
        // The agents report as they do every interval: their hosts are not silent.
        yield* reportAll
        yield* s.reclaim()
        return yield* s.getSession(id)
      }
    }
  })

/** The final round of a move: what a commit needs recorded (SPEC §5, §12). */
export const finalRound = { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 } as const

/** Records a move's final round, then commits it with `phases`: the source agent's last two calls. */
export const commitAfterFinal = (moveId: string, phases: MovePhases): Effect.Effect<Move.Record, StoreError, Store> =>
  Effect.gen(function* () {
    const s = yield* store
    yield* s.recordRound(moveId, finalRound)
    return yield* s.commitMove(moveId, phases)
  })

/** Everything a store shows, for "a failed operation changes nothing" (metrics apart). */
export const snapshot = Effect.gen(function* () {
  const s = yield* store
  return {
    hosts: yield* hostsNow(s),
    sessions: yield* s.listSessions(),
    reservations: yield* reservationsNow(s),
    queue: yield* queueNow(s),
  }
})

/** Fails the case unless the store shows exactly what `before` showed. */
export const expectUnchanged = (before: Effect.Success<typeof snapshot>, what: string) =>
  Effect.map(snapshot, (after) => expect(after, `${what} changed the store`).toStrictEqual(before))

const sortedIds = (xs: readonly { readonly id: string }[]): string[] => xs.map((x) => x.id)

/** The store-wide invariants of SPEC §1–§3 as seen through the interface. Answers a list of violations. */
export const violations = (previous?: ReadonlyMap<string, Budget>) =>
  Effect.gen(function* () {
    const s = yield* store
    const out: string[] = []
    const hosts = yield* hostsNow(s)
    const sessions = yield* s.listSessions()
    const reservations = yield* reservationsNow(s)
    const queue = yield* queueNow(s)
    const byId = new Map<string, Reservation>(reservations.map((r) => [r.id, r]))
    const sessionsById = new Map<string, Session.Record>(sessions.map((x) => [x.id, x]))

    const sorted = [...hosts].map((h) => h.id).sort()
    if (JSON.stringify(sorted) !== JSON.stringify(sortedIds(hosts))) out.push("the hosts page is not sorted by id")
    const rsorted = [...reservations].map((r) => r.id).sort()
    if (JSON.stringify(rsorted) !== JSON.stringify(sortedIds(reservations))) out.push("the reservations page is not sorted by id")

    for (const h of hosts) {
      const mine = reservations.filter((r) => r.hostId === h.id)
      const sum = mine.reduce((acc, r) => Headroom.add(acc, { memMib: r.memMib, vcpus: r.vcpus }), Headroom.zero)
      if (h.headroom.reserved.memMib !== sum.memMib || h.headroom.reserved.vcpus !== sum.vcpus)
        out.push(`host ${h.id}: headroom.reserved ${JSON.stringify(h.headroom.reserved)} != Σ entries ${JSON.stringify(sum)}`)
      if (h.entries !== mine.length) out.push(`host ${h.id}: entries ${h.entries} != ${mine.length} reservations`)
      const before = previous?.get(h.id) ?? Headroom.zero
      // Reserved beyond capacity is legal only when no step added to it (a smaller report can shrink capacity).
      if (Headroom.gatesRam(h.headroom) && sum.memMib > (h.headroom.allocatableMib as number) && sum.memMib > before.memMib)
        out.push(`host ${h.id}: RAM over-committed: reserved=${sum.memMib} > capacity=${String(h.headroom.allocatableMib)}`)
      if (Headroom.gatesCpu(h.headroom) && sum.vcpus > (h.headroom.cpuBudget as number) && sum.vcpus > before.vcpus)
        out.push(`host ${h.id}: vCPUs over-committed: reserved=${sum.vcpus} > cpuBudget=${String(h.headroom.cpuBudget)}`)
      if (mine.length > s.limits().maxEntriesPerNode)
        out.push(`host ${h.id}: ${mine.length} entries > maxEntriesPerNode`)
    }

    for (const x of sessions) {
      const owned = reservations.filter((r) => r.ownerKind === "session" && r.ownerId === x.id)
      if (Session.holdsReservation(x.state)) {
        if (owned.length !== 1) out.push(`session ${x.id} (${x.state}) holds ${owned.length} session reservations`)
        const r = x.reservationId === null ? undefined : byId.get(x.reservationId)
        if (r === undefined) out.push(`session ${x.id} (${x.state}): reservationId ${String(x.reservationId)} is not in the ledger`)
        else {
          if (r.ownerKind !== "session" || r.ownerId !== x.id) out.push(`session ${x.id}: reservation ${r.id} is owned by ${r.ownerKind}:${r.ownerId}`)
          if (r.hostId !== x.hostId) out.push(`session ${x.id}: on ${String(x.hostId)} but its reservation is on ${r.hostId}`)
          if (r.memMib !== x.budget.memMib || r.vcpus !== x.budget.vcpus) out.push(`session ${x.id}: reservation budget differs`)
        }
      } else {
        if (owned.length !== 0) out.push(`session ${x.id} (${x.state}) still owns ${owned.length} reservations`)
        if (x.state === "queued" && (x.hostId !== null || x.reservationId !== null))
          out.push(`queued session ${x.id} has hostId/reservationId set`)
      }
      const open = yield* s.openMove(x.id)
      if (x.state === "moving" && open === null) out.push(`moving session ${x.id} has no open move`)
      if (x.state !== "moving" && open !== null) out.push(`session ${x.id} (${x.state}) has open move ${open.id}`)
    }

    for (const r of reservations) {
      if (r.ownerKind === "session") {
        const owner = sessionsById.get(r.ownerId)
        if (owner === undefined || owner.reservationId !== r.id)
          out.push(`reservation ${r.id} is owned by session ${r.ownerId} which does not hold it`)
      } else if (r.ownerKind === "move") {
        const move = yield* Effect.result(s.getMove(r.ownerId))
        if (Result.isFailure(move)) out.push(`reservation ${r.id} is owned by unknown move ${r.ownerId}`)
        else if (move.success.state !== "pending" || move.success.reservationId !== r.id || move.success.targetHostId !== r.hostId)
          out.push(`reservation ${r.id} is owned by move ${r.ownerId} (${move.success.state}) which does not hold it`)
      }
    }

    const expectedQueue = sessions
      .filter((x) => x.state === "queued")
      .sort((a, b) => (a.queuedAt as number) - (b.queuedAt as number) || Order.byId(a, b))
      .map((x) => x.id)
    if (JSON.stringify(expectedQueue) !== JSON.stringify(queue.map((x) => x.id)))
      out.push(`queue ${JSON.stringify(queue.map((x) => x.id))} != queued sessions by queuedAt ${JSON.stringify(expectedQueue)}`)

    const reservedByHost = new Map<string, Budget>(hosts.map((h) => [h.id, h.headroom.reserved]))
    return { violations: out, reservedByHost }
  })

/** Fails the case if any invariant is broken. */
export const expectInvariants = Effect.flatMap(violations(), ({ violations: v }) =>
  Effect.sync(() => expect(v, "store invariants").toStrictEqual([])),
)
