/**
 * The fleet bench's probe inside the coordinator process (`FLEET_STAGES=1`: loaded with
 * `--import` before its main module): where a request's time goes there, without touching the
 * coordinator's code.
 *
 * - the event loop's delay (`monitorEventLoopDelay`): a starved or blocked loop answers late;
 * - each request from Node's `request` event (its head parsed) to its answer's last byte handed
 *   to the socket (`finish`), by kind (heartbeat, report, assignments, other);
 * - the process's memory each second (`process.memoryUsage()`: RSS, the JS heap reserved and in
 *   use, external) at its highest, and the garbage collector's pauses by kind (`PerformanceObserver`
 *   on `gc`): how many, their total, p99 and longest, and the longest pauses with their time;
 * - each grouped write's statement (store-pg `Batcher.ts` reports its timings to the hook
 *   `Symbol.for("engram.batcher.timing")` when one is installed): the wait of its first item
 *   until the statement began (its gathering window plus any wait for the slot), the statement's
 *   time, its items.
 *
 * With `FLEET_ALLOC_PROFILE=<file>` it also samples every allocation (V8's sampling heap profiler
 * through the inspector, objects collected since included: what the requests allocate, not what
 * stays) from each `POST /reset` to the next `GET /`, and writes the profile (`.heapprofile`,
 * readable in Chrome's DevTools) to that file.
 *
 * With `FLEET_CPU_PROFILE=<prefix>` it also profiles the CPU (V8's sampling profiler, every 0.5 ms)
 * from each `POST /reset` to the next `GET /`, written to `<prefix>-<n>.cpuprofile` (n counts the
 * profiles: 1 is the connect phase, 2 the idle window). It counts the connections the server
 * accepted and the requests it read, by second since the reset (`acceptedPerSecond`, `readPerSecond`).
 *
 * It answers on a port of its own (`FLEET_STAGES_PORT`): `GET /` the figures since the last
 * `POST /reset`.
 */
import { writeFileSync } from "node:fs"
import http from "node:http"
import { Session } from "node:inspector"
import { monitorEventLoopDelay, PerformanceObserver } from "node:perf_hooks"
import { constants } from "node:perf_hooks"

/** As store-pg's `Batcher.StatementTiming` (this file is loaded before the coordinator's modules, so it imports none of them). */
interface Timing {
  readonly name: string
  readonly items: number
  readonly waitedMs: number
  readonly statementMs: number
}

const pct = (sorted: readonly number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0
const summary = (values: readonly number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  return { count: sorted.length, p50: pct(sorted, 50), p99: pct(sorted, 99), max: sorted[sorted.length - 1] ?? 0 }
}

const loop = monitorEventLoopDelay({ resolution: 10 })
loop.enable()
let requests = new Map<string, number[]>()
/** Since the last reset: connections accepted (the server's `connection` event) and requests read, by kind, per second (`performance.now()` s). */
let accepted = new Map<number, number>()
let arrivals = new Map<string, Map<number, number>>()
let resetAt = performance.now()
const bump = (m: Map<number, number>) => {
  const s = Math.floor((performance.now() - resetAt) / 1000)
  m.set(s, (m.get(s) ?? 0) + 1)
}
let statements: Timing[] = []

// ---- memory and the collector's pauses
const gcKinds: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: "minor",
  [constants.NODE_PERFORMANCE_GC_MAJOR]: "major",
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: "incremental",
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: "weakcb",
}
let pauses = new Map<string, number[]>()
let longest: { kind: string; ms: number; at: number }[] = []
const gcObserver = new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    const kind = gcKinds[(e as { readonly detail?: { readonly kind?: number } }).detail?.kind ?? -1] ?? "other"
    let l = pauses.get(kind)
    if (l === undefined) pauses.set(kind, (l = []))
    l.push(e.duration)
    longest.push({ kind, ms: Math.round(e.duration * 10) / 10, at: Math.round(e.startTime) })
    if (longest.length > 64) longest = longest.sort((a, b) => b.ms - a.ms).slice(0, 8)
  }
})
gcObserver.observe({ entryTypes: ["gc"] })
const mib = (n: number) => Math.round(n / 1024 / 1024)
let memMax = { rss: 0, heapTotal: 0, heapUsed: 0, external: 0 }
let memLast = memMax
const sampleMemory = () => {
  const m = process.memoryUsage()
  memLast = { rss: mib(m.rss), heapTotal: mib(m.heapTotal), heapUsed: mib(m.heapUsed), external: mib(m.external) }
  memMax = { rss: Math.max(memMax.rss, memLast.rss), heapTotal: Math.max(memMax.heapTotal, memLast.heapTotal), heapUsed: Math.max(memMax.heapUsed, memLast.heapUsed), external: Math.max(memMax.external, memLast.external) }
}
setInterval(sampleMemory, 1000).unref()

const kindOf = (method: string | undefined, url: string | undefined): string => {
  const path = url ?? ""
  if (path.endsWith("/heartbeat")) return "heartbeat"
  if (path.endsWith("/report")) return "report"
  if (path.includes("/assignments")) return "assignments"
  return `other ${method ?? ""}`
}

