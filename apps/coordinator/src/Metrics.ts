/**
 * The coordinator's own counters, rendered with the store's gauges as Prometheus text at
 * `GET /metrics`. Counters are per process (each replica reports its own); the gauges read
 * from the store (queue, parks, reserve failures) are the same on every replica.
 */
import { Context, Layer } from "effect"

type Labels = Readonly<Record<string, string>>

const key = (name: string, labels: Labels): string => {
  const parts = Object.entries(labels)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, v]) => `${k}="${v.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n")}"`)
  return parts.length === 0 ? name : `${name}{${parts.join(",")}}`
}

/** Reaper pass duration buckets, seconds. */
const buckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

export interface MetricsShape {
  readonly inc: (name: string, labels?: Labels, by?: number) => void
  readonly set: (name: string, value: number, labels?: Labels) => void
  readonly observePassSeconds: (seconds: number) => void
  /** The value of a counter or gauge (tests and /readyz). */
  readonly get: (name: string, labels?: Labels) => number
  /** Prometheus text exposition of this process's counters and gauges, plus `extra` gauges. */
  readonly render: (extra: readonly { readonly name: string; readonly help: string; readonly value: number }[]) => string
}

const help: Record<string, { readonly type: "counter" | "gauge"; readonly help: string }> = {
  engram_placements_total: { type: "counter", help: "Session placements by outcome (placed, queued) and source (create, resume, drain)." },
  engram_descents_total: { type: "counter", help: "Descents started, by reason (demand, over_reserved, hard_ttl, idle)." },
  engram_parks_total: { type: "counter", help: "Idle sessions parked." },
  engram_reaper_passes_total: { type: "counter", help: "Reaper passes by result (ok, held)." },
  engram_reaper_fleet_read_failures_total: { type: "counter", help: "Reaper passes whose fleet read failed; every park was held." },
  engram_reaper_lost_races_total: { type: "counter", help: "Yields skipped because the park changed first (lost CAS)." },
  engram_reaper_reclaimed_total: { type: "counter", help: "Reservations reclaimed as expired or stale." },
  engram_reaper_leader: { type: "gauge", help: "1 while this replica holds the reaper leader lock." },
  engram_moves_total: { type: "counter", help: "Moves by outcome (committed, downtime, aborted, timeout)." },
  engram_http_store_unavailable_total: { type: "counter", help: "Requests answered 503 because the store was unavailable." },
}

export class Metrics extends Context.Service<Metrics, MetricsShape>()("@engram/coordinator/Metrics") {
  static readonly layer: Layer.Layer<Metrics> = Layer.sync(Metrics, () => {
    const values = new Map<string, { name: string; labels: Labels; value: number }>()
    const histo = { counts: buckets.map(() => 0), sum: 0, count: 0 }
    const inc = (name: string, labels: Labels = {}, by = 1) => {
      const k = key(name, labels)
      const v = values.get(k)
      if (v) v.value += by
      else values.set(k, { name, labels, value: by })
    }
    const set = (name: string, value: number, labels: Labels = {}) => {
      values.set(key(name, labels), { name, labels, value })
    }
    const observePassSeconds = (s: number) => {
      histo.sum += s
      histo.count += 1
      buckets.forEach((b, i) => {
        if (s <= b) histo.counts[i] = (histo.counts[i] ?? 0) + 1
      })
    }
    const get = (name: string, labels: Labels = {}) => values.get(key(name, labels))?.value ?? 0
    const render: MetricsShape["render"] = (extra) => {
      const lines: string[] = []
      const byName = new Map<string, { labels: Labels; value: number }[]>()
      for (const v of values.values()) {
        const list = byName.get(v.name) ?? []
        list.push(v)
        byName.set(v.name, list)
      }
      for (const name of [...new Set([...Object.keys(help), ...byName.keys()])].sort()) {
        const h = help[name]
        const list = byName.get(name)
        if (h === undefined && list === undefined) continue
        if (h) lines.push(`# HELP ${name} ${h.help}`, `# TYPE ${name} ${h.type}`)
        if (list === undefined || list.length === 0) {
          if (h?.type === "gauge") lines.push(`${name} 0`)
          continue
        }
        for (const v of list) lines.push(`${key(name, v.labels)} ${v.value}`)
      }
      lines.push("# HELP engram_reaper_pass_duration_seconds Reaper pass wall time.", "# TYPE engram_reaper_pass_duration_seconds histogram")
      buckets.forEach((b, i) => lines.push(`engram_reaper_pass_duration_seconds_bucket{le="${b}"} ${histo.counts[i] ?? 0}`))
      lines.push(`engram_reaper_pass_duration_seconds_bucket{le="+Inf"} ${histo.count}`)
      lines.push(`engram_reaper_pass_duration_seconds_sum ${histo.sum}`, `engram_reaper_pass_duration_seconds_count ${histo.count}`)
      for (const e of extra) lines.push(`# HELP ${e.name} ${e.help}`, `# TYPE ${e.name} gauge`, `${e.name} ${e.value}`)
      return `${lines.join("\n")}\n`
    }
    return Metrics.of({ inc, set, observePassSeconds, get, render })
  })
}
