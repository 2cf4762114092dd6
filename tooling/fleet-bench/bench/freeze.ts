/**
 * The freeze drill: a fleet of N agents, each host running one session, while a peer hangs
 * instead of dying (SIGSTOP, then SIGCONT), longer than the heartbeat stale window. It counts the
 * sessions lost (reclaimed: their agents would destroy the guests) after the thaw, against the
 * same drill with the failover grace off (`ENGRAM_RECLAIM_GRACE_MS=0`, the seed's rule) as the
 * baseline of the same run.
 *
 * Variants (`FREEZE_VARIANTS`, default all five, in this order):
 * - `coordinator`: the coordinator process frozen, the grace at its default (the stale window);
 * - `coordinator-nograce`: the same with `ENGRAM_RECLAIM_GRACE_MS=0`;
 * - `restart`, `restart-nograce`: the coordinator killed (SIGKILL: agents' requests fail
 *   meanwhile) and started again on the same database and port after the same time;
 * - `postgres`: every process of the PostgreSQL server frozen (the coordinator's store calls
 *   time out: heartbeats fail, the reaper's reads fail), the grace at its default;
 * - `leader` (not in the default list): three replicas on the database, the agents on one that
 *   does not lead (as a proxy would route around a frozen replica), the leading one frozen:
 *   another takes the lease, and the thawed one must change nothing (its writes are fenced).
 *
 * Each variant: a fresh database and coordinator; N hosts registered and reported; N sessions
 * created (one fits a host) and started; the agents (`driver.ts`: heartbeat every third of the
 * window, reports, long-polls) run until the coordinator's own start-up grace is over; the peer is
 * frozen for `FREEZE_SECONDS`; after the thaw the drill waits for the grace and the stale window
 * (plus a few passes) and reads how many sessions are `lost`, how many reservations the reaper
 * reclaimed and how many graces it began.
 *
 * Knobs: FREEZE_AGENTS (10000), FREEZE_STALE_MS (the coordinator's
 * `ENGRAM_HEARTBEAT_STALE_WINDOW_MS`, 60000; agents heartbeat at a third of it), FREEZE_SECONDS
 * (1.5 × the window), FREEZE_VARIANTS, FLEET_COORDINATOR (`dist` by default, or `source`: see main.ts).
 */
import { coordinatorToRun } from "@engram/bench"
import { createDatabase, freePort, startEmbeddedPostgres } from "@engram/test-pg"
import { closeRequests, inParallel, metricValue, registerHosts, request, sleep, spawnCoordinator, startDriver } from "./harness.js"
import { execFileSync } from "node:child_process"
import { readFileSync } from "node:fs"
import { loadavg } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, "..", "..", "..")
const env = process.env
const AGENTS = Number(env["FREEZE_AGENTS"] ?? 10_000)
const STALE_MS = Number(env["FREEZE_STALE_MS"] ?? 60_000)
const FREEZE_MS = Number(env["FREEZE_SECONDS"] ?? (1.5 * STALE_MS) / 1000) * 1000
const VARIANTS = (env["FREEZE_VARIANTS"] ?? "coordinator,coordinator-nograce,restart,restart-nograce,postgres").split(",").filter(Boolean)
const REAPER_MS = 5_000
/** FLEET_COORDINATOR: `dist` (default, built now) or `source`, as in main.ts. */
const coordinator = coordinatorToRun(root, "FLEET_COORDINATOR")
const TOKEN = "fleet-bench-admin-token-0123456789"
const hostReport = { totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 }
/** A session one host holds alone: two never fit on one host. */
const sessionBudget = { memMib: 160 * 1024, vcpus: 1 }

const log = (text: string) => console.log(`${new Date().toISOString().slice(11, 19)} ${text}`)
const load = () => loadavg().map((l) => l.toFixed(1)).join(" ")

// ---- HTTP (set-up and reads) -----------------------------------------------------------------

const call = (url: string, method: string, path: string, body?: unknown) => request(url, method, path, TOKEN, body, 120_000)
const json = async <A>(url: string, method: string, path: string, expect: number, body?: unknown): Promise<A> => {
  const r = await call(url, method, path, body)
  if (r.status !== expect) throw new Error(`${method} ${path}: ${r.status} ${r.text.slice(0, 300)}`)
  return JSON.parse(r.text) as A
}

const metric = (url: string, name: string): Promise<number> => metricValue(url, TOKEN, name)

