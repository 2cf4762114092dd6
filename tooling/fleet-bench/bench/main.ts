/**
 * fleet bench: a fleet of simulated host agents held against a coordinator process, on
 * PostgreSQL and on PGlite, each figure beside its baseline from the same run:
 *
 *   a. the scale curve (1,000 / 5,000 / 10,000 agents): database transactions/s with the fleet
 *      idle (PostgreSQL: `pg_stat_database`) against the fleet's heartbeat requests/s, ordinary
 *      request p50/p99 with the fleet against the same requests without it, the coordinator's RSS
 *      and CPU; every long-poll's answer against its bound;
 *   b. 2,000 concurrent waits (1,000 session waits and 1,000 assignments long-polls): every
 *      answer against its bound + 1 s, and session creates meanwhile against creates without them.
 *
 * The agents and the probes run in another process (`driver.ts`, on raw keep-alive sockets: `raw-http.ts`; each agent's
 * long-poll holds a connection of its own, heartbeats and reports share a keep-alive pool).
 *
 * Knobs: FLEET_CURVE (agents per step, default 1000,5000,10000), FLEET_BACKENDS (postgres,pglite),
 * FLEET_WINDOW_SECONDS (the idle window, default 30), FLEET_PROBE_SECONDS (10), FLEET_WAITS
 * (2000; 0 skips b), FLEET_WAIT_MS (bound of each wait, 20000), FLEET_SKIP (a,b), FLEET_BREAKDOWN=1
 * (PostgreSQL logs every statement; each idle window prints its transactions by kind, `breakdown.ts`),
 * FLEET_CPU_PROFILE=<prefix> (with FLEET_STAGES=1: the coordinator's CPU profile of the connect phase and of the idle window, `stages.ts`),
 * FLEET_STAGES=1 (the coordinator loads `stages.ts`: its event-loop delay, each request's time by kind and each
 * grouped write's wait and statement, its memory and the collector's pauses, printed per step beside the generator's own lag;
 * with FLEET_ALLOC_PROFILE=<file> also every allocation of the idle window, as a `.heapprofile`), FLEET_COORDINATOR_ROOT (the checkout whose coordinator runs, default this one: a baseline run of
 * another branch beside this one; its coordinator is built there first), FLEET_COORDINATOR (`dist`, the default: the coordinator as it
 * ships, `node dist/main.js`, built first with turbo; `source`: `src/main.ts` under tsx, whose esbuild `keepNames` and source maps
 * add allocation per request; a build that fails falls back to the source, saying so, unless `dist` was asked for), FLEET_COORDINATOR_FLAGS (Node flags of the coordinator process), FLEET_COORDINATOR_STDOUT=<file> (its stdout appended there:
 * what `--trace-gc-nvp` prints).
 */
import { coordinatorToRun, report as reportRow } from "@engram/bench"
import type { Row } from "@engram/bench"
import { makeBreakdown, statementLogSettings } from "./breakdown.js"
import { closeRequests, cpuSecondsOf, inParallel, metricValue, registerHosts, request, sleep, spawnCoordinator, startDriver } from "./harness.js"
import type { Agent } from "./harness.js"
import { createDatabase, freePort, startEmbeddedPostgres } from "@engram/test-pg"
import type { EmbeddedPostgresServer } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { cpus, loadavg, tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, "..", "..", "..")
const env = process.env
const CURVE = (env["FLEET_CURVE"] ?? "1000,5000,10000").split(",").map(Number).filter((n) => n > 0)
const BACKENDS = (env["FLEET_BACKENDS"] ?? "postgres,pglite").split(",").filter(Boolean)
const WINDOW_S = Number(env["FLEET_WINDOW_SECONDS"] ?? 30)
const PROBE_S = Number(env["FLEET_PROBE_SECONDS"] ?? 10)
const WAITS = Number(env["FLEET_WAITS"] ?? 2000)
const WAIT_MS = Number(env["FLEET_WAIT_MS"] ?? 20_000)
const BREAKDOWN = env["FLEET_BREAKDOWN"] === "1"
const breakdown = makeBreakdown()
const coordinatorRoot = env["FLEET_COORDINATOR_ROOT"] ?? root
/** FLEET_COORDINATOR: `dist` (default; that checkout's build, made now) or `source` (its src/main.ts under tsx). */
const coordinator = coordinatorToRun(coordinatorRoot, "FLEET_COORDINATOR")
/** Node flags of the coordinator process (e.g. `--max-old-space-size=768`: how its RSS answers a heap cap). */
const coordinatorFlags = (env["FLEET_COORDINATOR_FLAGS"] ?? "").split(" ").filter(Boolean)
/** Load `stages.ts` into the coordinator: its event-loop delay, each request's time by kind and each grouped write's wait and statement, printed per step. */
const STAGES = env["FLEET_STAGES"] === "1"
const skip = new Set((env["FLEET_SKIP"] ?? "").split(",").filter(Boolean))
const TOKEN = "fleet-bench-admin-token-0123456789"
const bench = "fleet"
const report = (row: Row): void => reportRow({ ...row, settings: { coordinator: coordinator.mode } })
/** The agent's defaults (apps/host-agent: a third of the 2 min stale window, 30 s, 20 s). */
const agentTiming = { heartbeatMs: 40_000, reportMs: 30_000, pollWaitMs: 20_000 }
const hostReport = { totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 }

