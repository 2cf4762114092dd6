/**
 * The HTTP edge against Node's own speed: `wrk` (a C load generator: a Node one tops out below
 * what it measures here) on a bare `node:http` server answering `/livez`, then on a coordinator's
 * `/livez` (the in-memory store), both served by this process, same connections, same run.
 *
 *   tsx --conditions=@engram/source bench/edge.ts   (EDGE_SECONDS=10, EDGE_CONNECTIONS=64; needs `wrk`)
 */
import { report } from "@engram/bench"
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { execFile, spawnSync } from "node:child_process"
import http from "node:http"
import type { AddressInfo } from "node:net"
import { loadavg } from "node:os"

const SECONDS = Number(process.env["EDGE_SECONDS"] ?? 10)
const CONNECTIONS = Number(process.env["EDGE_CONNECTIONS"] ?? 64)

/** wrk's requests/s and p99 (ms) on `url`. */
const wrk = (url: string): Promise<{ rps: number; p99: number }> =>
  new Promise((resolve, reject) => {
    execFile("wrk", ["-t2", `-c${CONNECTIONS}`, `-d${SECONDS}s`, "--latency", url], (error, stdout) => {
      if (error !== null) return reject(new Error(`wrk failed (is it installed? apt-get install wrk): ${error.message}`))
      const rps = /Requests\/sec:\s+([\d.]+)/.exec(stdout)
      const p99 = /99%\s+([\d.]+)(us|ms|s)/.exec(stdout)
      if (rps === null || p99 === null) return reject(new Error(`unexpected wrk output:\n${stdout}`))
      const scale = p99[2] === "us" ? 0.001 : p99[2] === "s" ? 1000 : 1
      resolve({ rps: Number(rps[1]), p99: Number(p99[1]) * scale })
    })
  })

// Without wrk there is nothing to measure with (a Node load generator would be the bottleneck).
if (spawnSync("wrk", ["-v"]).error !== undefined) {
  console.log("fleet edge bench: skipped, `wrk` is not installed (Debian: apt-get install wrk)")
  process.exit(0)
}

const bare = http.createServer((_req, res) => {
  res.writeHead(200, { "content-type": "application/json" })
  res.end('{"status":"ok"}')
})
await new Promise<void>((r) => bare.listen(0, "127.0.0.1", r))
const node = await wrk(`http://127.0.0.1:${(bare.address() as AddressInfo).port}/livez`)
await new Promise((r) => bare.close(r))

const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Warn", config: { port: 0, adminToken: "edge-bench-admin-token-0123456789" } })
try {
  const edge = await wrk(`${c.url}/livez`)
  const load = `load ${loadavg()[0]!.toFixed(1)}`
  report({ bench: "fleet", figure: `/livez req/s, wrk ${CONNECTIONS} connections (${load})`, value: edge.rps, unit: "/s", ratio: edge.rps / node.rps, baseline: `bare node:http ${node.rps.toFixed(0)}/s`, goal: ">= 0.5x" })
  report({ bench: "fleet", figure: `/livez p99, wrk ${CONNECTIONS} connections`, value: edge.p99, unit: "ms", ratio: edge.p99 / node.p99, baseline: `bare node:http ${node.p99.toFixed(1)} ms` })
} finally {
  await c.stop()
}
