/**
 * The HTTP edge against Node's own speed: `wrk` (a C load generator: a Node one tops out below
 * what it measures here) on a bare `node:http` server answering `/livez`, then on a coordinator's
 * `/livez` (the in-memory store), both served by this process, same connections, same run; then
 * an authenticated read of one resource (`GET /v1/sessions/:id` with its host's token: the
 * credential check, the route's schemas, one store call), against the same bare server.
 * `bench/edge-profile.ts` shows where each request's CPU goes.
 *
 *   tsx --conditions=@engram/source bench/edge.ts   (EDGE_SECONDS=10, EDGE_CONNECTIONS=64; needs `wrk`;
 *   FLEET_COORDINATOR=dist, the default: the coordinator's build, made now; `source`: its sources under tsx)
 */
import { report as reportRow } from "@engram/bench"
import type { Row } from "@engram/bench"
import { coordinatorInProcess } from "./harness.js"
import { execFile, spawnSync } from "node:child_process"
import http from "node:http"
import type { AddressInfo } from "node:net"
import { loadavg } from "node:os"
import { fileURLToPath } from "node:url"

const SECONDS = Number(process.env["EDGE_SECONDS"] ?? 10)
const CONNECTIONS = Number(process.env["EDGE_CONNECTIONS"] ?? 64)

/**
 * wrk's requests/s, p99 (ms) and answers that were not 2xx or 3xx, on its arguments (the URL
 * last), and the CPU this process spent per request meanwhile (µs: the servers run here, `wrk`
 * apart). On a loaded machine the CPU per request moves less than the rate: it does not count
 * the time the server waited for a core.
 */
const wrk = (args: readonly string[]): Promise<{ rps: number; p99: number; non2xx: number; cpuUs: number }> =>
  new Promise((resolve, reject) => {
    const cpu = process.cpuUsage()
    execFile("wrk", ["-t2", `-c${CONNECTIONS}`, `-d${SECONDS}s`, "--latency", ...args], (error, stdout) => {
      const used = process.cpuUsage(cpu)
      if (error !== null) return reject(new Error(`wrk failed (is it installed? apt-get install wrk): ${error.message}`))
      const rps = /Requests\/sec:\s+([\d.]+)/.exec(stdout)
      const p99 = /99%\s+([\d.]+)(us|ms|s)/.exec(stdout)
      const requests = /(\d+) requests in/.exec(stdout)
      const non2xx = /Non-2xx or 3xx responses:\s+(\d+)/.exec(stdout)
      if (rps === null || p99 === null || requests === null) return reject(new Error(`unexpected wrk output:\n${stdout}`))
      const scale = p99[2] === "us" ? 0.001 : p99[2] === "s" ? 1000 : 1
      resolve({
        rps: Number(rps[1]),
        p99: Number(p99[1]) * scale,
        non2xx: non2xx === null ? 0 : Number(non2xx[1]),
        cpuUs: (used.user + used.system) / Number(requests[1]),
      })
    })
  })

// Without wrk there is nothing to measure with (a Node load generator would be the bottleneck).
if (spawnSync("wrk", ["-v"]).error !== undefined) {
  console.log("fleet edge bench: skipped, `wrk` is not installed (Debian: apt-get install wrk)")
  process.exit(0)
}

// The coordinator's build (FLEET_COORDINATOR=dist, the default) or its source; this may run the script again in a child.
const mode = await coordinatorInProcess(fileURLToPath(import.meta.url))
const { startCoordinator } = await import("@engram/coordinator")
const { StoreSim } = await import("@engram/store-sim")
const report = (row: Row): void => reportRow({ ...row, settings: { coordinator: mode } })
console.log(`fleet edge bench: the coordinator from ${mode === "dist" ? "its build (dist)" : "its source under tsx"} (FLEET_COORDINATOR=${mode})`)

const bare = http.createServer((_req, res) => {
  res.writeHead(200, { "content-type": "application/json" })
  res.end('{"status":"ok"}')
})
await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r))
const node = await wrk([`http://127.0.0.1:${(bare.address() as AddressInfo).port}/livez`])
await new Promise((r) => bare.close(r))

const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Warn", config: { port: 0, adminToken: "edge-bench-admin-token-0123456789" } })
try {
  const edge = await wrk([`${c.url}/livez`])
  const load = `load ${loadavg()[0]!.toFixed(1)}`
  report({ bench: "fleet", figure: `/livez req/s, wrk ${CONNECTIONS} connections (${load})`, value: edge.rps, unit: "/s", ratio: edge.rps / node.rps, baseline: `bare node:http ${node.rps.toFixed(0)}/s`, goal: ">= 0.5x" })
  report({ bench: "fleet", figure: `/livez p99, wrk ${CONNECTIONS} connections`, value: edge.p99, unit: "ms", ratio: edge.p99 / node.p99, baseline: `bare node:http ${node.p99.toFixed(1)} ms` })
  // The same comparison in CPU: bare node:http's CPU per request over the coordinator's (≥ 0.5 is the goal's 0.5× rate on a core of its own).
  report({ bench: "fleet", figure: "/livez CPU per request", value: edge.cpuUs, unit: "µs", ratio: node.cpuUs / edge.cpuUs, baseline: `bare node:http ${node.cpuUs.toFixed(1)} µs (ratio: bare ÷ this)` })
  // One host (its token) and one session to read.
  const call = async (method: string, path: string, token: string, body: unknown) => {
    const r = await fetch(`${c.url}${path}`, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) })
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`)
    return (await r.json()) as Record<string, unknown>
  }
  const hostToken = String((await call("POST", "/v1/hosts", c.adminToken, { id: "edge-h0" }))["token"])
  await call("PUT", "/v1/hosts/edge-h0/report", hostToken, { totalMib: 65536, allocatableMib: 65536, totalVcpus: 64 })
  await call("POST", "/v1/sessions", c.adminToken, { id: "edge-s0", memMib: 256, vcpus: 1 })
  const read = await wrk(["-H", `authorization: Bearer ${hostToken}`, `${c.url}/v1/sessions/edge-s0`])
  if (read.non2xx > 0) throw new Error(`GET /v1/sessions/edge-s0: ${read.non2xx} answers were not 2xx`)
  report({
    bench: "fleet",
    figure: `GET /v1/sessions/:id (host token) req/s, wrk ${CONNECTIONS} connections (load ${loadavg()[0]!.toFixed(1)})`,
    value: read.rps,
    unit: "/s",
    ratio: read.rps / node.rps,
    baseline: `bare node:http ${node.rps.toFixed(0)}/s`,
  })
  report({ bench: "fleet", figure: "GET /v1/sessions/:id CPU per request", value: read.cpuUs, unit: "µs", ratio: node.cpuUs / read.cpuUs, baseline: `bare node:http ${node.cpuUs.toFixed(1)} µs (ratio: bare ÷ this)` })
} finally {
  await c.stop()
}
