/**
 * The reaper pass (SPEC §4.3), once, for every app: the coordinator runs it on its store under
 * leader election, the fleet simulator runs it on `@engram/store-sim` under a simulated clock,
 * so the simulator measures what production runs.
 *
 * One pass: read the fleet once (a failed read ends the pass and holds every park); sample the
 * recent demand for room; reclaim expired and stale reservations (only the expired while the
 * failover grace holds: `Options.reclaimGraceMs`, core's `Reclaim.Grace`) (when that frees room, read
 * the fleet again: the gate decides on the fleet after the reclaim); run the park policy (a
 * parameter; `ParkPolicy.defaultName` by default) over that read; start a descent for each
 * yield (a CAS `parked → descending`; a lost race is skipped); drain the queue. Leadership is
 * checked between steps through an injected predicate: a replica that loses the lock stops at
 * once. Each step is told to `ReaperEvents` as it happens (metrics, logs, wake-ups).
 *
 * With `moves` set, a fifth step after the drain: room made by moving running sessions off the
 * hosts held for starving sessions (core's `MakeRoom.forHolds` decides; each move begun through
 * `Store.beginMove`, as the API's, so the agents run it and the guard judges it like any move).
 * A session whose move ended aborted is not moved again within the cooldown.
 *
 * With `retention` set, a last step: one bounded chunk of the history that ended more than
 * `retentionMs` ago is deleted (`Store.pruneHistory`, the cutoff on the store's time, `nowOf`), so the store's
 * tables stop growing with the fleet's age; a backlog goes a chunk a pass. After a chunk that
 * deleted nothing the step waits `idleIntervalMs` (on the same time) before it prunes again, so an
 * idle fleet runs no write transaction a pass for it.
 *
 * `react` is the gate alone, run at once when a session queues without room (SPEC §12 / issue
 * "react at once"): read, decide, descend; `Trigger` coalesces the calls.
 *
 * Each write and the event that tells it are one step an interruption does not cut
 * (`committing`): a pass interrupted by a shutdown stops at its next step, never between a commit
 * and its notices.
 */
import { Downtime, Lifetime, MakeRoom, Move as MoveRecord, ParkPolicy, Placement, Reclaim } from "@engram/core"
import type { Limits, ParkGate, SessionState } from "@engram/core"
import { CurrentFence, nowOf, pruneKinds, Store } from "@engram/store"
import type { EndResult, Fence, FleetRead, Move, PruneResult, Session, StoreError, StoreShape } from "@engram/store"
import { Effect } from "effect"
import type { Result } from "effect"
import { ReaperEvents } from "./ReaperEvents.js"
import type { Event, FailureKind, Source } from "./ReaperEvents.js"
import * as ReaperState from "./ReaperState.js"

/** How a pass decides and whom it asks whether it still leads. */
export interface Options {
  /** The park policy, by name or as a function; `ParkPolicy.defaultName` when missing. */
  readonly policy?: ParkPolicy.Name | ParkPolicy.Policy | undefined
  /** The policy's knobs; `ParkPolicy.defaultOptions` when missing. */
  readonly policyOptions?: ParkPolicy.Options | undefined
  /** Whether this replica still leads; asked between steps. Missing: it always leads. */
  readonly leading?: (() => boolean) | undefined
  /**
   * The fence of this replica's writes now (its lease's epoch; null while it does not lead, or
   * always on one process, which needs none): `Leadership`'s `fence`. A pass or a reaction takes
   * it once as it starts and carries it on every write (`CurrentFence`), so a store refuses them
   * once a newer leader exists; and it goes on only while `leading` holds under that same fence
   * (a deadline that passed and a renewal since do not let a run that began unfenced write).
   * Missing: the `CurrentFence` in context is left as it is.
   */
  readonly fence?: (() => Fence | null) | undefined
  /**
   * What the reaper remembers between passes (holds for starving sessions, the recent demand).
   * Missing: a fresh memory for this call only (no holds kept, no reserve of free room).
   */
  readonly state?: ReaperState.ReaperState | undefined
  /** Moves for starving sessions after the drain (`MakeRoom.forHolds`); missing: no moves. */
  readonly moves?: MoveOptions | undefined
  /** The history the pass deletes once it is old enough (`Store.pruneHistory`); missing: none (the simulator). */
  readonly retention?: RetentionOptions | undefined
  /**
   * The failover grace (ms; as Nomad's `failover_heartbeat_ttl`): the reclaim step takes only
   * expired reservations (`Store.reclaim({ stale: false })`), and the idle step of lifetimes is
   * skipped (activity could not land either), until the reaper has reached the store as leader
   * this long without a gap (core's `Reclaim.Grace`): counted from the first pass of a leadership
   * (a fresh `state`, or `ReaperState.relead`) and again from a contact with the store (any store
   * call of a pass that succeeds) more than `reclaimGapMs` after the last one, or from the check
   * before the stale reclaim or at a pass's end when that long passed since the last contact
   * (failed reads, a frozen or suspended process, a call that hung, a clock step); so a fleet
   * whose hosts could not heartbeat while the coordinator side was down is not reclaimed whole.
   * Missing or 0: no grace (the simulator).
   */
  readonly reclaimGraceMs?: number | undefined
  /** The longest time between two contacts with the store that is not a gap; missing: core's `Reclaim.graceGapMs` of the store's stale window. */
  readonly reclaimGapMs?: number | undefined
}

