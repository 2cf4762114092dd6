// A host's agent tells the coordinator that a session's guest was lost (its VM ended by itself, or
// was not found where recorded) and booted fresh: `POST /v1/hosts/{id}/guest-lost`. The report
// joins the session's history (`guest_lost`, with the host and the reason) and counts in
// `engram_guests_lost_total`; the session's state stays. A host token reports only its own host's
// sessions: another host's session, another host's path, bad input or no credential are refused
// and write nothing.
import { describe, expect, it } from "vitest"
import { call, client } from "./support/http.js"
import { simCoordinatorForFile } from "./support/sim.js"

const adminToken = "guest-lost-admin-token-0123456789"
const c = simCoordinatorForFile(adminToken)

const lostCount = (metrics: string): number => Number(/^engram_guests_lost_total(?:\{\})? (\d+)/m.exec(metrics)?.[1] ?? Number.NaN)

describe("a guest lost on its host", () => {
  it("its host's report is in the session's history and the metric; another host's session, another host's path, bad input and no credential are refused and write nothing", async () => {
    const admin = client(c.url, adminToken)
    const tokens: Record<string, string> = {}
    for (const id of ["h1", "h2"]) {
      const h = await admin.post("/v1/hosts", { id })
      tokens[id] = h.body.token
      expect((await client(c.url, h.body.token).put(`/v1/hosts/${id}/report`, { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })).status).toBe(200)
    }
    const h1 = client(c.url, tokens["h1"])
    const h2 = client(c.url, tokens["h2"])
    expect((await admin.post("/v1/sessions", { id: "s1", memMib: 1024, vcpus: 1, affinity: ["h1"] })).body.hostId).toBe("h1")
    expect((await h1.post("/v1/sessions/s1/started")).status).toBe(200)
    expect(lostCount((await admin.get<string>("/metrics")).body)).toBe(0)
    const history = async () => (await admin.get("/v1/sessions/s1/events")).body.items as { kind: string }[]

    const r = await h1.post("/v1/hosts/h1/guest-lost", { sessionId: "s1", reason: "QEMU exited" })
    expect([r.status, r.body.id, r.body.state, r.body.hostId]).toEqual([200, "s1", "running", "h1"])
    const events = await history()
    expect(events.at(-1)).toMatchObject({ kind: "guest_lost", hostId: "h1", reason: "QEMU exited", seq: events.length })
    // The session's own host reads it too; its state did not change.
    expect((await h1.get("/v1/sessions/s1/events")).body.items.at(-1)).toMatchObject({ kind: "guest_lost" })
    expect((await admin.get("/v1/sessions/s1")).body).toMatchObject({ state: "running", hostId: "h1" })
    expect(lostCount((await admin.get<string>("/metrics")).body)).toBe(1)

    const kept = await history()
    // h2's token for h1's session, through its own path: 409 naming where the session is.
    const other = await h2.post("/v1/hosts/h2/guest-lost", { sessionId: "s1", reason: "QEMU exited" })
    expect([other.status, other.body.error]).toEqual([409, "Conflict"])
    expect(other.body.message).toContain("not on host h2")
    // h2's token on h1's path: 403.
    expect((await h2.post("/v1/hosts/h1/guest-lost", { sessionId: "s1", reason: "QEMU exited" })).status).toBe(403)
    // No credential, or a wrong one: 401.
    expect((await call(c.url, "POST", "/v1/hosts/h1/guest-lost", { body: { sessionId: "s1", reason: "QEMU exited" } })).status).toBe(401)
    expect((await client(c.url, "not-a-token").post("/v1/hosts/h1/guest-lost", { sessionId: "s1", reason: "QEMU exited" })).status).toBe(401)
    // Bad input: 400 naming the field; an unknown session: 404.
    for (const [body, field] of [
      [{ sessionId: "s1", reason: "" }, "reason"],
      [{ sessionId: "s1" }, "reason"],
      [{ sessionId: "../s1", reason: "x" }, "sessionId"],
      [{ sessionId: "s1", reason: "x", extra: 1 }, "extra"],
    ] as const) {
      const bad = await h1.post("/v1/hosts/h1/guest-lost", body)
      expect([bad.status, bad.body.field], JSON.stringify(body)).toEqual([400, field])
    }
    expect((await h1.post("/v1/hosts/h1/guest-lost", { sessionId: "nobody", reason: "x" })).status).toBe(404)
    expect(await history()).toStrictEqual(kept)
    expect(lostCount((await admin.get<string>("/metrics")).body)).toBe(1)

    // An ended session has no guest to lose: 409 (the agent drops its report), nothing written.
    expect((await admin.del("/v1/sessions/s1")).status).toBe(200)
    const ended = await history()
    const late = await h1.post("/v1/hosts/h1/guest-lost", { sessionId: "s1", reason: "not found at start" })
    expect([late.status, late.body.error]).toEqual([409, "IllegalTransition"])
    expect(await history()).toStrictEqual(ended)
  })
})
