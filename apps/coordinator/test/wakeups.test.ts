// Cross-replica wake-ups through PostgreSQL LISTEN/NOTIFY: two coordinators on one database,
// whose waiters never re-read the store on a timer, so nothing but a notification from the
// other replica can wake a waiter within the waits below. Then the listening connection of one
// replica is killed: it listens again, and wakes again.
import { Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "wakeups-admin-token-0123456789"
const waitMs = 20_000

describe("wake-ups across replicas (LISTEN/NOTIFY)", () => {
  let db: TestDatabase
  let a: RunningCoordinator
  let b: RunningCoordinator
  beforeAll(async () => {
    db = await freshDatabase()
    const config = { port: 0, databaseUrl: db.url, adminToken }
    a = await startCoordinator({ reaper: false, logLevel: "Error", config })
    b = await startCoordinator({ reaper: false, logLevel: "Error", config })
  })
  afterAll(async () => {
    await a?.stop()
    await b?.stop()
    await db?.drop()
  })

  /** A waiter on replica B's notifier, registered when this returns: true when notified, false when its wait ran out. */
  const waitOnB = (topic: string): Promise<boolean> => b.run(Effect.flatMap(Effect.service(Notifier), (n) => n.wait([topic], waitMs)))

  it("a create through replica A wakes the agent long-polling replica B and B's waiters of that host", async () => {
    const admin = client(a.url, adminToken)
    const host = await admin.post("/v1/hosts", { id: "wake-h1" })
    expect(host.status).toBe(201)
    expect((await admin.put("/v1/hosts/wake-h1/report", { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 })).status).toBe(200)
    const agentOnB = client(b.url, host.body.token as string)
    const before = await agentOnB.get("/v1/hosts/wake-h1/assignments")
    expect(before.body.sessions).toEqual([])
    const woken = waitOnB("host:wake-h1")
    let answeredAt = 0
    const polled = agentOnB.get(`/v1/hosts/wake-h1/assignments?waitMs=${waitMs}&since=${before.body.version as string}`).then((r) => {
      answeredAt = performance.now()
      return r
    })
    const askedAt = performance.now()
    const created = await admin.post("/v1/sessions", { id: "wake-s1", memMib: 1024, vcpus: 1 })
    const createdAt = performance.now()
    expect([created.status, created.body.hostId]).toEqual([201, "wake-h1"])
    // Only a notification from A can end B's wait before it runs out.
    expect(await woken).toBe(true)
    const answer = await polled
    expect(answer.status).toBe(200)
    expect(answer.body.version).not.toBe(before.body.version)
    expect(answer.body.sessions.map((s: { id: string }) => s.id)).toEqual(["wake-s1"])
    // A figure, not an assertion (the machine's load decides it): from A's answer to B's.
    console.log(
      `wake-up: B's long-poll answered ${(answeredAt - askedAt).toFixed(1)} ms after the create was sent to A ` +
        `(A answered it after ${(createdAt - askedAt).toFixed(1)} ms)`,
    )
  })

  it("a session's state changed through A answers a wait for it on B", async () => {
    const admin = client(a.url, adminToken)
    const host = await admin.post("/v1/hosts", { id: "wake-h2" })
    await admin.put("/v1/hosts/wake-h2/report", { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 })
    expect((await admin.post("/v1/sessions", { id: "wake-s2", memMib: 1024, vcpus: 1, affinity: ["wake-h2"] })).body.hostId).toBe("wake-h2")
    const woken = waitOnB("session:wake-s2")
    const waiting = client(b.url, adminToken).get(`/v1/sessions/wake-s2/wait?state=running&timeoutMs=${waitMs}`)
    expect((await client(a.url, host.body.token as string).post("/v1/sessions/wake-s2/started")).status).toBe(200)
    expect(await woken).toBe(true)
    const answer = await waiting
    expect([answer.status, answer.body.state]).toEqual([200, "running"])
  })

  it("when B's listening connection is killed, B listens again and is woken again", async () => {
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      const listeners = async () =>
        (await sql<{ pid: number }[]>`select pid from pg_stat_activity where datname = current_database() and application_name = 'engram-wakeups'`).map((r) => r.pid)
      const before = await listeners()
      // One LISTEN per replica.
      expect(before).toHaveLength(2)
      await sql`select pg_terminate_backend(pid) from pg_stat_activity where pid = any(${before}::int[])`
      // Both replicas open a new connection and LISTEN on it (a condition, checked until it holds).
      let after: number[] = []
      for (let i = 0; i < 400; i++) {
        after = await listeners()
        if (after.length === 2 && after.every((p) => !before.includes(p))) break
        await new Promise((r) => setTimeout(r, 25))
      }
      expect(after.filter((p) => !before.includes(p))).toHaveLength(2)
      const admin = client(a.url, adminToken)
      await admin.post("/v1/hosts", { id: "wake-h3" })
      await admin.put("/v1/hosts/wake-h3/report", { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 })
      const woken = waitOnB("host:wake-h3")
      expect((await admin.post("/v1/sessions", { id: "wake-s3", memMib: 1024, vcpus: 1, affinity: ["wake-h3"] })).body.hostId).toBe("wake-h3")
      expect(await woken).toBe(true)
    } finally {
      await sql.end()
    }
  })
})
