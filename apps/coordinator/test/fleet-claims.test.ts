// The fleet signal's queue without room over real HTTP (`GET /v1/fleet`, `engram_queue_without_room`)
// counts as the reaper's park gate does: a session that fits only on a host placement claims for
// a starving session waits as surely as one that fits nowhere. The starving session is made
// without a sleep: it is created by a store whose clock runs past the starvation limit behind.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { ParkPolicy } from "@engram/core"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { shiftedLayer } from "./support/clock.js"
import type { Shift } from "./support/clock.js"
import { client } from "./support/http.js"

const adminToken = "fleet-claims-admin-token-0123456789"
const GiB = 1024

describe("the fleet signal and placement's claims", () => {
  const shift: Shift = { ms: 0 }
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store: shiftedLayer(StoreSim.layer(), shift), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  it("a queued session that fits only on the host claimed for a starving one is without room, in /v1/fleet and /metrics", async () => {
    const admin = client(c.url, adminToken)
    const report = (id: string, mib: number) => admin.put(`/v1/hosts/${id}/report`, { totalMib: mib, allocatableMib: mib, totalVcpus: 16 })
    for (const [id, mib] of [["C", 16 * GiB], ["D", 2 * GiB]] as const) {
      expect((await admin.post("/v1/hosts", { id })).status).toBe(201)
      expect((await report(id, mib)).status).toBe(200)
    }
    // C: 12 GiB free once r runs there; D: 2 GiB.
    expect((await admin.post("/v1/sessions", { id: "r", memMib: 4 * GiB, vcpus: 1 })).body.hostId).toBe("C")
    // S (14 GiB) fits nowhere now, but on C once empty: it queues, and has waited past the limit.
    shift.ms = -(ParkPolicy.defaultOptions.starvationLimitMs + 1000)
    expect((await admin.post("/v1/sessions", { id: "S", memMib: 14 * GiB, vcpus: 1 })).body.state).toBe("queued")
    shift.ms = 0
    // B (10 GiB) fits in C's 12 GiB, but placement claims C for S: B queues.
    expect((await admin.post("/v1/sessions", { id: "B", memMib: 10 * GiB, vcpus: 1 })).body.state).toBe("queued")

    const fleet = (await admin.get("/v1/fleet")).body
    // Before, B counted as having room (C's headroom fits it): 1, where the gate counts 2.
    expect(fleet.queue).toMatchObject({ sessions: 2, withoutRoom: 2 })
    expect(fleet.unplaceable.count).toBe(0)
    const metrics = (await admin.get("/metrics")).body as string
    expect(metrics).toMatch(/^engram_queue_without_room 2$/m)
  })
})