/** How many sessions are in `state` (paged reads). */
const countSessions = async (url: string, state: string): Promise<number> => {
  let n = 0
  let cursor: string | null = null
  do {
    const page: { items: unknown[]; nextCursor: string | null } = await json(url, "GET", `/v1/sessions?state=${state}&limit=1000${cursor === null ? "" : `&cursor=${encodeURIComponent(cursor)}`}`, 200)
    n += page.items.length
    cursor = page.nextCursor
  } while (cursor !== null)
  return n
}

// ---- processes -------------------------------------------------------------------------------

const startCoordinator = async (databaseUrl: string, extra: Record<string, string>, port: number) => {
  const { url, child, stop } = await spawnCoordinator({
    run: coordinator,
    port,
    env: {
      ...env,
      ENGRAM_ADMIN_TOKEN: TOKEN,
      ENGRAM_DATABASE_URL: databaseUrl,
      ENGRAM_LOG_LEVEL: "Warn",
      ENGRAM_LOG_FORMAT: "json",
      ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(STALE_MS),
      ENGRAM_REAPER_INTERVAL_MS: String(REAPER_MS),
      ...extra,
    },
  })
  return { url, pid: child.pid as number, port, stop }
}

/** The PostgreSQL server's processes: its postmaster (first line of `postmaster.pid`) and every child of it. */
const postgresPids = (dataDir: string): number[] => {
  const postmaster = Number(readFileSync(join(dataDir, "postmaster.pid"), "utf8").split("\n")[0])
  const children = execFileSync("pgrep", ["-P", String(postmaster)], { encoding: "utf8" }).split("\n").filter(Boolean).map(Number)
  return [postmaster, ...children]
}

// ---- one variant -----------------------------------------------------------------------------

interface Outcome {
  readonly variant: string
  readonly lostBefore: number
  readonly lost: number
  readonly running: number
  readonly reclaimed: number
  readonly graces: number
  readonly heartbeatErrors: number
}

