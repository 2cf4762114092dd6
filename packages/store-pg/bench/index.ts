// The store-pg benchmark: one run, one PostgreSQL server (embedded PostgreSQL 18 from
// @engram/test-pg, or $ENGRAM_BENCH_DATABASE_URL), each figure on a database of its own.
//
//   1. baseline: a pgbench-like short write transaction (BEGIN; UPDATE one row by random key;
//      COMMIT) at 16 clients, in this Node process with postgres.js; and real pgbench when
//      it is installed
//   2. engram placements per second at 16 clients, and its ratio to the baseline
//   3. queue drain: placements per second, in batches
//   4. fleet view: the first (whole) read and the incremental reads after it, at 1,000 and 10,000 hosts
//   5. group placement: creates/s at 64 clients over 2,000 hosts, batched (the default) beside
//      one by one (`placementBatchSize: 1`), on PostgreSQL and on PGlite, with p50/p99; on
//      PostgreSQL also batched while a session too big for every host starves in the queue
//      (every group then reads the starving part of the queue for claims)
//   6. a host's assignments (an agent's first poll): the one statement of `hostAssignments`
//      beside the three reads it replaced (`getHost`, `listSessions`, `listMoves`, one after the
//      other), at 1 and 64 clients over 2,000 hosts of 10 sessions, with the Node process's CPU
//      per read
//
// `BENCH_ONLY=group` runs only 5 (and the baseline); `BENCH_ONLY=assignments` only 6.
import { report } from "@engram/bench"
import { execFileSync } from "node:child_process"
import { rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import path from "node:path"
import { Limits, ParkPolicy } from "@engram/core"
import { Store } from "@engram/store"
import { createDatabase, pgBinDir, startEmbeddedPostgres } from "@engram/test-pg"
import { Effect, ManagedRuntime } from "effect"
import type { Layer } from "effect"
import postgres from "@engram/postgres"
import { StorePg } from "../src/index.js"

const CLIENTS = 16
/** The placement figure's limits: the defaults with room for 256 entries per host. */
const PLACEMENT_LIMITS = { ...Limits.defaults, maxEntriesPerNode: 256 }
const DURATION_MS = Number(process.env["BENCH_SECONDS"] ?? 5) * 1000

const external = process.env["ENGRAM_BENCH_DATABASE_URL"]
const server = external === undefined || external === "" ? await startEmbeddedPostgres() : undefined
const serverUrl = server?.url ?? (external as string)
const dropLater: (() => Promise<void>)[] = []
const freshDb = async (): Promise<string> => {
  const db = await createDatabase(serverUrl, { prefix: "engram_bench" })
  dropLater.push(() => db.drop())
  return db.url
}
const fmt = (n: number, digits = 0): string => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits })

/** Runs `worker` on `clients` loops until the duration is up; answers operations per second. */
const closedLoop = async (clients: number, worker: (client: number, i: number) => Promise<unknown>): Promise<number> => {
  const started = performance.now()
  let done = 0
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      for (let i = 0; performance.now() - started < DURATION_MS; i++) {
        await worker(client, i)
        done++
      }
    }),
  )
  return done / ((performance.now() - started) / 1000)
}

const baseline = async (): Promise<number> => {
  const url = await freshDb()
  const sql = postgres(url, { max: CLIENTS, onnotice: () => undefined })
  try {
    await sql`create table accounts (id int primary key, balance bigint not null default 0)`
    await sql`insert into accounts (id) select g from generate_series(1, 100000) g`
    await sql`vacuum analyze accounts`
    return await closedLoop(CLIENTS, () =>
      sql.begin((tx) => tx`update accounts set balance = balance + 1 where id = ${1 + Math.floor(Math.random() * 100000)}`),
    )
  } finally {
    await sql.end()
  }
}

