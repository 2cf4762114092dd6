/**
 * The reaper (SPEC §4.3) in the coordinator: a thin wrapper of `@engram/reaper`'s shared pass
 * (the one the fleet simulator measures), adding what only the coordinator has: leadership
 * (Leader.ts), metrics, log lines and wake-ups of host agents, each from the pass's events.
 * `reaperPass` is one pass, for the loop and for tests under a TestClock. `reconcile` (reclaim,
 * then drain) runs once at every replica's start-up (`ReconcileAtStart`); with
 * `ENGRAM_RECLAIM_GRACE_MS` above 0 it reclaims only expired reservations, and the passes
 * reclaim stale ones only once the failover grace has passed. `ReactAtOnce` is the
 * immediate reaction to a queued session (`Trigger`), sharing the passes' memory. With
 * `ENGRAM_MAKE_ROOM_MOVES=1` a pass also begins the moves core's `MakeRoom` plans for starving
 * sessions (`makeRoomMoves`); the agents run them like any move. With `ENGRAM_RETENTION_MS` above
 * 0 a pass of the leader also deletes a chunk of the history that ended longer ago (`retention`).
 */
import { MakeRoom, ParkPolicy, Reclaim } from "@engram/core"
import { Reaper, ReaperEvents, ReaperState, Trigger } from "@engram/reaper"
import type { Event, FailureKind } from "@engram/reaper"
import { pruneKinds, Store, storeUnhealthy } from "@engram/store"
import type { DrainResult, ReclaimOptions, ReclaimResult, StoreShape } from "@engram/store"
import { Duration, Effect, Layer, Option, Schedule } from "effect"
import { AdminToken, sameHash } from "./Auth.js"
import { Leader, leaseRetryMs } from "./Leader.js"
import { Metrics } from "./Metrics.js"
import type { MetricsShape } from "./Metrics.js"
import { endedTopics, hostTopic, moveTopic, Notifier, sessionTopic } from "./Notifier.js"
import type { NotifierShape } from "./Notifier.js"
import type { CoordinatorConfig } from "./Config.js"
import { Settings } from "./Settings.js"
import * as Stalls from "./Stalls.js"
import type { Blockers } from "@engram/store-pg"

/** What one pass did (the shared pass's report). */
export type PassReport = Reaper.PassReport

/**
 * The park policy the coordinator runs, core's measured default, before the settings: `parkRule`
 * applies them, and its result is what the reaper yields parks by and the store's idle steps
 * decide by (`Coordinator.ts` hands it to the store).
 */
export const park: ParkPolicy.Rule = ParkPolicy.defaultRule

/**
 * The park policy the reaper runs under the settings: `park` with its reserve's groups
 * (`ENGRAM_RESERVE_GROUPS`), lead per class (`ENGRAM_RESERVE_LEAD_PER_CLASS`) and slow classes'
 * 99 % (`ENGRAM_RESERVE_SLOW_CLASS`, its quantile `ENGRAM_RESERVE_SLOW_CLASS_QUANTILE`) as set,
 * each on by default (core's defaults); 0 turns one off (a slow class then keeps the base
 * quantile's places, `reserveQuantile`, whatever its quantile). The stores are handed the same rule (their idle
 * steps read its name, floor and starvation limit, neither knob), so one policy is in force.
 */
export const parkRule = (config: Pick<CoordinatorConfig, "reserveGroups" | "reserveLeadPerClass" | "reserveSlowClass"> & Partial<Pick<CoordinatorConfig, "reserveSlowClassQuantile">>): ParkPolicy.Rule => ({
  name: park.name,
  options: {
    ...park.options,
    reserveGroups: config.reserveGroups === 1,
    reserveLeadPerClass: config.reserveLeadPerClass === 1,
    reserveSlowClassQuantile: config.reserveSlowClass === 1 ? (config.reserveSlowClassQuantile ?? park.options.reserveSlowClassQuantile) : park.options.reserveQuantile,
  },
})

/**
 * The pass's moves for starving sessions under the settings (`maxPerPass` 0 with `ENGRAM_MAKE_ROOM_MOVES=0`).
 * The costs are core's `MakeRoom.defaultCosts` (1 GiB/s copies, 64 MiB/s dirtied, 5 rounds, 1 s
 * of downtime), each pair's commit allowance the guard's own (learned from its recent commits
 * within `ENGRAM_ALLOWANCE_HORIZON_MS`, else the configured prior); the store knows no guest's
 * resident RAM, so a move is judged on its whole reservation (the most it can copy). The
 * source's guard judges each move again on its measured rounds. A move whose estimated
 * pre-copy runs past half of `ENGRAM_MOVE_TIMEOUT_MS` is never begun. A move no agent has taken
 * past its point of no return within `ENGRAM_MOVE_TIMEOUT_MS` is aborted by a later pass of the
 * same leader, as the API aborts its own. The leader also aborts any pending move twice that old,
 * whoever began it, with make-room moves on or off (`maxPerPass` 0 when off: no move is begun),
 * so an API move whose waiter died with its replica does not stay pending. A session whose move
 * ended aborted is not moved again within `ENGRAM_MAKE_ROOM_COOLDOWN_MS`.
 */
