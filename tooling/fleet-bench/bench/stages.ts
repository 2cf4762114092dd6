/**
 * The fleet bench's probe inside the coordinator process (`FLEET_STAGES=1`: loaded with
 * `--import` before its main module): where a request's time goes there, without touching the
 * coordinator's code.
 *
 * - the event loop's delay (`monitorEventLoopDelay`): a starved or blocked loop answers late;
 * - each request from Node's `request` event (its head parsed) to its answer's last byte handed
 *   to the socket (`finish`), by kind (heartbeat, report, assignments, other);
 * - each grouped write's statement (store-pg `Batcher.ts` reports its timings to the hook
 *   `Symbol.for("engram.batcher.timing")` when one is installed): the wait of its first item
 *   until the statement began (its gathering window plus any wait for the slot), the statement's
 *   time, its items.
 *
 * It answers on a port of its own (`FLEET_STAGES_PORT`): `GET /` the figures since the last
 * `POST /reset`.
 */
import http from "node:http"
import { monitorEventLoopDelay } from "node:perf_hooks"

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
let statements: Timing[] = []

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
  if (event === "request" && this !== probeServer) {
    const req = args[0] as http.IncomingMessage
    const res = args[1] as http.ServerResponse
    const t0 = performance.now()
    const kind = kindOf(req.method, req.url)
    res.once("finish", () => {
      let list = requests.get(kind)
      if (list === undefined) requests.set(kind, (list = []))
      list.push(performance.now() - t0)
    })
  }
  return Reflect.apply(emit, this, [event, ...args]) as boolean
} as typeof emit

const figures = () => {
  const byName = new Map<string, Timing[]>()
  for (const t of statements) {
    let list = byName.get(t.name)
    if (list === undefined) byName.set(t.name, (list = []))
    list.push(t)
  }
  return {
    loopDelayMs: { p50: loop.percentile(50) / 1e6, p99: loop.percentile(99) / 1e6, max: loop.max / 1e6 },
    requestsMs: Object.fromEntries([...requests].map(([k, v]) => [k, summary(v)])),
    statements: Object.fromEntries(
      [...byName].map(([k, v]) => [
        k,
        { waitedMs: summary(v.map((t) => t.waitedMs)), statementMs: summary(v.map((t) => t.statementMs)), items: summary(v.map((t) => t.items)) },
      ]),
    ),
  }
}

const probeServer: http.Server = http.createServer((req, res) => {
  if (req.method === "POST") {
    loop.reset()
    requests = new Map()
    statements = []
    res.end("{}")
  } else res.end(JSON.stringify(figures()))
})
probeServer.listen(Number(process.env["FLEET_STAGES_PORT"]), "127.0.0.1")
probeServer.unref()