const runVariant = async (variant: string, serverUrl: string, dataDir: string): Promise<Outcome> => {
  const db = await createDatabase(serverUrl)
  const extra: Record<string, string> = variant.endsWith("-nograce") ? { ENGRAM_RECLAIM_GRACE_MS: "0" } : {}
  let coordinator = await startCoordinator(db.url, extra, await freePort())
  // `leader`: three replicas on the database; the agents and the drill talk to one that does not
  // hold the reaper's lease (as a proxy in front of them would route around a frozen one), and
  // the leader is frozen.
  const peers = variant === "leader" ? [await startCoordinator(db.url, extra, await freePort()), await startCoordinator(db.url, extra, await freePort())] : []
  const replicas = () => [coordinator, ...peers]
  const leaderOf = async () => {
    for (let k = 0; k < 600; k++) {
      for (const r of replicas()) if ((await metric(r.url, "engram_reaper_leader")) === 1) return r
      await sleep(100)
    }
    throw new Error("no replica took the reaper's lease in 60 s")
  }
  const frozenLeader = variant === "leader" ? await leaderOf() : null
  const url = frozenLeader === null ? coordinator.url : (replicas().find((r) => r !== frozenLeader) as typeof coordinator).url
  const driver = startDriver()
  try {
    log(`${variant}: registering ${AGENTS} hosts and starting a session on each (load ${load()})`)
    const agents = await registerHosts(url, TOKEN, AGENTS, "fz", hostReport)
    // The agents run before any session is placed, as real ones do: a session's reservation is
    // renewed by its host's heartbeats from its placement on.
    await driver.send({ cmd: "agents", url, agents, pollWaitMs: 20_000, heartbeatMs: Math.floor(STALE_MS / 3), reportMs: 30_000, sharedSockets: 64 })
    // Few creates in flight: a coordinator saturated by creates answers heartbeats late, and the
    // generator's shared pool (one process for every agent, unlike a real fleet) queues them
    // behind each other past the stale window.
    await inParallel(AGENTS, 8, async (i) => {
      const placed = await json<{ state: string; hostId?: string }>(url, "POST", "/v1/sessions", 201, { id: `fs${String(i).padStart(5, "0")}`, ...sessionBudget })
      if (placed.state !== "pending") throw new Error(`session ${i}: ${JSON.stringify(placed)}`)
      await json(url, "POST", `/v1/sessions/fs${String(i).padStart(5, "0")}/started`, 200)
    })
    const running0 = await countSessions(url, "running")
    if (running0 !== AGENTS) {
      const states = ["pending", "running", "lost", "queued", "idle", "parked", "ended"]
      const counts = await Promise.all(states.map(async (st) => `${st} ${await countSessions(url, st)}`))
      throw new Error(`${running0} sessions running, expected ${AGENTS}: ${counts.join(", ")}`)
    }
    // The coordinator's own start-up grace (the stale window) and a heartbeat round of every agent.
    log(`${variant}: ${AGENTS} sessions running; agents up, waiting out the start-up grace (${STALE_MS / 1000} s + 2 passes)`)
    await sleep(STALE_MS + 2 * REAPER_MS)
    const lostBefore = await countSessions(url, "lost")
    const setup = await driver.send<{ heartbeats: number; heartbeatErrors: number; heartbeatTotal: unknown; heartbeatTimeline: string }>({ cmd: "stats" })
    log(`${variant}: before the freeze: ${lostBefore} lost; heartbeats ${setup.heartbeats}, failed ${setup.heartbeatErrors}, due → answered ${JSON.stringify(setup.heartbeatTotal)} ms`)
    if (env["FREEZE_TIMELINE"] === "1") log(`${variant}: heartbeats by 5 s of their due time (count/worst answer ms/worst lag ms): ${setup.heartbeatTimeline}`)
    await driver.send({ cmd: "reset" })

    if (variant.startsWith("restart")) {
      log(`${variant}: killing the coordinator (SIGKILL), restarting it on the same database and port after ${FREEZE_MS / 1000} s (load ${load()})`)
      process.kill(coordinator.pid, "SIGKILL")
      await sleep(FREEZE_MS)
      coordinator = await startCoordinator(db.url, extra, coordinator.port)
      log(`${variant}: restarted; waiting a grace, a stale window and 3 passes`)
    } else {
      const pids = variant === "postgres" ? postgresPids(dataDir) : [(frozenLeader ?? coordinator).pid]
      const what = variant === "postgres" ? `PostgreSQL (${pids.length} processes)` : frozenLeader !== null ? "the leading replica of three" : "the coordinator"
      log(`${variant}: freezing ${what} for ${FREEZE_MS / 1000} s (load ${load()})`)
      for (const pid of pids) process.kill(pid, "SIGSTOP")
      await sleep(FREEZE_MS)
      for (const pid of pids) process.kill(pid, "SIGCONT")
      log(`${variant}: thawed; waiting a grace, a stale window and 3 passes`)
    }
    // The grace that begins at the thaw (the stale window), then a stale window for any host that
    // really stopped, then passes to act on it.
    await sleep(2 * STALE_MS + 3 * REAPER_MS)
    const stats = await driver.send<{ heartbeatErrors: number }>({ cmd: "stats" })
    const outcome: Outcome = {
      variant,
      lostBefore,
      lost: await countSessions(url, "lost"),
      running: await countSessions(url, "running"),
      // Summed over the replicas: whichever led meanwhile reclaimed and began graces.
      reclaimed: (await Promise.all(replicas().map((r) => metric(r.url, "engram_reaper_reclaimed_total")))).reduce((a, b) => a + b, 0),
      graces: (await Promise.all(replicas().map((r) => metric(r.url, "engram_reaper_reclaim_graces_total")))).reduce((a, b) => a + b, 0),
      heartbeatErrors: stats.heartbeatErrors,
    }
    log(`${variant}: ${JSON.stringify(outcome)} (load ${load()})`)
    return outcome
  } finally {
    await driver.stop()
    await Promise.all(replicas().map((r) => r.stop()))
    await db.drop()
  }
}

// ---- main ------------------------------------------------------------------------------------

const server = await startEmbeddedPostgres()
const outcomes: Outcome[] = []
try {
  for (const variant of VARIANTS) outcomes.push(await runVariant(variant, server.url, server.dataDir))
} finally {
  closeRequests()
  await server.stop()
}
console.log(`\nfreeze drill: ${AGENTS} agents, one running session each, stale window ${STALE_MS / 1000} s, frozen ${FREEZE_MS / 1000} s; the coordinator from ${coordinator.mode === "dist" ? "its build, node dist/main.js" : "its source under tsx"} (FLEET_COORDINATOR=${coordinator.mode})\n`)
console.log("| peer | grace | sessions lost before the freeze | sessions lost after | running after | reservations reclaimed | graces begun | heartbeats failed |")
console.log("|---|---|---|---|---|---|---|---|")
for (const o of outcomes) {
  const frozen =
    o.variant === "postgres" ? "PostgreSQL frozen" : o.variant === "leader" ? "leading replica of three frozen" : o.variant.startsWith("restart") ? "coordinator killed, restarted" : "coordinator frozen"
  const grace = o.variant.endsWith("-nograce") ? "0 (off)" : "default"
  console.log(`| ${frozen} | ${grace} | ${o.lostBefore} | ${o.lost} | ${o.running} | ${o.reclaimed} | ${o.graces} | ${o.heartbeatErrors} |`)
}
