// Waits woken by the change itself, across two replicas on one PostgreSQL: replica B's store is
// counted, so a test sees that a long-poll and a session wait held on B read the store only
// when they begin and when a change made through replica A wakes them, never on a timer. A
// rotated or removed host token ends B's open long-polls with 401 at once (SPEC §13), and a
// host token holds only a few long-polls open at once (429 beyond).
import { LongPolls, Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { ChangesPg, StorePg } from "@engram/store-pg"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { assert, describe as describeEffect, it as itEffect } from "@effect/vitest"
import { Context, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { answered, clockedCoordinator } from "./support/clocked.js"
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

  it("a long-poll whose agent leaves while it waits (its request parked at the edge) frees its slot and its watch at once", async () => {
    const token = await register("waits-h6")
    const first = await client(b.url, token).get("/v1/hosts/waits-h6/assignments")
    const watching = () => b.run(Effect.map(Effect.service(Notifier), (n) => n.watching()))
    const watchingBefore = await watching()
    const leaving = new AbortController()
    const left = fetch(`${b.url}/v1/hosts/waits-h6/assignments?waitMs=30000&since=${first.body.version as string}`, {
      headers: { authorization: `Bearer ${token}` },
      signal: leaving.signal,
    }).catch(() => "left")
    await until(async () => (await openPolls(b)) === 1)
    expect(await watching()).toBe(watchingBefore + 1)
    leaving.abort()
    expect(await left).toBe("left")
    await until(async () => (await openPolls(b)) === 0)
    expect(await watching()).toBe(watchingBefore)
    // The token's slots are all free: its cap of polls opens again.
    const path = `/v1/hosts/waits-h6/assignments?waitMs=30000&since=${first.body.version as string}`
    const agentOnB = client(b.url, token)
    const held = [agentOnB.get(path), agentOnB.get(path)]
    await until(async () => (await openPolls(b)) === 2)
    await client(a.url, adminToken).post("/v1/sessions", { id: "waits-s6", memMib: 512, vcpus: 1, affinity: ["waits-h6"] })
    expect((await Promise.all(held)).map((r) => r.status)).toEqual([200, 200])
  })
})

describeEffect("waits across replicas on PostgreSQL, replica B on the test's clock", () => {
  // Replica B runs whole (HTTP, its counted store, its LISTEN) on the test's clock: a waiter that
  // read the store on a timer would show it when the test moves the clock, however slow or fast
  // the machine (before, a real 1.2 s pause, which a slow machine could let pass falsely).
  itEffect.effect("a long-poll and a session wait on B read the store only when they begin and when a change through A wakes them", () =>
    Effect.gen(function* () {
      const http = <A>(request: () => Promise<A>) => Effect.promise(request)
      const db = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const config = { port: 0, adminToken }
      const a = yield* Effect.acquireRelease(
        Effect.promise(() => startCoordinator({ reaper: false, logLevel: "Error", config: { ...config, databaseUrl: db.url } })),
        (c) => Effect.promise(() => c.stop()),
      )
      const counted = counting(StorePg.layer({ url: db.url }))
      const readsOnB = counted.counts
      // The fleet history's samples (a read every 10 s) are not waiters: out of the clock's way.
      const b = yield* clockedCoordinator({ reaper: false, store: counted.layer, changes: ChangesPg.layer({ url: db.url }), uiHistory: { sampleMs: 3_600_000 }, config })
      const longPolls = Context.get(b.context, LongPolls)
      const admin = client(a.url, adminToken)
      const host = yield* http(() => admin.post("/v1/hosts", { id: "waits-h1" }))
      assert.strictEqual(host.status, 201)
      const token = host.body.token as string
      assert.strictEqual((yield* http(() => admin.put("/v1/hosts/waits-h1/report", report))).status, 200)
      assert.strictEqual((yield* http(() => admin.post("/v1/sessions", { id: "waits-s1", memMib: 1024, vcpus: 1, affinity: ["waits-h1"] }))).status, 201)
      const agentOnB = client(b.url, token)
      const first = yield* http(() => agentOnB.get("/v1/hosts/waits-h1/assignments"))
      assert.strictEqual(first.status, 200)
      const polled = yield* Effect.forkChild(http(() => agentOnB.get(`/v1/hosts/waits-h1/assignments?waitMs=20000&since=${first.body.version as string}`)))
      const waited = yield* Effect.forkChild(http(() => client(b.url, adminToken).get("/v1/sessions/waits-s1/wait?state=running&timeoutMs=20000")))
      // Both begun, and both read what they wait on (the poll's assignments were read just before;
      // the admin's wait reads its session once).
      yield* http(() => vi.waitFor(() => expect([longPolls.open(), (readsOnB.byName.get("getSession") ?? 0) >= 1]).toEqual([2, true]), { timeout: 30_000, interval: 20 }))
      const before = new Map(readsOnB.byName)
      // 15 s of B's clock, short of both deadlines (20 s): a waiter re-reading on a timer (every
      // 500 ms before waits were woken by the change) would have read 30 times.
      yield* TestClock.adjust(15_000)
      assert.strictEqual(readsOnB.total(), [...before.values()].reduce((x, y) => x + y, 0))
      // The agent starts the session through A: both waits on B wake, with B's clock standing still.
      assert.strictEqual((yield* http(() => client(a.url, token).post("/v1/sessions/waits-s1/started"))).status, 200)
      const poll = yield* answered("the long-poll woken by A's change", Fiber.join(polled))
      const wait = yield* answered("the session wait woken by A's change", Fiber.join(waited))
      assert.deepStrictEqual([poll.status, poll.body.sessions.map((s: { state: string }) => s.state)], [200, ["running"]])
      assert.deepStrictEqual([wait.status, wait.body.state], [200, "running"])
      // One re-read each, woken by the notice: the host's assignments (host, sessions and moves in
      // one read) and the session.
      const after = (name: string) => (readsOnB.byName.get(name) ?? 0) - (before.get(name) ?? 0)
      const names = ["hostAssignments", "getHost", "listSessions", "listMoves", "getSession"]
      assert.deepStrictEqual(Object.fromEntries(names.map((n) => [n, after(n)])), { hostAssignments: 1, getHost: 0, listSessions: 0, listMoves: 0, getSession: 1 })
    }).pipe(Effect.scoped),
  )
})
