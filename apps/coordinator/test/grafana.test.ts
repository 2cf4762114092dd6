// The Grafana dashboard (grafana/engram-coordinator.json) against a real coordinator's /metrics:
// every metric its queries name exists, every rate() or increase() reads a counter (or a
// histogram's buckets), and every label a query filters or groups by is on that metric. The
// coordinator first does what each metric counts (placements, a queue, parks, an idle descent,
// a warm resume, a committed move, reaper passes), since a labelled series appears with its
// first event.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, pendingMove, uid } from "./support/http.js"

const adminToken = "grafana-admin-token-0123456789"
const dashboard = JSON.parse(readFileSync(join(import.meta.dirname, "..", "grafana", "engram-coordinator.json"), "utf8")) as {
  readonly panels: readonly { readonly title: string; readonly targets?: readonly { readonly expr: string }[] }[]
  readonly templating: { readonly list: readonly { readonly query?: unknown }[] }
}

// ---- a small reading of PromQL: the metric names, the functions they go through, the labels ---

const keywords = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"])
/** Labels Prometheus adds when it scrapes (not in the exposition), and a histogram's bucket bound. */
const scrapeLabels = new Set(["instance", "job"])

interface Use {
  readonly metric: string
  /** The innermost function the metric is read through (`rate`, `increase`, `max`…), or null. */
  readonly through: string | null
  readonly labels: readonly string[]
}

/** Every metric a query reads, with the labels the query's matchers on it name and the labels it groups by. */
export const uses = (expr: string): Use[] => {
  const unquoted = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').replace(/\$\{?\w+\}?/g, "")
  const clause = /\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g
  const grouped = [...unquoted.matchAll(clause)].flatMap((m) => (m[1] ?? "").split(",").map((l) => l.trim()).filter((l) => l !== ""))
  // Without its grouping clauses, an aggregation reads as a function: `sum (rate(x[5m]))`.
  const text = unquoted.replace(clause, "")
  const out: Use[] = []
  const stack: (string | null)[] = []
  const token = /([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?|(\()|(\))|\[[^\]]*\]|[^A-Za-z_:()[]+/g
  let pendingFunction: string | null = null
  for (const m of text.matchAll(token)) {
    if (m[3] !== undefined) {
      stack.push(pendingFunction)
      pendingFunction = null
      continue
    }
    if (m[4] !== undefined) {
      stack.pop()
      continue
    }
    const name = m[1]
    if (name === undefined) continue
    const after = text.slice((m.index ?? 0) + m[0].length).trimStart()
    if (after.startsWith("(") && m[2] === undefined) {
      pendingFunction = name
      continue
    }
    if (keywords.has(name) || /^\d/.test(name)) continue
    const matchers = [...(m[2] ?? "").matchAll(/([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)/g)].map((x) => x[1] as string)
    const through = [...stack].reverse().find((f) => f !== null) ?? null
    out.push({ metric: name, through, labels: [...matchers, ...grouped].filter((l) => !scrapeLabels.has(l)) })
  }
  return out
}

/** The scrape: each family's type, and every sample's name and label names. */
const exposition = (text: string) => {
  const types = new Map<string, string>()
  const labels = new Map<string, Set<string>>()
  for (const line of text.split("\n")) {
    const t = /^# TYPE (\S+) (\S+)/.exec(line)
    if (t !== null) types.set(t[1] as string, t[2] as string)
    if (line.startsWith("#") || line.trim() === "") continue
    const s = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})?\s/.exec(line)
    if (s === null) continue
    const set = labels.get(s[1] as string) ?? new Set<string>()
    for (const l of (s[3] ?? "").matchAll(/([A-Za-z_][A-Za-z0-9_]*)="/g)) set.add(l[1] as string)
    labels.set(s[1] as string, set)
  }
  return { types, labels }
}

/** The family a sample name belongs to (`x_bucket` of histogram `x`), and its type. */
const familyOf = (name: string, types: Map<string, string>) => {
  if (types.has(name)) return { family: name, type: types.get(name) as string }
  const base = name.replace(/_(bucket|sum|count)$/, "")
  return types.get(base) === "histogram" ? { family: base, type: "histogram" } : null
}

let c: RunningCoordinator
let scrape = ""

beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  const api = client(c.url, adminToken)
  const [a, b] = [uid("a"), uid("b")]
  for (const id of [a, b]) {
    expect((await api.post("/v1/hosts", { id })).status).toBe(201)
    expect((await api.put(`/v1/hosts/${id}/report`, { totalMib: 5120, allocatableMib: 5120, totalVcpus: 4 })).status).toBe(200)
  }
  // Each host holds 4 GiB after the reserve.
  const [parked, moved, idle, filler, waiting, huge] = [uid("p"), uid("m"), uid("i"), uid("f"), uid("w"), uid("huge")]
  const running = async (id: string, host: string, memMib: number) => {
    expect((await api.post("/v1/sessions", { id, memMib, vcpus: 1, affinity: [host] })).status).toBe(201)
    expect((await api.post(`/v1/sessions/${id}/started`)).status).toBe(200)
  }
  await running(parked, a, 1024)
  expect((await api.post(`/v1/sessions/${parked}/idle`)).body.state).toBe("parked")
  expect((await api.post(`/v1/sessions/${parked}/resume`)).body.resumed).toBe("warm")
  // A committed move, b to a.
  await running(moved, b, 1024)
  const moving = api.post(`/v1/sessions/${moved}/move`, { targetHostId: a, maxDowntimeMs: 700 })
  const moveId = await pendingMove(api, b, moved)
  expect((await api.post(`/v1/moves/${moveId}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
  expect((await api.post(`/v1/moves/${moveId}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 390 })).status).toBe(200)
  expect((await moving).status).toBe(200)
  // a holds 3 GiB and b 4 GiB: a 2 GiB session waits without room, one of 64 GiB is unplaceable,
  // and meanwhile an idle session descends (no park while a session waits without room).
  await running(idle, a, 1024)
  await running(filler, b, 4096)
  expect((await api.post("/v1/sessions", { id: waiting, memMib: 2048, vcpus: 1 })).status).toBe(202)
  expect((await api.post("/v1/sessions", { id: huge, memMib: 64 * 1024, vcpus: 1 })).status).toBe(202)
  expect((await api.post(`/v1/sessions/${idle}/idle`)).body.state).toBe("descending")
  await c.reaperPass()
  const scraped = await api.get<string>("/metrics")
  expect(scraped.status).toBe(200)
  scrape = scraped.body
})
afterAll(async () => {
  await c?.stop()
})

