/**
 * Where one request's CPU goes at the HTTP edge: `wrk` on three requests of a coordinator served
 * by this process (the in-memory store) — `GET /livez`, an authenticated `GET /v1/sessions/:id`
 * (a host's token) and `POST /v1/sessions` (the admin's token, a new session each) — each under
 * V8's sampling profiler (`node:inspector`), and the samples of each grouped by part: Node's
 * HTTP and sockets, Effect's runtime, its HTTP server and router, the API builder (schemas,
 * middlewares), the coordinator's own code, the store, the garbage collector. Prints, per
 * request, its CPU (µs, from `process.cpuUsage`, in a run without the profiler) and a table of
 * parts with their share (a second run, profiled). A bare `node:http` server is profiled first.
 *
 *   tsx --conditions=@engram/source bench/edge-profile.ts   (PROFILE_SECONDS=5, EDGE_CONNECTIONS=64;
 *   PROFILE_ONLY=text runs the requests whose name includes it; PROFILE_TOP=N also lists the N functions with the most self time; PROFILE_DIR=dir writes each .cpuprofile)
 */
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { execFile } from "node:child_process"
import { writeFileSync } from "node:fs"
import http from "node:http"
import type { AddressInfo } from "node:net"
import { Session } from "node:inspector/promises"
import { loadavg, tmpdir } from "node:os"
import { join } from "node:path"

const SECONDS = Number(process.env["PROFILE_SECONDS"] ?? 5)
const CONNECTIONS = Number(process.env["EDGE_CONNECTIONS"] ?? 64)
const TOP = Number(process.env["PROFILE_TOP"] ?? 0)
const DIR = process.env["PROFILE_DIR"]
const ONLY = process.env["PROFILE_ONLY"]

interface Node {
  readonly id: number
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number }
  readonly children?: readonly number[]
}
interface Profile {
  readonly nodes: readonly Node[]
  readonly samples: readonly number[]
  readonly timeDeltas: readonly number[]
}

/** The part of the stack a function belongs to, by its file. */
const partOf = (frame: Node["callFrame"]): string => {
  const { url, functionName } = frame
  if (url === "") {
    if (functionName === "(garbage collector)") return "garbage collector"
    if (functionName === "(program)") return "V8 and native (program)"
    if (functionName === "(idle)") return "(idle)"
    if (/^(writev|writeBuffer|writeUtf8String|writeLatin1String|read|readStart|readStop)$/.test(functionName)) return "socket syscalls (writev, read)"
    if (/^(Hash|digest|update|timingSafeEqual)$/.test(functionName)) return "crypto (token hash)"
    return "V8 builtins and natives"
  }
  if (url.startsWith("node:")) {
    if (/_http_|node:http/.test(url)) return "Node HTTP (parser, headers, answers)"
    if (/node:net|stream|node:internal\/(net|stream|timers|async_hooks|process\/task_queues)/.test(url)) return "Node sockets, streams, timers"
    return "Node other"
  }
  if (url.includes("@effect/platform-node")) return "Effect Node adapter (NodeHttpServer, request)"
  const effect = /\/effect\/(?:dist|src)\/(.+)$/.exec(url)
  if (effect !== null) {
    const file = effect[1]!
    if (file.startsWith("unstable/httpapi") || file.startsWith("http-api") || file.includes("HttpApi")) return "Effect HttpApi builder (endpoint, security, schema wiring)"
    if (file.startsWith("unstable/http") || file.startsWith("http/")) return "Effect HTTP (router, request, response, middleware)"
    if (/Schema|SchemaAST|SchemaParser|SchemaIssue|SchemaTransformation|SchemaGetter|Formatter|Option|Result|Predicate/.test(file)) return "Effect Schema (decode, encode)"
    if (/Metric/.test(file)) return "Effect Metric"
    if (/Tracer|Logger|References|LogLevel/.test(file)) return "Effect tracer, logger, references"
    return "Effect runtime (fibers, Context, Effect ops)"
  }
  if (url.includes("/apps/coordinator/")) return "coordinator (edge, auth, handlers, metrics)"
  if (url.includes("/packages/store-sim/") || url.includes("/packages/store/") || url.includes("/packages/core/")) return "store and core"
  if (url.includes("/packages/api/")) return "@engram/api"
  return "other"
}

const summarize = (profile: Profile) => {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]))
  const parts = new Map<string, number>()
  const functions = new Map<string, number>()
  let total = 0
  for (let i = 0; i < profile.samples.length; i++) {
    const node = byId.get(profile.samples[i]!)!
    const dt = profile.timeDeltas[i] ?? 0
    const part = partOf(node.callFrame)
    if (part === "(idle)") continue
    total += dt
    parts.set(part, (parts.get(part) ?? 0) + dt)
    const short = node.callFrame.url.replace(/^.*node_modules\//, "").replace(/^file:\/\/.*\/(apps|packages)\//, "$1/")
    const key = `${node.callFrame.functionName || "(anonymous)"} ${short}:${node.callFrame.lineNumber + 1}`
    functions.set(key, (functions.get(key) ?? 0) + dt)
  }
  return { total, parts: [...parts].sort((a, b) => b[1] - a[1]), functions: [...functions].sort((a, b) => b[1] - a[1]) }
}