// ---- the coordinator process ----------------------------------------------------------------

interface Coordinator {
  readonly url: string
  /** Resident set size now (MiB). */
  readonly rssMib: () => number
  /** CPU seconds used so far (user + system). */
  readonly cpuSeconds: () => number
  readonly stop: () => Promise<void>
  /** Its warnings so far that its change listener lost or failed a check (each empties its copies in memory: credentials, assignments). */
  readonly listenerWarnings: () => number
  /** With `FLEET_STAGES=1`: the probe's figures since its last reset (`stages.ts`), or resets them. */
  readonly stages: (reset: boolean) => Promise<unknown>
}

const startCoordinator = async (extra: Record<string, string>): Promise<Coordinator> => {
  const port = await freePort()
  const stagesPort = STAGES ? await freePort() : 0
  let listenerWarnings = 0
  const { url, child, stop } = await spawnCoordinator({
    run: coordinator,
    port,
    flags: coordinatorFlags,
    preload: STAGES ? [join(here, "stages.ts")] : [],
    env: { ...env, ENGRAM_ADMIN_TOKEN: TOKEN, ENGRAM_LOG_LEVEL: "Warn", ENGRAM_LOG_FORMAT: "json", FLEET_STAGES_PORT: String(stagesPort), ...extra },
    onStderr: (text) => (listenerWarnings += text.split("change listener").length - 1),
  })
  return {
    url,
    rssMib: () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.pid}/status`, "utf8"))?.[1]) / 1024,
    cpuSeconds: () => cpuSecondsOf(child.pid),
    listenerWarnings: () => listenerWarnings,
    stages: async (reset) => (STAGES ? (await call(`http://127.0.0.1:${stagesPort}`, reset ? "POST" : "GET", "/", "")).json : null),
    stop,
  }
}

/**
 * The kernel's count of connections dropped because a listen queue was full (`ListenOverflows`,
 * every listener of the machine's network namespace): a connection dropped so waits for the
 * server's SYN-ACK retransmits (1, 2, 4, 8 s…) before its first request is even read.
 */
const listenOverflows = (): number => {
  const [names, values] = readFileSync("/proc/net/netstat", "utf8").split("\n")
  const i = names?.split(" ").indexOf("ListenOverflows") ?? -1
  return i < 0 ? Number.NaN : Number(values?.split(" ")[i])
}

// ---- HTTP from here (set-up only) ------------------------------------------------------------

const call = async (url: string, method: string, path: string, token: string, body?: unknown): Promise<{ status: number; json: unknown }> => {
  const r = await request(url, method, path, token, body)
  return { status: r.status, json: r.text === "" ? null : (JSON.parse(r.text) as unknown) }
}
const get = (url: string, path: string, token: string) => call(url, "GET", path, token)

interface Latency {
  readonly count: number
  readonly p50: number
  readonly p99: number
  readonly max: number
  readonly failures?: number
}