/**
 * How long the store keeps history, and how much a pass deletes. Pick `retentionMs` longer than
 * every window history is still read in: the allowance horizon, the make-room cooldown, a
 * client's retry of a create by id (a pruned session's id makes a new session).
 */
export interface RetentionOptions {
  /** History that ended at least this long ago (ms, an integer > 0) is deleted. */
  readonly retentionMs: number
  /** At most this many rows of each kind a pass (`PruneRequest.limit`). */
  readonly limit: number
  /**
   * After a prune that deleted nothing, the passes skip the step until this long (ms) has passed
   * on the store's time (`nowOf`: the Effect Clock's unless the store keeps its own); a prune that deleted anything is followed by one the next pass. Default
   * `idleRetentionIntervalMs`; 0: every pass.
   */
  readonly idleIntervalMs?: number | undefined
}

/** How long the retention step waits after a prune that deleted nothing (ms): a minute. */
export const idleRetentionIntervalMs = 60_000

/** How a pass moves running sessions to make room for starving ones. */
export interface MoveOptions {
  /** What a move costs (`MakeRoom.Costs`); its `maxDowntimeMs` is each begun move's downtime budget. */
  readonly costs: MakeRoom.Costs
  /** At most this many moves begun in one pass; 0: none (only the timeouts below are enforced). */
  readonly maxPerPass: number
  /**
   * The RAM a running session's guest touches (what its move copies). Missing: its
   * reservation's RAM, the most a move of it can copy.
   */
  readonly residentMib?: ((session: Session) => number) | undefined
  /**
   * A move the pass began that no agent has taken past its point of no return (its intent or
   * final round) this long after it began is aborted (reason `timeout`), as the API aborts its
   * own on `ENGRAM_MOVE_TIMEOUT_MS`: the session runs on at its source and can idle again. Any
   * pending move twice this old, whoever began it (a replica that died, an API waiter gone with
   * its process), is aborted the same way. Missing: never (the simulator, whose moves always end).
   */
  readonly timeoutMs?: number | undefined
  /**
   * How long a move that ended aborted (refused by its source's guard, timed out) keeps its
   * session from being moved again, to any target (core's `MakeRoom.cooling`). Missing:
   * `MakeRoom.defaultCooldownMs`.
   */
  readonly cooldownMs?: number | undefined
  /**
   * The guard's allowance policy (its prior and horizon): with it, a pass plans each move on its
   * host pair's learned commit allowance (`Downtime.pairAllowance` over one bounded
   * `Store.listAllowanceCommits` read per held host), so a pair whose allowance alone passes the
   * budget takes no move. Missing: `costs.commitAllowanceMs` for every pair (the simulator).
   */
  readonly allowance?: Partial<Downtime.RecencyPolicy> | undefined
}

/** A move a pass began to make room, and the plan it carries out. */
export interface MoveBegun {
  readonly moveId: string
  readonly planned: MakeRoom.Planned
}

/** A placement a drain made. */
export interface Placed {
  readonly sessionId: string
  readonly hostId: string
}

/** A session a lifetime changed: its id, its host before, and the state it is in now. */
export interface LifetimeStep {
  readonly sessionId: string
  readonly hostId: string | null
  readonly state: SessionState
}

/**
 * A session its TTL ended: as a `LifetimeStep` (its host as the end found it), with what else the
 * end changed, as the store's end answered it (`EndResult`): the host holding its descent image
 * (no longer that host's to keep), and, for a session that was moving, the move that was open at
 * the end and aborted by it (its target's agent and the move's waiters are owed a notice).
 */
export interface ExpiredStep extends LifetimeStep {
  readonly imageHostId: string | null
  readonly openMove: { readonly id: string; readonly targetHostId: string } | null
}

/** The `ExpiredStep` of an end, from the store's answer alone. */
const expiredStep = (r: EndResult): ExpiredStep => ({
  sessionId: r.session.id,
  hostId: r.before.hostId,
  state: r.session.state,
  imageHostId: r.before.imageHostId,
  openMove: r.closedMove === null ? null : { id: r.closedMove.id, targetHostId: r.closedMove.targetHostId },
})

