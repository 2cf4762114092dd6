// How the coordinator's auth path reads after a possible miss of notices: every agent's next
// request looks its host up by its token hash (`Store.hostByTokenHash`) at about the same moment.
// One PostgreSQL (embedded from @engram/test-pg, or $ENGRAM_BENCH_DATABASE_URL), 10,000 hosts
// (`HOSTS`) each with a token hash, the store's default pool; then 10,000 lookups all at once, and
// 8, 64 and 512 at a time (each caller asks its next when its answer came). Each figure: wall
// time, statements and hashes per statement (from the batcher's timing hook), the statements'
// mean and p99 time, and pg_stat_statements' count where the server has it loaded. Each figure
// also for the grouped statement of before 2026-12-07 (`in (select jsonb_array_elements_text(…))`,
// a hash join over every host), through a batcher like the store's (`BASELINE=0` leaves it out).
//
//   pnpm exec tsx --conditions=@engram/source bench/token-lookups.ts
import { createDatabase, startEmbeddedPostgres } from "@engram/test-pg"
import { Store } from "@engram/store"
import { Effect, ManagedRuntime } from "effect"
import postgres from "@engram/postgres"
import { asc, eq, sql as q } from "drizzle-orm"
import { StorePg } from "../src/index.js"
import * as Batcher from "../src/Batcher.js"
import type { StatementTiming } from "../src/Batcher.js"
import { maxGroupedReads } from "../src/Assignments.js"
import * as PostgresJs from "../src/PostgresJs.js"
import { hosts } from "../src/schema.js"

const HOSTS = Number(process.env["HOSTS"] ?? 10_000)
const ROUNDS = Number(process.env["ROUNDS"] ?? 3)
const BASELINE = process.env["BASELINE"] !== "0"

const statements: StatementTiming[] = []
;let counting = "hostByTokenHash"
;(globalThis as Record<symbol, unknown>)[Batcher.timingHook] = (t: StatementTiming) => {
  if (t.name === counting) statements.push(t)
}

const external = process.env["ENGRAM_BENCH_DATABASE_URL"]
const server = external === undefined || external === "" ? await startEmbeddedPostgres() : undefined
const serverUrl = server?.url ?? (external as string)
const db = await createDatabase(serverUrl, { prefix: "engram_bench" })
const runtime = ManagedRuntime.make(StorePg.layer({ url: db.url }))
const sql = postgres(db.url, { max: 1 })
const fmt = (n: number, digits = 0): string => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits })
const hashOf = (i: number): string => `sha256:${i.toString(16).padStart(64, "0")}`