export const makeRoomMoves = (
  config: Pick<CoordinatorConfig, "makeRoomMoves" | "makeRoomMovesPerPass" | "makeRoomCooldownMs" | "moveTimeoutMs" | "allowanceHorizonMs" | "limits">,
): Reaper.MoveOptions => ({
  // A move whose pre-copy would outlast half the timeout is never begun: it would be
  // aborted before its point of no return and planned again after the cooldown.
  costs: { ...MakeRoom.defaultCosts, commitAllowanceMs: config.limits.commitAllowanceMs, maxCopyMs: config.moveTimeoutMs / 2 },
  // Off: no move is begun, but the timeouts' safety net still runs.
  maxPerPass: config.makeRoomMoves === 1 ? config.makeRoomMovesPerPass : 0,
  // As the API's moves: one no agent takes past its point of no return in time is aborted.
  timeoutMs: config.moveTimeoutMs,
  cooldownMs: config.makeRoomCooldownMs,
  // As the assignments hand it to the source's guard (Allowances.ts).
  allowance: { priorMs: config.limits.commitAllowanceMs, horizonMs: config.allowanceHorizonMs },
})

/**
 * The pass's retention under the settings, or none (`ENGRAM_RETENTION_MS=0`): each pass of the
 * leader deletes at most `ENGRAM_RETENTION_PRUNE_LIMIT` rows of each kind of the history that
 * ended `ENGRAM_RETENTION_MS` ago, behind the leader's fence like its other writes.
 */
export const retention = (config: Pick<CoordinatorConfig, "retentionMs" | "retentionPruneLimit">): Reaper.RetentionOptions | undefined =>
  config.retentionMs === 0 ? undefined : { retentionMs: config.retentionMs, limit: config.retentionPruneLimit }

// What the reaper remembers between passes (held hosts, the recent demand for room), per store:
// the loop, passes driven by hand and the immediate reaction on one store share it.
const states = new WeakMap<StoreShape, ReaperState.ReaperState>()
const stateFor = (store: StoreShape): ReaperState.ReaperState => {
  let state = states.get(store)
  if (state === undefined) {
    state = ReaperState.make()
    states.set(store, state)
  }
  return state
}

/**
 * Who a reclaim changed: the hosts of the reservations, their sessions (now lost) and moves; every
 * move it closed, with both its hosts (a lost session's target keeps no reservation, released
 * rather than reclaimed) and its session; and the hosts that held a lost session's descent image
 * (a restore cut short: the image is no longer theirs to keep).
 */
const reclaimedTopics = (r: ReclaimResult): (string | null)[] => [
  ...r.reclaimed.flatMap((x) => [hostTopic(x.hostId), x.ownerKind === "move" ? moveTopic(x.ownerId) : x.ownerKind === "session" ? sessionTopic(x.ownerId) : null]),
  ...r.lostSessions.map(sessionTopic),
  ...r.closedMoves.flatMap((m) => [moveTopic(m.id), hostTopic(m.sourceHostId), hostTopic(m.targetHostId), sessionTopic(m.sessionId)]),
  ...r.imageHostIds.map(hostTopic),
  ...(r.returned ?? []).flatMap((x) => [hostTopic(x.hostId), sessionTopic(x.sessionId)]),
]

/**
 * A reclaim's log line: a warning when it made sessions lost (their guests are gone: an agent
 * stopped heartbeating, or a reservation expired), naming the hosts, else info.
 */
const logReclaimed = (context: string, r: ReclaimResult) => {
  const fields = {
    count: r.reclaimed.length,
    hosts: [...new Set(r.reclaimed.map((x) => x.hostId))].sort(),
    lostSessions: r.lostSessions,
    ...(r.returned === undefined ? {} : { returnedToSource: r.returned.map((x) => `${x.sessionId}@${x.hostId}`) }),
  }
  return r.lostSessions.length > 0 || r.returned !== undefined
    ? Effect.logWarning(`${context}: reclaimed reservations; ${r.lostSessions.length} session${r.lostSessions.length === 1 ? "" : "s"} lost (stale heartbeats or expired reservations)${r.returned === undefined ? "" : `, ${r.returned.length} sent back to the source of the move that brought them (it may hold their paused copy)`}`, fields)
    : Effect.logInfo(`${context}: reclaimed reservations`, fields)
}