/** What one pass did. */
export type PassReport =
  | { readonly _tag: "Held"; readonly reason: string }
  | {
      readonly _tag: "Done"
      readonly reclaimed: number
      readonly lostSessions: readonly string[]
      /**
       * The failover grace held: the reclaim step took only expired reservations, and the idle
       * step of lifetimes was skipped, until this time (the store's time, `nowOf`, ms); null: both ran in full.
       */
      readonly reclaimHeldUntil: number | null
      /** Running sessions made idle for want of activity (each then parked or descended by the park policy). */
      readonly idled: readonly LifetimeStep[]
      /** Sessions ended because their TTL passed. */
      readonly expired: readonly ExpiredStep[]
      readonly yields: readonly ParkPolicy.PolicyYield[]
      /** Yields whose descent started (the others lost a race and were skipped). */
      readonly descents: readonly ParkPolicy.PolicyYield[]
      readonly placed: readonly Placed[]
      readonly withoutRoom: number
      readonly unplaceable: number
      readonly holds: readonly ParkGate.Hold[]
      /** Moves begun to make room for starving sessions (`Options.moves`). */
      readonly moves: readonly MoveBegun[]
      /**
       * What the retention deleted this pass (`Options.retention`); null: no retention, its call
       * failed, or the step waited (`RetentionOptions.idleIntervalMs` after a prune that deleted nothing).
       */
      readonly pruned: PruneResult | null
    }

/** What one immediate reaction did. */
export type ReactReport =
  | { readonly _tag: "Held"; readonly reason: string }
  | {
      readonly _tag: "Done"
      readonly yields: readonly ParkPolicy.PolicyYield[]
      readonly descents: readonly ParkPolicy.PolicyYield[]
      readonly withoutRoom: number
    }

const LOST = "lost the leader lock mid-pass"

/** The abort reason of a move the pass began that timed out (the API's own word for its timeout). */
export const timeoutReason = "timeout"

/** Tells the listener an event; undefined when nobody listens (then nothing is built or run). */
type Tell = ((event: Event) => Effect.Effect<void>) | undefined

/** The listener in context, resolved once per pass (a pass tells several events). */
const listener: Effect.Effect<Tell> = Effect.map(Effect.serviceOption(ReaperEvents), (l) => (l._tag === "Some" ? l.value.emit : undefined))

/**
 * A write of the pass and what it tells, as one step an interruption does not cut (a shutdown's:
 * SIGTERM closes the reaper's scope): a write that committed is always told, so the app's
 * notices for it go out (the coordinator wakes the hosts and waiters it changed), and a write in
 * flight is not abandoned midway (a statement sent may still commit). `after` sees the write's
 * result in the same step (the pass's own books, then its event). Reads stay interruptible: a
 * shutdown stops the pass at the next step, held at most by the write in flight (each store call
 * keeps its own bound in the coordinator).
 */
const committing = <A, E>(write: Effect.Effect<A, E>, after: (r: Result.Result<A, E>) => Effect.Effect<void> | void): Effect.Effect<Result.Result<A, E>> =>
  Effect.uninterruptible(Effect.tap(Effect.result(write), (r) => after(r) ?? Effect.void))

/** The policy function of the options. */
export const policyOf = (options: Options): ParkPolicy.Policy => {
  const p = options.policy ?? ParkPolicy.defaultName
  return typeof p === "string" ? ParkPolicy.policy(p) : p
}

const withPeaks = (rate: ParkPolicy.Recent | undefined, state: ReaperState.ReaperState): ParkPolicy.Recent | undefined =>
  rate === undefined ? undefined : { ...rate, queuedPeaks: state.queuePeaks.peaks() }

/** Runs the policy over the read with what the reaper remembers, and remembers its answer. */
const decideOn = (fleet: FleetRead, limits: Limits.Limits, options: Options, state: ReaperState.ReaperState): ParkPolicy.Decision => {
  const decision = policyOf(options)(fleet, {
    now: fleet.readAt,
    limits,
    options: options.policyOptions ?? ParkPolicy.defaultOptions,
    memory: state.memory,
    recent: withPeaks(state.meter.rate(), state),
  })
  state.memory = { holds: decision.holds }
  return decision
}

/**
 * Starts a descent for each yield, in order, while the replica leads; answers the ones that
 * started, or null when leadership was lost on the way.
 */
const descend = (store: StoreShape, yields: readonly ParkPolicy.PolicyYield[], leading: () => boolean, source: Source, tell: Tell) =>
  Effect.gen(function* () {
    const started: ParkPolicy.PolicyYield[] = []
    for (const y of yields) {
      if (!leading()) {
        if (tell) yield* tell({ _tag: "LeadershipLost", source, step: "descents" })
        return null
      }
      yield* committing(store.beginDescent(y.sessionId), (began) => {
        if (began._tag === "Success") started.push(y)
        if (!tell) return
        if (began._tag === "Success") return tell({ _tag: "DescentStarted", source, yield: y })
        return began.failure._tag === "Unavailable"
          ? tell({ _tag: "DescentFailed", source, yield: y, reason: began.failure.reason })
          : tell({ _tag: "DescentLostRace", source, yield: y })
      })
    }
    return started
  })

