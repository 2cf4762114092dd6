// The end-to-end suite on the in-memory store (fast), plus the cases only a wrapped store can show.
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { failingFleetLayer } from "./support/failing.js"
import type { FleetSwitch } from "./support/failing.js"
import { client, uid } from "./support/http.js"
import { apiSuite } from "./suite.js"

const adminToken = "sim-admin-token-0123456789"

apiSuite("StoreSim", {
  start: (o) =>
    startCoordinator({
      store: StoreSim.layer(),
      reaper: false,
      logLevel: "Warn",
      config: { port: 0, adminToken, ...(o?.moveTimeoutMs === undefined ? {} : { moveTimeoutMs: o.moveTimeoutMs }) },
    }),
})

describe("a failed fleet read holds every park (over HTTP)", () => {
  const sw: FleetSwitch = { failFleet: false }
  let c: Awaited<ReturnType<typeof startCoordinator>>
  beforeAll(async () => {
    c = await startCoordinator({ store: failingFleetLayer(StoreSim.layer(), sw), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  it("the pass ends at once, no park descends, the failure is counted; the next good read yields", async () => {
    const admin = client(c.url, adminToken)
    const hid = uid("h")
    const token = (await admin.post("/v1/hosts", { id: hid })).body.token as string
    await admin.put(`/v1/hosts/${hid}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 4 })
    const agent = client(c.url, token)
    await admin.post("/v1/sessions", { id: "p1", memMib: 1536, vcpus: 1 })
    await agent.post("/v1/sessions/p1/started")
    expect((await agent.post("/v1/sessions/p1/idle")).body.state).toBe("parked")
    expect((await admin.post("/v1/sessions", { id: "q1", memMib: 1024, vcpus: 1 })).status).toBe(202)

    sw.failFleet = true
    expect(await c.reaperPass()).toEqual({ _tag: "Held", reason: "fleet read failed (test)" })
    expect(await c.reaperPass()).toMatchObject({ _tag: "Held" })
    expect((await admin.get("/v1/sessions/p1")).body.state).toBe("parked")
    const metrics = (await admin.get("/metrics")).body as string
    expect(metrics).toContain("engram_reaper_fleet_read_failures_total 2")
    expect(metrics).toContain("engram_store_up 0")
    // The API answers 503 with Retry-After where it needs the fleet read.
    const fleet = await admin.get("/v1/fleet")
    expect(fleet.status).toBe(503)
    expect(fleet.headers.get("retry-after")).toBe("1")
    expect(fleet.body).toMatchObject({ error: "Unavailable", retryAfterMs: 1000 })

    sw.failFleet = false
    expect(await c.reaperPass()).toMatchObject({ _tag: "Done", descents: [{ sessionId: "p1", reason: "demand" }] })
  })
})