/** Who a drain changed: the hosts it placed on and the sessions it placed (one create's or resume's are `Notifier.placedTopics`). */
const drainedTopics = (r: DrainResult): (string | null)[] => r.placed.flatMap((p) => [hostTopic(p.hostId), sessionTopic(p.sessionId)])

/**
 * Where a pass's failed store calls are told: its fleet read, its reclaim and its drain, when the
 * failure says the store is unhealthy (`storeUnhealthy`: not a write refused as fenced, another
 * replica leads; not one that lost to concurrent work on a database that answered, `contended`:
 * a busy fleet's lock waits and lost races would churn leadership, and the next leader meets the
 * same contention). The loop steps down after `ENGRAM_LEADER_STEP_DOWN_PASSES` passes in a row
 * with one (`reaperLoopSteps`).
 */
type StoreFailed = (step: string, reason: string, kind: FailureKind) => void

const storeFailure = (failed: StoreFailed | undefined, step: string, e: { readonly reason: string; readonly kind?: FailureKind }): void => {
  if (failed !== undefined && storeUnhealthy(e)) failed(step, e.reason, e.kind)
}

/** The pass's events as the coordinator's metrics, logs and wake-ups. */
const listen = (metrics: MetricsShape, notifier: NotifierShape, failed?: StoreFailed) =>
  ReaperEvents.layer((e: Event) => {
    switch (e._tag) {
      case "FleetReadFailed":
        if (e.source === "pass") {
          metrics.reaperFleetReadFailures.inc()
          storeFailure(failed, "fleet read", e)
        }
        return Effect.logWarning(`reaper${e.source === "react" ? " (react)" : ""}: fleet read failed; holding every park this pass`, { reason: e.reason, kind: e.kind })
      case "Reclaimed":
        if (e.result.reclaimed.length === 0) return
        metrics.reaperReclaimed.inc(e.result.reclaimed.length)
        metrics.sessionsLost.inc(e.result.lostSessions.length)
        return logReclaimed("reaper", e.result).pipe(Effect.andThen(notifier.notify(...reclaimedTopics(e.result))))
      case "ReclaimFailed":
        storeFailure(failed, "reclaim", e)
        return Effect.logWarning("reaper: reclaim failed", { reason: e.reason, kind: e.kind })
      case "ReclaimHeld":
        // Once per grace: a leadership's first contact with the store, or the first after a gap.
        metrics.reaperReclaimGraces.inc()
        return Effect.logInfo("reaper: no stale reservation is reclaimed (and no session idled) until the hosts have had ENGRAM_RECLAIM_GRACE_MS to heartbeat (a new leadership, or a gap in the leader's reads of the store: it was unreachable, or this process did not run)", {
          until: new Date(e.until).toISOString(),
        })
      case "LifetimesApplied":
        // The sessions' agents are woken: an idle one parks or descends, an ended one stops; an
        // end tells what the API's end tells (`endedTopics`: its image's host, its aborted move's target and waiters).
        return Effect.logInfo("reaper: session lifetimes", {
          idled: e.idled.map((x) => `${x.sessionId}→${x.state}`),
          ttlExpired: e.expired.map((x) => x.sessionId),
        }).pipe(
          Effect.andThen(
            notifier.notify(
              ...e.idled.flatMap((x) => [hostTopic(x.hostId), sessionTopic(x.sessionId)]),
              ...e.expired.flatMap((x) => endedTopics({ id: x.sessionId, hostId: x.hostId, imageHostId: x.imageHostId }, x.openMove)),
            ),
          ),
        )
      case "LifetimesFailed":
        return Effect.logWarning("reaper: lifetime read failed; no session idled or ended this pass", { reason: e.reason, kind: e.kind })
      case "DescentStarted":
        metrics.descents.inc({ reason: e.yield.reason })
        return notifier.notify(hostTopic(e.yield.hostId), sessionTopic(e.yield.sessionId))
      case "DescentLostRace":
        metrics.reaperLostRaces.inc()
        return
      case "DescentFailed":
        return Effect.logWarning("reaper: descent not started, store unavailable", { sessionId: e.yield.sessionId, reason: e.reason })
      case "Drained":
        return drained(metrics, notifier, e.result)
      case "DrainFailed":
        storeFailure(failed, "queue drain", e)
        return Effect.logWarning("queue drain failed", { reason: e.reason, kind: e.kind })
      case "MoveBegun":
        // The source's and the target's agents run it; the session's waiters see it moving.
        metrics.makeRoomMoves.inc({ result: "begun" })
        return Effect.logInfo("reaper: move begun to make room for a starving session", {
          moveId: e.move.id,
          sessionId: e.move.sessionId,
          from: e.move.sourceHostId,
          to: e.move.targetHostId,
        }).pipe(Effect.andThen(notifier.notify(hostTopic(e.move.sourceHostId), hostTopic(e.move.targetHostId), sessionTopic(e.move.sessionId))))
      case "MoveTimedOut":
        // Its target's room is free again (the next pass drains into it); the session runs on at its source.
        if (e.own) metrics.makeRoomMoves.inc({ result: "timeout" })
        return Effect.logWarning(
          e.own
            ? "reaper: a move begun for a starving session timed out before its agents took it up; aborted"
            : "reaper: a pending move twice ENGRAM_MOVE_TIMEOUT_MS old that no agent took up (the replica that began it gone?); aborted",
          { moveId: e.move.id, sessionId: e.move.sessionId, from: e.move.sourceHostId, to: e.move.targetHostId },
        ).pipe(Effect.andThen(notifier.notify(hostTopic(e.move.sourceHostId), hostTopic(e.move.targetHostId), moveTopic(e.move.id), sessionTopic(e.move.sessionId))))
      case "MovesFailed":
        // The pending moves are read every pass (their timeouts run with make-room moves off too).
        return Effect.logWarning("reaper: moves step skipped this pass (pending-move timeouts, moves for starving sessions), store read failed", { reason: e.reason, kind: e.kind })
      case "MoveEnded":
        // A loop of doomed moves shows as begun and aborted rising together.
        metrics.makeRoomMoves.inc({ result: e.move.state === "committed" ? "committed" : "aborted" })
        return e.move.state === "aborted"
          ? Effect.logInfo("reaper: a move begun for a starving session aborted; its session is not moved again within ENGRAM_MAKE_ROOM_COOLDOWN_MS", {
              moveId: e.move.id,
              sessionId: e.move.sessionId,
              to: e.move.targetHostId,
              reason: e.move.abortReason,
            })
          : undefined
      case "MoveNotBegun":
        metrics.makeRoomMoves.inc({ result: e.unavailable ? "unavailable" : "refused" })
        return Effect.logInfo("reaper: planned move not begun", { sessionId: e.planned.sessionId, to: e.planned.toHostId, reason: e.reason })
      case "Pruned": {
        const r = e.result
        if (r.sessions + r.events + r.moves + r.pairs === 0) return
        for (const kind of pruneKinds) if (r[kind] > 0) metrics.reaperPruned.inc({ kind }, r[kind])
        return Effect.logInfo("reaper: pruned history older than ENGRAM_RETENTION_MS", { sessions: r.sessions, events: r.events, moves: r.moves, pairs: r.pairs })
      }
      case "PruneFailed":
        return Effect.logWarning("reaper: history prune failed; the next pass tries again", { reason: e.reason, kind: e.kind })
      case "LeadershipLost":
        return Effect.logWarning("reaper: lost the leader lock mid-pass; the pass stops there", { step: e.step })
      default:
        return
    }
  })

