/**
 * Memory per waiter: a coordinator in this process (the in-memory store, real HTTP), N agents'
 * assignments long-polls held open by another process (`driver.ts`), and this process's JS heap
 * after a full collection before and after they open: what one open long-poll costs (its
 * request and socket, its fiber and watch, its revocation watch, the host's credential and
 * assignments kept in memory). Run with `node --expose-gc`.
 *
 *   tsx --conditions=@engram/source --expose-gc bench/waiter-memory.ts   (WAITERS=2000; WAITER_CENSUS=1;
 *   FLEET_COORDINATOR=dist, the default: the coordinator's build, made now; `source`: its sources under tsx)
 */
import { report } from "@engram/bench"
import { census, growth } from "./heap-census.js"
import { coordinatorInProcess } from "./harness.js"
import { spawn } from "node:child_process"
import http from "node:http"
import { dirname, join } from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))
const N = Number(process.env["WAITERS"] ?? 2000)
/** `WAITER_CENSUS=1`: also print what the open long-polls hold, kind by kind (a heap snapshot before and after). */
const CENSUS = process.env["WAITER_CENSUS"] === "1"
const TOKEN = "waiter-memory-admin-token-0123456789"
const gc = (globalThis as { gc?: () => void }).gc
if (gc === undefined) throw new Error("run with node --expose-gc")

const heapMib = (): number => {
  for (let i = 0; i < 3; i++) gc()
  return process.memoryUsage().heapUsed / 1024 / 1024
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 32 })
const call = (url: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> =>
  new Promise((resolve, reject) => {
    const u = new URL(url)
    const text = body === undefined ? undefined : JSON.stringify(body)
    const headers: Record<string, string | number> = { authorization: `Bearer ${TOKEN}` }
    if (text !== undefined) Object.assign(headers, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
    const req = http.request({ agent, host: u.hostname, port: u.port, method, path, headers }, (res) => {
      let data = ""
      res.on("data", (c: Buffer) => (data += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, json: data === "" ? null : (JSON.parse(data) as unknown) }))
    })
    req.on("error", reject)
    req.end(text)
  })

// The coordinator's build (FLEET_COORDINATOR=dist, the default) or its source; this may run the script again in a child.
const mode = await coordinatorInProcess(fileURLToPath(import.meta.url))
const { startCoordinator } = await import("@engram/coordinator")
const { StoreSim } = await import("@engram/store-sim")
console.log(`waiter memory: the coordinator from ${mode === "dist" ? "its build (dist)" : "its source under tsx"} (FLEET_COORDINATOR=${mode})`)
const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Warn", config: { port: 0, adminToken: TOKEN } })
const driver = spawn(process.execPath, ["--import", "tsx", join(here, "driver.ts")], { stdio: ["pipe", "pipe", "inherit"] })
const answers = createInterface({ input: driver.stdout })[Symbol.asyncIterator]()
try {
  const agents: { id: string; token: string }[] = []
  for (let i = 0; i < N; i++) {
    const id = `m${i}`
    const r = await call(c.url, "POST", "/v1/hosts", { id })
    await call(c.url, "PUT", `/v1/hosts/${id}/report`, { totalMib: 65_536, allocatableMib: 65_536, totalVcpus: 16 })
    agents.push({ id, token: (r.json as { token: string }).token })
  }
  // Each host's assignments read once (as an agent's first poll does), so the copies are in both figures.
  for (const a of agents) await call(c.url, "GET", `/v1/hosts/${a.id}/assignments`)
  const before = heapMib()
  const mem0 = process.memoryUsage()
  const census0 = CENSUS ? await census() : null
  // Polls only: heartbeats and reports far apart (they would otherwise run during the measure).
  driver.stdin.write(`${JSON.stringify({ id: 0, cmd: "agents", url: c.url, agents, sharedSockets: 8, pollWaitMs: 30_000, heartbeatMs: 3_600_000, reportMs: 3_600_000 })}\n`)
  await answers.next()
  for (let i = 0; i < 200; i++) {
    driver.stdin.write(`${JSON.stringify({ id: 1, cmd: "stats" })}\n`)
    const s = JSON.parse(((await answers.next()).value as string) ?? "{}") as { value: { pollsOpen: number; polls: number } }
    if (s.value.polls >= N && s.value.pollsOpen >= N) break
    await new Promise((r) => setTimeout(r, 100))
  }
  await new Promise((r) => setTimeout(r, 1000))
  const during = heapMib()
  const mem1 = process.memoryUsage()
  const mib = (n: number) => `${(n / 1024 / 1024).toFixed(0)} MiB`
  console.log(
    `memory before → with ${N} polls open (this process: the coordinator; after GC): ` +
      (["rss", "heapTotal", "heapUsed", "external", "arrayBuffers"] as const).map((k) => `${k} ${mib(mem0[k])} → ${mib(mem1[k])}`).join(", "),
  )
  const perWaiterKiB = ((during - before) * 1024) / N
  if (census0 !== null) {
    console.log(`what one open long-poll holds (objects and bytes per poll, by kind; ${N} open):`)
    const census1 = await census()
    for (const [kind, count, bytes] of growth(census0, census1, N, Number(process.env["WAITER_CENSUS_TOP"] ?? 30))) console.log(`  ${bytes.toFixed(0).padStart(7)} B ${count.toFixed(2).padStart(7)} × ${kind}`)
    const all = growth(census0, census1, N, Number.POSITIVE_INFINITY)
    const total = (rows: readonly [string, number, number][]) => rows.reduce((sum, [, , bytes]) => sum + bytes, 0)
    // Every kind's growth summed (kinds that shrank included), and the same without V8's own (`hidden`, `synthetic`, code, shapes).
    const ownKinds = all.filter(([kind]) => !/^(hidden|synthetic|code|object shape)/.test(kind))
    console.log(`  total: ${(total(all) / 1024).toFixed(2)} KiB per poll; objects (without V8's hidden, synthetic, code and shapes): ${(total(ownKinds) / 1024).toFixed(2)} KiB`)
  }
  report({ bench: "fleet", figure: `JS heap per open assignments long-poll (${N} open, after GC)`, value: perWaiterKiB, unit: "KiB", baseline: `heap ${before.toFixed(1)} → ${during.toFixed(1)} MiB`, settings: { coordinator: mode } })
} finally {
  // The driver gone first, so its open polls are not cut off by the coordinator's shutdown.
  const exited = new Promise((r) => driver.once("exit", r))
  driver.stdin.write(`${JSON.stringify({ id: 2, cmd: "stop" })}\n`)
  await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))])
  agent.destroy()
  await c.stop()
}