const realPgbench = async (): Promise<number | null> => {
  let bin: string
  try {
    bin = pgBinDir({ needs: ["pgbench"] })
  } catch {
    return null
  }
  const url = new URL(await freshDb())
  const env = { ...process.env, PGPASSWORD: decodeURIComponent(url.password) }
  const args = ["-h", url.hostname, "-p", url.port, "-U", decodeURIComponent(url.username), url.pathname.slice(1)]
  const script = path.join(tmpdir(), `engram-bench-${process.pid}.sql`)
  writeFileSync(
    script,
    "\\set aid random(1, 100000 * :scale)\nBEGIN;\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\nEND;\n",
  )
  let out: string
  try {
    execFileSync(path.join(bin, "pgbench"), ["-i", "-s", "1", "-q", ...args], { env, stdio: "ignore" })
    out = execFileSync(
      path.join(bin, "pgbench"),
      ["-n", "-c", String(CLIENTS), "-j", "2", "-T", String(DURATION_MS / 1000), "-f", script, ...args],
      { env, encoding: "utf8" },
    )
  } finally {
    rmSync(script, { force: true })
  }
  const m = /tps = ([\d.]+)/.exec(out)
  return m === null ? null : Number(m[1])
}

/** Creates/s and latency at `clients` in flight over `hosts` hosts, on `layer`'s store. */
const groupRun = async (
  layer: Layer.Layer<Store, unknown>,
  label: string,
  clients: number,
  hostCount: number,
  starving = false,
): Promise<{ perSec: number; p50: number; p99: number; placed: number }> => {
  const runtime = ManagedRuntime.make(layer)
  try {
    await runtime.runPromise(
      Store.use((s) =>
        Effect.forEach(
          Array.from({ length: hostCount }, (_, i) => `h${String(i).padStart(5, "0")}`),
          (id) => Effect.andThen(s.registerHost({ id }), s.reportHost(id, { totalMib: 524288 + 1024, allocatableMib: 524288 + 1024, totalVcpus: 64 })),
          { concurrency: 16, discard: true },
        ),
      ),
    )
    if (starving) await runtime.runPromise(Store.use((s) => s.createSession({ id: `${label}-too-big`, budget: { memMib: 2 * 524288, vcpus: 1 } })))
    const latencies: number[] = []
    let placed = 0
    const perSec = await closedLoop(clients, async (client, i) => {
      const t0 = performance.now()
      const outcome = await runtime.runPromise(
        Store.use((s) => s.createSession({ id: `${label}-${client}-${i}`, budget: { memMib: 512 + 512 * (i % 4), vcpus: 1 } })),
      )
      latencies.push(performance.now() - t0)
      if (outcome._tag === "Placed") placed++
    })
    latencies.sort((a, b) => a - b)
    const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0
    return { perSec, p50: at(0.5), p99: at(0.99), placed }
  } finally {
    await runtime.dispose()
  }
}

const GROUP_CLIENTS = 64
const GROUP_HOSTS = 2000

