// A leader stopping cleanly gives its lease up at once (coordinator README, "Replicas"): before
// its server drains the requests still open (a slow upload holds the drain up to its 10 s), so
// another replica leads at its next check; and its open long-polls answer at once, as at their
// deadline, rather than holding the drain and being cut by it. A real PostgreSQL; the lease
// row read beside the coordinator.
import { request } from "node:http"
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, client } from "./support/http.js"

const adminToken = "giveup-admin-token-0123456789"
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

let db: TestDatabase
let sql: ReturnType<typeof postgres>
let c: RunningCoordinator | undefined

beforeAll(async () => {
  db = await freshDatabase()
  sql = postgres(db.url, { max: 1, onnotice: () => {} })
})

afterAll(async () => {
  await c?.stop().catch(() => undefined)
  await sql?.end()
  await db?.drop()
})

/** Waits until `read` holds (checked every 50 ms, up to 60 s). */
const until = async (what: string, read: () => Promise<boolean>): Promise<void> => {
  for (let i = 0; i < 1200; i++) {
    if (await read()) return
    await sleep(50)
  }
  throw new Error(`${what}: never held`)
}

describe("a leader that stops", () => {
  it("gives its lease up before its server drains a request still open, and answers its open long-polls at once (unchanged) instead of cutting them", async () => {
    c = await startCoordinator({ logLevel: "None", config: { port: 0, adminToken, databaseUrl: db.url } })
    const coordinator = c
    await until("the replica leads", async () => (await call(coordinator.url, "GET", "/readyz")).body?.leader === true)
    const admin = client(coordinator.url, adminToken)
    const host = await admin.post("/v1/hosts", { id: "giveup-h1" })
    expect(host.status).toBe(201)
    const agent = client(coordinator.url, host.body.token as string)
    const first = await agent.get("/v1/hosts/giveup-h1/assignments")
    expect(first.status).toBe(200)
    // An agent's long-poll, open while the coordinator stops.
    const polled = agent.get(`/v1/hosts/giveup-h1/assignments?waitMs=30000&since=${first.body.version as string}`).catch((e: unknown) => e)
    // A request the drain waits for: its body not all sent. `Expect: 100-continue` makes the
    // server say when it has read the request's head (Node answers 100 before the handler
    // reads the body): from then on it is a request in flight, not an idle connection a stop
    // may close, however slow the machine.
    let uploadSettled = false
    const upload = request(`${coordinator.url}/v1/hosts`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json", "content-length": "1000", expect: "100-continue" },
    })
    upload.on("response", (r) => ((uploadSettled = true), r.resume()))
    upload.on("error", () => (uploadSettled = true))
    upload.on("close", () => (uploadSettled = true))
    const headRead = new Promise<void>((resolve) => upload.once("continue", () => resolve()))
    upload.flushHeaders()
    await headRead
    await new Promise<void>((resolve, reject) => upload.write('{"id":"giveup-', (e) => (e ? reject(e) : resolve())))
    await until("the long-poll open", async () => (await coordinator.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))) === 1)
    const [held] = await sql`select lease_duration_ms from leases`
    expect(Number(held?.["lease_duration_ms"])).toBeGreaterThan(0)
    const stopping = c.stop()
    c = undefined
    await until("the lease given up", async () => Number((await sql`select lease_duration_ms from leases`)[0]?.["lease_duration_ms"]) === 0)
    // Given up while the drain still waited for the upload.
    expect(uploadSettled).toBe(false)
    const poll = (await polled) as { status: number; body: { version: string } }
    expect([poll.status, poll.body.version]).toEqual([200, first.body.version])
    upload.destroy()
    await stopping
  }, 120_000)

  it("with ENGRAM_SHUTDOWN_DELAY_MS it gives its lease up as the delay begins (its reaper stops then), not after it", async () => {
    const delayed = await startCoordinator({ logLevel: "None", config: { port: 0, adminToken, databaseUrl: db.url, shutdownDelayMs: 20_000 } })
    await until("the replica leads", async () => (await call(delayed.url, "GET", "/readyz")).body?.leader === true)
    const stopping = delayed.stop()
    await until("the lease given up", async () => Number((await sql`select lease_duration_ms from leases`)[0]?.["lease_duration_ms"]) === 0)
    // Still within the delay: not ready, still serving.
    expect((await call(delayed.url, "GET", "/readyz")).status).toBe(503)
    expect((await call(delayed.url, "GET", "/livez")).status).toBe(200)
    await stopping
  }, 120_000)
})
