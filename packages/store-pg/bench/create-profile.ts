/**
 * The store's share of a create on PostgreSQL, without HTTP: `CREATE_CLIENTS` (64) creates in
 * flight straight on `StorePg` over 2,000 hosts for `BENCH_SECONDS` (5, after a 2 s warm-up),
 * on a PostgreSQL of its own (`pg_config --bindir` when installed), and this process's CPU per
 * create beside the creates/s, the apply statements per create and the server's statements per
 * create (`pg_stat_statements`, when the server has it). Run it under `node --cpu-prof` to see
 * where the store's CPU goes (`node tooling/scripts/cpu-profile-top.mjs <dir>`).
 *
 *   pnpm --filter @engram/store-pg exec tsx --conditions=@engram/source bench/create-profile.ts
 */
import { Limits } from "@engram/core"
import { Store } from "@engram/store"
import { createDatabase, pgBinDir, startEmbeddedPostgres } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect, ManagedRuntime } from "effect"
import { appendFileSync } from "node:fs"
import { StorePg } from "../src/index.js"

const SECONDS = Number(process.env["BENCH_SECONDS"] ?? 5)
const CLIENTS = Number(process.env["CREATE_CLIENTS"] ?? 64)
const HOSTS = 2000
const bin = (() => {
  try {
    return pgBinDir({ needs: ["initdb", "pg_ctl", "postgres"] })
  } catch {
    return undefined
  }
})()
// CREATE_EXPLAIN=<file>: every apply statement's plan (auto_explain, analyzed) is written there.
const explainTo = process.env["CREATE_EXPLAIN"]
const explain = explainTo === undefined || explainTo === "" ? {} : { "auto_explain.log_min_duration": "0", "auto_explain.log_analyze": "on", "auto_explain.log_buffers": "off", "auto_explain.log_timing": "on", "auto_explain.log_nested_statements": "on", "auto_explain.sample_rate": "0.05" }
const server = await startEmbeddedPostgres({
  ...(bin === undefined ? {} : { binDir: bin }),
  settings: { shared_preload_libraries: explainTo === undefined || explainTo === "" ? "pg_stat_statements" : "pg_stat_statements,auto_explain", ...explain },
  ...(explainTo === undefined || explainTo === "" ? {} : { onLog: (line: string) => appendFileSync(explainTo, `${line}\n`) }),
})
const db = await createDatabase(server.url, { prefix: "create_profile" })
const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
const runtime = ManagedRuntime.make(StorePg.layer({ url: db.url, poolSize: 16, limits: { ...Limits.defaults, maxEntriesPerNode: 256 }, placementReadMaxAgeMs: 100 }))
try {
  await runtime.runPromise(
    Store.use((s) =>
      Effect.forEach(
        Array.from({ length: HOSTS }, (_, i) => `h${String(i).padStart(5, "0")}`),
        (id) => Effect.andThen(s.registerHost({ id }), s.reportHost(id, { totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 })),
        { concurrency: 16, discard: true },
      ),
    ),
  )
  const run = async (ms: number, prefix: string): Promise<number> => {
    const until = performance.now() + ms
    let n = 0
    await Promise.all(
      Array.from({ length: CLIENTS }, async (_, c) => {
        for (let i = 0; performance.now() < until; i++) {
          await runtime.runPromise(Store.use((s) => s.createSession({ id: `${prefix}-${c}-${i}`, budget: { memMib: 512, vcpus: 1 } })))
          n++
        }
      }),
    )
    return n
  }
  await run(2000, "warm")
  const stats = await sql`select count(*) from pg_extension where extname = 'pg_stat_statements'`.then(async (r) => {
    if (Number(r[0]?.["count"]) > 0) return true
    try {
      await sql`create extension pg_stat_statements`
      return true
    } catch {
      return false
    }
  })
  if (stats) await sql`select pg_stat_statements_reset()`
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  const n = await run(SECONDS * 1000, "m")
  const wall = (performance.now() - t0) / 1000
  const cpu = process.cpuUsage(cpu0)
  console.log(`store-pg creates: ${(n / wall).toFixed(0)}/s at ${CLIENTS} in flight, ${(((cpu.user + cpu.system) / n)).toFixed(0)} µs CPU per create (this process), load ${(await import("node:fs")).readFileSync("/proc/loadavg", "utf8").trim()}`)
  if (stats) {
    const rows = await sql`select calls, rows, total_exec_time, regexp_replace(left(query, 90), '\s+', ' ', 'g') as q from pg_stat_statements
      where dbid = (select oid from pg_database where datname = current_database()) order by calls desc limit 12`
    for (const r of rows) console.log(`  ${(Number(r["calls"]) / n).toFixed(3)} calls per create, ${(Number(r["total_exec_time"]) * 1000 / n).toFixed(0)} µs exec per create: ${String(r["q"])}`)
  }
} finally {
  await runtime.dispose()
  await sql.end()
  await db.drop()
  await server.stop()
}
