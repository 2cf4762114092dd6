// An integer in a query string is at most 15 decimal digits (core's `Names.decimalInt`: every
// such number is exact). A 16th digit is refused with that rule in words, naming the parameter:
// before, `?waitMs=999999999999999999` was told "must be an integer in decimal digits", which it is.
import { describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { simCoordinatorForFile } from "./support/sim.js"

const adminToken = "query-integers-admin-token-0123456789"
const c = simCoordinatorForFile(adminToken)

describe("an integer in a query string", () => {
  it("of 16 digits or more is a 400 naming the parameter and the rule of at most 15 digits; 15 digits are read", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "h1" })).status).toBe(201)
    expect((await admin.post("/v1/sessions", { id: "s1", memMib: 64, vcpus: 1 })).status).toBe(202)
    for (const [path, field] of [
      ["/v1/hosts/h1/assignments?waitMs=999999999999999999", "waitMs"],
      ["/v1/hosts/h1/assignments?waitMs=1000000000000000", "waitMs"],
      ["/v1/sessions?limit=0000000000000010", "limit"],
      ["/v1/sessions/s1/wait?state=running&timeoutMs=12345678901234567890", "timeoutMs"],
      ["/v1/sessions?limit=0x10", "limit"],
    ] as const) {
      const r = await admin.get(path)
      expect([r.status, r.body.error, r.body.field, r.body.in, r.body.rule], path).toEqual([400, "InvalidInput", field, "query", "must be an integer of at most 15 decimal digits"])
    }
    expect((await admin.get("/v1/hosts/h1/assignments?waitMs=000000000000000")).status).toBe(200)
    expect((await admin.get("/v1/sessions?limit=000000000000010")).body.items).toHaveLength(1)
  })
})
