/**
 * The coordinator's metrics as effect `Metric`s in a registry of its own (two coordinators in
 * one process count apart), rendered by `effect/observability`'s `PrometheusMetrics` at
 * `GET /metrics`: this replica's counters (placements, descents, moves, reaper passes, HTTP
 * requests by route and status), the store's gauges set at scrape time (the same on every
 * replica), and process metrics read at scrape time. Each metric is a typed handle (`Counter`
 * with the types of its labels, `Gauge`) made once, here, with its name and help: callers
 * never spell a metric's name.
 */
import type { ParkPolicy } from "@engram/core"
import { liveStates } from "@engram/store"
import type { SessionCounts } from "@engram/store"
import { Context, Effect, Layer, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { readdirSync } from "node:fs"
import { monitorEventLoopDelay } from "node:perf_hooks"

type Labels = Readonly<Record<string, string>>

/** A counter with labels `L` (none when `L` is empty): its series are made on first use. */
export interface Counter<L extends Labels = Record<never, string>> {
  readonly name: string
  /** Adds `by` (default 1) to the series of `labels`. */
  readonly inc: keyof L extends never ? (by?: number) => void : (labels: L, by?: number) => void
  /** The series' count (tests). */
  readonly get: keyof L extends never ? () => number : (labels: L) => number
}

/** A gauge without labels. */
export interface Gauge {
  readonly name: string
  readonly set: (value: number) => void
  readonly get: () => number
}

/** The store's gauges: set at every scrape, dropped when the store cannot be read. */
export const storeGauges = [
  "engram_queue_length",
  "engram_queue_without_room",
  "engram_parks",
  "engram_descents_running",
  "engram_hosts",
  "engram_hosts_silent",
  "engram_free_mib",
  "engram_capacity_mib",
  "engram_free_vcpus",
  "engram_unplaceable",
  "engram_reserve_failures",
  "engram_ledger_active_entries",
] as const

/** The name of a store gauge. */
export type StoreGauge = (typeof storeGauges)[number]

/** A store gauge's value read for one scrape. */
export interface StoreGaugeValue {
  readonly name: StoreGauge
  readonly value: number
}

const storeHelp: { readonly [G in StoreGauge]: string } = {
  engram_queue_length: "Sessions queued for room.",
  engram_queue_without_room: "Queued sessions that fit on no candidate host.",
  engram_parks: "Parked sessions now.",
  engram_descents_running: "Descents running now.",
  engram_hosts: "Registered hosts.",
  engram_hosts_silent:
    "Hosts whose agent has not reported within the stale window (ENGRAM_HEARTBEAT_STALE_WINDOW_MS) at the fleet read: they take no placements until it reports again.",
  engram_free_mib: "Free RAM over measured ready hosts.",
  engram_capacity_mib: "RAM capacity over measured ready hosts (after the system reserve and the overcommit ratio).",
  engram_free_vcpus: "Free vCPUs over ready hosts that reported cores.",
  engram_unplaceable: "Queued sessions too big for every ready measured host even empty: the cue for a bigger host.",
  engram_reserve_failures: "Ledger reserve refusals (cumulative, from the store).",
  engram_ledger_active_entries: "Reservations held now.",
}

const sessionsHelp = "Sessions by state now, every state but ended (0 included), from the store."

/** Why a descent started: a yield's reason, or an idle session that could not park. */
export type DescentReason = ParkPolicy.Reason | "idle"

/** How a move ended, as its counter labels it. */
export type MoveEnd = "committed" | "downtime" | "aborted" | "timeout" | "commit_pending"

export interface MetricsShape {
  readonly placements: Counter<{ readonly outcome: "placed" | "queued"; readonly source: "create" | "resume" | "drain" }>
  readonly drainUnapplied: Counter
  /** Creates this replica forwarded to the placer and the placer answered (`ENGRAM_PLACEMENT_FORWARD`). */
  readonly forwarded: Counter
  /** Forwarded creates placed here instead: the placer did not answer within the bound (`timeout`) or refused or failed the batch (`error`). */
  readonly forwardFallbacks: Counter<{ readonly reason: "timeout" | "error" }>
  /** Creates other replicas forwarded to this one (the placer), answered. */
  readonly placedForPeers: Counter
  readonly descents: Counter<{ readonly reason: DescentReason }>
  readonly parks: Counter
  readonly resumes: Counter<{ readonly resumed: "warm" | "cold" }>
  readonly reaperPasses: Counter<{ readonly result: "ok" | "held" }>
  readonly reaperFleetReadFailures: Counter
  readonly reaperLostRaces: Counter
  readonly reaperReclaimed: Counter
  /**
   * Sessions this replica's reclaims made `lost` (their reservation expired or went stale). Only
   * the reaper's leader reclaims and each loss is written by one reclaim, so the sum over the
   * replicas is the fleet's count.
   */
  readonly sessionsLost: Counter
  /** Guests their host's agent reported lost and booted fresh (`POST /v1/hosts/{id}/guest-lost`): each report is counted by the replica that wrote it. */
  readonly guestsLost: Counter
  /** Failover graces started (`ENGRAM_RECLAIM_GRACE_MS`): a leadership's first pass, or a read after a gap. */
  readonly reaperReclaimGraces: Counter
  /** History the reaper's retention deleted (`ENGRAM_RETENTION_MS`), by kind: ended sessions, their events, ended moves, host pairs. */
  readonly reaperPruned: Counter<{ readonly kind: "sessions" | "events" | "moves" | "pairs" }>
  readonly reaperLeader: Gauge
  /** Seconds since this replica last saw the reaper's lease renewed or taken (`Leadership.unrenewedMs`), as of its last lease check; 0 with one process. */
  readonly leaseUnrenewed: Gauge
  /** The database's clock less this replica's, seconds, as its last lease check measured it (`Leadership.clockSkewMs`); 0 with one process. */
  readonly clockSkew: Gauge
  readonly reaperLeaderChecks: Counter
  /** Times this replica gave the reaper's lease up because its passes' store calls kept failing (`ENGRAM_LEADER_STEP_DOWN_PASSES`). */
  readonly reaperStepDowns: Counter
  readonly moves: Counter<{ readonly outcome: MoveEnd }>
  /**
   * Moves the reaper planned for starving sessions (`ENGRAM_MAKE_ROOM_MOVES`): begun, refused by
   * the store, not begun with the store unavailable (a fenced write too), and how the begun ones
   * ended: committed, aborted (by their agents, e.g. the downtime guard) or timed out.
   */
  readonly makeRoomMoves: Counter<{ readonly result: "begun" | "refused" | "unavailable" | "committed" | "aborted" | "timeout" }>
  readonly storeUnavailable: Counter
  /** Requests whose client left while a store call of theirs had not answered (the client's bound shorter than the store's), by method and route. */
  readonly requestsAbandoned: Counter<{ readonly method: string; readonly route: string }>
  /** Connections the HTTP server holds open now (this replica), set by `Connections.track`. */
  readonly connectionsOpen: Gauge
  /** Connections the HTTP server closed as soon as it accepted them: it held `ENGRAM_MAX_CONNECTIONS` already. */
  readonly connectionsRefused: Counter
  readonly observePassSeconds: (seconds: number) => void
  /** One answered HTTP request: its route template (`/v1/sessions/:id`), status and duration. */
  readonly observeRequest: (method: string, route: string, status: number, seconds: number) => void
  /**
   * The Prometheus text exposition of this registry, after setting the store's gauges to those
   * read for this scrape (`engram_store_up` = `up`); a store gauge not read is dropped, not stale
   * (`sessions`: `engram_sessions{state}`, every state but ended).
   */
  readonly scrape: (store: {
    readonly up: boolean
    readonly gauges: readonly StoreGaugeValue[]
    readonly sessions?: SessionCounts | undefined
    readonly checks?: PlacementChecks | undefined
    /** Whether changes made through other processes reach this one now (`Changes.live`): `engram_change_listener_up`. */
    readonly listenerUp?: boolean | undefined
  }) => Effect.Effect<string>
}

/** This replica's store's placement version checks so far (cumulative): written, and lost to another writer's change. */
export interface PlacementChecks {
  readonly placed: number
  readonly conflicts: number
  /** Apply statements that wrote placements (absent: not counted). */
  readonly statements?: number | undefined
}

/** Reaper pass duration buckets, seconds. */
const passBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
/** HTTP request duration buckets, seconds (long-polls and move waits run for many seconds). */
const requestBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]