/** wrk's requests/s and the requests it counted. */
const wrk = (args: readonly string[]): Promise<{ rps: number; requests: number; non2xx: number }> =>
  new Promise((resolve, reject) => {
    execFile("wrk", ["-t2", `-c${CONNECTIONS}`, `-d${SECONDS}s`, ...args], (error, stdout) => {
      if (error !== null) return reject(new Error(`wrk failed (apt-get install wrk): ${error.message}`))
      const rps = /Requests\/sec:\s+([\d.]+)/.exec(stdout)
      const requests = /(\d+) requests in/.exec(stdout)
      const non2xx = /Non-2xx or 3xx responses:\s+(\d+)/.exec(stdout)
      if (rps === null || requests === null) return reject(new Error(`unexpected wrk output:\n${stdout}`))
      resolve({ rps: Number(rps[1]), requests: Number(requests[1]), non2xx: non2xx === null ? 0 : Number(non2xx[1]) })
    })
  })

const bare = http.createServer((_req, res) => {
  res.writeHead(200, { "content-type": "application/json" })
  res.end('{"status":"ok"}')
})
await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r))
const bareUrl = `http://127.0.0.1:${(bare.address() as AddressInfo).port}`
const admin = "edge-profile-admin-token-0123456789"
const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Warn", config: { port: 0, adminToken: admin } })
const call = async (method: string, path: string, token: string, body?: unknown) => {
  const r = await fetch(`${c.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await r.text()
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${text}`)
  return JSON.parse(text) as Record<string, unknown>
}
const session = new Session()
session.connect()
await session.post("Profiler.enable")
await session.post("Profiler.setSamplingInterval", { interval: 1000 })
try {
  // Hosts with room for every create of the run, and one session to read.
  const hostToken = String((await call("POST", "/v1/hosts", admin, { id: "h0" }))["token"])
  await call("PUT", "/v1/hosts/h0/report", hostToken, { totalMib: 1e12, allocatableMib: 1e12, totalVcpus: 1e9 })
  const created = await call("POST", "/v1/sessions", admin, { id: "s0", memMib: 1, vcpus: 1 })
  const sessionId = String((created["session"] as Record<string, unknown> | undefined)?.["id"] ?? "s0")
  const createScript = join(tmpdir(), `edge-profile-${process.pid}.lua`)
  writeFileSync(
    createScript,
    `wrk.method = "POST"\nwrk.body = '{"memMib":1,"vcpus":1}'\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer ${admin}"\n`,
  )
  const scenarios: readonly { readonly name: string; readonly args: readonly string[] }[] = [
    { name: "bare node:http (baseline)", args: [`${bareUrl}/livez`] },
    { name: "GET /livez", args: [`${c.url}/livez`] },
    { name: "GET /v1/sessions/:id (host token)", args: ["-H", `authorization: Bearer ${hostToken}`, `${c.url}/v1/sessions/${sessionId}`] },
    { name: "POST /v1/sessions (admin token)", args: ["-s", createScript, `${c.url}/v1/sessions`] },
  ]
  for (const s of scenarios.filter((s) => ONLY === undefined || s.name.includes(ONLY))) {
    // CPU per request without the profiler, then the shares with it (it costs CPU of its own).
    const cpu = process.cpuUsage()
    const r = await wrk(s.args)
    const used = process.cpuUsage(cpu)
    await session.post("Profiler.start")
    await wrk(s.args)
    const { profile } = (await session.post("Profiler.stop")) as unknown as { profile: Profile }
    if (DIR !== undefined) writeFileSync(join(DIR, `${s.name.replace(/[^a-z0-9]+/gi, "_")}.cpuprofile`), JSON.stringify(profile))
    const { total, parts, functions } = summarize(profile)
    const perRequest = (used.user + used.system) / r.requests
    console.log(`\n${s.name}: ${r.rps.toFixed(0)} req/s (${r.non2xx} not 2xx), ${perRequest.toFixed(1)} µs CPU per request (load ${loadavg()[0]!.toFixed(1)})`)
    console.log("| part | share of CPU | µs per request |\n|---|---|---|")
    for (const [part, t] of parts) console.log(`| ${part} | ${((100 * t) / total).toFixed(1)} % | ${((perRequest * t) / total).toFixed(1)} |`)
    if (TOP > 0) for (const [f, t] of functions.slice(0, TOP)) console.log(`  ${((100 * t) / total).toFixed(1).padStart(5)} %  ${f}`)
  }
} finally {
  session.disconnect()
  await c.stop()
  await new Promise((r) => bare.close(r))
}