/**
 * The lifetime step of a pass: the store's indexed read of what is due (core's `Lifetime`
 * decides), then for each, while this replica leads, the store's own step: `endSession` with
 * the TTL's reason, or `idle`. A session that changed first (a lost race) is skipped; a failed
 * read skips the step. Null: leadership was lost midway. What was written is told however the
 * step ends (done, leadership lost, or a shutdown's interruption between two writes).
 */
const lifetimes = (
  store: StoreShape,
  leading: () => boolean,
  tell: Tell,
  idleToo: Effect.Effect<boolean>,
): Effect.Effect<{ idled: LifetimeStep[]; expired: ExpiredStep[] } | null> =>
  Effect.suspend(() => {
    const idled: LifetimeStep[] = []
    const expired: ExpiredStep[] = []
    const told = Effect.suspend(() => (tell && (idled.length > 0 || expired.length > 0) ? tell({ _tag: "LifetimesApplied", idled, expired }) : Effect.void))
    return Effect.ensuring(lifetimeWrites(store, leading, tell, idleToo, idled, expired), told)
  })

/** The reads and writes of `lifetimes`, each write kept in `idled` or `expired` as one step with it (`committing`). */
const lifetimeWrites = (
  store: StoreShape,
  leading: () => boolean,
  tell: Tell,
  idleToo: Effect.Effect<boolean>,
  idled: LifetimeStep[],
  expired: ExpiredStep[],
): Effect.Effect<{ idled: LifetimeStep[]; expired: ExpiredStep[] } | null> =>
  Effect.gen(function* () {
    const due = yield* Effect.result(store.lifetimesDue())
    if (due._tag === "Failure") {
      if (tell) yield* tell({ _tag: "LifetimesFailed", reason: due.failure.reason, kind: due.failure.kind })
      return { idled, expired }
    }
    for (const s of due.success.expired) {
      if (!leading()) return null
      // What else the end changed (its host, its image's host, the move it aborted) is the store's
      // own answer: a move begun after the due read is still told.
      const ended = yield* committing(store.endSession(s.id, { reason: Lifetime.ttlExpiredReason, onlyIfDue: true }), (r) => {
        if (r._tag === "Success") expired.push(expiredStep(r.success))
      })
      if (ended._tag === "Failure" && ended.failure._tag === "Unavailable") break
    }
    // Not while the failover grace holds: the activity that would keep a busy session running
    // could not land while the coordinator side was down (TTL ends are deadlines: they still run).
    for (const s of (yield* idleToo) ? due.success.idle : []) {
      if (!leading()) return null
      const idle = yield* committing(store.idle(s.id, { onlyIfDue: true }), (r) => {
        if (r._tag === "Success") idled.push({ sessionId: s.id, hostId: s.hostId, state: r.success.state })
      })
      if (idle._tag === "Failure" && idle.failure._tag === "Unavailable") break
    }
    return { idled, expired }
  })

/**
 * `store` with `contact` run after each of its calls that succeeds (the failover grace's
 * contacts with the store); its plain functions (`limits`) as they are.
 */
const withContacts = (store: StoreShape, contact: Effect.Effect<void>): StoreShape =>
  new Proxy(store, {
    get: (target, key, receiver) => {
      const value: unknown = Reflect.get(target, key, receiver)
      if (typeof value !== "function") return value
      return (...args: unknown[]) => {
        const out: unknown = Reflect.apply(value, target, args)
        return Effect.isEffect(out) ? Effect.tap(out, () => contact) : out
      }
    },
  })

/** Why a store call failed: an outage's reason, else the error's words (a bad request names its field). */
const reasonOf = (e: StoreError): string => (e._tag === "Unavailable" ? e.reason : e.message)

/** A failed store call's kind, for a listener to tell contention from an unhealthy store (`storeUnhealthy`). */
const kindOf = (e: StoreError): FailureKind => (e._tag === "Unavailable" ? e.kind : undefined)

/** An aborted move as the cooldown keeps it. */
const abortOf = (m: Move, now: number): MakeRoom.Aborted => ({ sessionId: m.sessionId, targetHostId: m.targetHostId, endedAt: m.endedAt ?? now })

/**
 * The pass's own moves that left pending since the last pass, each read once to learn how it
 * ended (told as `MoveEnded`: a loop of doomed moves shows in the counts); an aborted one
 * cools down. A failed read keeps the move for the next pass.
 */
