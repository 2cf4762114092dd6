// An agent's first requests after a reconnect read its credential (`hostByTokenHash`) and its
// assignments (`hostAssignments`): when thousands of agents reconnect at once (a coordinator
// restart), concurrent reads share statements. Counted at the driver: every statement the
// store sends (postgres.js `debug`), no timing.
import { Limits } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { migrate } from "../src/index.js"
import * as PostgresJs from "../src/PostgresJs.js"
import * as StorePg from "../src/StorePg.js"
import { nodes } from "./plans.js"
import type { PlanNode } from "./plans.js"

const hosts = 300

describe("concurrent reads of hosts share statements", () => {
  let db: TestDatabase
  let pool: postgres.Sql
  let store: StoreShape
  let statements: string[] = []
  beforeAll(async () => {
    db = await freshDatabase()
    await migrate(db.url)
    pool = postgres(db.url, { max: 4, onnotice: () => undefined, debug: (_connection, query) => void statements.push(query) })
    store = StorePg.make(PostgresJs.makeDb(pool), Limits.defaults).store
    await Effect.runPromise(
      Effect.forEach(Array.from({ length: hosts }, (_, i) => i), (i) => store.registerHost({ id: `h${i}`, tokenHash: `hash-${i}` }), { concurrency: 8, discard: true }),
    )
    // h1 holds a session (its assignments are not empty).
    await Effect.runPromise(Effect.andThen(store.reportHost("h1", { totalMib: null, allocatableMib: 65536, totalVcpus: 16 }), store.createSession({ id: "s1", budget: { memMib: 512, vcpus: 1 }, affinity: ["h1"] })))
  }, 120_000)
  afterAll(async () => {
    await pool?.end()
    await db?.drop()
  })

  it("assignments: 300 concurrent reads in a few statements, each answering its own host; an unknown host fails alone", async () => {
    const alone = await Effect.runPromise(store.hostAssignments("h1"))
    expect(alone.sessions.map((s) => s.id)).toStrictEqual(["s1"])
    statements = []
    const ids = [...Array.from({ length: hosts }, (_, i) => `h${i}`), "h1", "nope"]
    const answers = await Effect.runPromise(Effect.forEach(ids, (id) => Effect.exit(store.hostAssignments(id)), { concurrency: "unbounded" }))
    const reads = statements.filter((s) => s.includes("jsonb_agg"))
    // One statement per host before: 302.
    expect(reads.length).toBeLessThanOrEqual(4)
    expect(answers.map((a) => (Exit.isSuccess(a) ? a.value.hostId : "failed"))).toStrictEqual([...ids.slice(0, -1), "failed"])
    expect(answers[1]).toStrictEqual(Exit.succeed(alone))
    expect(answers[hosts]).toStrictEqual(Exit.succeed(alone))
    const unknown = answers[hosts + 1]
    expect(unknown !== undefined && Exit.isFailure(unknown) ? JSON.stringify(unknown.cause) : "").toContain("NotFound")
  })

  it("credentials: 300 concurrent lookups by token hash in a few statements, each finding its own host; an unknown hash finds none", async () => {
    statements = []
    const hashes = [...Array.from({ length: hosts }, (_, i) => `hash-${i}`), "hash-7", "no-such-hash"]
    const found = await Effect.runPromise(Effect.forEach(hashes, (h) => store.hostByTokenHash(h), { concurrency: "unbounded" }))
    const reads = statements.filter((s) => s.includes("token_hash"))
    expect(reads.length).toBeLessThanOrEqual(4)
    expect(found.map((h) => h?.id ?? null)).toStrictEqual([...Array.from({ length: hosts }, (_, i) => `h${i}`), "h7", null])
  })
})

