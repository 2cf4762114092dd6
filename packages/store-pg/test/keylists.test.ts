// Every statement the store sends with a list of keys (one jsonb parameter, `anyJson`) finds its
// rows by an index, whatever the table's size. Before 2026-12-07 they read `x in (select
// jsonb_array_elements_text(…))`, planned for the 100 rows PostgreSQL assumes of a set-returning
// function: from about 10,000 rows a table, a hash join over a scan of the whole table for one
// key as for 500 (1.5 to 3 ms a statement) — among them the hosts locked by the apply of a
// transaction, the hosts a queue walk locks and reads again, and the reclaim's locks. The plans
// are read from the server (`explain`) for the very statements the store sent, with the keys it
// sent, custom and generic (a prepared statement turns generic after five runs).
import { Limits } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Db } from "../src/Db.js"
import { readHostRows } from "../src/HostRows.js"
import { migrate } from "../src/index.js"
import { lockHosts } from "../src/Locks.js"
import * as PostgresJs from "../src/PostgresJs.js"
import * as StorePg from "../src/StorePg.js"
import { nodes } from "./plans.js"
import type { PlanNode } from "./plans.js"

const many = 10_000
const ids = (prefix: string, ns: readonly number[]) => ns.map((n) => `${prefix}${n}`)
const eight = [11, 2_222, 3_333, 4_444, 5_555, 6_666, 7_777, 9_999]