/**
 * What follows a drain, wherever it ran: its placements counted and their hosts' agents woken;
 * a placement the drain decided but did not write (core refused it, or its session or host
 * changed first) is logged and counted, and its session stays queued for the next drain.
 */
const drained = (metrics: MetricsShape, notifier: NotifierShape, result: DrainResult) =>
  Effect.gen(function* () {
    if (result.unapplied.length > 0) {
      metrics.drainUnapplied.inc(result.unapplied.length)
      yield* Effect.logInfo("queue drain: placements not applied; the sessions stay queued", { unapplied: result.unapplied })
    }
    if (result.placed.length === 0) return
    metrics.placements.inc({ outcome: "placed", source: "drain" }, result.placed.length)
    yield* notifier.notify(...drainedTopics(result))
  })

/**
 * Drains the queue into whatever room exists, counts the placements and wakes their hosts'
 * agents. A failure is logged and answers nothing placed: the caller's own change stands. The
 * drain and its notices are one step an interruption (a shutdown's) does not cut: a placement
 * written is always told to its host's agent (held at most by the store call's own bound).
 */
export const drainQueue = Effect.uninterruptible(
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const result = yield* store.drainQueue().pipe(
      Effect.catchTag("Unavailable", (e) =>
        Effect.logWarning("queue drain failed", { reason: e.reason, kind: e.kind }).pipe(Effect.as<DrainResult>({ placed: [], unapplied: [], remaining: -1 })),
      ),
    )
    yield* drained(metrics, notifier, result)
    return result
  }),
)

const nothingReclaimed: ReclaimResult = { reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] }

/**
 * Reclaims every expired or stale reservation (only the expired with `options.stale` false;
 * their sessions become `lost`), counts and logs them and wakes their hosts' agents. A failure
 * is logged and answers nothing reclaimed. The reclaim and its notices are one step a shutdown
 * does not cut (as `drainQueue`).
 */