const groupPlacement = async (base: number): Promise<void> => {
  for (const backend of ["PostgreSQL", "PGlite"] as const) {
    const figures: Record<string, { perSec: number; p50: number; p99: number; placed: number }> = {}
    // On PostgreSQL the coordinator's default read reuse (100 ms); PGlite's own default (one writer).
    const placementReadMaxAgeMs = backend === "PostgreSQL" ? 100 : undefined
    for (const [mode, placementBatchSize] of [
      ["one by one", 1],
      ["grouped", 64],
    ] as const) {
      const layer =
        backend === "PostgreSQL"
          ? StorePg.layer({ url: await freshDb(), poolSize: 16, limits: PLACEMENT_LIMITS, placementBatchSize, placementReadMaxAgeMs })
          : StorePg.layerPglite({ limits: PLACEMENT_LIMITS, placementBatchSize })
      const f = await groupRun(layer, `${backend}-${mode}`.replace(/\W/g, ""), GROUP_CLIENTS, GROUP_HOSTS)
      figures[mode] = f
      console.log(`  ${backend}, ${mode}: ${fmt(f.perSec)} creates/s, p50 ${fmt(f.p50, 1)} ms, p99 ${fmt(f.p99, 1)} ms (${f.placed} placed)`)
    }
    const grouped = figures["grouped"] as { perSec: number; p99: number }
    const single = figures["one by one"] as { perSec: number; p99: number }
    if (backend === "PostgreSQL") {
      // Starving from its first millisecond: every group of creates reads the queue for claims.
      const park = { ...ParkPolicy.defaultRule, options: { ...ParkPolicy.defaultOptions, starvationLimitMs: 1 } }
      const layer = StorePg.layer({ url: await freshDb(), poolSize: 16, limits: PLACEMENT_LIMITS, placementBatchSize: 64, placementReadMaxAgeMs, park })
      const f = await groupRun(layer, "PostgreSQLstarving", GROUP_CLIENTS, GROUP_HOSTS, true)
      console.log(`  ${backend}, grouped, a too-big session starving in the queue: ${fmt(f.perSec)} creates/s, p50 ${fmt(f.p50, 1)} ms, p99 ${fmt(f.p99, 1)} ms (${f.placed} placed)`)
      report({
        bench: "store-pg",
        figure: `creates, ${GROUP_CLIENTS} in flight, ${fmt(GROUP_HOSTS)} hosts, PostgreSQL, read reuse ${placementReadMaxAgeMs} ms, grouped, a session starving in the queue (p99 ${fmt(f.p99, 1)} ms)`,
        value: f.perSec,
        unit: "/s",
        ratio: f.perSec / grouped.perSec,
        baseline: "the same, nobody starving",
      })
    }
    report({
      bench: "store-pg",
      figure: `creates, ${GROUP_CLIENTS} in flight, ${fmt(GROUP_HOSTS)} hosts, ${backend}${placementReadMaxAgeMs === undefined ? "" : `, read reuse ${placementReadMaxAgeMs} ms`}, grouped (one by one: ${fmt(single.perSec)}/s, p99 ${fmt(single.p99, 1)} ms)`,
      value: grouped.perSec,
      unit: "/s",
      ratio: grouped.perSec / single.perSec,
      baseline: "the same, one by one",
    })
    if (backend === "PostgreSQL")
      report({ bench: "store-pg", figure: `creates grouped, PostgreSQL, ÷ write baseline`, value: grouped.perSec, unit: "/s", ratio: grouped.perSec / base, baseline: "write baseline" })
  }
}

const placements = async (placementReadMaxAgeMs = 0): Promise<{ perSec: number; placed: number; queued: number }> => {
  const url = await freshDb()
  const runtime = ManagedRuntime.make(StorePg.layer({ url, poolSize: CLIENTS, placementReadMaxAgeMs, limits: PLACEMENT_LIMITS }))
  try {
    // 200 hosts of 512 GiB and 64 cores, up to 256 entries each: room for 51,200 sessions, more
    // than a run creates, so every create is a placement (none queued).
    await runtime.runPromise(
      Store.use((s) =>
        Effect.forEach(Array.from({ length: 200 }, (_, i) => `h${String(i).padStart(3, "0")}`), (id) =>
          Effect.andThen(s.registerHost({ id }), s.reportHost(id, { totalMib: 524288 + 1024, allocatableMib: 524288 + 1024, totalVcpus: 64 })),
        ),
      ),
    )
    let placed = 0
    let queued = 0
    const perSec = await closedLoop(CLIENTS, async (client, i) => {
      const outcome = await runtime.runPromise(
        Store.use((s) => s.createSession({ id: `c${client}-${i}`, budget: { memMib: 512 + 512 * (i % 4), vcpus: 1 } })),
      )
      if (outcome._tag === "Placed") placed++
      else queued++
    })
    return { perSec, placed, queued }
  } finally {
    await runtime.dispose()
  }
}

