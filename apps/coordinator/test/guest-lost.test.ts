// A host's agent tells the coordinator that a session's guest was lost (its VM ended by itself, or
// was not found where recorded) and booted fresh: `POST /v1/hosts/{id}/guest-lost`. The report
// joins the session's history (`guest_lost`, with the host and the reason) and counts in
// `engram_guests_lost_total`; the session's state stays. A host token reports only its own host's
// sessions: another host's session, another host's path, bad input or no credential are refused
// and write nothing. A report that waited while a move took the session away (the session runs
// on the move's target now) is still the loss of the copy on the host the move left: recorded
// with the move and where the session went, the session unchanged (before, a 409 the agent
// dropped, and the loss was missing from the history).
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

  it("a report that comes after a move took the session away is recorded as the copy lost on the host the move left; a host the session never left by that move is refused", async () => {
    const admin = client(c.url, adminToken)
    const tokens: Record<string, string> = {}
    for (const id of ["m1", "m2", "m3"]) {
      const h = await admin.post("/v1/hosts", { id })
      tokens[id] = h.body.token
      expect((await client(c.url, h.body.token).put(`/v1/hosts/${id}/report`, { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })).status).toBe(200)
    }
    const m1 = client(c.url, tokens["m1"])
    expect((await admin.post("/v1/sessions", { id: "sm", memMib: 1024, vcpus: 1, affinity: ["m1"] })).body.hostId).toBe("m1")
    expect((await m1.post("/v1/sessions/sm/started")).status).toBe(200)
    // The move m1 -> m2, driven as its source's agent would: the final round, then the commit.
    const answer = admin.post("/v1/sessions/sm/move", { targetHostId: "m2", maxDowntimeMs: 600 })
    // The move as m1's assignments show it (a long-poll from the version read last, until it does).
    let moveId: string | undefined
    let since = ""
    for (let i = 0; i < 50 && moveId === undefined; i++) {
      const a = await m1.get(`/v1/hosts/m1/assignments${since === "" ? "" : `?waitMs=2000&since=${since}`}`)
      moveId = (a.body.moves as { id: string; sessionId: string }[]).find((x) => x.sessionId === "sm")?.id
      since = a.body.version
    }
    expect(moveId).toBeDefined()
    expect((await m1.post(`/v1/moves/${moveId}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 })).status).toBe(200)
    expect((await m1.post(`/v1/moves/${moveId}/commit`, { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 })).status).toBe(200)
    expect((await answer).status).toBe(200)
    expect((await admin.get("/v1/sessions/sm")).body).toMatchObject({ state: "running", hostId: "m2" })
    const lostBefore = lostCount((await admin.get<string>("/metrics")).body)

    // m1's report waited while the move committed: the copy lost on m1, before the move.
    const late = await m1.post("/v1/hosts/m1/guest-lost", { sessionId: "sm", reason: "VM exited while the agent ran" })
    expect([late.status, late.body.id, late.body.state, late.body.hostId]).toEqual([200, "sm", "running", "m2"])
    const events = (await admin.get("/v1/sessions/sm/events")).body.items as { kind: string }[]
    expect(events.at(-1)).toStrictEqual({ seq: events.length, at: expect.any(Number), kind: "guest_lost", hostId: "m1", reason: "VM exited while the agent ran", moveId, toHostId: "m2" })
    expect(events.at(-2)).toMatchObject({ kind: "moved", moveId, fromHostId: "m1", toHostId: "m2" })
    expect((await admin.get("/v1/sessions/sm")).body).toMatchObject({ state: "running", hostId: "m2" })
    expect(lostCount((await admin.get<string>("/metrics")).body)).toBe(lostBefore + 1)

    // m3 never held it: 409, nothing written.
    const other = await client(c.url, tokens["m3"]).post("/v1/hosts/m3/guest-lost", { sessionId: "sm", reason: "QEMU exited" })
    expect([other.status, other.body.error]).toEqual([409, "Conflict"])
    expect(other.body.message).toContain("not on host m3")
    expect((await admin.get("/v1/sessions/sm/events")).body.items).toStrictEqual(events)
  })
})
