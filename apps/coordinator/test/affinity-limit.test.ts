// A session's affinity is a preference among a few hosts: at most 64 host ids, each once. A
// longer list (50,000 copies of one id fit in a 1 MiB body) or a repeated host is a 400 naming
// `affinity` and the rule, and nothing is stored: before, it was kept and copied into every
// assignments answer of its host.
import { describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { simCoordinatorForFile } from "./support/sim.js"

const adminToken = "affinity-limit-admin-token-0123456789"
const c = simCoordinatorForFile(adminToken)

describe("a create's affinity", () => {
  it("of more than 64 hosts, or naming a host twice, is a 400 naming affinity and the rule; nothing is stored", async () => {
    const admin = client(c.url, adminToken)
    const h = await admin.post("/v1/hosts", { id: "h1" })
    expect((await client(c.url, h.body.token).put("/v1/hosts/h1/report", { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })).status).toBe(200)
    const session = { id: "s1", memMib: 1024, vcpus: 1 }
    for (const [affinity, field, rule] of [
      [Array.from({ length: 50_000 }, () => "h1"), "affinity", "must be an array of at most 64 host ids"],
      [Array.from({ length: 65 }, (_, i) => `h${i}`), "affinity", "must be an array of at most 64 host ids"],
      [["h1", "h2", "h1"], "affinity.2", "must name a host once (it repeats affinity.0)"],
    ] as const) {
      const r = await admin.post("/v1/sessions", { ...session, affinity })
      expect([r.status, r.body.error, r.body.field, r.body.rule], `${affinity.length} entries`).toEqual([400, "InvalidInput", field, rule])
    }
    expect((await admin.get("/v1/sessions/s1")).status).toBe(404)
    // 64 hosts, each once, are taken, in their order.
    const most = Array.from({ length: 64 }, (_, i) => `h${i + 1}`)
    const placed = await admin.post("/v1/sessions", { ...session, affinity: most })
    expect([placed.status, placed.body.hostId]).toEqual([201, "h1"])
    expect((await admin.get("/v1/sessions/s1")).body.affinity).toEqual(most)
  })
})
