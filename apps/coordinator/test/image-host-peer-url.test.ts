// A host restoring a session from another host's descent image learns that image host's new peer
// URL at once. The restoring host's assignments name each image host with its URL (`imageHosts`);
// before, that URL was not part of the assignments' version and an image host's report of a new
// one notified only the sources of its pending moves: the restoring host's cached assignments kept
// the old URL and its agent's long-poll never answered the new one (its fetch of the image kept
// going to an address no agent served). Now the URLs are in the version and the report notifies
// the hosts restoring from the image. Real HTTP, a real coordinator on the in-memory store.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "image-host-peer-url-admin-token-0123456789"
const figures = { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 }
const u = "http://10.8.0.1:7100"
const v = "http://10.8.0.2:7200"
let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

it("an image host's new peer URL wakes the poll of the host restoring from its image", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const img = (await admin.post("/v1/hosts", { id: "img" })).body
  expect((await admin.put("/v1/hosts/img/report", { ...figures, peerUrl: u })).status).toBe(200)
  const imgAgent = client(c.url, img.token)
  expect((await admin.post("/v1/sessions", { id: "s1", memMib: 1024, vcpus: 1, affinity: ["img"] })).body.hostId).toBe("img")
  await imgAgent.post("/v1/sessions/s1/started")
  // A queued session with no room makes the idle one descend rather than park.
  expect((await admin.post("/v1/sessions", { id: "q1", memMib: 1536, vcpus: 1 })).status).toBe(202)
  expect((await imgAgent.post("/v1/sessions/s1/idle")).body.state).toBe("descending")
  await admin.del("/v1/sessions/q1")
  expect((await imgAgent.post("/v1/sessions/s1/descended")).body).toMatchObject({ state: "descended", hostId: null })
  // The image's host is full: the restore goes to another host.
  const free = (await admin.get("/v1/hosts/img")).body.freeMib
  expect((await admin.post("/v1/sessions", { id: "fill", memMib: free, vcpus: 1, affinity: ["img"] })).body.hostId).toBe("img")
  const other = (await admin.post("/v1/hosts", { id: "c1" })).body
  expect((await admin.put("/v1/hosts/c1/report", { ...figures, peerUrl: "http://10.8.0.3:7300" })).status).toBe(200)
  const restorer = client(c.url, other.token)
  expect((await admin.post("/v1/sessions/s1/resume")).body).toMatchObject({ state: "pending", hostId: "c1" })
  const before = (await restorer.get("/v1/hosts/c1/assignments")).body
  expect(before.imageHosts).toEqual([{ hostId: "img", peerUrl: u }])
  // The restorer's agent polls; the image host's agent restarts on a new address and reports it.
  const t0 = Date.now()
  const poll = restorer.get(`/v1/hosts/c1/assignments?waitMs=25000&since=${encodeURIComponent(before.version)}`)
  await new Promise((r) => setTimeout(r, 100))
  expect((await admin.put("/v1/hosts/img/report", { ...figures, peerUrl: v })).status).toBe(200)
  const after = await poll
  expect(after.status).toBe(200)
  expect(after.body.imageHosts).toEqual([{ hostId: "img", peerUrl: v }])
  expect(after.body.version).not.toBe(before.version)
  // Woken by the change, not answered at its deadline (a read then would find the URL too).
  expect(Date.now() - t0).toBeLessThan(15_000)
})