interface AgentStats {
  readonly polls: number
  readonly pollErrors: number
  readonly heartbeats: number
  readonly heartbeatErrors: number
  readonly reports: number
  readonly reportErrors: number
  readonly pollsOpen: number
  readonly latePolls: number
  readonly maxPollOverMs: number
  readonly pollErrorStatuses: Record<string, number>
  readonly pollErrorSample: readonly string[]
  readonly heartbeatLatency: Latency
  readonly heartbeatSendLag: Latency
  readonly heartbeatTotal: Latency
  readonly heartbeatTimeline: string
  readonly freshHeartbeats: { readonly count: number; readonly maxAnswerMs: number; readonly over1s: number }
  readonly reusedHeartbeats: { readonly count: number; readonly maxAnswerMs: number; readonly over1s: number }
  readonly loopDelay: { readonly p50: number; readonly p99: number; readonly max: number }
}

/** The coordinator's JS heap in use (MiB), from its own metrics. */
const heapUsedMib = (url: string): Promise<number> => heapMetricMib(url, "nodejs_heap_size_used_bytes")
/** The coordinator's JS heap reserved (MiB), from its own metrics. */
const heapTotalMib = (url: string): Promise<number> => heapMetricMib(url, "nodejs_heap_size_total_bytes")
const heapMetricMib = async (url: string, metric: string): Promise<number> => (await metricValue(url, TOKEN, metric)) / 1024 / 1024

/** The database's connections now (every process's: coordinator and bench) by state, wait event and statement. */
const activity = async (dbUrl: string): Promise<string> => {
  const sql = postgres(dbUrl, { max: 1, onnotice: () => undefined })
  try {
    const rows = await sql<{ state: string | null; wait: string | null; query: string; n: number }[]>`
      select state, wait_event as wait, left(regexp_replace(query, '\\s+', ' ', 'g'), 50) as query, count(*)::int as n
      from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()
      group by 1, 2, 3 order by 4 desc limit 8`
    return rows.map((r) => `${r.n}× ${r.state ?? "?"}/${r.wait ?? "-"} "${r.query}"`).join("; ")
  } finally {
    await sql.end()
  }
}

/** Committed and rolled-back transactions of the database so far. */
const transactions = async (dbUrl: string): Promise<number> => {
  const sql = postgres(dbUrl, { max: 1, onnotice: () => undefined })
  try {
    const [row] = await sql<{ n: string }[]>`select (xact_commit + xact_rollback)::text as n from pg_stat_database where datname = current_database()`
    return Number(row?.n)
  } finally {
    await sql.end()
  }
}

// ---- (a) the scale curve ------------------------------------------------------------------