const settle = (store: StoreShape, state: ReaperState.ReaperState, open: readonly Move[], now: number, tell: Tell) =>
  Effect.gen(function* () {
    const pendingIds = new Set(open.map((m) => m.id))
    for (const id of [...state.moves]) {
      if (pendingIds.has(id)) continue
      const ended = yield* Effect.result(store.getMove(id))
      if (ended._tag === "Failure" && ended.failure._tag === "Unavailable") continue
      state.moves.delete(id)
      if (ended._tag === "Failure") continue
      if (ended.success.state === "aborted") state.aborted.push(abortOf(ended.success, now))
      if (tell) yield* tell({ _tag: "MoveEnded", move: ended.success })
    }
  })

/**
 * The pending moves that timed out (`MoveOptions.timeoutMs`): the pass's own at the timeout, any
 * other at twice it (the leader's safety net for a replica that died with its timeouts), each
 * aborted before its point of no return (the store's conditional abort, as the API's timeout;
 * one past it is left to its source). Answers the moves still pending, or null when leadership
 * was lost.
 */
const timeOut = (store: StoreShape, moves: MoveOptions, state: ReaperState.ReaperState, open: readonly Move[], now: number, leading: () => boolean, tell: Tell) =>
  Effect.gen(function* () {
    const timeoutMs = moves.timeoutMs
    if (timeoutMs === undefined) return open
    const aborted = new Set<string>()
    for (const m of open) {
      const own = state.moves.has(m.id)
      if (now - m.createdAt < (own ? timeoutMs : 2 * timeoutMs) || MoveRecord.pastNoReturn(m)) continue
      if (!leading()) {
        if (tell) yield* tell({ _tag: "LeadershipLost", source: "pass", step: "moves" })
        return null
      }
      yield* committing(store.abortMove(m.id, timeoutReason, { onlyBeforeFinalRound: true }), (abort) => {
        if (abort._tag === "Failure") return
        // Told here, not as it leaves pending: its end is this timeout.
        state.moves.delete(m.id)
        aborted.add(m.id)
        state.aborted.push(abortOf(abort.success, now))
        if (tell) return tell({ _tag: "MoveTimedOut", move: abort.success, own })
      })
    }
    return open.filter((m) => !aborted.has(m.id))
  })

/**
 * The moves step of a pass: the open moves (how the pass's own that left pending ended, then
 * the timed out aborted); when a starving session's host is held, the aborted moves still
 * cooling down (read from the store once per leadership: a new leader does not begin them
 * again), one more fleet read and the running sessions of the holds' hosts moves may serve,
 * then core's `MakeRoom.forHolds`; each planned move is begun while this replica leads. A
 * failed read skips the step (told); a move the store refuses (its session changed, its target
 * filled) is skipped and told. Null: leadership was lost midway.
 */
