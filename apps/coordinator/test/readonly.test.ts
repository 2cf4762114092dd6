// The coordinator when its PostgreSQL only reads (a failover that left its connections on a
// hot standby, or `default_transaction_read_only` set): a real PostgreSQL whose database is set
// read-only and its connections cut (the new ones only read). A write answers a JSON 503
// `ReadOnly` with Retry-After, naming the cause, and changes nothing (not a 500); reads go on;
// /readyz is not ready; once the database takes writes again (the "promotion") the same write
// succeeds and /readyz is ready, without a restart.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, client } from "./support/http.js"
import type { Answer, Client } from "./support/http.js"

let db: TestDatabase
let c: RunningCoordinator
let admin: Client
let sql: ReturnType<typeof postgres>

beforeAll(async () => {
  db = await freshDatabase()
  sql = postgres(db.url, { max: 1, onnotice: () => {} })
  c = await startCoordinator({
    reaper: false,
    logLevel: "None",
    config: { port: 0, databaseUrl: db.url, adminToken: "readonly-admin-token-0123456789", storeTimeoutMs: 5000 },
  })
  admin = client(c.url, c.adminToken)
  expect((await admin.post("/v1/hosts", { id: "h1" })).status).toBe(201)
})

afterAll(async () => {
  await c?.stop()
  await sql?.end()
  await db?.drop()
})

/** Sets the database read-only (or back) and cuts every other connection to it: the new ones get the setting. */
const readOnly = async (on: boolean) => {
  const name = new URL(db.url).pathname.slice(1)
  if (on) await sql.unsafe(`alter database "${name}" set default_transaction_read_only = on`)
  else await sql.unsafe(`alter database "${name}" reset default_transaction_read_only`)
  await sql`select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`
}

/** `f` again (a client retrying a cut connection's 503) until `until` holds of its answer, up to 60 tries a quarter second apart. */
const retried = async (f: () => Promise<Answer>, until: (a: Answer) => boolean): Promise<Answer> => {
  let a = await f()
  for (let i = 0; i < 60 && !until(a); i++) {
    await new Promise((r) => setTimeout(r, 250))
    a = await f()
  }
  return a
}

describe("a database that only reads", () => {
  it("a write answers 503 ReadOnly (Retry-After, the cause named) and changes nothing; reads go on; /readyz is not ready until a write succeeds on the primary again", async () => {
    await readOnly(true)
    try {
      const refused = await retried(() => admin.post("/v1/hosts", { id: "h2" }), (a) => a.status !== 503 || a.body?.error !== "Unavailable")
      expect(refused.status).toBe(503)
      expect(refused.body).toMatchObject({ error: "ReadOnly", retryAfterMs: expect.any(Number) })
      expect(refused.body.message).toMatch(/refuses writes \(read-only\).*25006.*Nothing was changed/)
      expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1)
      const fleet = await admin.get("/v1/hosts")
      expect(fleet.status).toBe(200)
      expect(JSON.stringify(fleet.body)).not.toContain('"h2"')
      const notReady = await call(c.url, "GET", "/readyz")
      expect(notReady.status).toBe(503)
      expect(notReady.body).toMatchObject({ error: "ReadOnly" })
      // The probe names both ways it clears: a write that succeeds, or the hold after the last refusal.
      expect(notReady.body.message).toMatch(/until a write succeeds again, or 10 s after the last write refused/)
    } finally {
      await readOnly(false)
    }
    const created = await retried(() => admin.post("/v1/hosts", { id: "h2" }), (a) => a.status === 201)
    expect(created.status).toBe(201)
    expect((await call(c.url, "GET", "/readyz")).status).toBe(200)
  }, 120_000)
})
