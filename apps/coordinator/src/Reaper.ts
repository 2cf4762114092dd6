/**
 * The reaper (SPEC §4.3): one fleet read per pass (a failed read ends the pass and holds
 * every park), reclaim, the park gate (core `ParkGate.evaluate`), a descent for each yield
 * (a lost CAS is skipped), then a queue drain. Only the leader runs it (Leader.ts).
 * `reaperPass` is one pass, for the loop and for tests under a TestClock. `reconcile` (reclaim,
 * then drain) runs once at every replica's start-up (`ReconcileAtStart`).
 */
import { ParkGate } from "@engram/core"
import type { Yield } from "@engram/core"
import { Store } from "@engram/store"
import { Clock, Duration, Effect, Layer, Option, Schedule } from "effect"
import { Leader } from "./Leader.js"
import { Metrics } from "./Metrics.js"
import { hostTopic, Notifier } from "./Notifier.js"
import { Settings } from "./Settings.js"

/** What one pass did. */
export type PassReport =
  | { readonly _tag: "Held"; readonly reason: string }
  | {
      readonly _tag: "Done"
      readonly reclaimed: number
      readonly lostSessions: readonly string[]
      readonly yields: readonly Yield[]
      /** Yields whose descent started (the others lost a race and were skipped). */
      readonly descents: readonly Yield[]
      readonly placed: readonly { readonly sessionId: string; readonly hostId: string }[]
      readonly withoutRoom: number
    }

/**
 * Drains the queue into whatever room exists, counts the placements and wakes their hosts'
 * agents. A failure is logged and answers nothing placed: the caller's own change stands.
 */
export const drainQueue = Effect.gen(function* () {
  const store = yield* Store
  const metrics = yield* Metrics
  const notifier = yield* Notifier
  const result = yield* store.drainQueue().pipe(
    Effect.catchTag("Unavailable", (e) =>
      Effect.logWarning("queue drain failed", { reason: e.reason }).pipe(Effect.as({ placed: [], remaining: -1 })),
    ),
  )
  if (result.placed.length > 0) {
    metrics.inc("engram_placements_total", { outcome: "placed", source: "drain" }, result.placed.length)
    yield* notifier.notify(...result.placed.map((p) => hostTopic(p.hostId)))
  }
  return result
})

/**
 * Reclaims every expired or stale reservation (their sessions become `lost`), counts and logs
 * them and wakes their hosts' agents. A failure is logged and answers nothing reclaimed.
 */
const reclaimNow = (context: string) =>
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const reclaim = yield* store.reclaim().pipe(
      Effect.catchTag("Unavailable", (e) =>
        Effect.logWarning(`${context}: reclaim failed`, { reason: e.reason }).pipe(
          Effect.as({ reclaimed: [], lostSessions: [] as readonly string[] }),
        ),
      ),
    )
    if (reclaim.reclaimed.length > 0) {
      metrics.inc("engram_reaper_reclaimed_total", {}, reclaim.reclaimed.length)
      yield* Effect.logInfo(`${context}: reclaimed reservations`, { count: reclaim.reclaimed.length, lostSessions: reclaim.lostSessions })
      yield* notifier.notify(...reclaim.reclaimed.map((r) => hostTopic(r.hostId)))
    }
    return reclaim
  })

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
 */
export const reconcile: Effect.Effect<ReconcileReport, never, Store | Metrics | Notifier> = Effect.gen(function* () {
  const reclaim = yield* reclaimNow("reconcile")
  const drained = yield* drainQueue
  if (drained.placed.length > 0) yield* Effect.logInfo("reconcile: placed queued sessions", { placed: drained.placed })
  return { reclaimed: reclaim.reclaimed.length, lostSessions: reclaim.lostSessions, placed: drained.placed }
}).pipe(Effect.withLogSpan("reconcile"))