const makeRoom = (store: StoreShape, moves: MoveOptions, options: Options, state: ReaperState.ReaperState, leading: () => boolean, tell: Tell) =>
  Effect.gen(function* () {
    const begun: MoveBegun[] = []
    const holds = state.memory.holds
    const starving = holds.some((h) => h.reason === "starving")
    if (!starving && state.moves.size === 0 && moves.timeoutMs === undefined) return begun
    const failed = (e: StoreError) => (tell ? tell({ _tag: "MovesFailed", reason: reasonOf(e), kind: kindOf(e) }).pipe(Effect.as(begun)) : Effect.succeed(begun))
    const open = yield* Effect.result(store.listMoves({ state: "pending" }))
    if (open._tag === "Failure") return yield* failed(open.failure)
    // The store's time: moves' starts and ends were stamped on it.
    const now = yield* nowOf(store)
    yield* settle(store, state, open.success, now, tell)
    const pending = yield* timeOut(store, moves, state, open.success, now, leading, tell)
    if (pending === null) return null
    const cooldownMs = moves.cooldownMs ?? MakeRoom.defaultCooldownMs
    // Pruned every pass, starving or not: the aborts only matter within the cooldown.
    state.aborted = MakeRoom.cooling(state.aborted, now, cooldownMs)
    // No move to begin (none starving, or `maxPerPass` 0): the timeouts above were the step.
    if (!starving || moves.maxPerPass <= 0) return begun
    if (!state.abortedRead) {
      // The moves aborted within the cooldown, once per leadership: the store's indexed read of
      // the window (`endedSince`), not every abort it keeps.
      const ended = yield* Effect.result(store.listMoves({ state: "aborted", endedSince: now - cooldownMs }))
      if (ended._tag === "Failure") return yield* failed(ended.failure)
      state.aborted.push(...MakeRoom.cooling(ended.success.map((m) => abortOf(m, now)), now, cooldownMs))
      state.abortedRead = true
    }
    const read = yield* Effect.result(store.fleetView())
    if (read._tag === "Failure") return yield* failed(read.failure)
    const limits = store.limits()
    const movingFrom = new Set(pending.map((m) => m.sourceHostId))
    const running = new Map<string, MakeRoom.Running[]>()
    const allowanceMs = new Map<string, Map<string, number>>()
    for (const hold of MakeRoom.servable(read.success, holds, movingFrom, limits)) {
      const sessions = yield* Effect.result(store.listSessions({ hostId: hold.hostId, state: "running" }))
      if (sessions._tag === "Failure") return yield* failed(sessions.failure)
      running.set(
        hold.hostId,
        sessions.success.map((s) => ({ sessionId: s.id, budget: s.budget, residentMib: moves.residentMib?.(s) ?? s.budget.memMib })),
      )
      const policy = moves.allowance
      if (policy === undefined) continue
      // The guard's own allowance of each pair from this host, as the assignments hand it to the source.
      // Only hosts that take moves can be a target (`MakeRoom` skips the others).
      const targetHostIds = read.success.hosts.filter((h) => h.id !== hold.hostId && Placement.acceptsMoves(h)).map((h) => h.id)
      const recent = yield* Effect.result(store.listAllowanceCommits(Downtime.allowanceCommitsQuery(hold.hostId, targetHostIds, now, policy)))
      if (recent._tag === "Failure") return yield* failed(recent.failure)
      allowanceMs.set(hold.hostId, new Map(targetHostIds.map((t) => [t, Downtime.pairAllowance(recent.success, hold.hostId, t, now, policy).allowanceMs])))
    }
    if (running.size === 0) return begun
    const planned = MakeRoom.forHolds({
      fleet: read.success,
      holds,
      running,
      movingFrom,
      now: read.success.readAt,
      gate: options.policyOptions ?? ParkPolicy.defaultOptions,
      maxMoves: moves.maxPerPass,
      aborted: state.aborted,
      cooldownMs,
      allowanceMs,
      costs: moves.costs,
      limits,
    })
    for (const m of planned) {
      if (!leading()) {
        if (tell) yield* tell({ _tag: "LeadershipLost", source: "pass", step: "moves" })
        return null
      }
      yield* committing(store.beginMove({ sessionId: m.sessionId, targetHostId: m.toHostId, maxDowntimeMs: moves.costs.maxDowntimeMs }), (move) => {
        if (move._tag === "Success") {
          begun.push({ moveId: move.success.id, planned: m })
          state.moves.add(move.success.id)
          if (tell) return tell({ _tag: "MoveBegun", move: move.success, planned: m })
        } else if (tell) {
          const unavailable = move.failure._tag === "Unavailable"
          return tell({ _tag: "MoveNotBegun", planned: m, unavailable, reason: `${move.failure._tag}: ${move.failure.message}` })
        }
      })
    }
    return begun
  })

/**
 * The retention step: `Store.pruneHistory` of what ended `retentionMs` before the store's now, at
 * most `limit` of each kind; told either way. Null when it failed (the next pass tries again).
 */
const prune = (store: StoreShape, retention: RetentionOptions, tell: Tell) =>
  Effect.gen(function* () {
    const now = yield* nowOf(store)
    const done = yield* committing(store.pruneHistory({ endedBefore: Math.max(0, now - retention.retentionMs), limit: retention.limit }), (r) =>
      !tell ? undefined : r._tag === "Failure" ? tell({ _tag: "PruneFailed", reason: reasonOf(r.failure), kind: kindOf(r.failure) }) : tell({ _tag: "Pruned", result: r.success }),
    )
    return done._tag === "Failure" ? null : done.success
  })

// The pass is one generator with the steps inline: it runs every few seconds over the whole
// fleet, and each nested generator or event nobody hears costs allocations there.

/** Whether two fences are the same lease's same epoch (null: none). */
const sameFence = (a: Fence | null, b: Fence | null): boolean =>
  a === b || (a !== null && b !== null && a.name === b.name && a.epoch === b.epoch)

/**
 * One run (a pass or a reaction) under the fence it takes as it starts: `leading` holds only
 * while `options.leading` does and the fence is still that one, and every write carries it.
 */
const underFence = <A, R>(options: Options, run: (leading: () => boolean) => Effect.Effect<A, never, R>): Effect.Effect<A, never, R> =>
  Effect.suspend(() => {
    const leading = options.leading ?? (() => true)
    const current = options.fence
    if (current === undefined) return run(leading)
    const fence = current()
    return Effect.provideService(run(() => leading() && sameFence(current(), fence)), CurrentFence, fence)
  })

/** One reaper pass (SPEC §4.3). Never fails: a store failure ends or skips a step and is told to the listener. */
export const pass = (options: Options = {}): Effect.Effect<PassReport, never, Store> =>
  underFence(options, (leading) => passLeading(options, leading))

