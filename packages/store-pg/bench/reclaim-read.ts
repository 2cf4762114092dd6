// What one reaper pass's reclaim costs with a large ledger and nothing to reclaim (the usual
// pass): `Store.reclaim()` on a ledger of `HOSTS` × `PER_HOST` live reservations (200,000 by
// default), against the read of before 2026-12-07 side by side in the same process (every
// reservation's figures shipped to Node, then judged by core's `Ledger.reclaimable`: what the old
// reclaim did before it found nothing to take). Each figure the median of `ROUNDS`, alternating.
// One PostgreSQL (embedded from @engram/test-pg, or $ENGRAM_BENCH_DATABASE_URL).
//
//   pnpm exec tsx --conditions=@engram/source bench/reclaim-read.ts
import { Ledger, Limits } from "@engram/core"
import { Store } from "@engram/store"
import { createDatabase, startEmbeddedPostgres } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect, ManagedRuntime } from "effect"
import { StorePg } from "../src/index.js"
import * as PostgresJs from "../src/PostgresJs.js"
import { reservations } from "../src/schema.js"

const HOSTS = Number(process.env["HOSTS"] ?? 10_000)
const PER_HOST = Number(process.env["PER_HOST"] ?? 20)
const ROUNDS = Number(process.env["ROUNDS"] ?? 9)

const external = process.env["ENGRAM_BENCH_DATABASE_URL"]
const server = external === undefined || external === "" ? await startEmbeddedPostgres() : undefined
const db = await createDatabase(server?.url ?? (external as string), { prefix: "engram_bench" })
const runtime = ManagedRuntime.make(StorePg.layer({ url: db.url }))
const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
const beforePool = postgres(db.url, { max: 2, onnotice: () => undefined })
const beforeDb = PostgresJs.makeDb(beforePool, { poolSize: 2 })
const fmt = (n: number, digits = 0): string => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits })
const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0

try {
  const store = await runtime.runPromise(Store.use((s) => Effect.succeed(s)))
  const now = Date.now()
  await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
    select 'h' || g, 'ready', 1048576, 1048576, 4096, ${now}::bigint, 0, ${PER_HOST}, ${PER_HOST}, ${PER_HOST} from generate_series(1, ${HOSTS}) g`
  // External reservations (no session behind them): live, heartbeated a moment ago, no expiry.
  await sql`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
    select 'r' || h || '-' || k, 'h' || h, 'external', 'x' || h || '-' || k, 1, 1, 0, ${now}::bigint + 3600000 from generate_series(1, ${HOSTS}) h, generate_series(1, ${PER_HOST}) k`
  await sql`vacuum analyze`
  const before = () =>
    Effect.map(
      beforeDb.pool.use((exec) =>
        exec
          .select({ id: reservations.id, expiresAt: reservations.expiresAt, lastHeartbeatAt: reservations.lastHeartbeatAt, ownerKind: reservations.ownerKind, ownerId: reservations.ownerId })
          .from(reservations),
      ),
      (all) => Ledger.reclaimable(all, Date.now(), Limits.defaults),
    )
  const timed = async (run: () => Effect.Effect<unknown, unknown>): Promise<number> => {
    const started = performance.now()
    await runtime.runPromise(run() as Effect.Effect<unknown>)
    return performance.now() - started
  }
  // Warm: connections opened, statements prepared.
  for (let i = 0; i < 2; i++) {
    await timed(before)
    await timed(() => store.reclaim())
  }
  const was: number[] = []
  const is: number[] = []
  for (let r = 0; r < ROUNDS; r++) {
    was.push(await timed(before))
    is.push(await timed(() => store.reclaim()))
  }
  const taken = await runtime.runPromise(store.reclaim())
  if (taken.reclaimed.length !== 0) throw new Error(`reclaimed ${taken.reclaimed.length} live reservations`)
  console.log(`reclaim with nothing to take, ${fmt(HOSTS * PER_HOST)} live reservations (${fmt(HOSTS)} hosts × ${PER_HOST}), median of ${ROUNDS}, alternating:`)
  console.log(`  before (every entry read, judged in Node): ${fmt(median(was), 1)} ms (${was.map((x) => fmt(x, 0)).join(" / ")})`)
  console.log(`  now (only entries past core's cutoffs read): ${fmt(median(is), 1)} ms (${is.map((x) => fmt(x, 0)).join(" / ")})`)
  console.log(`  ratio now ÷ before: ${fmt(median(is) / median(was), 3)}`)
} finally {
  await beforePool.end()
  await sql.end()
  await runtime.dispose()
  await db.drop()
  await server?.stop()
}
