// The park gate's immediate reaction over real HTTP: a session that queues without room makes a
// park yield within one coalescing window, not at the next reaper pass. The reaper interval is
// an hour here, so nothing but the reaction can start the descent the test waits for.
import { Limits } from "@engram/core"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startCoordinator } from "../src/index.js"
import type { RunningCoordinator } from "../src/index.js"
import { client } from "./support/http.js"

const adminToken = "react-test-admin-token-0123456789"
const hourly = (() => {
  const r = Limits.make({ reaperIntervalMs: 60 * 60 * 1000 })
  if (r._tag === "Invalid") throw new Error("bad test limits")
  return r.limits
})()

let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), logLevel: "Error", config: { port: 0, adminToken, limits: hourly } })
})
afterAll(() => c?.stop())

describe("the gate reacts at once", () => {
  it("a create that queues without room makes the park on the full host descend", async () => {
    const api = client(c.url, adminToken)
    expect((await api.post("/v1/hosts", { id: "h1" })).status).toBe(201)
    // 2 GiB of room after the 1 GiB system reserve.
    expect((await api.put("/v1/hosts/h1/report", { totalMib: 3072, allocatableMib: 3072, totalVcpus: 4 })).status).toBe(200)
    expect((await api.post("/v1/sessions", { id: "p1", memMib: 2048, vcpus: 1 })).status).toBe(201)
    expect((await api.post("/v1/sessions/p1/started")).status).toBe(200)
    expect((await api.post("/v1/sessions/p1/idle")).body.state).toBe("parked")

    const queued = await api.post("/v1/sessions", { id: "q1", memMib: 1024, vcpus: 1 })
    expect([queued.status, queued.body.state]).toStrictEqual([202, "queued"])
    // The reaction asks the agent to descend p1 (no agent runs here: it stays descending).
    const waited = await api.get("/v1/sessions/p1/wait?state=descending&timeoutMs=30000")
    expect([waited.status, waited.body.state]).toStrictEqual([200, "descending"])
  })
})
