// The PostgreSQL connections of one replica, as an operator plans them (README "Connections"):
// the store pool of ENGRAM_STORE_POOL_SIZE (`engram-placer <id>`), the lease (`engram-lease
// <holder>`) and the change listener (`engram-wakeups`), at most `connectionsPerReplica` however
// many requests arrive together.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Config from "../src/Config.js"
import { client } from "./support/http.js"

const adminToken = "connections-admin-token-0123456789"

describe("a replica's connections (ENGRAM_STORE_POOL_SIZE)", () => {
  let db: TestDatabase
  let replica: RunningCoordinator
  let sql: postgres.Sql
  beforeAll(async () => {
    db = await freshDatabase()
    replica = await startCoordinator({ logLevel: "Error", config: { port: 0, databaseUrl: db.url, adminToken, storePoolSize: 2 } })
    sql = postgres(db.url, { max: 1, onnotice: () => undefined })
  })
  afterAll(async () => {
    await sql?.end({ timeout: 1 })
    await replica?.stop()
    await db?.drop()
  })

  it("64 requests at once: the pool holds 2, plus the lease and the listener, each named", async () => {
    const admin = client(replica.url, adminToken)
    for (let i = 0; i < 8; i++) expect((await admin.post("/v1/hosts", { id: `conn-h${i}` })).status).toBe(201)
    const answers = await Promise.all(Array.from({ length: 64 }, (_, i) => (i % 2 === 0 ? admin.get("/v1/hosts") : admin.get(`/v1/hosts/conn-h${i % 8}`))))
    expect(answers.map((a) => a.status)).toEqual(Array.from({ length: 64 }, () => 200))
    const rows = await sql<{ name: string }[]>`select application_name as name from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`
    const kinds = rows.map((r) => r.name.replace(/^(engram-placer|engram-lease) .*$/, "$1")).sort()
    expect(kinds).toEqual(["engram-lease", "engram-placer", "engram-placer", "engram-wakeups"])
    expect(rows.length).toBe(Config.connectionsPerReplica(2))
  })
})