const passLeading = (options: Options, leading: () => boolean): Effect.Effect<PassReport, never, Store> =>
  Effect.gen(function* () {
    const inner = yield* Store
    const tell = yield* listener
    const state = options.state ?? ReaperState.make()
    const held = (step: string): Effect.Effect<PassReport> =>
      tell === undefined
        ? Effect.succeed({ _tag: "Held", reason: LOST })
        : tell({ _tag: "LeadershipLost", source: "pass", step }).pipe(Effect.as({ _tag: "Held" as const, reason: LOST }))

    // The failover grace (core's `Reclaim.Grace`): every store call of the pass that succeeds is
    // a contact, and a contact more than the gap after the last one (a freeze, an outage, one call
    // that hung) starts the grace again, told at once, whatever the pass does next.
    const graceMs = options.reclaimGraceMs ?? 0
    const gapMs = options.reclaimGapMs ?? Reclaim.graceGapMs(inner.limits().heartbeatStaleWindowMs)
    const graceTold = (started: boolean): Effect.Effect<void> =>
      started && tell ? tell({ _tag: "ReclaimHeld", until: Reclaim.graceEnds(state.grace, graceMs) as number }) : Effect.void
    // On the store's time (`nowOf`): the clock the heartbeats it judges were stamped on, so a step
    // of it (the database's clock, with store-pg's `databaseTime`) is a gap too.
    const storeNow = nowOf(inner)
    const contact = Effect.flatMap(storeNow, (now) => {
      const after = Reclaim.graceAfterContact(state.grace, now, gapMs)
      state.grace = after.grace
      return graceTold(after.started)
    })
    // A check against the last contact that is no contact (before a stale reclaim, at the pass's end).
    const check = Effect.flatMap(storeNow, (now) => {
      const after = Reclaim.graceCheck(state.grace, now, gapMs)
      state.grace = after.grace
      return Effect.as(graceTold(after.started), now)
    })
    const store = graceMs > 0 ? withContacts(inner, contact) : inner

    // 1. One fleet read. Without it nothing is known, so nothing descends: every park holds.
    const read = yield* Effect.result(store.fleetView())
    if (read._tag === "Failure") {
      // No contact: a failure that lasts makes a gap, which starts the grace again.
      if (tell) yield* tell({ _tag: "FleetReadFailed", source: "pass", reason: read.failure.reason, kind: read.failure.kind })
      return { _tag: "Held", reason: read.failure.reason } satisfies PassReport
    }
    let fleet = read.success
    if (tell) yield* tell({ _tag: "FleetRead", source: "pass", fleet })
    // The recent demand for room, from the store's cumulative counter (a failed read keeps the last rate).
    const counters = yield* Effect.result(store.metrics())
    if (counters._tag === "Success") state.meter.sample(fleet.readAt, counters.success.totalReservedMib)
    state.queuePeaks.sample(fleet.readAt, fleet, (options.policyOptions ?? ParkPolicy.defaultOptions).reserveBurstHoldMs)

    // 2. Reclaim expired and stale reservations (their sessions become lost). While the failover
    // grace holds (core's `Reclaim.Grace`: started at a leadership's first contact or after a
    // gap) only the expired go: hosts that could not heartbeat meanwhile renew first, but
    // an entry past its own `expiresAt` is over whatever the outage did.
    if (!leading()) return yield* held("reclaim")
    let reclaimHeldUntil: number | null = null
    if (graceMs > 0) {
      // The clock again, right before the reclaim: a freeze since the last contact is a gap too.
      const now = yield* check
      if (Reclaim.graceHolds(state.grace, now, graceMs)) reclaimHeldUntil = Reclaim.graceEnds(state.grace, graceMs) ?? now + graceMs
    }
    let reclaimed = 0
    let lostSessions: readonly string[] = []
    const reclaim = yield* committing(store.reclaim(reclaimHeldUntil === null ? undefined : { stale: false }), (r) =>
      !tell ? undefined : r._tag === "Success" ? tell({ _tag: "Reclaimed", result: r.success }) : tell({ _tag: "ReclaimFailed", reason: r.failure.reason, kind: r.failure.kind }),
    )
    if (reclaim._tag === "Success") {
      reclaimed = reclaim.success.reclaimed.length
      lostSessions = reclaim.success.lostSessions
    }

    // 2b. Lifetimes: a TTL that passed ends its session; a running session with no activity for
    // its idle timeout goes idle by the explicit idle step (the park policy parks or descends it).
    // Leadership was asked for the reclaim; each write of this step asks again.
    // The idle step is decided once its read is back: a grace that held the reclaim, or one that
    // began since (a freeze in that read), holds it too.
    const idleToo = Effect.map(storeNow, (now) => reclaimHeldUntil === null && !Reclaim.graceHolds(state.grace, now, graceMs))
    const lives = yield* lifetimes(store, leading, tell, idleToo)
    if (lives === null) return yield* held("lifetimes")

    // A reclaim or a lifetime that changed the fleet: the gate decides on a read taken after it,
    // so no park yields for room just given back. A failed re-read holds every park.
    let gateHeld = false
    if (reclaimed > 0 || lives.idled.length > 0 || lives.expired.length > 0) {
      const again = yield* Effect.result(store.fleetView())
      if (again._tag === "Success") {
        fleet = again.success
        if (tell) yield* tell({ _tag: "FleetRead", source: "pass", fleet })
      } else {
        gateHeld = true
        if (tell) yield* tell({ _tag: "FleetReadFailed", source: "pass", reason: again.failure.reason, kind: again.failure.kind })
      }
    }

    // 3. The policy decides which parks yield; each yield is a CAS parked → descending.
    if (!leading()) return yield* held("gate")
    const decision = gateHeld ? null : decideOn(fleet, store.limits(), options, state)
    if (tell && decision !== null) yield* tell({ _tag: "Decided", source: "pass", decision })
    const yields = decision?.yields ?? []
    const descents = yields.length === 0 ? [] : yield* descend(store, yields, leading, "pass", tell)
    if (descents === null) return { _tag: "Held", reason: LOST } satisfies PassReport

    // 4. Drain the queue into whatever room exists now.
    if (!leading()) return yield* held("drain")
    const drained = yield* committing(store.drainQueue(), (r) =>
      !tell ? undefined : r._tag === "Success" ? tell({ _tag: "Drained", result: r.success }) : tell({ _tag: "DrainFailed", reason: r.failure.reason, kind: r.failure.kind }),
    )
    const placed: readonly Placed[] = drained._tag === "Success" ? drained.success.placed : []

    // 5. Moves for starving sessions whose held host's parks cannot make the room.
    const moves = options.moves === undefined ? [] : yield* makeRoom(store, options.moves, options, state, leading, tell)
    if (moves === null) return { _tag: "Held", reason: LOST } satisfies PassReport

    // 6. Retention: one bounded chunk of the history that ended before the cutoff.
    let pruned: PruneResult | null = null
    if (options.retention !== undefined) {
      if (!leading()) return yield* held("prune")
      const now = yield* storeNow
      if (now >= state.pruneAfter) {
        const done = yield* prune(store, options.retention, tell)
        pruned = done
        // Nothing was due: wait before the next write transaction. Anything deleted (a backlog) or a
        // failed call: the next pass prunes again.
        const idle = done !== null && pruneKinds.every((kind) => done[kind] === 0)
        state.pruneAfter = idle ? now + (options.retention.idleIntervalMs ?? idleRetentionIntervalMs) : 0
      }
    }
    // The pass's end: a freeze after its last store call is a gap too (the next pass's reclaim waits).
    if (graceMs > 0) yield* check
    return {
      _tag: "Done",
      reclaimed,
      lostSessions,
      reclaimHeldUntil,
      idled: lives.idled,
      expired: lives.expired,
      yields,
      descents,
      placed,
      withoutRoom: decision?.withoutRoom ?? 0,
      unplaceable: decision?.unplaceable ?? 0,
      holds: decision?.holds ?? state.memory.holds,
      moves,
      pruned,
    } satisfies PassReport
  })