// A group of lookups by token hash probes the token hash index for its hashes: before
// 2026-12-07 its `in (select jsonb_array_elements_text(…))` was planned as a hash join over a
// scan of every host (PostgreSQL takes a set-returning function for 100 rows), about 3 ms a
// statement at 10,000 hosts whatever its number of hashes. The plan is read from the server
// (`explain`) for the very statement the store sent, custom and generic (a prepared statement
// turns generic after five runs); answers are checked after rotations and a removal.
describe("a group of lookups by token hash reads by the index", () => {
  const many = 5_000
  let db: TestDatabase
  let pool: postgres.Sql
  let store: StoreShape
  let statements: string[] = []
  beforeAll(async () => {
    db = await freshDatabase()
    await migrate(db.url)
    pool = postgres(db.url, { max: 4, onnotice: () => undefined, debug: (_connection, query) => void statements.push(query) })
    store = StorePg.make(PostgresJs.makeDb(pool), Limits.defaults).store
    await pool.unsafe(`insert into hosts (id, token_hash, created_at) select 'h' || i, 'hash-' || i, 0 from generate_series(0, ${many - 1}) i`)
    await pool.unsafe("analyze hosts")
  }, 120_000)
  afterAll(async () => {
    await pool?.end()
    await db?.drop()
  })

  it("no scan of every host, custom or generic plan; each lookup answers what a single read would after rotations and a removal", async () => {
    // h3's credential rotated, h4 removed; h5 refused h6's hash (a hash authenticates one host).
    await Effect.runPromise(Effect.all([store.setHostTokenHash("h3", "hash-3-new"), store.removeHost("h4")]))
    expect((await Effect.runPromise(Effect.flip(store.setHostTokenHash("h5", "hash-6"))))._tag).toBe("Conflict")
    statements = []
    const asked = ["hash-1", "hash-2", "hash-3", "hash-3-new", "hash-4", "hash-6", "hash-5", "hash-4999", "nope", "hash-2"]
    const found = await Effect.runPromise(Effect.forEach(asked, (h) => store.hostByTokenHash(h), { concurrency: "unbounded" }))
    expect(found.map((h) => h?.id ?? null)).toStrictEqual(["h1", "h2", null, "h3", null, "h6", "h5", "h4999", null, "h2"])
    const single = await Effect.runPromise(Effect.forEach(asked, (h) => store.hostByTokenHash(h), { concurrency: 1 }))
    expect(single).toStrictEqual(found)

    const grouped = [...new Set(statements.filter((s) => s.includes("token_hash") && s.includes("jsonb_array_elements_text")))]
    expect(grouped).toHaveLength(1)
    const explain = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      PostgresJs.drizzleOn(explain) // the store's serializers: a jsonb parameter goes as the text it is
      for (const mode of ["force_custom_plan", "force_generic_plan"]) {
        await explain.unsafe(`set plan_cache_mode = ${mode}`)
        const [row] = await explain.unsafe(`explain (format json) ${grouped[0] as string}`, [JSON.stringify(asked.slice(0, 8))])
        const plan = nodes(((row as Record<string, unknown>)["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode)
        // An index scan, or a bitmap heap scan over a bitmap index scan, both by the token hash index.
        const scans = plan.filter((n) => n["Relation Name"] === "hosts").map((n) => n["Node Type"])
        const indexes = plan.flatMap((n) => (n["Index Name"] === undefined ? [] : [n["Index Name"]]))
        expect({ mode, seqScan: scans.includes("Seq Scan"), indexes }).toStrictEqual({ mode, seqScan: false, indexes: ["hosts_token_hash_idx"] })
      }
    } finally {
      await explain.end()
    }
  })

  // The same for a group of assignments reads (an agent's long-poll after a reconnect), whose
  // `h.id in (select jsonb_array_elements_text(…))` scanned every host too before 2026-12-07.
  it("a group of assignments reads finds its hosts by their key, no scan of every host; each answers its own host", async () => {
    statements = []
    const ids = ["h1", "h2", "h4999", "nope", "h2"]
    const answers = await Effect.runPromise(Effect.forEach(ids, (id) => Effect.exit(store.hostAssignments(id)), { concurrency: "unbounded" }))
    expect(answers.map((a) => (Exit.isSuccess(a) ? a.value.hostId : "failed"))).toStrictEqual(["h1", "h2", "h4999", "failed", "h2"])
    const grouped = [...new Set(statements.filter((s) => s.includes("jsonb_agg") && s.includes("jsonb_array_elements_text")))]
    expect(grouped).toHaveLength(1)
    // The plan a prepared statement turns to after five runs, without parameter values.
    const rows = await pool.unsafe(`explain (generic_plan, format json) ${grouped[0] as string}`)
    const plan = nodes(((rows[0] as Record<string, unknown>)["QUERY PLAN"] as { Plan: PlanNode }[])[0]?.Plan as PlanNode)
    const onHosts = plan.filter((n) => n["Relation Name"] === "hosts").map((n) => `${n["Node Type"]} ${n["Index Name"] ?? ""}`)
    expect(onHosts.some((n) => n.startsWith("Seq Scan"))).toBe(false)
    expect(plan.some((n) => n["Index Name"] === "hosts_pkey")).toBe(true)
  })
})