/** One reaper pass. Never fails: a store failure ends the pass (and is logged and counted). */
export const reaperPass: Effect.Effect<PassReport, never, Store | Metrics | Notifier> = Effect.gen(function* () {
  const store = yield* Store
  const metrics = yield* Metrics
  const notifier = yield* Notifier
  const startedAt = yield* Clock.currentTimeMillis
  const t0 = performance.now()
  const finish = (report: PassReport) =>
    Effect.sync(() => {
      metrics.inc("engram_reaper_passes_total", { result: report._tag === "Held" ? "held" : "ok" })
      metrics.observePassSeconds((performance.now() - t0) / 1000)
      return report
    })

  // 1. One fleet read. Without it nothing is known, so nothing descends: every park holds.
  const read = yield* Effect.result(store.fleetView())
  if (read._tag === "Failure") {
    metrics.inc("engram_reaper_fleet_read_failures_total")
    yield* Effect.logWarning("reaper: fleet read failed; holding every park this pass", { reason: read.failure.reason })
    return yield* finish({ _tag: "Held", reason: read.failure.reason })
  }
  const fleet = read.success
  const limits = store.limits()

  // 2. Reclaim expired and stale reservations (their sessions become lost).
  const reclaim = yield* reclaimNow("reaper")

  // 3. The gate decides which parks yield; each yield is a CAS parked → descending.
  const decision = ParkGate.evaluate(fleet, fleet.readAt ?? startedAt, limits)
  const descents: Yield[] = []
  // SPEC §4.3: a replica that loses the lock stops reaping at once, also within a pass (the
  // lock's connection may drop while the pass runs). Without a Leader in context, it leads.
  const leader = yield* Effect.serviceOption(Leader)
  const leading = () => Option.isNone(leader) || leader.value.isLeader()
  for (const y of decision.yields) {
    if (!leading()) {
      yield* Effect.logWarning("reaper: lost the leader lock mid-pass; no further descents")
      return yield* finish({ _tag: "Held", reason: "lost the leader lock mid-pass" })
    }
    const began = yield* Effect.result(store.beginDescent(y.sessionId))
    if (began._tag === "Success") {
      descents.push(y)
      metrics.inc("engram_descents_total", { reason: y.reason })
      yield* notifier.notify(hostTopic(y.hostId))
    } else if (began.failure._tag === "Unavailable") {
      yield* Effect.logWarning("reaper: descent not started, store unavailable", { sessionId: y.sessionId, reason: began.failure.reason })
    } else {
      metrics.inc("engram_reaper_lost_races_total")
    }
  }
  if (descents.length > 0) yield* Effect.logInfo("reaper: parks yield", { yields: descents })

  // 4. Drain the queue into whatever room exists now.
  if (!leading()) return yield* finish({ _tag: "Held", reason: "lost the leader lock mid-pass" })
  const drained = yield* drainQueue
  return yield* finish({
    _tag: "Done",
    reclaimed: reclaim.reclaimed.length,
    lostSessions: reclaim.lostSessions,
    yields: decision.yields,
    descents,
    placed: drained.placed,
    withoutRoom: decision.withoutRoom,
  })
}).pipe(Effect.withLogSpan("reaper"))

/**
 * Runs `reconcile` once while the coordinator starts, before the server takes requests (also
 * with the reaper loop off, and on a replica that does not lead).
 */
export const ReconcileAtStart: Layer.Layer<never, never, Store | Metrics | Notifier> = Layer.effectDiscard(
  reconcile.pipe(Effect.catchCause((cause) => Effect.logError("reconcile at start-up failed", cause))),
)

/**
 * The reaper loop: every `reaperIntervalMs`, take (or confirm) leadership and, when leading,
 * run one pass. Lives as long as the layer.
 */
export const ReaperLoop: Layer.Layer<never, never, Store | Metrics | Notifier | Leader | Settings> = Layer.effectDiscard(
  Effect.gen(function* () {
    const settings = yield* Settings
    const leader = yield* Leader
    const metrics = yield* Metrics
    let wasLeader = false
    const tick = Effect.gen(function* () {
      const leading = yield* leader.tick
      metrics.set("engram_reaper_leader", leading ? 1 : 0)
      if (leading !== wasLeader) {
        wasLeader = leading
        yield* Effect.logInfo(leading ? "reaper: this replica is the leader" : "reaper: this replica is not the leader")
      }
      if (leading) yield* reaperPass
    }).pipe(Effect.catchCause((cause) => Effect.logError("reaper: pass failed", cause)))
    yield* Effect.forkScoped(tick.pipe(Effect.repeat(Schedule.spaced(Duration.millis(settings.config.limits.reaperIntervalMs)))))
  }),
)