const drain = async (queuedCount: number, batch: number): Promise<{ perSec: number; placed: number; batches: number }> => {
  const url = await freshDb()
  const runtime = ManagedRuntime.make(StorePg.layer({ url, poolSize: 4 }))
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    await runtime.runPromise(Store.use((s) => Effect.sync(() => s.limits())))
    // Hosts with room for the whole queue (32 entries each), and a queue written in bulk.
    const hostCount = Math.ceil(queuedCount / 30)
    await sql`insert into hosts (id, labels, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at)
      select 'h' || lpad(g::text, 5, '0'), '{}'::jsonb, 'ready', 200000, 200000, 64, ${Date.now()}, 0 from generate_series(1, ${hostCount}) g`
    await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, queued_at, created_at, updated_at)
      select 'q' || g, 'queued', 1024 * (1 + g % 4), 1 + g % 2, '{}', g, g, g from generate_series(1, ${queuedCount}) g`
    await sql`analyze`
    const started = performance.now()
    let placed = 0
    let batches = 0
    for (;;) {
      const result = await runtime.runPromise(Store.use((s) => s.drainQueue({ limit: batch })))
      batches++
      placed += result.placed.length
      if (result.placed.length === 0 || result.remaining === 0) break
    }
    return { perSec: placed / ((performance.now() - started) / 1000), placed, batches }
  } finally {
    await sql.end()
    await runtime.dispose()
  }
}

const fleetView = async (hostCount: number): Promise<{ wholeMs: number; medianMs: number; parks: number; entries: number }> => {
  const url = await freshDb()
  const runtime = ManagedRuntime.make(StorePg.layer({ url, poolSize: 2 }))
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    await runtime.runPromise(Store.use((s) => Effect.sync(() => s.limits())))
    // Every host with 8 sessions: 5 running, 2 parked, 1 descending; and a queue of 1,000.
    await sql`insert into hosts (id, labels, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at)
      select 'h' || lpad(g::text, 5, '0'), '{"zone":"a"}'::jsonb, 'ready', 262144, 262144, 64, ${Date.now()}, 0 from generate_series(1, ${hostCount}) g`
    await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, parked_at, created_at, updated_at)
      select 's' || h || '-' || k,
        case when k <= 5 then 'running' when k <= 7 then 'parked' else 'descending' end,
        4096, 2, '{}', 'h' || lpad(h::text, 5, '0'), 'r' || h || '-' || k,
        case when k in (6, 7) then h * 10 + k end, 0, 0
      from generate_series(1, ${hostCount}) h, generate_series(1, 8) k`
    await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select 'r' || h || '-' || k, 'h' || lpad(h::text, 5, '0'), 'session', 's' || h || '-' || k, 4096, 2, 0, 0
      from generate_series(1, ${hostCount}) h, generate_series(1, 8) k`
    await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, queued_at, created_at, updated_at)
      select 'q' || g, 'queued', 8192, 2, '{}', g, g, g from generate_series(1, 1000) g`
    await sql`analyze`
    // The first read is whole; every later one reads only what changed since (FleetCache). Between
    // reads, 20 creates place and 20 running sessions park: a busy fleet's traffic between reaper passes.
    const read = async () => {
      const started = performance.now()
      const fleet = await runtime.runPromise(Store.use((s) => s.fleetView()))
      const ms = performance.now() - started
      if (fleet.hosts.length !== hostCount) throw new Error(`fleet view read ${fleet.hosts.length} hosts`)
      return { ms, parks: fleet.hosts.reduce((n, h) => n + h.parks.length, 0) }
    }
    const first = await read()
    const times: number[] = []
    let parks = first.parks
    for (let i = 0; i < 7; i++) {
      await runtime.runPromise(
        Store.use((s) =>
          Effect.forEach(Array.from({ length: 20 }, (_, k) => k), (k) =>
            Effect.andThen(s.createSession({ id: `n${i}-${k}`, budget: { memMib: 1024, vcpus: 1 } }), s.idle(`s${1 + i * 20 + k}-1`)),
          ),
        ),
      )
      const r = await read()
      times.push(r.ms)
      parks = r.parks
    }
    times.sort((a, b) => a - b)
    // The baseline, warm: the whole read of stores that never read this fleet (their first read),
    // in the same process after the reads above (median of 3).
    const wholes: number[] = []
    for (let i = 0; i < 3; i++) {
      const other = ManagedRuntime.make(StorePg.layer({ url, poolSize: 1 }))
      try {
        await other.runPromise(Store.use((s) => Effect.sync(() => s.limits())))
        const started = performance.now()
        await other.runPromise(Store.use((s) => s.fleetView()))
        wholes.push(performance.now() - started)
      } finally {
        await other.dispose()
      }
    }
    wholes.sort((a, b) => a - b)
    return { wholeMs: wholes[1] as number, medianMs: times[Math.floor(times.length / 2)] as number, parks, entries: hostCount * 8 }
  } finally {
    await sql.end()
    await runtime.dispose()
  }
}