const queries = () => [
  ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ where: p.title, expr: t.expr }))),
  ...dashboard.templating.list.flatMap((v) => {
    const q = v.query as { query?: string } | string | undefined
    const text = typeof q === "string" ? q : q?.query
    // label_values(metric, label): the metric is what the variable reads.
    const lv = text === undefined ? null : /^label_values\((\w+),/.exec(text)
    return lv === null ? [] : [{ where: "a variable", expr: lv[1] as string }]
  }),
]

describe("the Grafana dashboard", () => {
  it("reads PromQL as the checks below need it", () => {
    expect(uses('sum by (outcome, source) (rate(engram_placements_total{instance=~"$instance"}[$__rate_interval]))')).toEqual([
      { metric: "engram_placements_total", through: "rate", labels: ["outcome", "source"] },
    ])
    expect(uses('histogram_quantile(0.99, sum by (le, route) (rate(x_bucket{route!~"/a|/b"}[5m])))')).toEqual([{ metric: "x_bucket", through: "rate", labels: ["route", "le", "route"] }])
    expect(uses("sum(rate(a_total[1m])) by (code) / on (code) group_left sum(b)")).toEqual([
      { metric: "a_total", through: "rate", labels: ["code", "code"] },
      { metric: "b", through: "sum", labels: ["code", "code"] },
    ])
    expect(uses("max(engram_free_mib) * 1048576")).toEqual([{ metric: "engram_free_mib", through: "max", labels: [] }])
  })

  it("has queries, and every metric they name is in a real coordinator's /metrics", () => {
    const { types, labels } = exposition(scrape)
    const all = queries()
    expect(all.length).toBeGreaterThan(20)
    const missing: string[] = []
    for (const q of all) {
      const found = uses(q.expr)
      expect(found.length, `${q.where}: ${q.expr} names no metric`).toBeGreaterThan(0)
      for (const u of found) if (!labels.has(u.metric) && familyOf(u.metric, types) === null) missing.push(`${q.where}: ${u.metric}`)
    }
    expect(missing).toEqual([])
  })

  it("rate() and increase() read counters or histogram buckets, and every label a query names is on its metric", () => {
    const { types, labels } = exposition(scrape)
    const problems: string[] = []
    for (const q of queries()) {
      for (const u of uses(q.expr)) {
        const family = familyOf(u.metric, types)
        if (u.through !== null && ["rate", "irate", "increase"].includes(u.through)) {
          const ok = family !== null && (family.type === "counter" || (family.type === "histogram" && u.metric !== family.family))
          if (!ok) problems.push(`${q.where}: ${u.through}(${u.metric}) of a ${family?.type ?? "missing"} metric`)
        }
        const has = labels.get(u.metric) ?? new Set<string>()
        for (const l of u.labels) if (!has.has(l)) problems.push(`${q.where}: ${u.metric} has no label ${l} (it has ${[...has].join(", ") || "none"})`)
      }
    }
    expect(problems).toEqual([])
  })
})