// Labels in a fixed order, so the exposition does not depend on how a caller spelt them.
const sorted = (labels: Labels): Labels => Object.fromEntries(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)))
const keyOf = (name: string, labels: Labels) => `${name}${JSON.stringify(sorted(labels))}`

/** Process metrics read at scrape time (the names of the Prometheus client libraries). */
const registerProcessMetrics = (context: Context.Context<never>) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const lag = monitorEventLoopDelay({ resolution: 20 })
      lag.enable()
      const startedAt = Date.now() / 1000 - process.uptime()
      const counter = (name: string, description: string, read: () => number) =>
        Metric.registerUnsafe(Metric.counter(name, { description }), context, { get: () => ({ count: read(), incremental: true }), update: () => {}, modify: () => {} })
      const gauge = (name: string, description: string, read: () => number) =>
        Metric.registerUnsafe(Metric.gauge(name, { description }), context, { get: () => ({ value: read() }), update: () => {}, modify: () => {} })
      const openFds = () => {
        try {
          return readdirSync("/proc/self/fd").length
        } catch {
          return 0
        }
      }
      // At the file-descriptor limit `process.memoryUsage()` throws (EMFILE: it opens /proc):
      // the scrape answers the last figures read rather than failing whole.
      let lastMemory: NodeJS.MemoryUsage = process.memoryUsage()
      const memory = (): NodeJS.MemoryUsage => {
        try {
          lastMemory = process.memoryUsage()
        } catch {
          // the last figures
        }
        return lastMemory
      }
      const registrations = [
        counter("process_cpu_user_seconds_total", "User CPU time spent, seconds.", () => process.cpuUsage().user / 1e6),
        counter("process_cpu_system_seconds_total", "System CPU time spent, seconds.", () => process.cpuUsage().system / 1e6),
        counter("process_cpu_seconds_total", "User and system CPU time spent, seconds.", () => {
          const u = process.cpuUsage()
          return (u.user + u.system) / 1e6
        }),
        gauge("process_resident_memory_bytes", "Resident memory size, bytes.", () => memory().rss),
        gauge("process_start_time_seconds", "Start time of the process since the Unix epoch, seconds.", () => startedAt),
        gauge("process_open_fds", "Open file descriptors.", openFds),
        gauge("nodejs_heap_size_total_bytes", "V8 heap size, bytes.", () => memory().heapTotal),
        gauge("nodejs_heap_size_used_bytes", "V8 heap used, bytes.", () => memory().heapUsed),
        gauge("nodejs_external_memory_bytes", "Memory of C++ objects bound to JavaScript objects, bytes.", () => memory().external),
        gauge("nodejs_eventloop_lag_p99_seconds", "The 99th percentile of the event loop's delay since start, seconds.", () => lag.percentile(99) / 1e9),
        gauge("nodejs_eventloop_lag_max_seconds", "The largest event loop delay since start, seconds.", () => lag.max / 1e9),
      ]
      return { lag, registrations }
    }),
    ({ lag, registrations }) =>
      Effect.sync(() => {
        lag.disable()
        for (const r of registrations) r.remove()
      }),
  )

