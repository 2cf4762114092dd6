// A create that repeats an id answers the session only when it asks for that session: another
// affinity, idle timeout, TTL or template under the id is a 409 Conflict naming the field (as
// another budget is), and nothing changes; the same create again, or one that leaves options
// out, is answered as before (201 placed, 202 queued).
import { describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { simCoordinatorForFile } from "./support/sim.js"

const adminToken = "repeated-create-admin-token-0123456789"
const c = simCoordinatorForFile(adminToken)

describe("a repeated create", () => {
  it("with options its session was not created with is a 409 naming the first that differs, and changes nothing; the same create is answered as it is", async () => {
    const admin = client(c.url, adminToken)
    const h = await admin.post("/v1/hosts", { id: "h1" })
    expect((await client(c.url, h.body.token).put("/v1/hosts/h1/report", { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })).status).toBe(200)
    const first = await admin.post("/v1/sessions", { id: "s1", memMib: 1024, vcpus: 1, affinity: ["h1"] })
    expect([first.status, first.body.state]).toEqual([201, "pending"])
    const before = await admin.get("/v1/sessions/s1")
    for (const [more, field] of [
      [{ ttlMs: 1000 }, "ttlMs"],
      [{ idleTimeoutMs: 5000 }, "idleTimeoutMs"],
      [{ template: "t" }, "template"],
      [{ affinity: ["h2"] }, "affinity"],
      [{ affinity: [] }, "affinity"],
      [{ memMib: 2048 }, "budget"],
      // The first that differs is named.
      [{ ttlMs: 1000, idleTimeoutMs: 5000, template: "t", onNoRoom: "refuse" }, "idleTimeoutMs"],
    ] as const) {
      const r = await admin.post("/v1/sessions", { id: "s1", memMib: 1024, vcpus: 1, affinity: ["h1"], ...more })
      expect([r.status, r.body.error, r.body.entity, r.body.id, r.body.state], JSON.stringify(more)).toEqual([409, "Conflict", "session", "s1", "pending"])
      expect(r.body.message, JSON.stringify(more)).toContain(`session exists with another ${field}`)
    }
    // Nothing changed: the session is as it was created.
    expect(await admin.get("/v1/sessions/s1")).toMatchObject({ status: 200, body: before.body })
    expect(before.body).toMatchObject({ affinity: ["h1"], idleTimeoutMs: null, endsAt: null, template: null })
    // The same create again, or one that leaves options out, answers the session as it is.
    for (const body of [
      { id: "s1", memMib: 1024, vcpus: 1, affinity: ["h1"] },
      { id: "s1", memMib: 1024, vcpus: 1 },
      { id: "s1", memMib: 1024, vcpus: 1, affinity: ["h1"], onNoRoom: "refuse" },
    ]) {
      const r = await admin.post("/v1/sessions", body)
      expect([r.status, r.body.id, r.body.state, r.body.hostId], JSON.stringify(body)).toEqual([201, "s1", "pending", "h1"])
    }
    // With every option: its repeat is answered (a TTL counts from the first create: the store's conformance case moves the clock).
    const full = { id: "s2", memMib: 1024, vcpus: 1, affinity: ["h1"], ttlMs: 3_600_000, idleTimeoutMs: 60_000, template: "t1" }
    expect((await admin.post("/v1/sessions", full)).status).toBe(201)
    expect((await admin.post("/v1/sessions", full)).status).toBe(201)
    const shorter = await admin.post("/v1/sessions", { ...full, ttlMs: 1000 })
    expect([shorter.status, shorter.body.state]).toEqual([409, "pending"])
    expect(shorter.body.message).toContain("session exists with another ttlMs: it ends at")
  })
})