describe("statements with a list of keys read by index", () => {
  let db: TestDatabase
  let pool: postgres.Sql
  let explain: postgres.Sql
  let storeDb: Db
  let store: StoreShape
  let sent: { query: string; params: unknown[] }[] = []
  beforeAll(async () => {
    db = await freshDatabase()
    await migrate(db.url)
    pool = postgres(db.url, { max: 4, onnotice: () => undefined, debug: (_c, query, params) => void sent.push({ query, params: params as unknown[] }) })
    storeDb = PostgresJs.makeDb(pool)
    store = StorePg.make(storeDb, Limits.defaults).store
    explain = postgres(db.url, { max: 1, onnotice: () => undefined })
    PostgresJs.drizzleOn(explain) // the store's serializers: a jsonb parameter goes as the text it is
    const now = Date.now()
    // Each host one running session on one reservation, and a committed move of it; s1 moving
    // (pending move m0 to h2 on the reservation rm0); rm0 and the reservations of s3…s10 stale.
    await explain`insert into hosts (id, state, token_hash, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
      select 'h' || g, 'ready', 'hash-' || g, 1048576, 1048576, 4096, ${now}::bigint, 0, case when g = 2 then 2 else 1 end, case when g = 2 then 2 else 1 end, case when g = 2 then 2 else 1 end
      from generate_series(1, ${many}) g`
    await explain`insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select 'r' || g, 'h' || g, 'session', 's' || g, 1, 1, 0, case when g between 3 and 10 then 0 else ${now}::bigint end from generate_series(1, ${many}) g
      union all select 'rm0', 'h2', 'move', 'm0', 1, 1, 0, 0`
    await explain`insert into sessions (id, state, mem_mib, vcpus, host_id, reservation_id, created_at, updated_at)
      select 's' || g, case when g = 1 then 'moving' else 'running' end, 1, 1, 'h' || g, 'r' || g, g, g from generate_series(1, ${many}) g`
    await explain`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
      select 'm' || g, 's' || g, 'h' || g, 'h' || (g % ${many} + 1), 'r' || g, 1000, 'committed', g, g from generate_series(1, ${many}) g
      union all select 'm0', 's1', 'h1', 'h2', 'rm0', 1000, 'pending', 0, null`
    // Each session's history: created, placed (the reclaim reads the newest event of each running session whose entry goes).
    await explain`insert into session_events (session_id, seq, at, event)
      select 's' || g, k, k, case when k = 1 then '{"_tag":"Created"}'::jsonb else jsonb_build_object('_tag', 'Placed', 'hostId', 'h' || g) end
      from generate_series(1, ${many}) g, generate_series(1, 2) k`
    await explain`vacuum analyze`
  }, 120_000)
  afterAll(async () => {
    await explain?.end()
    await pool?.end()
    await db?.drop()
  })

  /** The statements sent by `run` with a list of keys (the apply's own statement aside: its keys are its document's). */
  const keyed = async <A>(run: Effect.Effect<A, unknown>): Promise<[A, { query: string; params: unknown[] }[]]> => {
    sent = []
    const a = await Effect.runPromise(run)
    return [a, sent.filter((s) => s.query.includes("jsonb_array_elements_text") && !s.query.startsWith("with doc"))]
  }

  /** For each statement, custom and generic: the scans of `table` (none whole) and the indexes read. */
  const plansOf = async (statements: readonly { query: string; params: unknown[] }[]) => {
    const out: { table: string; mode: string; seqScan: string[]; indexes: string[]; locks: string[] }[] = []
    for (const { query, params } of statements) {
      const table = /\bfrom "?(\w+)"?/.exec(query)?.[1] ?? "?"
      for (const mode of ["force_custom_plan", "force_generic_plan"]) {
        await explain.unsafe(`set plan_cache_mode = ${mode}`)
        const [row] = await explain.unsafe(`explain (format json) ${query}`, params as never[])
        const plan = nodes(((row as Record<string, unknown>)["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode)
        out.push({
          table,
          mode,
          seqScan: plan.filter((n) => n["Node Type"] === "Seq Scan").map((n) => n["Relation Name"] ?? "?"),
          indexes: [...new Set(plan.flatMap((n) => (n["Index Name"] === undefined ? [] : [n["Index Name"]])))].sort(),
          // A locking read locks its rows (`LockRows`) in id order: sorted by id, or read in the primary key's order.
          locks: plan.some((n) => n["Node Type"] === "LockRows")
            ? [(plan.find((n) => n["Node Type"] === "Sort") as { "Sort Key"?: string[] } | undefined)?.["Sort Key"]?.join(",") ?? (plan.find((n) => n["Node Type"] === "Index Scan")?.["Index Name"] ?? "?")]
            : [],
        })
      }
    }
    return out
  }

  it("getSessions, getMoves, hostTokenHashes: the primary key, no scan of the table, custom or generic", async () => {
    const [found, a] = await keyed(store.getSessions(ids("s", eight)))
    expect(found.map((s) => s.id).sort()).toStrictEqual(ids("s", eight).sort())
    const [moved, b] = await keyed(store.getMoves(ids("m", eight)))
    expect(moved.map((m) => m.id).sort()).toStrictEqual(ids("m", eight).sort())
    const tokenHashes = store.hostTokenHashes
    if (tokenHashes === undefined) throw new Error("store-pg answers hostTokenHashes")
    const [hashes, c] = await keyed(tokenHashes([...ids("h", eight), "nope"]))
    expect([...hashes.entries()].sort()).toStrictEqual(eight.map((n) => [`h${n}`, `hash-${n}`]).sort())
    const plans = await plansOf([...a, ...b, ...c])
    expect(plans.map((p) => p.table)).toStrictEqual(["sessions", "sessions", "moves", "moves", "hosts", "hosts"])
    for (const p of plans) expect(p).toStrictEqual({ ...p, seqScan: [], indexes: [`${p.table}_pkey`] })
  })

  it("a queue walk's hosts: locked and read again by the primary key, in id order", async () => {
    const hostIds = ids("h", eight).sort()
    const [[locked, rows], statements] = await keyed(
      storeDb.transaction((tx) => Effect.all([lockHosts(tx, hostIds), readHostRows(tx, { hostIds, columns: "room" })])),
    )
    expect(locked).toStrictEqual(hostIds)
    expect(rows.map((r) => r.id)).toStrictEqual(hostIds)
    const [views, counted] = await keyed(readHostRows(storeDb.pool, { hostIds, sessions: "counts" }))
    expect(views.map((r) => r.id)).toStrictEqual(hostIds)
    const plans = await plansOf([...statements, ...counted])
    expect(plans.map((p) => `${p.table} ${p.seqScan.join(",")}`)).toStrictEqual(Array(6).fill("hosts "))
    expect(plans.map((p) => p.indexes.includes("hosts_pkey"))).toStrictEqual(Array(6).fill(true))
    expect(plans.map((p) => p.locks)).toStrictEqual([["hosts_pkey"], ["hosts_pkey"], [], [], [], []])
  })

  it("heartbeats (a host's, a reservation's) and reports: the rows found by host and by id through their indexes, never a scan of the ledger or the fleet", async () => {
    const beats = async <A>(run: Effect.Effect<A, unknown>): Promise<[A, { query: string; params: unknown[] }[]]> => {
      sent = []
      const a = await Effect.runPromise(run)
      return [a, sent.filter((x) => x.query.includes("jsonb_to_recordset"))]
    }
    const [renewed, a] = await beats(store.heartbeatHost("h20"))
    expect(renewed).toBeGreaterThanOrEqual(0)
    const [entry, b] = await beats(store.heartbeat("r21"))
    expect(entry.id).toBe("r21")
    const [reported, c] = await beats(store.reportHost("h22", { totalMib: 1048576, allocatableMib: 1048576, totalVcpus: 4096 }))
    expect(reported.id).toBe("h22")
    const plans = await plansOf([...a, ...b, ...c])
    expect(plans.map((p) => p.mode)).toStrictEqual(Array(3).fill(["force_custom_plan", "force_generic_plan"]).flat())
    for (const p of plans) expect({ mode: p.mode, seqScan: p.seqScan }).toStrictEqual({ mode: p.mode, seqScan: [] })
    expect(plans.slice(0, 2).map((p) => p.indexes.includes("reservations_host_idx"))).toStrictEqual([true, true])
    expect(plans.slice(2, 4).map((p) => p.indexes.includes("reservations_pkey"))).toStrictEqual([true, true])
    expect(plans.slice(4).map((p) => p.indexes.includes("hosts_pkey"))).toStrictEqual([true, true])
  })

  /** The rows the reclaim's first read (the ledger's figures, before any lock) returns now, run again with the parameters it was sent with. */
  const firstReadRows = async (statements: readonly { query: string; params: unknown[] }[]) => {
    const first = statements.find((x) => /from "reservations"/.test(x.query) && !/for update/.test(x.query))
    if (first === undefined) throw new Error("the reclaim read no reservation")
    const [row] = await explain.unsafe(`explain (analyze, format json) ${first.query}`, first.params as never[])
    return (((row as Record<string, unknown>)["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode)["Actual Rows"]
  }

  it("reclaim while the failover grace holds (expired entries only): the first read ships no live entry, and nothing is written", async () => {
    sent = []
    const result = await Effect.runPromise(store.reclaim({ stale: false }))
    expect(result.reclaimed).toStrictEqual([])
    // 10,009 entries, none with an expiry: none comes back (every one did before 2026-12-07).
    expect(await firstReadRows(sent)).toBe(0)
  })

  it("reclaim: reads and locks sessions, moves, reservations and hosts by key, in id order", async () => {
    const [result, statements] = await keyed(store.reclaim())
    expect(result.reclaimed.map((r) => r.id).sort()).toStrictEqual(["r10", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "rm0"])
    // The first read took only the entries past the stale window: run again, now that they are gone, it returns none of the 10,000 live ones.
    expect(await firstReadRows(sent)).toBe(0)
    const plans = await plansOf(statements)
    // The move owners' sessions, then the locks: sessions, moves, reservations; the newest event of
    // each running session whose entry goes (its way back to a move's source, `Reclaim.wayBackOf`);
    // the hosts (the apply's, in the transaction).
    expect([...new Set(plans.map((p) => p.table))]).toStrictEqual(["moves", "sessions", "reservations", "session_events", "hosts"])
    for (const p of plans) expect({ table: p.table, mode: p.mode, seqScan: p.seqScan }).toStrictEqual({ table: p.table, mode: p.mode, seqScan: [] })
    // By the primary key (the events by theirs, session and seq, newest first); the open moves (here one) may come from an index of the pending ones.
    for (const p of plans) expect(p.indexes.some((i) => i === `${p.table}_pkey` || /^moves_\w+_pending_idx$|^moves_open_idx$|^session_events_session_id_seq_pk$/.test(i))).toBe(true)
    // Four locking reads (sessions, moves, reservations, hosts), each in id order, custom and generic.
    const locking = plans.filter((p) => p.locks.length > 0)
    expect(locking.map((p) => p.table)).toStrictEqual(["sessions", "sessions", "moves", "moves", "reservations", "reservations", "hosts", "hosts"])
    for (const p of locking) expect(p.locks[0]).toMatch(/(^|\.)"?id"?$|_pkey$/)
  })
})