export class Metrics extends Context.Service<Metrics, MetricsShape>()("@engram/coordinator/Metrics") {
  static readonly layer: Layer.Layer<Metrics> = Layer.effect(
    Metrics,
    Effect.gen(function* () {
      const context = Context.make(Metric.MetricRegistry, new Map())
      const series = new Map<string, Metric.Metric<number, unknown>>()
      const seriesOf = (name: string, labels: Labels, make: (attributes: Labels) => Metric.Metric<number, unknown>) => {
        const key = keyOf(name, labels)
        let m = series.get(key)
        if (m === undefined) series.set(key, (m = make(sorted(labels))))
        return m
      }
      const valueOf = (name: string, labels: Labels): number => {
        const m = series.get(keyOf(name, labels))
        if (m === undefined) return 0
        const state = m.valueUnsafe(context) as { readonly count?: number; readonly value?: number }
        return state.count ?? state.value ?? 0
      }
      const counterSeries = (name: string, description: string, labels: Labels) =>
        seriesOf(name, labels, (attributes) => Metric.counter(name, { description, attributes, incremental: true }))
      const gaugeSeries = (name: string, description: string, labels: Labels = {}) =>
        seriesOf(name, labels, (attributes) => Metric.gauge(name, { description, attributes }))

      /** A counter; `shown`: its zero series exists from the first scrape (its HELP shows before anything happens). */
      const counter = <L extends Labels = Record<never, string>>(name: string, description: string, shown = false): Counter<L> => {
        if (shown) counterSeries(name, description, {}).updateUnsafe(0, context)
        const inc = (a?: L | number, b?: number): void => {
          const labels = typeof a === "object" ? a : {}
          counterSeries(name, description, labels).updateUnsafe(typeof a === "number" ? a : (b ?? 1), context)
        }
        return { name, inc: inc as Counter<L>["inc"], get: ((labels: L = {} as L) => valueOf(name, labels)) as Counter<L>["get"] }
      }
      const gauge = (name: string, description: string): Gauge => ({
        name,
        set: (value) => gaugeSeries(name, description).updateUnsafe(value, context),
        get: () => valueOf(name, {}),
      })
      const passHistogram = Metric.histogram("engram_reaper_pass_duration_seconds", { description: "Reaper pass wall time.", boundaries: passBuckets })
      // Every request is observed: its series are found by two map lookups (method and route, then
      // status), not by spelling their labels into a key.
      const requestSeries = new Map<string, { readonly duration: Metric.Metric<number, unknown>; readonly byStatus: Map<number, Metric.Metric<number, unknown>> }>()
      const observeRequest: MetricsShape["observeRequest"] = (method, route, status, seconds) => {
        const key = `${method} ${route}`
        let s = requestSeries.get(key)
        if (s === undefined) {
          const duration = Metric.histogram("engram_http_request_duration_seconds", {
            description: "HTTP request duration by method and route template, seconds (long-polls included).",
            attributes: sorted({ method, route }),
            boundaries: requestBuckets,
          })
          requestSeries.set(key, (s = { duration, byStatus: new Map() }))
        }
        let count = s.byStatus.get(status)
        if (count === undefined)
          s.byStatus.set(status, (count = counterSeries("engram_http_requests_total", "HTTP requests answered, by method, route template and status.", { method, route, status: String(status) })))
        count.updateUnsafe(1, context)
        s.duration.updateUnsafe(seconds, context)
      }
      const up = gauge("engram_store_up", "1 when the last store read for this scrape succeeded.")
      const listenerUp = gauge(
        "engram_change_listener_up",
        "1 while changes made through other replicas reach this one (PostgreSQL: its LISTEN connection is established; always 1 on an embedded or in-memory store); 0 while it reconnects, when waiters are woken only by this replica's own changes and their deadlines.",
      )
      // The store counts its version checks itself; each scrape adds what it counted since the last.
      const placementWrites = counter("engram_placement_writes_total", "Placements written at the host version they were decided on (this replica).", true)
      const placementConflicts = counter(
        "engram_placement_conflicts_total",
        "Placements refused at their write because another writer changed the host since the decision; each is decided again (this replica).",
        true,
      )
      const placementStatements = counter(
        "engram_placement_statements_total",
        "Apply statements that wrote placements (this replica): engram_placement_writes_total divided by it is the mean group one statement placed.",
        true,
      )
      let checksSeen: PlacementChecks = { placed: 0, conflicts: 0, statements: 0 }
      const scrape: MetricsShape["scrape"] = (store) =>
        Effect.sync(() => {
          up.set(store.up ? 1 : 0)
          listenerUp.set(store.listenerUp === false ? 0 : 1)
          if (store.checks !== undefined) {
            placementWrites.inc(Math.max(0, store.checks.placed - checksSeen.placed))
            placementConflicts.inc(Math.max(0, store.checks.conflicts - checksSeen.conflicts))
            placementStatements.inc(Math.max(0, (store.checks.statements ?? 0) - (checksSeen.statements ?? 0)))
            checksSeen = store.checks
          }
          for (const state of liveStates) {
            const g = gaugeSeries("engram_sessions", sessionsHelp, { state })
            if (store.sessions === undefined) Metric.removeUnsafe(g, context)
            else g.updateUnsafe(store.sessions[state], context)
          }
          const read = new Map(store.gauges.map((g) => [g.name, g.value]))
          for (const name of storeGauges) {
            const value = read.get(name)
            const g = gaugeSeries(name, storeHelp[name])
            if (value === undefined) Metric.removeUnsafe(g, context)
            else g.updateUnsafe(value, context)
          }
          return PrometheusMetrics.formatUnsafe(context)
        })

      const reaperLeader = gauge("engram_reaper_leader", "1 while this replica holds the reaper leader lock.")
      reaperLeader.set(0)
      const leaseUnrenewed = gauge(
        "engram_lease_unrenewed_seconds",
        "Seconds since this replica last saw the reaper's lease renewed or taken, by itself or another replica, as of its last lease check (0 with an embedded store). Above the lease duration on every replica: no replica leads.",
      )
      leaseUnrenewed.set(0)
      const clockSkew = gauge(
        "engram_clock_skew_seconds",
        "The database's clock less this replica's, seconds, as its last lease check measured it (0 with an embedded store). The store's times follow the database's clock; this replica's logs and traces carry its own: keep every replica within a few seconds of the database (NTP).",
      )
      clockSkew.set(0)
      const connectionsOpen = gauge("engram_http_connections_open", "Connections the HTTP server holds open now (this replica), idle kept-alive ones and long-polls included.")
      connectionsOpen.set(0)
      passHistogram.valueUnsafe(context)
      yield* registerProcessMetrics(context)

      return Metrics.of({
        placements: counter("engram_placements_total", "Session placements by outcome (placed, queued) and source (create, resume, drain)."),
        drainUnapplied: counter(
          "engram_drain_unapplied_total",
          "Placements a queue drain decided but did not write (refused, or a lost race): their sessions stay queued.",
          true,
        ),
        forwarded: counter("engram_placement_forwarded_total", "Creates this replica forwarded to the placer (the reaper's lease holder), answered by it.", true),
        forwardFallbacks: counter(
          "engram_placement_forward_fallbacks_total",
          "Forwarded creates placed by this replica instead, by reason: the placer did not answer within ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS (timeout), or refused or failed the batch (error).",
        ),
        placedForPeers: counter("engram_placement_placed_for_peers_total", "Creates other replicas forwarded to this one (the placer), answered.", true),
        descents: counter("engram_descents_total", "Descents started, by reason (demand, over_reserved, hard_ttl, starving, reserve, idle…)."),
        parks: counter("engram_parks_total", "Idle sessions parked.", true),
        resumes: counter("engram_resumes_total", "Resumes by how they came back (warm: a park unparked in place; cold: restored from a descent)."),
        reaperPasses: counter("engram_reaper_passes_total", "Reaper passes by result (ok, held)."),
        reaperFleetReadFailures: counter("engram_reaper_fleet_read_failures_total", "Reaper passes whose fleet read failed; every park was held.", true),
        reaperLostRaces: counter("engram_reaper_lost_races_total", "Yields skipped because the park changed first (lost CAS).", true),
        reaperReclaimed: counter("engram_reaper_reclaimed_total", "Reservations reclaimed as expired or stale.", true),
        sessionsLost: counter(
          "engram_sessions_lost_total",
          "Sessions this replica's reclaims made lost (reservation expired or stale); only the reaper's leader reclaims, so the sum over replicas is the fleet's.",
          true,
        ),
        guestsLost: counter(
          "engram_guests_lost_total",
          "Session guests their host's agent reported lost (a VM that ended by itself, or was not found where recorded) and booted fresh: their memory state is gone. Counted by the replica that recorded the report, so the sum over replicas is the fleet's.",
          true,
        ),
        reaperReclaimGraces: counter("engram_reaper_reclaim_graces_total", "Failover graces started: no reclaim of stale reservations (nor idle step) for ENGRAM_RECLAIM_GRACE_MS after a new leadership or a gap in the leader's contacts with the store.", true),
        reaperPruned: counter(
          "engram_reaper_pruned_total",
          "History the reaper's retention deleted (ended more than ENGRAM_RETENTION_MS ago), by kind: sessions (ended), events (of those sessions), moves (committed or aborted), pairs (host pairs with no recent commit).",
        ),
        reaperLeader,
        clockSkew,
        leaseUnrenewed,
        reaperLeaderChecks: counter("engram_reaper_leader_checks_total", "Reaper ticks: each takes or confirms the leader lock, leader or not.", true),
        reaperStepDowns: counter(
          "engram_reaper_step_downs_total",
          "Times this replica gave the reaper's lease up because ENGRAM_LEADER_STEP_DOWN_PASSES passes in a row found its store failing (its pool wedged while the lease's own connection worked).",
          true,
        ),
        moves: counter("engram_moves_total", "Moves by outcome (committed, downtime, aborted, timeout, commit_pending)."),
        makeRoomMoves: counter(
          "engram_reaper_make_room_moves_total",
          "Moves the reaper planned to make room for starving sessions (ENGRAM_MAKE_ROOM_MOVES), by result: begun, refused by the store, unavailable (the store down or the write fenced), and how begun ones ended: committed, aborted by their agents, or timeout (no agent took it up within ENGRAM_MOVE_TIMEOUT_MS).",
        ),
        storeUnavailable: counter("engram_http_store_unavailable_total", "Requests answered 503 because the store was unavailable.", true),
        requestsAbandoned: counter(
          "engram_http_requests_abandoned_total",
          "Requests whose client left (closed the connection) while a store call of theirs had not answered, by method and route: a stall of the database the client saw as a hung replica.",
          true,
        ),
        connectionsOpen,
        connectionsRefused: counter(
          "engram_http_connections_refused_total",
          "Connections the HTTP server closed as soon as it accepted them because it held ENGRAM_MAX_CONNECTIONS already (this replica).",
          true,
        ),
        observePassSeconds: (seconds) => passHistogram.updateUnsafe(seconds, context),
        observeRequest,
        scrape,
      })
    }),
  )
}