const reclaimNow = (context: string, options?: ReclaimOptions) =>
  Effect.uninterruptible(Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const reclaim = yield* store.reclaim(options).pipe(
      Effect.catchTag("Unavailable", (e) =>
        Effect.logWarning(`${context}: reclaim failed`, { reason: e.reason }).pipe(
          Effect.as(nothingReclaimed),
        ),
      ),
    )
    if (reclaim.reclaimed.length > 0) {
      metrics.reaperReclaimed.inc(reclaim.reclaimed.length)
      metrics.sessionsLost.inc(reclaim.lostSessions.length)
      yield* logReclaimed(context, reclaim)
      yield* notifier.notify(...reclaimedTopics(reclaim))
    }
    return reclaim
  }))

/** What the start-up reconcile did. */
export interface ReconcileReport {
  readonly reclaimed: number
  readonly lostSessions: readonly string[]
  readonly placed: readonly { readonly sessionId: string; readonly hostId: string }[]
}

/**
 * The start-up reconcile (SPEC §3: "`reconcile` is the same pass, run at start-up"): reclaim
 * what expired or went stale while no coordinator ran, then drain the queue into the room that
 * freed. Every replica runs it once when it starts, leader or not: reclaim and drain are
 * transactional and idempotent in the store, so replicas starting together cannot
 * double-count. Never fails: a store failure is logged, and the reaper's passes catch up.
 *
 * With the failover grace on (`ENGRAM_RECLAIM_GRACE_MS` above 0, the default) it reclaims only
 * expired reservations (past their own `expiresAt`, over whatever the outage did): while no
 * coordinator ran no host could heartbeat, so every reservation may look stale; the leader's
 * passes reclaim the stale ones once the grace has passed (the drain still runs).
 */
export const reconcile: Effect.Effect<ReconcileReport, never, Store | Metrics | Notifier> = Effect.gen(function* () {
  const settings = yield* Effect.serviceOption(Settings)
  const graceMs = Option.isSome(settings) ? settings.value.config.reclaimGraceMs : 0
  if (graceMs > 0)
    yield* Effect.logInfo("reconcile: no stale reservation reclaimed at start-up (expired ones are); the leader's passes reclaim stale ones after ENGRAM_RECLAIM_GRACE_MS", { graceMs })
  const reclaim = yield* reclaimNow("reconcile", graceMs > 0 ? { stale: false } : undefined)
  const drained = yield* drainQueue
  if (drained.placed.length > 0) yield* Effect.logInfo("reconcile: placed queued sessions", { placed: drained.placed })
  return { reclaimed: reclaim.reclaimed.length, lostSessions: reclaim.lostSessions, placed: drained.placed }
}).pipe(Effect.withLogSpan("reconcile"))

/** Whether this replica leads: the Leader in context, or always without one. */
const leadingNow = Effect.map(Effect.serviceOption(Leader), (leader) => () => Option.isNone(leader) || leader.value.isLeader())

/**
 * The fence of the leader's writes (its epoch; none without a Leader, or on a single process),
 * asked by each pass and each reaction as it starts (`Reaper.Options.fence`).
 */
const fenceNow = Effect.map(Effect.serviceOption(Leader), (leader) => (Option.isNone(leader) ? undefined : () => leader.value.fence()))

/**
 * The park policy of the passes and the immediate reaction: `parkRule` of the `Settings` in
 * context, `park` without. The fleet signal counts its queue without room by the same rule's
 * starvation limit (`Fleet.snapshot`: a host claimed for a starving session is no room).
 */
export const ruleNow = Effect.map(Effect.serviceOption(Settings), (settings) => (Option.isSome(settings) ? parkRule(settings.value.config) : park))

/**
 * One reaper pass (`@engram/reaper`'s). Never fails: a store failure ends the pass (and is logged
 * and counted). Its moves for starving sessions and its failover grace (`ENGRAM_RECLAIM_GRACE_MS`)
 * follow the `Settings` in context (neither without).
 */
export const reaperPass: Effect.Effect<PassReport, never, Store | Metrics | Notifier> = Effect.suspend(() => judgedPass(undefined))

/** One pass (`reaperPass`), its failed store calls told to `failed` as they happen. */
const judgedPass = (failed: StoreFailed | undefined): Effect.Effect<PassReport, never, Store | Metrics | Notifier> => Effect.gen(function* () {
  const store = yield* Store
  const metrics = yield* Metrics
  const notifier = yield* Notifier
  const settings = yield* Effect.serviceOption(Settings)
  const leading = yield* leadingNow
  const fence = yield* fenceNow
  const moves = Option.isSome(settings) ? makeRoomMoves(settings.value.config) : undefined
  const kept = Option.isSome(settings) ? retention(settings.value.config) : undefined
  const t0 = performance.now()
  const reclaimGraceMs = Option.isSome(settings) ? settings.value.config.reclaimGraceMs : undefined
  const rule = yield* ruleNow
  // A gap in the leader's contacts with the store restarts the grace: a third of the stale window, at least two passes.
  const reclaimGapMs = Reclaim.graceGapMs(store.limits().heartbeatStaleWindowMs, store.limits().reaperIntervalMs)
  // Every write of the pass carries the leader's epoch (`fence`): refused in its transaction once a newer leader exists.
  const report = yield* Reaper.pass({ policy: rule.name, policyOptions: rule.options, leading, fence, state: stateFor(store), moves, retention: kept, reclaimGraceMs, reclaimGapMs }).pipe(
    Effect.provide(listen(metrics, notifier, failed)),
  )
  if (report._tag === "Done" && report.descents.length > 0) yield* Effect.logInfo("reaper: parks yield", { yields: report.descents })
  metrics.reaperPasses.inc({ result: report._tag === "Held" ? "held" : "ok" })
  metrics.observePassSeconds((performance.now() - t0) / 1000)
  return report
}).pipe(Effect.withLogSpan("reaper"))

