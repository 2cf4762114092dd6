// A resumed session placed on host f while its descent image sits on host img: f's assignments
// name img (`imageHosts`: its peer URL). When img reports a new peer URL, or is removed from the
// fleet, f's long-poll answers at once with the change (a new version): before, neither notified
// f's topic nor changed its version, so f's agent kept trying the old URL (or a removed host's)
// until its fetch deadline. A removed image host is said to be (`removed: true`), not shown as a
// host whose peer URL is not known yet. Over real HTTP, on the simulated store and on PostgreSQL.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "imagehost-notices-admin-token-0123456789"
const figures = { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 }
const u = "http://10.8.0.1:7100"
const v = "http://10.8.0.2:7200"

describe.each(["sim", "postgres"] as const)("an image host's new peer URL or removal wakes the hosts fetching from it (%s)", (backend) => {
  let c: RunningCoordinator
  let db: TestDatabase | undefined
  beforeAll(async () => {
    if (backend === "postgres") {
      db = await freshDatabase()
      c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, adminToken, databaseUrl: db.url } })
    } else {
      c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
    }
  }, 120_000)
  afterAll(async () => {
    await c?.stop()
    await db?.drop()
  })

  it("f's long-poll answers img's new peer URL, then img's removal, each with a new version", { timeout: 60_000 }, async () => {
    const admin = client(c.url, adminToken)
    const token = async (id: string) => {
      const created = await admin.post("/v1/hosts", { id })
      expect(created.status).toBe(201)
      expect((await admin.put(`/v1/hosts/${id}/report`, { ...figures, peerUrl: u })).status).toBe(200)
      return created.body.token as string
    }
    const img = client(c.url, await token("img"))
    const f = client(c.url, await token("f"))
    // d1 descends on img (f cordoned meanwhile): a queued session with no room makes it descend rather than park.
    expect((await admin.post("/v1/hosts/f/cordon")).status).toBe(200)
    expect((await admin.post("/v1/sessions", { id: "d1", memMib: 1024, vcpus: 1, affinity: ["img"] })).body.hostId).toBe("img")
    expect((await img.post("/v1/sessions/d1/started")).status).toBe(200)
    expect((await admin.post("/v1/sessions", { id: "dq1", memMib: 1536, vcpus: 1, affinity: ["img"] })).status).toBe(202)
    expect((await img.post("/v1/sessions/d1/idle")).body.state).toBe("descending")
    expect((await admin.del("/v1/sessions/dq1")).status).toBe(200)
    expect((await img.post("/v1/sessions/d1/descended")).body).toMatchObject({ state: "descended", hostId: null })
    // Resumed onto f (img cordoned): f fetches the image from img.
    expect((await admin.post("/v1/hosts/f/uncordon")).status).toBe(200)
    expect((await admin.post("/v1/hosts/img/cordon")).status).toBe(200)
    const resumed = await admin.post("/v1/sessions/d1/resume")
    expect([resumed.status, resumed.body.hostId]).toEqual([201, "f"])
    const seen = (await f.get("/v1/hosts/f/assignments")).body
    expect(seen.imageHosts).toEqual([{ hostId: "img", peerUrl: u }])

    // img's agent restarts on a new address: f's poll answers it.
    const polling = f.get(`/v1/hosts/f/assignments?waitMs=25000&since=${encodeURIComponent(seen.version)}`)
    expect((await img.put("/v1/hosts/img/report", { ...figures, peerUrl: v })).status).toBe(200)
    const woke = (await polling).body
    expect([woke.imageHosts, woke.version === seen.version]).toEqual([[{ hostId: "img", peerUrl: v }], false])

    // img is removed from the fleet (it holds only the image): f's poll answers that it is gone.
    const polling2 = f.get(`/v1/hosts/f/assignments?waitMs=25000&since=${encodeURIComponent(woke.version)}`)
    expect((await admin.del("/v1/hosts/img")).status).toBe(200)
    const gone = (await polling2).body
    expect([gone.imageHosts, gone.version === woke.version]).toEqual([[{ hostId: "img", peerUrl: null, removed: true }], false])
    // The session still names img: the agent boots it fresh and tells the loss.
    expect((await admin.get("/v1/sessions/d1")).body).toMatchObject({ state: "pending", hostId: "f", imageHostId: "img" })
  })
})
