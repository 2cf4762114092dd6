// A host's agent tells the coordinator that a session's guest was lost (its VM ended by itself, or
// was not found where recorded) and booted fresh: `POST /v1/hosts/{id}/guest-lost`. The report
// joins the session's history (`guest_lost`, with the host and the reason) and counts in
// `engram_guests_lost_total`; the session's state stays. A host token reports only its own host's
// sessions: another host's session, another host's path, bad input or no credential are refused
// and write nothing. A report that waited while a move took the session away (the session runs
// on the move's target now) is still the loss of the copy on the host the move left: recorded
// with the move and where the session went, the session unchanged (before, a 409 the agent
// dropped, and the loss was missing from the history).
// A descent that left no image (the agent found neither guest nor image, told
// the loss, then `descended?image=none`) names no image host, so a resume elsewhere fetches from
// nobody and no second loss is reported for it.
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

  it("a descent that left no image (`descended?image=none`, after its loss was told) names no image host: its image host lists nothing, its resume elsewhere fetches from nobody; a bad value is a 400 naming image and changes nothing", async () => {
    const admin = client(c.url, adminToken)
    // The earlier cases' roomy hosts take nothing here.
    for (const id of ["h1", "h2", "m1", "m2", "m3"]) expect((await admin.post(`/v1/hosts/${id}/cordon`)).status).toBe(200)
    const figures = { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 }
    const tokens: Record<string, string> = {}
    for (const id of ["i1", "i2"]) {
      const h = await admin.post("/v1/hosts", { id })
      tokens[id] = h.body.token
      expect((await client(c.url, h.body.token).put(`/v1/hosts/${id}/report`, { ...figures, peerUrl: `http://10.9.0.1:7${id.slice(1)}00` })).status).toBe(200)
    }
    const i1 = client(c.url, tokens["i1"])
    const i2 = client(c.url, tokens["i2"])
    // d1 and d2 descend on i1 (i2 cordoned): a queued session with no room makes each descend rather than park.
    expect((await admin.post("/v1/hosts/i2/cordon")).status).toBe(200)
    const descending = async (id: string) => {
      expect((await admin.post("/v1/sessions", { id, memMib: 1024, vcpus: 1, affinity: ["i1"] })).body.hostId).toBe("i1")
      expect((await i1.post(`/v1/sessions/${id}/started`)).status).toBe(200)
      expect((await admin.post("/v1/sessions", { id: `${id}q`, memMib: 1536, vcpus: 1, affinity: ["i1"] })).status).toBe(202)
      expect((await i1.post(`/v1/sessions/${id}/idle`)).body.state).toBe("descending")
      expect((await admin.del(`/v1/sessions/${id}q`)).status).toBe(200)
    }
    await descending("d1")
    const lostOf = async (id: string) => ((await admin.get(`/v1/sessions/${id}/events`)).body.items as { kind: string; hostId?: string }[]).filter((e) => e.kind === "guest_lost")
    // i1's agent found neither d1's guest nor an image: it tells the loss, then the descent without an image.
    expect((await i1.post("/v1/hosts/i1/guest-lost", { sessionId: "d1", reason: "VM not found; descended without an image: a resume boots fresh" })).status).toBe(200)
    const before = (await admin.get("/v1/sessions/d1/events")).body.items
    for (const bad of ["yes", "", "none&image=none"]) {
      const refused = await i1.post(`/v1/sessions/d1/descended?image=${bad}`)
      expect([refused.status, refused.body.field], bad).toEqual([400, "image"])
    }
    const unknown = await i1.post("/v1/sessions/d1/descended?image=none&bogus=1")
    expect([unknown.status, unknown.body.field]).toEqual([400, "bogus"])
    expect((await admin.get("/v1/sessions/d1")).body.state).toBe("descending")
    expect((await admin.get("/v1/sessions/d1/events")).body.items).toStrictEqual(before)
    expect((await i1.post("/v1/sessions/d1/descended?image=none")).body).toMatchObject({ state: "descended", hostId: null, imageHostId: null })
    // d2 descends with its image (no word: as before): i1 holds it.
    await descending("d2")
    expect((await i1.post("/v1/sessions/d2/descended")).body).toMatchObject({ state: "descended", imageHostId: "i1" })
    expect((await i1.get("/v1/hosts/i1/assignments")).body.imageSessions).toStrictEqual(["d2"])
    // Resumed onto i2 (i1 cordoned): i2 is told to fetch d2's image from i1, and d1's from nobody.
    expect((await admin.post("/v1/hosts/i2/uncordon")).status).toBe(200)
    expect((await admin.post("/v1/hosts/i1/cordon")).status).toBe(200)
    for (const id of ["d1", "d2"]) expect((await admin.post(`/v1/sessions/${id}/resume`)).body).toMatchObject({ resumed: "cold", hostId: "i2" })
    const seen = (await i2.get("/v1/hosts/i2/assignments")).body
    expect(seen.sessions.map((x: { id: string; imageHostId?: string | null }) => [x.id, x.imageHostId ?? null])).toStrictEqual([["d1", null], ["d2", "i1"]])
    expect(seen.imageHosts).toStrictEqual([{ hostId: "i1", peerUrl: "http://10.9.0.1:7100" }])
    // The loss is in d1's history once; d2 lost nothing.
    expect((await lostOf("d1")).map((e) => e.hostId)).toStrictEqual(["i1"])
    expect(await lostOf("d2")).toStrictEqual([])
  })
})
