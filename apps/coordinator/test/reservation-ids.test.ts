// A reservation's id and hostId keep the one id rule (SPEC §12): an empty or malformed one is a
// 400 naming the field and the rule, not a 409 `Refused` of the ledger, and it is no reserve
// failure (`reserveFailures` counts the ledger's refusals only). Nothing is stored.
import { Names } from "@engram/core"
import { describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { simCoordinatorForFile } from "./support/sim.js"

const adminToken = "reservation-ids-admin-token-0123456789"
const c = simCoordinatorForFile(adminToken)

describe("a reservation with a malformed id or hostId", () => {
  it("is a 400 naming the field and the id rule, stores nothing and counts no reserve failure", async () => {
    const admin = client(c.url, adminToken)
    const h = await admin.post("/v1/hosts", { id: "h1" })
    expect((await client(c.url, h.body.token).put("/v1/hosts/h1/report", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })).status).toBe(200)
    const asked = { hostId: "h1", ownerKind: "external", ownerId: "job", memMib: 1, vcpus: 0 }
    const failures = (await admin.get("/v1/ledger/metrics")).body.reserveFailures
    for (const [body, field] of [
      [{ ...asked, id: "" }, "id"],
      [{ ...asked, id: " " }, "id"],
      [{ ...asked, hostId: "" }, "hostId"],
      [{ ...asked, hostId: "h1:x" }, "hostId"],
      [{ ...asked, id: "", hostId: "", memMib: 0 }, "id"],
    ] as const) {
      const r = await admin.post("/v1/reservations", body)
      expect([r.status, r.body.error, r.body.field, r.body.rule], JSON.stringify(body)).toEqual([400, "InvalidInput", field, Names.idRule])
    }
    expect((await admin.get("/v1/reservations")).body.items).toEqual([])
    expect((await admin.get("/v1/ledger/metrics")).body.reserveFailures).toBe(failures)
    // A ledger refusal still is one: memMib 0 on a good id and host is a 409 that counts.
    const refused = await admin.post("/v1/reservations", { ...asked, memMib: 0 })
    expect([refused.status, refused.body.error, refused.body.check]).toEqual([409, "Refused", "mem_not_positive"])
    expect((await admin.get("/v1/ledger/metrics")).body.reserveFailures).toBe(failures + 1)
  })
})
