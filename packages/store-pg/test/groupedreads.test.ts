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