try {
  const store = await runtime.runPromise(Store.use((s) => Effect.succeed(s)))
  // The hosts, through the store (32 at a time).
  await runtime.runPromise(
    Effect.forEach(
      Array.from({ length: HOSTS }, (_, i) => i),
      (i) => store.registerHost({ id: `h-${String(i).padStart(5, "0")}`, tokenHash: hashOf(i) }),
      { concurrency: 32, discard: true },
    ),
  )
  await sql`analyze hosts`
  const stat = await sql`select 1 from pg_extension where extname = 'pg_stat_statements'`.then(
    (r) => r.length > 0,
    () => false,
  )

  // The statement of before, grouped as the store groups its lookups (same sizes, same slots).
  const beforePool = postgres(db.url, { max: 10, onnotice: () => undefined })
  const beforeDb = PostgresJs.makeDb(beforePool, { poolSize: 10 })
  const before = Batcher.make({
    name: "hostByTokenHash-before",
    maxBatch: maxGroupedReads,
    maxInFlight: 2,
    keysOf: () => [],
    run: (hashes: readonly string[]) =>
      Effect.map(
        beforeDb.pool.use((exec) =>
          hashes.length === 1
            ? exec.select().from(hosts).where(eq(hosts.tokenHash, hashes[0] as string)).orderBy(hosts.id).limit(1)
            : exec.select().from(hosts).where(q`${hosts.tokenHash} is not null and ${hosts.tokenHash} in (select jsonb_array_elements_text(${JSON.stringify([...new Set(hashes)])}::jsonb))`).orderBy(asc(hosts.id)),
        ),
        (rows) => hashes.map((h) => rows.find((r) => r.tokenHash === h) ?? null),
      ),
  })
  const statementOf: Record<string, (hash: string) => Effect.Effect<{ readonly id: string } | null, unknown>> = {
    hostByTokenHash: (hash) => store.hostByTokenHash(hash),
    "hostByTokenHash-before": before,
  }

  const lookup = (i: number) =>
    runtime.runPromise((statementOf[counting] as (hash: string) => Effect.Effect<{ readonly id: string } | null>)(hashOf(i))).then((h) => {
      if (h?.id !== `h-${String(i).padStart(5, "0")}`) throw new Error(`lookup ${i} answered ${h?.id ?? "none"}`)
    })
  /** `HOSTS` lookups, `clients` at a time (`Infinity`: all at once). */
  const run = async (clients: number) => {
    statements.length = 0
    if (stat) await sql`select pg_stat_statements_reset()`
    const started = performance.now()
    if (!Number.isFinite(clients)) await Promise.all(Array.from({ length: HOSTS }, (_, i) => lookup(i)))
    else {
      let next = 0
      await Promise.all(
        Array.from({ length: clients }, async () => {
          while (next < HOSTS) await lookup(next++)
        }),
      )
    }
    const wallMs = performance.now() - started
    const sorted = statements.map((s) => s.statementMs).sort((a, b) => a - b)
    const counted = stat
      ? Number((await sql`select coalesce(sum(calls), 0)::int as n from pg_stat_statements where query ilike '%token_hash%' and query not ilike '%pg_stat%'`)[0]?.["n"] ?? 0)
      : null
    return {
      wallMs,
      statements: statements.length,
      perStatement: HOSTS / Math.max(1, statements.length),
      meanMs: sorted.reduce((a, b) => a + b, 0) / Math.max(1, sorted.length),
      p99Ms: sorted[Math.floor(sorted.length * 0.99)] ?? 0,
      waitedMs: statements.reduce((a, s) => a + s.waitedMs, 0) / Math.max(1, statements.length),
      counted,
    }
  }

  console.log(`hostByTokenHash: ${fmt(HOSTS)} hosts, ${fmt(HOSTS)} lookups per figure, best wall of ${ROUNDS} (pg_stat_statements: ${stat ? "yes" : "not loaded"})`)
  for (const which of BASELINE ? ["hostByTokenHash-before", "hostByTokenHash"] : ["hostByTokenHash"]) {
    counting = which
    console.log(which === "hostByTokenHash" ? "now (token hash index, `anyJson`):" : "before (a hash join over every host):")
    await run(64) // warm: connections opened, statements prepared
    for (const clients of [Infinity, 8, 64, 512]) {
      const results = []
      for (let r = 0; r < ROUNDS; r++) results.push(await run(clients))
      const best = results.reduce((a, b) => (b.wallMs < a.wallMs ? b : a))
      console.log(
        `  ${Number.isFinite(clients) ? `${clients} at a time` : "all at once"}: ${fmt(best.wallMs)} ms wall (${results.map((r) => fmt(r.wallMs)).join(" / ")}), ` +
          `${fmt(best.statements)} statements${best.counted === null ? "" : ` (server counted ${fmt(best.counted)})`}, ${fmt(best.perStatement, 1)} hashes each, ` +
          `statement mean ${fmt(best.meanMs, 2)} ms, p99 ${fmt(best.p99Ms, 2)} ms, waited for a slot mean ${fmt(best.waitedMs, 2)} ms`,
      )
    }
  }
  await beforePool.end()
} finally {
  await sql.end()
  await runtime.dispose()
  await db.drop()
  await server?.stop()
}