/**
 * The immediate reaction: `Trigger.poke` after a session queues without room runs
 * the gate within one coalescing window, on the leader only, with the passes' memory. Handlers
 * get the `Trigger` from context and call `poke` after every `Queued` outcome.
 */
export const ReactAtOnce: Layer.Layer<Trigger, never, Store | Metrics | Notifier> = Layer.unwrap(
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const leading = yield* leadingNow
    const fence = yield* fenceNow
    const rule = yield* ruleNow
    // A reaction's descents carry the leader's epoch as a pass's do: a leader that thaws after a takeover starts none.
    return Trigger.layer({ policy: rule.name, policyOptions: rule.options, leading, fence, state: stateFor(store) }).pipe(Layer.provide(listen(metrics, notifier)))
  }),
)

/**
 * Runs `reconcile` once while the coordinator starts, before the server takes requests (also
 * with the reaper loop off, and on a replica that does not lead).
 */
export const ReconcileAtStart: Layer.Layer<never, never, Store | Metrics | Notifier> = Layer.effectDiscard(
  reconcile.pipe(
    Effect.catchCause((cause) => Effect.logError("reconcile at start-up failed", cause)),
    Effect.withTracerEnabled(false),
  ),
)

/** The error logged when the leader's admin token differs from this replica's: what to do, never a token. */
export const adminTokenMismatchMessage =
  "this replica's admin token differs from the one the leader (the reaper's lease holder) was started with: " +
  "each refuses the other's admin token ('invalid bearer token') and forwarded creates fail. Start every replica on this database with the same ENGRAM_ADMIN_TOKEN. " +
  "If you are rotating it, this clears once every replica runs the new one"

/**
 * Compares the leader's admin token fingerprint, as the lease last showed it, with this
 * replica's (constant time): an error when they start to differ (once per leader's
 * fingerprint), an info line when they agree again. Unknown (no leader seen, PGlite): nothing.
 */
const adminTokenCheck = (own: string) => {
  let reported: string | null = null
  return (leaders: string | null): Effect.Effect<void> => {
    if (leaders === null || leaders === reported) return Effect.void
    if (sameHash(leaders, own)) {
      const was = reported
      reported = null
      return was === null ? Effect.void : Effect.logInfo("this replica's admin token now matches the leader's")
    }
    reported = leaders
    return Effect.logError(adminTokenMismatchMessage)
  }
}

/** A replica's clock this far from the database's (ms) is warned about (`clockSkewCheck`). */
export const clockSkewWarnMs = 5_000

/**
 * Warns once when this replica's clock is `clockSkewWarnMs` or more from the database's (as the
 * lease measured it), and says so again once it is back within half of that. The store stamps
 * and judges its times on the database's clock (store-pg's `databaseTime`), so heartbeats are
 * judged alike whichever replica an agent reaches; what stays on this replica's own clock is its
 * logs' and traces' times, and an agent of its own that compares times with the coordinator's.
 */
export const clockSkewCheck = () => {
  let warned = false
  return (skewMs: number | null): Effect.Effect<void> => {
    if (skewMs === null) return Effect.void
    const off = Math.abs(skewMs)
    if (!warned && off >= clockSkewWarnMs) {
      warned = true
      return Effect.logWarning(
        `this replica's clock is ${(off / 1000).toFixed(1)} s ${skewMs > 0 ? "behind" : "ahead of"} the database's: the store's times (heartbeats, reports, sessions) follow the database's clock, ` +
          "but this replica's logs and traces carry its own. Keep every replica's clock synchronized (NTP)",
        { clockSkewMs: Math.round(skewMs) },
      )
    }
    if (warned && off < clockSkewWarnMs / 2) {
      warned = false
      return Effect.logInfo("this replica's clock agrees with the database's again", { clockSkewMs: Math.round(skewMs) })
    }
    return Effect.void
  }
}