/** One way to read a host's assignments, its reads a second and the Node process's CPU per read. */
interface AssignmentsRun {
  readonly perSec: number
  readonly cpuUsPerRead: number
}

/**
 * A host's assignments read `clients` at a time for the bench's duration, at random hosts of a
 * fleet of 2,000 hosts with 10 sessions each (one of them moving to the next host): the one
 * statement beside the three reads of before, same store, same database.
 */
const assignments = async (clients: number): Promise<{ one: AssignmentsRun; three: AssignmentsRun }> => {
  const url = await freshDb()
  const runtime = ManagedRuntime.make(StorePg.layer({ url, poolSize: 16 }))
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  const hosts = 2000
  try {
    await runtime.runPromise(Store.use((s) => Effect.sync(() => s.limits())))
    await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
      select 'h' || g, 'ready', 262144, 262144, 64, ${Date.now()}, 0, 10240, 10, 10 from generate_series(1, ${hosts}) g`
    await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select 'r' || h || '-' || k, 'h' || h, 'session', 's' || h || '-' || k, 1024, 1, 0, 0 from generate_series(1, ${hosts}) h, generate_series(1, 10) k`
    await sql`insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, created_at, updated_at)
      select 's' || h || '-' || k, case when k = 1 then 'moving' else 'running' end, 1024, 1, '{}', 'h' || h, 'r' || h || '-' || k, k, k
      from generate_series(1, ${hosts}) h, generate_series(1, 10) k`
    await sql`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at)
      select 'mv-' || h, 's' || h || '-1', 'h' || h, 'h' || (h % ${hosts} + 1), 'x', 600, 'pending', h from generate_series(1, ${hosts}) h`
    await sql`analyze`
    const host = () => `h${1 + Math.floor(Math.random() * hosts)}`
    const one = (id: string) => Store.use((s) => s.hostAssignments(id))
    const three = (id: string) =>
      Store.use((s) => Effect.andThen(s.getHost(id), Effect.andThen(s.listSessions({ hostId: id }), s.listMoves({ hostId: id, state: "pending" }))))
    const run = async (read: (id: string) => Effect.Effect<unknown, unknown, Store>): Promise<AssignmentsRun> => {
      // Warm: every connection has prepared the statements.
      await Promise.all(Array.from({ length: 32 }, () => runtime.runPromise(read(host()))))
      const cpu = process.cpuUsage()
      let reads = 0
      const perSec = await closedLoop(clients, async () => {
        await runtime.runPromise(read(host()))
        reads++
      })
      const used = process.cpuUsage(cpu)
      return { perSec, cpuUsPerRead: (used.user + used.system) / reads }
    }
    const threeRun = await run(three)
    const oneRun = await run(one)
    return { one: oneRun, three: threeRun }
  } finally {
    await sql.end()
    await runtime.dispose()
  }
}

