// The dashboard's change feed (`GET /ui/changes`) is a long-poll like the API's: it counts against
// the admin token's cap and the replica's total (`ENGRAM_MAX_WAITS_PER_ADMIN_TOKEN`,
// `ENGRAM_MAX_WAITS`; 429 `TooManyWaits` with `Retry-After` beyond, the API's answer), and it
// answers at once when the coordinator stops, as the API's long-polls do. Before, it was outside
// both: any number of dashboard tabs (or a runaway script with the admin token) held polls
// without bound, and a stopping coordinator's drain waited out every open one (up to its 10 s,
// then a 503). Real HTTP, real coordinators on the in-memory store.
import { LongPolls, Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { Effect } from "effect"
import { describe, expect, it, vi } from "vitest"
import { client } from "./support/http.js"

const adminToken = "ui-longpolls-admin-token-0123456789ab"

const openPolls = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))
const watching = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(Notifier), (n) => n.watching()))

/** The fleet's version now, and a `/ui/changes` path that waits 20 s for it to change. */
const waitingPath = async (c: RunningCoordinator) => {
  const now = await client(c.url, adminToken).get("/ui/changes?since=&waitMs=0")
  expect(now.status).toBe(200)
  return { version: now.body.version as string, path: `/ui/changes?since=${encodeURIComponent(now.body.version as string)}&waitMs=20000` }
}

const start = (config: Record<string, number>) => startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken, ...config } })

describe("the dashboard's /ui/changes under the long-poll caps", () => {
  it("counts against the admin token's cap, shared with the API's long-polls: beyond it a 429 TooManyWaits with Retry-After", async () => {
    const c = await start({ maxWaitsPerAdminToken: 2 })
    try {
      const admin = client(c.url, adminToken)
      const { path } = await waitingPath(c)
      const held = [admin.get(path), admin.get(path)]
      await vi.waitFor(async () => expect(await openPolls(c)).toBe(2), { timeout: 10_000, interval: 20 })
      const refused = await admin.get(path)
      expect([refused.status, refused.body.error, refused.body.limit, refused.body.retryAfterMs, refused.headers.get("retry-after")]).toEqual([429, "TooManyWaits", 2, 1000, "1"])
      expect(refused.body.message).toMatch(/the admin token already holds 2 open long-polls/)
      // One cap for the credential: the API's own long-poll is refused as well while the dashboard's hold it.
      expect((await admin.post("/v1/sessions", { id: "ui-capped", memMib: 64, vcpus: 1 })).status).toBe(202)
      expect((await admin.get("/v1/sessions/ui-capped/wait?state=running&timeoutMs=2000")).status).toBe(429)
      // The create changed the fleet: the held polls answer its new version, and their slots are free again.
      const answered = await Promise.all(held)
      expect(answered.map((r) => r.status)).toEqual([200, 200])
      expect(await openPolls(c)).toBe(0)
      expect((await admin.get("/ui/changes?since=&waitMs=0")).status).toBe(200)
    } finally {
      await c.stop()
    }
  })

  it("counts against this replica's total, beside the agents' polls", async () => {
    const c = await start({ maxWaits: 2 })
    try {
      const admin = client(c.url, adminToken)
      const host = (await admin.post("/v1/hosts", { id: "ui-total-h1" })).body
      const agent = client(c.url, host.token as string)
      expect((await agent.put("/v1/hosts/ui-total-h1/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })).status).toBe(200)
      const first = await agent.get("/v1/hosts/ui-total-h1/assignments")
      const agentPoll = agent.get(`/v1/hosts/ui-total-h1/assignments?waitMs=20000&since=${encodeURIComponent(first.body.version as string)}`)
      const { path } = await waitingPath(c)
      const uiPoll = admin.get(path)
      await vi.waitFor(async () => expect(await openPolls(c)).toBe(2), { timeout: 10_000, interval: 20 })
      const refused = await admin.get(path)
      expect([refused.status, refused.body.error, refused.body.limit, refused.headers.get("retry-after")]).toEqual([429, "TooManyWaits", 2, "1"])
      expect(refused.body.message).toMatch(/this coordinator already holds 2 open long-polls/)
      // A session placed on the host wakes both.
      expect((await admin.post("/v1/sessions", { id: "ui-total-s1", memMib: 64, vcpus: 1, affinity: ["ui-total-h1"] })).body.hostId).toBe("ui-total-h1")
      expect((await Promise.all([agentPoll, uiPoll])).map((r) => r.status)).toEqual([200, 200])
    } finally {
      await c.stop()
    }
  })
})

describe("the dashboard's /ui/changes when the coordinator stops", () => {
  it("answers at once with the version it has, as at its deadline, like the API's long-polls", async () => {
    const c = await start({})
    const { version, path } = await waitingPath(c)
    const before = await watching(c)
    const poll = client(c.url, adminToken).get(path)
    // Its watch is open: the poll waits on the fleet.
    await vi.waitFor(async () => expect(await watching(c)).toBe(before + 1), { timeout: 10_000, interval: 20 })
    await c.stop()
    const answered = await poll
    // Not the 503 of a request still open when the server's drain gave up (after 10 s).
    expect([answered.status, answered.body]).toEqual([200, { version }])
  })
})