/**
 * What the reaper loop repeats (`ReaperLoop`), apart so tests can run each step by hand under a
 * TestClock: `lease` takes, renews or watches the lease (every `leaseRetryMs`), `pass` runs one
 * pass while this replica leads (every `reaperIntervalMs`).
 *
 * A leader whose passes find its store failing (the fleet read, the reclaim or the drain failed;
 * `ENGRAM_LEADER_STEP_DOWN_PASSES` passes in a row) gives the lease up (`Leadership.stepDown`):
 * its store's pool may be wedged (a dead socket, saturated) while the lease's own connection
 * still renews, and it would otherwise stay the leader and placer while nothing is reclaimed,
 * drained, gated or timed out fleet-wide. Another replica takes the lease at its next check. The
 * replica that stepped down takes part again (`standAgain`) once a store read of its own (the
 * ledger's metrics, as readiness reads) succeeds at one of its next passes' times. Failures that
 * only say the store is busy (`contended`: lock waits, lost races) do not count, nor do failures
 * of the database every replica shares (`sharedFailure`): writes refused for its full disk
 * (`disk_full`), and calls that timed out while the database, answering, shows this replica's
 * statements waiting on it (`Stalls.stalledForEveryReplica`: a lock an operator or a migration
 * holds, statements that run long). Another leader would meet the same, and each hand-over would
 * restart the failover grace.
 *
 * A replica that does not lead reads its store likewise at its passes' times, and one whose reads
 * fail as many times in a row stands aside (takes no lease) until a read succeeds: a candidate
 * that cannot reach the store would only take the lease to step down again (`standAside`).
 */
export const reaperLoopSteps: Effect.Effect<
  { readonly lease: Effect.Effect<void>; readonly pass: Effect.Effect<void> },
  never,
  Store | Metrics | Notifier | Leader | Settings | AdminToken
