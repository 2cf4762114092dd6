/**
 * The coordinator's metrics as effect `Metric`s in a registry of its own (two coordinators in
 * one process count apart), rendered by `effect/observability`'s `PrometheusMetrics` at
 * `GET /metrics`: this replica's counters (placements, descents, moves, reaper passes, HTTP
 * requests by route and status), the store's gauges set at scrape time (the same on every
 * replica), and process metrics read at scrape time.
 */
import { Context, Effect, Layer, Metric } from "effect"
import { PrometheusMetrics } from "effect/observability"
import { readdirSync } from "node:fs"
import { monitorEventLoopDelay } from "node:perf_hooks"

type Labels = Readonly<Record<string, string>>

/** A store gauge set at scrape time. */
export interface Gauge {
  readonly name: string
  readonly value: number
}

export interface MetricsShape {
  readonly inc: (name: string, labels?: Labels, by?: number) => void
  readonly set: (name: string, value: number, labels?: Labels) => void
  readonly observePassSeconds: (seconds: number) => void
  /** One answered HTTP request: its route template (`/v1/sessions/:id`), status and duration. */
  readonly observeRequest: (method: string, route: string, status: number, seconds: number) => void
  /** The value of a counter or gauge (tests). */
  readonly get: (name: string, labels?: Labels) => number
  /**
   * The Prometheus text exposition of this registry, after setting the store's gauges to those
   * read for this scrape (`engram_store_up` = `up`); a store gauge not read is dropped, not stale.
   */
  readonly scrape: (store: { readonly up: boolean; readonly gauges: readonly Gauge[] }) => Effect.Effect<string>
}

const help: Record<string, { readonly type: "counter" | "gauge"; readonly help: string }> = {
  engram_placements_total: { type: "counter", help: "Session placements by outcome (placed, queued) and source (create, resume, drain)." },
  engram_descents_total: { type: "counter", help: "Descents started, by reason (demand, over_reserved, hard_ttl, idle)." },
  engram_parks_total: { type: "counter", help: "Idle sessions parked." },
  engram_resumes_total: { type: "counter", help: "Resumes by how they came back (warm: a park unparked in place; cold: restored from a descent)." },
  engram_reaper_passes_total: { type: "counter", help: "Reaper passes by result (ok, held)." },
  engram_reaper_fleet_read_failures_total: { type: "counter", help: "Reaper passes whose fleet read failed; every park was held." },
  engram_reaper_lost_races_total: { type: "counter", help: "Yields skipped because the park changed first (lost CAS)." },
  engram_reaper_reclaimed_total: { type: "counter", help: "Reservations reclaimed as expired or stale." },
  engram_reaper_leader: { type: "gauge", help: "1 while this replica holds the reaper leader lock." },
  engram_reaper_leader_checks_total: { type: "counter", help: "Reaper ticks: each takes or confirms the leader lock, leader or not." },
  engram_moves_total: { type: "counter", help: "Moves by outcome (committed, downtime, aborted, timeout, commit_pending)." },
  engram_http_store_unavailable_total: { type: "counter", help: "Requests answered 503 because the store was unavailable." },
  engram_http_requests_total: { type: "counter", help: "HTTP requests answered, by method, route template and status." },
  engram_store_up: { type: "gauge", help: "1 when the last store read for this scrape succeeded." },
  engram_queue_length: { type: "gauge", help: "Sessions queued for room." },
  engram_queue_without_room: { type: "gauge", help: "Queued sessions that fit on no candidate host." },
  engram_parks: { type: "gauge", help: "Parked sessions now." },
  engram_descents_running: { type: "gauge", help: "Descents running now." },
  engram_hosts: { type: "gauge", help: "Registered hosts." },
  engram_free_mib: { type: "gauge", help: "Free RAM over measured ready hosts." },
  engram_capacity_mib: { type: "gauge", help: "RAM capacity over measured ready hosts (after the system reserve and the overcommit ratio)." },
  engram_free_vcpus: { type: "gauge", help: "Free vCPUs over ready hosts that reported cores." },
  engram_unplaceable: { type: "gauge", help: "Queued sessions too big for every ready measured host even empty: the cue for a bigger host." },
  engram_reserve_failures: { type: "gauge", help: "Ledger reserve refusals (cumulative, from the store)." },
  engram_ledger_active_entries: { type: "gauge", help: "Reservations held now." },
}