const reportAssignments = async (): Promise<void> => {
  for (const clients of [1, 64]) {
    const { one, three } = await assignments(clients)
    report({ bench: "store-pg", figure: `assignments, 3 reads (before), ${clients} client${clients === 1 ? "" : "s"}`, value: three.perSec, unit: "/s" })
    report({ bench: "store-pg", figure: `assignments, 1 statement, ${clients} client${clients === 1 ? "" : "s"}`, value: one.perSec, unit: "/s", ratio: one.perSec / three.perSec, baseline: "3 reads" })
    report({ bench: "store-pg", figure: `assignments, Node CPU per read, 3 reads, ${clients} client${clients === 1 ? "" : "s"}`, value: three.cpuUsPerRead, unit: "µs" })
    report({
      bench: "store-pg",
      figure: `assignments, Node CPU per read, 1 statement, ${clients} client${clients === 1 ? "" : "s"}`,
      value: one.cpuUsPerRead,
      unit: "µs",
      ratio: one.cpuUsPerRead / three.cpuUsPerRead,
      baseline: "3 reads",
    })
  }
}

const onlyGroup = process.env["BENCH_ONLY"] === "group"
const onlyAssignments = process.env["BENCH_ONLY"] === "assignments"

try {
  console.log(`store-pg bench: ${server === undefined ? "external server" : "embedded PostgreSQL 18 (fsync off)"}, ${CLIENTS} clients, ${DURATION_MS / 1000} s per figure, placement limits = defaults with maxEntriesPerNode ${PLACEMENT_LIMITS.maxEntriesPerNode}`)
  if (onlyAssignments) await reportAssignments()
  else await everyFigure()
} finally {
  for (const drop of dropLater) await drop().catch(() => undefined)
  await server?.stop()
}

async function everyFigure(): Promise<void> {
  const base = await baseline()
  console.log(`baseline (postgres.js, BEGIN; UPDATE one row by random key; COMMIT) at ${CLIENTS} clients: ${fmt(base)} TPS`)
  report({ bench: "store-pg", figure: `write baseline (BEGIN; UPDATE; COMMIT), ${CLIENTS} clients`, value: base, unit: "TPS" })
  if (!onlyGroup) {
    const pgb = await realPgbench()
    console.log(pgb === null ? "pgbench: not installed" : `pgbench (same transaction, -c ${CLIENTS} -j 2) at ${CLIENTS} clients: ${fmt(pgb)} TPS`)
    if (pgb !== null) report({ bench: "store-pg", figure: `pgbench, same transaction, ${CLIENTS} clients`, value: pgb, unit: "TPS", ratio: pgb / base, baseline: "postgres.js baseline" })
    const place = await placements()
    console.log(`  (${place.placed} placed, ${place.queued} queued)`)
    report({ bench: "store-pg", figure: `placements, ${CLIENTS} clients, fresh read each`, value: place.perSec, unit: "/s", ratio: place.perSec / base, baseline: "write baseline", goal: ">= 0.8" })
    const cachedPlace = await placements(100)
    console.log(`  (${cachedPlace.placed} placed, ${cachedPlace.queued} queued)`)
    report({ bench: "store-pg", figure: `placements, ${CLIENTS} clients, placementReadMaxAgeMs 100`, value: cachedPlace.perSec, unit: "/s", ratio: cachedPlace.perSec / base, baseline: "write baseline", goal: ">= 0.8" })
    for (const batch of [1000, 5000]) {
      const d = await drain(10_000, batch)
      report({ bench: "store-pg", figure: `queue drain, 10,000 queued, batches of ${batch}`, value: d.perSec, unit: "/s", goal: ">= 10,000/s" })
    }
    for (const hosts of [1000, 10_000]) {
      const f = await fleetView(hosts)
      report({ bench: "store-pg", figure: `fleet view, whole read (a store's first, warm process), ${fmt(hosts)} hosts`, value: f.wholeMs, unit: "ms" })
      report({
        bench: "store-pg",
        figure: `fleet view, incremental read (40 changes since), ${fmt(hosts)} hosts`,
        value: f.medianMs,
        unit: "ms",
        ratio: f.medianMs / f.wholeMs,
        baseline: "whole read",
        ...(hosts === 10_000 ? { goal: "<= 20 ms" } : {}),
      })
    }
  }
  await groupPlacement(base)
  if (!onlyGroup) await reportAssignments()
}