const curveStep = async (backend: string, agents: number, server: EmbeddedPostgresServer | null): Promise<void> => {
  const db = server === null ? null : await createDatabase(server.url, { prefix: `fleet_${agents}` })
  const dir = server === null ? mkdtempSync(join(tmpdir(), "engram-fleet-bench-")) : null
  const coordinator = await startCoordinator(db !== null ? { ENGRAM_DATABASE_URL: db.url } : { ENGRAM_DATA_DIR: dir as string })
  const driver = startDriver()
  const label = `${backend}, ${agents.toLocaleString("en")} agents`
  try {
    const fleet = await registerHosts(coordinator.url, TOKEN, agents, "f", hostReport)
    const sessions: string[] = []
    for (let i = 0; i < 100; i++) {
      const r = await call(coordinator.url, "POST", "/v1/sessions", TOKEN, { id: `probe-${i}`, memMib: 1024, vcpus: 1 })
      if (r.status === 201) sessions.push(`probe-${i}`)
    }
    const paths = sessions.flatMap((s, i) => [`/v1/sessions/${s}`, `/v1/hosts/${fleet[i % fleet.length]?.id ?? ""}`])
    const probe = () => driver.send<Latency>({ cmd: "probe", url: coordinator.url, token: TOKEN, paths, concurrency: 4, durationMs: PROBE_S * 1000 })
    const quiet = await probe()
    const before = { rss: coordinator.rssMib(), heap: await heapUsedMib(coordinator.url) }

    await coordinator.stages(true)
    const overflows0 = listenOverflows()
    const connectLoad = loadavg()[0] ?? 0
    const connect0 = performance.now()
    const connectCpu0 = { coordinator: coordinator.cpuSeconds(), driver: driver.cpuSeconds() }
    await driver.send({ cmd: "agents", url: coordinator.url, agents: fleet, sharedSockets: 512, ...agentTiming })
    // Every agent's long-poll open and answered once (a first poll, without `since`, waits out its 20 s like any other).
    for (let i = 0; i < 600; i++) {
      const s = await driver.send<AgentStats>({ cmd: "stats" })
      if (s.pollsOpen >= agents && s.polls >= agents) break
      await sleep(500)
    }
    // The connect phase: every agent connected at once (a coordinator restart, a network blip),
    // until each one's first poll is answered (to the 0.5 s of the check above). A first poll
    // waits out its 20 s (nothing changes), so the figure is the last agent's wait to be read
    // plus that (up to 1 s less: a wait answers early by up to `earlyMs`).
    const connectSeconds = (performance.now() - connect0) / 1000
    const connectCpu = (now: number, before: number) => `${(((now - before) / connectSeconds) * 100).toFixed(0)} %`
    console.log(
      `${label}: every agent's first poll answered ${connectSeconds.toFixed(1)} s after they began connecting (load ${connectLoad.toFixed(1)} → ${(loadavg()[0] ?? 0).toFixed(1)}; ` +
        `CPU meanwhile: coordinator ${connectCpu(coordinator.cpuSeconds(), connectCpu0.coordinator)}, load generator ${connectCpu(driver.cpuSeconds(), connectCpu0.driver)} of a core; listen-queue overflows ${listenOverflows() - overflows0})`,
    )
    report({ bench, figure: `${label}: connect, every agent's first poll answered`, value: connectSeconds, unit: "s" })
    await sleep(5000)
    await driver.send({ cmd: "reset" })
    const startup = await coordinator.stages(false)
    if (startup !== null) console.log(`${label} inside the coordinator while the agents started (stages.ts): ${JSON.stringify(startup)}`)
    await coordinator.stages(true)
    const tx0 = db === null ? 0 : await transactions(db.url)
    breakdown.start()
    const cpu0 = coordinator.cpuSeconds()
    const driverCpu0 = driver.cpuSeconds()
    const t0 = performance.now()
    await sleep((WINDOW_S * 1000) / 2)
    if (db !== null) console.log(`${label}, mid-window: the coordinator's database connections by state and wait: ${await activity(db.url)}`)
    await sleep((WINDOW_S * 1000) / 2)
    const seconds = (performance.now() - t0) / 1000
    const tx1 = db === null ? 0 : await transactions(db.url)
    const kinds = breakdown.stop()
    const cpu1 = coordinator.cpuSeconds()
    const driverCpu1 = driver.cpuSeconds()
    if (BREAKDOWN && db !== null) {
      console.log(`${label} idle: transactions/s by their first statement (every database of the server):`)
      for (const k of kinds.slice(0, 20)) console.log(`  ${(k.count / seconds).toFixed(2).padStart(8)}/s  ${k.shape}`)
    }
    const idle = await driver.send<AgentStats>({ cmd: "stats" })
    const stages = await coordinator.stages(false)
    const heap = await heapUsedMib(coordinator.url)
    const heapTotal = await heapTotalMib(coordinator.url)
    const loaded = await probe()
    const rss = coordinator.rssMib()

    const heartbeatsPerSec = idle.heartbeats / seconds
    // The two reads of pg_stat_database are transactions too.
    const txPerSec = (tx1 - tx0 - 1) / seconds
    console.log(
      `${label}: ${idle.polls} polls, ${idle.heartbeats} heartbeats, ${idle.reports} reports in ${seconds.toFixed(0)} s; ` +
        `errors: polls ${idle.pollErrors} ${JSON.stringify(idle.pollErrorStatuses)} ${JSON.stringify(idle.pollErrorSample)}, heartbeats ${idle.heartbeatErrors}, reports ${idle.reportErrors}; ` +
        `polls answered past their bound + 1 s: ${idle.latePolls} (worst +${idle.maxPollOverMs.toFixed(0)} ms); heartbeat p99 ${idle.heartbeatLatency.p99.toFixed(1)} ms; ` +
        `change listener warnings so far ${coordinator.listenerWarnings()}`,
    )
    const ms = (l: Latency) => `p50 ${l.p50.toFixed(1)}, p99 ${l.p99.toFixed(1)}, max ${l.max.toFixed(0)} ms (${l.count})`
    console.log(
      `${label} heartbeats (load ${loadavg().map((l) => l.toFixed(1)).join(" ")}): written → answered ${ms(idle.heartbeatLatency)}; ` +
        `the generator's lag before writing (timer late + its pool's queue) ${ms(idle.heartbeatSendLag)}; due → answered ${ms(idle.heartbeatTotal)}; ` +
        `the generator's event-loop delay p99 ${idle.loopDelay.p99.toFixed(1)}, max ${idle.loopDelay.max.toFixed(0)} ms`,
    )
    console.log(`${label} heartbeats since the agents started, by 5 s of their due time (count/worst answer ms/worst lag before writing ms): ${idle.heartbeatTimeline}`)
    const kind = (k: AgentStats["freshHeartbeats"]) => `${k.count} (worst ${k.maxAnswerMs.toFixed(0)} ms, ${k.over1s} over 1 s)`
    console.log(`${label} heartbeats since the agents started: on a connection opened for them ${kind(idle.freshHeartbeats)}; on one already open ${kind(idle.reusedHeartbeats)}; the kernel's listen-queue overflows so far ${listenOverflows() - overflows0}`)
    if (stages !== null) console.log(`${label} inside the coordinator (stages.ts): ${JSON.stringify(stages)}`)
    if (db !== null) {
      report({
        bench,
        figure: `${label} idle: database transactions/s`,
        value: txPerSec,
        unit: "/s",
        ratio: txPerSec / Math.max(heartbeatsPerSec, 1e-9),
        baseline: `heartbeat requests ${heartbeatsPerSec.toFixed(0)}/s`,
        goal: `<= heartbeat writes/s + 10`,
      })
    }
    report({ bench, figure: `${label}: ordinary request p50 (4 in flight)`, value: loaded.p50, unit: "ms", ratio: loaded.p50 / quiet.p50, baseline: `no fleet ${quiet.p50.toFixed(1)} ms` })
    report({ bench, figure: `${label}: ordinary request p99 (4 in flight)`, value: loaded.p99, unit: "ms", ratio: loaded.p99 / quiet.p99, baseline: `no fleet ${quiet.p99.toFixed(1)} ms`, goal: "<= 2x" })
    report({ bench, figure: `${label}: coordinator RSS`, value: rss, unit: "MiB", ratio: rss / before.rss, baseline: `before the fleet ${before.rss.toFixed(0)} MiB`, goal: "<= 1024 MiB" })
    report({
      bench,
      figure: `${label}: JS heap per agent (its long-poll, connection, cached credential and assignments)`,
      value: ((heap - before.heap) * 1024) / agents,
      unit: "KiB",
      baseline: `heap ${before.heap.toFixed(0)} → ${heap.toFixed(0)} MiB`,
    })
    report({ bench, figure: `${label}: coordinator JS heap in use / reserved (no GC forced)`, value: heap, unit: "MiB", baseline: `reserved ${heapTotal.toFixed(0)} MiB` })
    report({ bench, figure: `${label} idle: coordinator CPU`, value: ((cpu1 - cpu0) / seconds) * 100, unit: "% of a core" })
    report({ bench, figure: `${label} idle: load generator CPU (its agents)`, value: ((driverCpu1 - driverCpu0) / seconds) * 100, unit: "% of a core" })
    report({ bench, figure: `${label} idle: long-polls past their bound + 1 s`, value: idle.latePolls, unit: "polls", goal: "0" })
  } finally {
    await driver.stop()
    await coordinator.stop()
    if (dir !== null) rmSync(dir, { recursive: true, force: true })
  }
}