/** The store's gauges: set at every scrape, dropped when the store cannot be read. */
export const storeGauges = [
  "engram_queue_length",
  "engram_queue_without_room",
  "engram_parks",
  "engram_descents_running",
  "engram_hosts",
  "engram_free_mib",
  "engram_capacity_mib",
  "engram_free_vcpus",
  "engram_unplaceable",
  "engram_reserve_failures",
  "engram_ledger_active_entries",
] as const

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
      const registrations = [
        counter("process_cpu_user_seconds_total", "User CPU time spent, seconds.", () => process.cpuUsage().user / 1e6),
        counter("process_cpu_system_seconds_total", "System CPU time spent, seconds.", () => process.cpuUsage().system / 1e6),
        counter("process_cpu_seconds_total", "User and system CPU time spent, seconds.", () => {
          const u = process.cpuUsage()
          return (u.user + u.system) / 1e6
        }),
        gauge("process_resident_memory_bytes", "Resident memory size, bytes.", () => process.memoryUsage().rss),
        gauge("process_start_time_seconds", "Start time of the process since the Unix epoch, seconds.", () => startedAt),
        gauge("process_open_fds", "Open file descriptors.", openFds),
        gauge("nodejs_heap_size_total_bytes", "V8 heap size, bytes.", () => process.memoryUsage().heapTotal),
        gauge("nodejs_heap_size_used_bytes", "V8 heap used, bytes.", () => process.memoryUsage().heapUsed),
        gauge("nodejs_external_memory_bytes", "Memory of C++ objects bound to JavaScript objects, bytes.", () => process.memoryUsage().external),
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
      const counter = (name: string, labels: Labels) =>
        seriesOf(name, labels, (attributes) => Metric.counter(name, { description: help[name]?.help, attributes, incremental: true }))
      const gauge = (name: string, labels: Labels) => seriesOf(name, labels, (attributes) => Metric.gauge(name, { description: help[name]?.help, attributes }))
      const passHistogram = Metric.histogram("engram_reaper_pass_duration_seconds", { description: "Reaper pass wall time.", boundaries: passBuckets })

      const inc: MetricsShape["inc"] = (name, labels = {}, by = 1) => counter(name, labels).updateUnsafe(by, context)
      const set: MetricsShape["set"] = (name, value, labels = {}) => gauge(name, labels).updateUnsafe(value, context)
      const get: MetricsShape["get"] = (name, labels = {}) => {
        const m = series.get(keyOf(name, labels))
        if (m === undefined) return 0
        const state = m.valueUnsafe(context) as { readonly count?: number; readonly value?: number }
        return state.count ?? state.value ?? 0
      }
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
        if (count === undefined) s.byStatus.set(status, (count = counter("engram_http_requests_total", { method, route, status: String(status) })))
        count.updateUnsafe(1, context)
        s.duration.updateUnsafe(seconds, context)
      }
      const scrape: MetricsShape["scrape"] = (store) =>
        Effect.sync(() => {
          set("engram_store_up", store.up ? 1 : 0)
          const read = new Map(store.gauges.map((g) => [g.name, g.value]))
          for (const name of storeGauges) {
            const value = read.get(name)
            if (value === undefined) Metric.removeUnsafe(gauge(name, {}), context)
            else set(name, value)
          }
          return PrometheusMetrics.formatUnsafe(context)
        })

      // Series that exist before anything happens: their HELP and a zero show from the first scrape.
      for (const name of ["engram_parks_total", "engram_reaper_fleet_read_failures_total", "engram_reaper_lost_races_total", "engram_reaper_reclaimed_total", "engram_http_store_unavailable_total", "engram_reaper_leader_checks_total"]) {
        inc(name, {}, 0)
      }
      set("engram_reaper_leader", 0)
      passHistogram.valueUnsafe(context)
      yield* registerProcessMetrics(context)

      return Metrics.of({
        inc,
        set,
        observePassSeconds: (s) => passHistogram.updateUnsafe(s, context),
        observeRequest,
        get,
        scrape,
      })
    }),
  )
}
