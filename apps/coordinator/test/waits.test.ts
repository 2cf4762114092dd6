// Waits woken by the change itself, across two replicas on one PostgreSQL: replica B's store is
// counted, so a test sees that a long-poll and a session wait held on B read the store only
// when they begin and when a change made through replica A wakes them, never on a timer. A
// rotated or removed host token ends B's open long-polls with 401 at once (SPEC §13), and a
// host token holds only a few long-polls open at once (429 beyond).
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { ChangesPg, StorePg } from "@engram/store-pg"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { counting } from "./support/counting.js"
import type { Counts } from "./support/counting.js"
import { client } from "./support/http.js"

const adminToken = "waits-admin-token-0123456789"
const report = { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 }
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Waits until `read` holds (a condition checked every 20 ms, up to 20 s). */
const until = async (read: () => Promise<boolean>): Promise<void> => {
  for (let i = 0; i < 1000; i++) {
    if (await read()) return
    await sleep(20)
  }
  throw new Error("condition never held")
}
const openPolls = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))

describe("waits across replicas on PostgreSQL", () => {
  let db: TestDatabase
  let a: RunningCoordinator
  let b: RunningCoordinator
  let readsOnB: Counts
  beforeAll(async () => {
    db = await freshDatabase()
    const config = { port: 0, adminToken, maxWaitsPerHostToken: 2 }
    const counted = counting(StorePg.layer({ url: db.url }))
    readsOnB = counted.counts
    a = await startCoordinator({ reaper: false, logLevel: "Error", config: { ...config, databaseUrl: db.url } })
    b = await startCoordinator({ reaper: false, logLevel: "Error", config, store: counted.layer, changes: ChangesPg.layer({ url: db.url }) })
  })
  afterAll(async () => {
    await a?.stop()
    await b?.stop()
    await db?.drop()
  })

  const register = async (id: string): Promise<string> => {
    const admin = client(a.url, adminToken)
    const host = await admin.post("/v1/hosts", { id })
    expect(host.status).toBe(201)
    expect((await admin.put(`/v1/hosts/${id}/report`, report)).status).toBe(200)
    return host.body.token as string
  }

  it("a long-poll and a session wait on B read the store only when they begin and when a change through A wakes them", async () => {
    const token = await register("waits-h1")
    const admin = client(a.url, adminToken)
    expect((await admin.post("/v1/sessions", { id: "waits-s1", memMib: 1024, vcpus: 1, affinity: ["waits-h1"] })).status).toBe(201)
    const agentOnB = client(b.url, token)
    const first = await agentOnB.get("/v1/hosts/waits-h1/assignments")
    expect(first.status).toBe(200)
    const polled = agentOnB.get(`/v1/hosts/waits-h1/assignments?waitMs=20000&since=${first.body.version as string}`)
    const waited = client(b.url, adminToken).get("/v1/sessions/waits-s1/wait?state=running&timeoutMs=20000")
    // Both begun, and both read what they wait on (the poll's assignments were read just before;
    // the admin's wait reads its session once).
    await until(async () => (await openPolls(b)) === 2 && (readsOnB.byName.get("getSession") ?? 0) >= 1)
    const before = new Map(readsOnB.byName)
    // Long enough for a waiter that re-read on a timer to show it (every 500 ms before this change).
    await sleep(1200)
    expect(readsOnB.total()).toBe([...before.values()].reduce((x, y) => x + y, 0))
    // The agent starts the session through A: both waits on B wake.
    expect((await client(a.url, token).post("/v1/sessions/waits-s1/started")).status).toBe(200)
    const [poll, wait] = await Promise.all([polled, waited])
    expect([poll.status, poll.body.sessions.map((s: { state: string }) => s.state)]).toEqual([200, ["running"]])
    expect([wait.status, wait.body.state]).toEqual([200, "running"])
    // One re-read each, woken by the notice: the host's assignments (host, sessions and moves in
    // one read) and the session.
    const after = (name: string) => (readsOnB.byName.get(name) ?? 0) - (before.get(name) ?? 0)
    const names = ["hostAssignments", "getHost", "listSessions", "listMoves", "getSession"]
    expect(Object.fromEntries(names.map((n) => [n, after(n)]))).toEqual({ hostAssignments: 1, getHost: 0, listSessions: 0, listMoves: 0, getSession: 1 })
  })

  it("a long-poll of an idle host answers its deadline from memory, without a read", async () => {
    const token = await register("waits-h2")
    const agentOnB = client(b.url, token)
    const first = await agentOnB.get("/v1/hosts/waits-h2/assignments")
    const reads = readsOnB.total()
    // Its credential and its assignments are known: the whole poll reads nothing.
    const idle = await agentOnB.get(`/v1/hosts/waits-h2/assignments?waitMs=300&since=${first.body.version as string}`)
    expect([idle.status, idle.body.version]).toEqual([200, first.body.version])
    expect(readsOnB.total()).toBe(reads)
  })

  it("a rotated token ends the host's open long-polls on B with 401 at once; the new token works there", async () => {
    const token = await register("waits-h3")
    const admin = client(a.url, adminToken)
    expect((await admin.post("/v1/sessions", { id: "waits-s3", memMib: 1024, vcpus: 1, affinity: ["waits-h3"] })).status).toBe(201)
    const agentOnB = client(b.url, token)
    const first = await agentOnB.get("/v1/hosts/waits-h3/assignments")
    const polled = agentOnB.get(`/v1/hosts/waits-h3/assignments?waitMs=30000&since=${first.body.version as string}`)
    const waited = agentOnB.get("/v1/sessions/waits-s3/wait?state=ended&timeoutMs=60000")
    await until(async () => (await openPolls(b)) === 2)
    const rotated = await admin.post("/v1/hosts/waits-h3/token")
    expect(rotated.status).toBe(200)
    // Before their deadlines (30 s, 60 s), with nothing changed in their assignments or session.
    const [poll, wait] = await Promise.all([polled, waited])
    expect([poll.status, poll.body.error]).toEqual([401, "Unauthorized"])
    expect([wait.status, wait.body.error]).toEqual([401, "Unauthorized"])
    expect((await agentOnB.get("/v1/hosts/waits-h3/assignments")).status).toBe(401)
    expect((await client(b.url, rotated.body.token as string).get("/v1/hosts/waits-h3/assignments")).status).toBe(200)
  })

  it("a removed host's open long-poll on B ends with 401 at once", async () => {
    const token = await register("waits-h4")
    const agentOnB = client(b.url, token)
    const first = await agentOnB.get("/v1/hosts/waits-h4/assignments")
    const polled = agentOnB.get(`/v1/hosts/waits-h4/assignments?waitMs=30000&since=${first.body.version as string}`)
    await until(async () => (await openPolls(b)) === 1)
    expect((await client(a.url, adminToken).del("/v1/hosts/waits-h4")).status).toBe(200)
    const poll = await polled
    expect([poll.status, poll.body.error]).toEqual([401, "Unauthorized"])
  })

  it("a host token holds at most its cap of long-polls: the next is a 429 with Retry-After; the admin's are counted apart", async () => {
    const token = await register("waits-h5")
    const agentOnB = client(b.url, token)
    const first = await agentOnB.get("/v1/hosts/waits-h5/assignments")
    const path = `/v1/hosts/waits-h5/assignments?waitMs=30000&since=${first.body.version as string}`
    const held = [agentOnB.get(path), agentOnB.get(path)]
    await until(async () => (await openPolls(b)) === 2)
    const refused = await agentOnB.get(path)
    expect([refused.status, refused.body.error, refused.body.limit, refused.headers.get("retry-after")]).toEqual([429, "TooManyWaits", 2, "1"])
    // The admin token is another credential, under its own cap.
    const byAdmin = await client(b.url, adminToken).get(`/v1/hosts/waits-h5/assignments?waitMs=100&since=${first.body.version as string}`)
    expect(byAdmin.status).toBe(200)
    // The held polls end (a change wakes them), and a slot is free again.
    await client(a.url, adminToken).post("/v1/sessions", { id: "waits-s5", memMib: 512, vcpus: 1, affinity: ["waits-h5"] })
    expect((await Promise.all(held)).map((r) => r.status)).toEqual([200, 200])
    expect((await agentOnB.get(`/v1/hosts/waits-h5/assignments?waitMs=0`)).status).toBe(200)
  })
})