/**
 * The gate at once, between passes: read the fleet, run the policy, start the descents it
 * asks for. For a session that just queued without room, so its descent starts now rather than
 * at the next pass. Only the leader reacts (others answer `Held`); never fails.
 */
export const react = (options: Options = {}): Effect.Effect<ReactReport, never, Store> =>
  underFence(options, (leading) => reactLeading(options, leading))

const reactLeading = (options: Options, leading: () => boolean): Effect.Effect<ReactReport, never, Store> =>
  Effect.gen(function* () {
    if (!leading()) return { _tag: "Held", reason: "not the leader" } satisfies ReactReport
    const store = yield* Store
    const tell = yield* listener
    const state = options.state ?? ReaperState.make()
    const read = yield* Effect.result(store.fleetView())
    if (read._tag === "Failure") {
      if (tell) yield* tell({ _tag: "FleetReadFailed", source: "react", reason: read.failure.reason, kind: read.failure.kind })
      return { _tag: "Held", reason: read.failure.reason } satisfies ReactReport
    }
    if (tell) yield* tell({ _tag: "FleetRead", source: "react", fleet: read.success })
    if (!leading()) return { _tag: "Held", reason: LOST } satisfies ReactReport
    const decision = decideOn(read.success, store.limits(), options, state)
    if (tell) yield* tell({ _tag: "Decided", source: "react", decision })
    const descents = decision.yields.length === 0 ? [] : yield* descend(store, decision.yields, leading, "react", tell)
    if (descents === null) return { _tag: "Held", reason: LOST } satisfies ReactReport
    return { _tag: "Done", yields: decision.yields, descents, withoutRoom: decision.withoutRoom } satisfies ReactReport
  })
