// A full host (its RAM report at or below the system reserve, its cores times cpuOvercommit below
// one vCPU) keeps the smallest positive capacity inside core so it stays gated; the API showed
// that sentinel as it was: `allocatableMib: 5e-324`, `cpuBudget: 5e-324`, `freeVcpus: 5e-324`.
// Over real HTTP, every view of it says 0: the host view, the no-fit details and the fleet signal.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "full-host-view-admin-token-0123456789"
const limits = { ...Limits.defaults, cpuOvercommit: 0.5 }

describe("a full host as the API shows it", () => {
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store: StoreSim.layer({ limits }), reaper: false, logLevel: "Error", config: { port: 0, adminToken, limits } })
  })
  afterAll(() => c?.stop())

  it("has capacity 0, budget 0 and 0 free, never 5e-324, in its view, the no-fit details and the fleet; it takes nothing", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "full" })).status).toBe(201)
    // 512 MiB is below the 1024 MiB reserve; one core at 0.5 floors to no vCPU.
    expect((await admin.put("/v1/hosts/full/report", { totalMib: 512, allocatableMib: 512, totalVcpus: 1 })).status).toBe(200)
    const view = (await admin.get("/v1/hosts/full")).body
    expect([view.allocatableMib, view.freeMib, view.cpuBudget, view.freeVcpus]).toEqual([0, 0, 0, 0])
    const noFit = await admin.get("/v1/placement/no-fit?memMib=256&vcpus=1")
    expect(noFit.body).toEqual({ fits: false, hosts: [{ hostId: "full", reason: "ram_full", freeMib: 0, freeVcpus: 0 }] })
    const fleet = (await admin.get("/v1/fleet")).body
    expect([fleet.capacityMib, fleet.freeMib, fleet.cpuBudget, fleet.freeVcpus]).toEqual([0, 0, 0, 0])
    // Still full, not ungated: a create queues.
    expect((await admin.post("/v1/sessions", { id: "s1", memMib: 256, vcpus: 1 })).status).toBe(202)
  })
})