// ---- (b) 2,000 concurrent waits ------------------------------------------------------------------

const concurrentWaits = async (server: EmbeddedPostgresServer): Promise<void> => {
  const db = await createDatabase(server.url, { prefix: "fleet_waits" })
  const coordinator = await startCoordinator({ ENGRAM_DATABASE_URL: db.url })
  const driver = startDriver()
  try {
    const half = Math.floor(WAITS / 2)
    const hosts = await registerHosts(coordinator.url, TOKEN, Math.max(half, 100), "w", hostReport)
    // Sessions that stay pending (no agent starts them): a wait for `running` runs to its bound.
    const sessions: string[] = []
    await inParallel(half, 32, async (i) => {
      const h = hosts[i % hosts.length] as Agent
      const r = await call(coordinator.url, "POST", "/v1/sessions", TOKEN, { id: `pending-${i}`, memMib: 256, vcpus: 1, affinity: [h.id] })
      if (r.status !== 201) throw new Error(`create pending-${i}: ${r.status}`)
      sessions.push(`pending-${i}`)
    })
    const polled = await Promise.all(
      hosts.slice(0, WAITS - half).map(async (h) => ({ ...h, version: ((await get(coordinator.url, `/v1/hosts/${h.id}/assignments`, h.token)).json as { version: string }).version })),
    )
    const creates = (prefix: string) => driver.send<Latency & { perSec: number }>({ cmd: "creates", url: coordinator.url, token: TOKEN, prefix, concurrency: 16, durationMs: PROBE_S * 1000 })
    const quiet = await creates("quiet")
    const waited = driver.send<{ waits: number; statuses: Record<string, number>; maxOverMs: number; p50OverMs: number; withinBound: number }>({
      cmd: "waits",
      url: coordinator.url,
      token: TOKEN,
      sessions,
      hosts: polled,
      timeoutMs: WAIT_MS,
    })
    await sleep(2000)
    const during = await creates("during")
    const w = await waited
    console.log(`waits: ${w.waits} answered, statuses ${JSON.stringify(w.statuses)}, worst ${w.maxOverMs.toFixed(0)} ms past the bound (p50 ${w.p50OverMs.toFixed(0)} ms)`)
    report({ bench, figure: `${w.waits} concurrent waits (${WAIT_MS / 1000} s): answered within bound + 1 s`, value: w.withinBound, unit: "waits", ratio: w.withinBound / w.waits, baseline: `${w.waits} waits`, goal: "all" })
    report({ bench, figure: `${w.waits} concurrent waits: latest answer past its bound`, value: w.maxOverMs, unit: "ms", goal: "<= 1000 ms" })
    report({ bench, figure: `creates p99 during ${w.waits} waits (16 in flight)`, value: during.p99, unit: "ms", ratio: during.p99 / quiet.p99, baseline: `without waits ${quiet.p99.toFixed(1)} ms`, goal: "<= 2x" })
    report({ bench, figure: `creates/s during ${w.waits} waits (16 in flight)`, value: during.perSec, unit: "/s", ratio: during.perSec / quiet.perSec, baseline: `without waits ${quiet.perSec.toFixed(0)}/s` })
  } finally {
    await driver.stop()
    await coordinator.stop()
  }
}

const main = async (): Promise<void> => {
  console.log(`fleet bench: the coordinator of ${coordinatorRoot} from ${coordinator.mode === "dist" ? "its build, node dist/main.js" : "its source under tsx"} (FLEET_COORDINATOR=${coordinator.mode})`)
  console.log(`fleet bench: ${cpus().length} cores, load ${loadavg().map((l) => l.toFixed(1)).join(" ")}; curve ${CURVE.join(", ")} agents on ${BACKENDS.join(", ")}; idle window ${WINDOW_S} s`)
  const server = BACKENDS.includes("postgres") || !skip.has("b") ? await startEmbeddedPostgres(BREAKDOWN ? { settings: statementLogSettings, onLog: breakdown.line } : {}) : null
  try {
    if (!skip.has("a")) {
      for (const backend of BACKENDS) for (const n of CURVE) await curveStep(backend, n, backend === "postgres" ? server : null)
    }
    if (!skip.has("b") && WAITS > 0 && server !== null) await concurrentWaits(server)
  } finally {
    closeRequests()
    await server?.stop()
  }
  console.log(`fleet bench: done; load ${loadavg().map((l) => l.toFixed(1)).join(" ")}`)
}

await main()