> = Effect.gen(function* () {
  const settings = yield* Settings
  const store = yield* Store
  const leader = yield* Leader
  const metrics = yield* Metrics
  const tokenCheck = adminTokenCheck((yield* AdminToken).fingerprint)
  const skewCheck = clockSkewCheck()
  const context = yield* Effect.context<Store | Metrics | Notifier | Settings | Leader>()
  const stepDownPasses = settings.config.leaderStepDownPasses
  const stalls = Option.getOrElse(yield* Effect.serviceOption(Stalls.Stalls), () => Stalls.none)
  /**
   * Whether failures (their kinds) are the database's own, which every replica shares, not this
   * replica's: each one a write refused for the database's full disk (`disk_full`), or timed out
   * while the database answers a diagnosis read since the calls began (`since`: the one the
   * timed-out calls made while they waited, shared) showing this replica's statements on it. No
   * diagnosis (PGlite, a custom store), a database that does not answer, or another kind of
   * failure (a lost connection, a read-only standby this replica's connection reached): not.
   */
  const sharedFailure = (kinds: readonly FailureKind[], since: Effect.Effect<Blockers.Diagnosis | null>): Effect.Effect<boolean> => {
    if (kinds.length === 0 || !kinds.every((k) => k === "timed_out" || k === "disk_full")) return Effect.succeed(false)
    return kinds.includes("timed_out") ? Effect.map(since, Stalls.stalledForEveryReplica) : Effect.succeed(true)
  }
  let wasLeader = false
  const lease = Effect.gen(function* () {
    const leading = yield* leader.tick
    yield* tokenCheck(leader.leaderAdminTokenHash?.() ?? null)
    metrics.reaperLeader.set(leading ? 1 : 0)
    metrics.leaseUnrenewed.set((leader.unrenewedMs?.() ?? 0) / 1000)
    const skewMs = leader.clockSkewMs?.() ?? null
    metrics.clockSkew.set((skewMs ?? 0) / 1000)
    yield* skewCheck(skewMs)
    metrics.reaperLeaderChecks.inc()
    if (leading !== wasLeader) {
      wasLeader = leading
      // Moves may have aborted under another leader meanwhile: the next moves step reads them;
      // and the failover grace starts again at the next pass.
      if (leading) ReaperState.relead(stateFor(store))
      yield* Effect.logInfo(leading ? "reaper: this replica is the leader" : "reaper: this replica is not the leader", { fence: leader.fence() })
    }
  }).pipe(Effect.catchCause((cause) => Effect.logError("reaper: lease check failed", cause)))

  /** Leading passes in a row whose store calls failed, and the last failure seen. */
  let failedPasses = 0
  let lastFailure: { step: string; reason: string } | null = null
  /** Set when this replica stepped down or stood aside, until a store read of its own succeeds. */
  let steppedDown = false
  const standAgain = Effect.gen(function* () {
    const read = yield* Effect.result(store.metrics())
    if (read._tag === "Failure") return
    steppedDown = false
    leader.standAgain?.()
    yield* Effect.logInfo("reaper: this replica's store answers again; it may take the reaper's lease again (when no other replica holds it)")
  })
  /**
   * A replica that does not lead reads its store at each of its passes' times (the ledger's
   * metrics, as readiness does): one whose reads say the store is unhealthy
   * `ENGRAM_LEADER_STEP_DOWN_PASSES` times in a row stands aside (`Leadership.stepDown`: it holds
   * nothing, so it only stops taking the lease) until a read succeeds (`standAgain`). Else, while
   * every replica's store fails, the lease went from each one to the next as each stepped down,
   * every change restarting the failover grace.
   */
  let asideFails = 0
  const standAside = Effect.gen(function* () {
    // Not with step-downs off (0), and not while this replica holds the lease's epoch past its
    // renew deadline: it renews once the database answers (the lease's own rule); giving the
    // epoch up for a blip would hand leadership over and restart the failover grace.
    if (leader.stepDown === undefined || stepDownPasses === 0 || leader.holds?.() === true) {
      asideFails = 0
      return
    }
    const since = stalls.diagnoseSince()
    const read = yield* Effect.result(store.metrics())
    if (read._tag === "Success" || !storeUnhealthy(read.failure) || (read.failure._tag === "Unavailable" && (yield* sharedFailure([read.failure.kind], since)))) {
      asideFails = 0
      return
    }
    // As many failed reads in a row as a leader's failed passes before it steps down.
    if (++asideFails < stepDownPasses) return
    asideFails = 0
    steppedDown = true
    yield* Effect.logWarning(
      "reaper: this replica's store read failed; it takes no reaper's lease until a store read of its own succeeds (a leader that cannot reach the store would reclaim, drain and gate nothing)",
      { reason: read.failure.reason },
    )
    yield* leader.stepDown
  })
  const pass = Effect.gen(function* () {
    if (steppedDown) return yield* standAgain
    // Acting is judged now, not at the last renewal: a leader past its renew deadline stops.
    if (!leader.isLeader()) {
      failedPasses = 0
      return yield* standAside
    }
    const kinds: FailureKind[] = []
    const since = stalls.diagnoseSince()
    yield* judgedPass((step, reason, kind) => {
      kinds.push(kind)
      lastFailure = { step, reason }
    }).pipe(Effect.provideContext(context))
    // A pass whose failures are all contention or the shared database's own (`sharedFailure`)
    // ends the streak as a pass without failure does: its database answered this replica (a lock
    // wait past lock_timeout, a full disk's refusal, statements of it seen waiting there), so its
    // pool is not the one wedged.
    failedPasses = kinds.length > 0 && !(yield* sharedFailure(kinds, since)) ? failedPasses + 1 : 0
    if (stepDownPasses === 0 || failedPasses < stepDownPasses || leader.stepDown === undefined || !leader.isLeader()) return
    failedPasses = 0
    steppedDown = true
    metrics.reaperStepDowns.inc()
    yield* Effect.logWarning(
      `reaper: giving the reaper's lease up: ${stepDownPasses} passes in a row found this replica's store failing (ENGRAM_LEADER_STEP_DOWN_PASSES) while its lease still renewed; ` +
        "another replica that reaches the store takes over. This replica takes part again once its own store read succeeds. Check its database connections (pool wedged or saturated?)",
      { passes: stepDownPasses, step: lastFailure?.step ?? null, reason: lastFailure?.reason ?? null, fence: leader.fence() },
    )
    yield* leader.stepDown
  }).pipe(Effect.catchCause((cause) => Effect.logError("reaper: pass failed", cause)))
  return { lease, pass }
})

/**
 * The reaper loop: the lease renewed (or watched) every `leaseRetryMs`, and every
 * `reaperIntervalMs` one pass while this replica leads (`reaperLoopSteps`). The two loops are
 * apart so that a long pass never delays a renewal. Lives as long as the layer.
 */
export const ReaperLoop: Layer.Layer<never, never, Store | Metrics | Notifier | Leader | Settings | AdminToken> = Layer.effectDiscard(
  Effect.gen(function* () {
    const { config } = yield* Settings
    const { lease, pass } = yield* reaperLoopSteps
    yield* lease
    // A pass every few seconds is not a trace worth sending (Tracing.ts): the loops make no spans.
    yield* Effect.forkScoped(
      lease.pipe(
        Effect.withTracerEnabled(false),
        Effect.repeat(Schedule.spaced(Duration.millis(leaseRetryMs({ leaseDurationMs: config.leaseDurationMs, renewDeadlineMs: config.leaseRenewDeadlineMs })))),
      ),
    )
    yield* Effect.forkScoped(pass.pipe(Effect.withTracerEnabled(false), Effect.repeat(Schedule.spaced(Duration.millis(config.limits.reaperIntervalMs)))))
  }),
)