;(globalThis as Record<symbol, unknown>)[Symbol.for("engram.batcher.timing")] = (t: Timing) => {
  statements.push(t)
}

const emit = http.Server.prototype.emit
http.Server.prototype.emit = function (this: http.Server, event: string | symbol, ...args: unknown[]): boolean {
  if (event === "connection" && this !== probeServer) bump(accepted)
  if (event === "request" && this !== probeServer) {
    const req = args[0] as http.IncomingMessage
    const res = args[1] as http.ServerResponse
    const t0 = performance.now()
    const kind = kindOf(req.method, req.url)
    let a = arrivals.get(kind)
    if (a === undefined) arrivals.set(kind, (a = new Map()))
    bump(a)
    res.once("finish", () => {
      let list = requests.get(kind)
      if (list === undefined) requests.set(kind, (list = []))
      list.push(performance.now() - t0)
    })
  }
  return Reflect.apply(emit, this, [event, ...args]) as boolean
} as typeof emit

/** Counts by second since the reset, as "second:count" up to the last non-zero second. */
const perSecond = (m: Map<number, number>): string => {
  const last = Math.max(-1, ...m.keys())
  return Array.from({ length: last + 1 }, (_, i) => m.get(i) ?? 0).join(" ")
}

const figures = () => {
  const byName = new Map<string, Timing[]>()
  for (const t of statements) {
    let list = byName.get(t.name)
    if (list === undefined) byName.set(t.name, (list = []))
    list.push(t)
  }
  return {
    memoryMib: { max: memMax, now: memLast },
    gcPausesMs: Object.fromEntries([...pauses].map(([k, v]) => [k, { ...summary(v), totalMs: Math.round(v.reduce((a, b) => a + b, 0)) }])),
    gcLongestMs: [...longest].sort((a, b) => b.ms - a.ms).slice(0, 8),
    loopDelayMs: { p50: loop.percentile(50) / 1e6, p99: loop.percentile(99) / 1e6, max: loop.max / 1e6 },
    acceptedPerSecond: perSecond(accepted),
    readPerSecond: Object.fromEntries([...arrivals].map(([k, m]) => [k, perSecond(m)])),
    requestsMs: Object.fromEntries([...requests].map(([k, v]) => [k, summary(v)])),
    statements: Object.fromEntries(
      [...byName].map(([k, v]) => [
        k,
        { waitedMs: summary(v.map((t) => t.waitedMs)), statementMs: summary(v.map((t) => t.statementMs)), items: summary(v.map((t) => t.items)) },
      ]),
    ),
  }
}

// ---- allocations (FLEET_ALLOC_PROFILE)
const allocFile = process.env["FLEET_ALLOC_PROFILE"]
const inspector = allocFile === undefined ? null : new Session()
inspector?.connect()
const post = (method: string, params?: object): Promise<unknown> =>
  new Promise((resolve, reject) => inspector?.post(method, params, (err, result) => (err ? reject(err) : resolve(result))))
let sampling = false
const startSampling = async () => {
  if (inspector === null) return
  if (sampling) await post("HeapProfiler.stopSampling")
  await post("HeapProfiler.startSampling", { samplingInterval: 32768, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
  sampling = true
}
const stopSampling = async () => {
  if (inspector === null || !sampling || allocFile === undefined) return
  const { profile } = (await post("HeapProfiler.stopSampling")) as { profile: unknown }
  sampling = false
  writeFileSync(allocFile, JSON.stringify(profile))
}

// ---- CPU (FLEET_CPU_PROFILE)
const cpuPrefix = process.env["FLEET_CPU_PROFILE"]
const cpuSession = cpuPrefix === undefined ? null : new Session()
cpuSession?.connect()
const cpuPost = (method: string, params?: object): Promise<unknown> =>
  new Promise((resolve, reject) => cpuSession?.post(method, params, (err, result) => (err ? reject(err) : resolve(result))))
let profiling = false
let profiles = 0
const startCpu = async () => {
  if (cpuSession === null) return
  if (profiling) await cpuPost("Profiler.stop")
  await cpuPost("Profiler.enable")
  await cpuPost("Profiler.setSamplingInterval", { interval: 500 })
  await cpuPost("Profiler.start")
  profiling = true
}
const stopCpu = async () => {
  if (cpuSession === null || !profiling || cpuPrefix === undefined) return
  const { profile } = (await cpuPost("Profiler.stop")) as { profile: unknown }
  profiling = false
  writeFileSync(`${cpuPrefix}-${++profiles}.cpuprofile`, JSON.stringify(profile))
}

const probeServer: http.Server = http.createServer((req, res) => {
  if (req.method === "POST") {
    loop.reset()
    resetAt = performance.now()
    accepted = new Map()
    arrivals = new Map()
    requests = new Map()
    statements = []
    pauses = new Map()
    longest = []
    memMax = { rss: 0, heapTotal: 0, heapUsed: 0, external: 0 }
    void startSampling().then(startCpu).then(() => res.end("{}"))
  } else void stopSampling().then(stopCpu).then(() => res.end(JSON.stringify(figures())))
})
probeServer.listen(Number(process.env["FLEET_STAGES_PORT"]), "127.0.0.1")
probeServer.unref()
