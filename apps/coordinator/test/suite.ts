// The end-to-end suite over real HTTP, a function of how to start a coordinator, run once
// per backend (StoreSim, PGlite, PostgreSQL).
import type { RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, uid } from "./support/http.js"
import type { Client } from "./support/http.js"

export interface SuiteOptions {
  /** Starts a fresh coordinator with the reaper loop off (tests drive `reaperPass`). */
  readonly start: (overrides?: { readonly moveTimeoutMs?: number }) => Promise<RunningCoordinator>
}

// Capacity after policy = allocatable − 1024 (system reserve), ratio 1.0; cpuBudget = 4 × vCPUs.
const report = (capacityMib: number, vcpus = 8) => ({ totalMib: capacityMib + 2048, allocatableMib: capacityMib + 1024, totalVcpus: vcpus })

/** Registers a measured host; answers its id and token. */
const addHost = async (admin: Client, capacityMib: number, vcpus = 8) => {
  const id = uid("h")
  const created = await admin.post("/v1/hosts", { id })
  expect(created.status).toBe(201)
  const reported = await admin.put(`/v1/hosts/${id}/report`, report(capacityMib, vcpus))
  expect(reported.status).toBe(200)
  return { id, token: created.body.token as string }
}

export const apiSuite = (name: string, options: SuiteOptions) =>
  describe(`coordinator over HTTP: ${name}`, () => {
    let c: RunningCoordinator
    let admin: Client
    let anon: Client
    beforeAll(async () => {
      c = await options.start({ moveTimeoutMs: 2500 })
      admin = client(c.url, c.adminToken)
      anon = client(c.url)
    })
    afterAll(async () => {
      await c?.stop()
    })

    describe("auth", () => {
      it("GET /healthz needs no token; everything else answers 401 without one", async () => {
        expect((await anon.get("/healthz")).body).toEqual({ ok: true })
        for (const [method, path] of [
          ["GET", "/readyz"],
          ["GET", "/metrics"],
          ["GET", "/openapi.json"],
          ["GET", "/v1/hosts"],
          ["POST", "/v1/hosts"],
          ["GET", "/v1/sessions"],
          ["POST", "/v1/sessions"],
          ["GET", "/v1/fleet"],
          ["GET", "/v1/reservations"],
          ["GET", "/v1/ledger/summary"],
          ["GET", "/v1/moves/x"],
          ["DELETE", "/v1/sessions/x"],
        ] as const) {
          const r = method === "GET" ? await anon.get(path) : method === "POST" ? await anon.post(path, {}) : await anon.del(path)
          expect(r.status, `${method} ${path}`).toBe(401)
          expect(r.body.error).toBe("Unauthorized")
        }
      })

      it("a wrong token is 401", async () => {
        const r = await client(c.url, "not-a-token-of-anyone-at-all").get("/v1/hosts")
        expect(r.status).toBe(401)
      })

      it("a host token acts for its own host only: 403 for another host's resources and for admin operations", async () => {
        const a = await addHost(admin, 4096)
        const b = await addHost(admin, 4096)
        const asA = client(c.url, a.token)
        expect((await asA.get(`/v1/hosts/${a.id}`)).status).toBe(200)
        expect((await asA.post(`/v1/hosts/${a.id}/heartbeat`)).status).toBe(200)
        expect((await asA.put(`/v1/hosts/${a.id}/report`, report(4096))).status).toBe(200)
        expect((await asA.get(`/v1/hosts/${a.id}/assignments`)).status).toBe(200)

        expect((await asA.get(`/v1/hosts/${b.id}`)).status).toBe(403)
        expect((await asA.put(`/v1/hosts/${b.id}/report`, report(1))).status).toBe(403)
        expect((await asA.post(`/v1/hosts/${b.id}/heartbeat`)).status).toBe(403)
        expect((await asA.get(`/v1/hosts/${b.id}/assignments`)).status).toBe(403)
        expect((await asA.get("/v1/hosts")).status).toBe(403)
        expect((await asA.post("/v1/hosts", { id: uid("x") })).status).toBe(403)
        expect((await asA.post(`/v1/hosts/${a.id}/cordon`)).status).toBe(403)
        expect((await asA.post("/v1/sessions", { memMib: 64, vcpus: 1 })).status).toBe(403)
        expect((await asA.get("/v1/fleet")).status).toBe(403)
        expect((await asA.get("/v1/ledger/summary")).status).toBe(403)

        // A session on host b: a's token may not start, idle or read it.
        const s = await admin.post("/v1/sessions", { memMib: 64, vcpus: 1, affinity: [b.id] })
        expect(s.status).toBe(201)
        expect(s.body.hostId).toBe(b.id)
        const f = await asA.post(`/v1/sessions/${s.body.id}/started`)
        expect(f.status).toBe(403)
        expect(f.body.error).toBe("Forbidden")
        expect((await asA.get(`/v1/sessions/${s.body.id}`)).status).toBe(403)
        expect((await client(c.url, b.token).post(`/v1/sessions/${s.body.id}/started`)).body.state).toBe("running")
        await admin.del(`/v1/sessions/${s.body.id}`)
      })
    })

    describe("bad input: 400 {error, field, rule}, nothing changed", () => {
      it("schema failures name the field path and the rule", async () => {
        const wrongType = await admin.post("/v1/sessions", { memMib: "lots", vcpus: 1 })
        expect(wrongType.status).toBe(400)
        expect(wrongType.body).toMatchObject({ error: "InvalidInput", field: "memMib" })
        expect(typeof wrongType.body.rule).toBe("string")

        const missing = await admin.post("/v1/sessions", { memMib: 64 })
        expect(missing.status).toBe(400)
        expect(missing.body).toMatchObject({ field: "vcpus", rule: "is required" })

        const nested = await admin.post("/v1/sessions", { memMib: 64, vcpus: 1, affinity: ["ok", 7] })
        expect(nested.status).toBe(400)
        expect(nested.body.field).toBe("affinity.1")

        const notJson = await admin.raw("POST", "/v1/sessions", "{nope")
        expect(notJson.status).toBe(400)
        expect(notJson.body.error).toBe("InvalidInput")

        const badQuery = await admin.get("/v1/sessions?state=sleepy")
        expect(badQuery.status).toBe(400)
        expect(badQuery.body.field).toBe("state")

        const badWait = await admin.get("/v1/hosts/h/assignments?waitMs=-5")
        expect(badWait.status).toBe(400)
        expect(badWait.body.field).toBe("waitMs")
      })

      it("store rules: memMib > 0, integer vcpus, ids, reports, maxDowntimeMs", async () => {
        expect((await admin.post("/v1/sessions", { memMib: 0, vcpus: 1 })).body).toEqual({ error: "InvalidInput", field: "memMib", rule: "must be an integer > 0" })
        expect((await admin.post("/v1/sessions", { memMib: 64, vcpus: 1.5 })).body).toMatchObject({ field: "vcpus" })
        expect((await admin.post("/v1/sessions", { id: "has space", memMib: 64, vcpus: 1 })).body).toMatchObject({ field: "id" })
        expect((await admin.post("/v1/hosts", { id: "" })).body).toMatchObject({ error: "InvalidInput", field: "id" })
        const h = await addHost(admin, 1024)
        const bad = await admin.put(`/v1/hosts/${h.id}/report`, { totalMib: -1, allocatableMib: 10, totalVcpus: 1 })
        expect(bad.status).toBe(400)
        expect(bad.body.field).toBe("totalMib")
        expect((await admin.get(`/v1/placement/no-fit?memMib=0&vcpus=1`)).body).toMatchObject({ error: "InvalidInput", field: "memMib" })
        const noFitText = await admin.get(`/v1/placement/no-fit?memMib=abc&vcpus=1`)
        expect(noFitText.status).toBe(400)
        expect(noFitText.body.field).toBe("memMib")
      })
    })

    describe("hosts", () => {
      it("register, report, view with capacity after policy, list, cordon, drain, uncordon", async () => {
        const id = uid("h")
        const created = await admin.post("/v1/hosts", { id, labels: { zone: "a" } })
        expect(created.status).toBe(201)
        expect(created.body.id).toBe(id)
        expect(created.body.token).toMatch(/^[A-Za-z0-9_-]{43}$/)
        expect((await admin.post("/v1/hosts", { id })).status).toBe(409)

        const unmeasured = await admin.get(`/v1/hosts/${id}`)
        expect(unmeasured.body).toMatchObject({ id, measured: false, allocatableMib: null, labels: { zone: "a" }, state: "ready" })

        const r = await admin.put(`/v1/hosts/${id}/report`, { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })
        expect(r.body).toMatchObject({
          measured: true,
          allocatableMib: 4096,
          reportedAllocatableMib: 5120,
          reservedMib: 0,
          freeMib: 4096,
          cpuBudget: 16,
          reservedVcpus: 0,
          freeVcpus: 16,
          entries: 0,
          parks: 0,
          descentsRunning: 0,
        })
        const list = await admin.get("/v1/hosts")
        expect(list.body.map((h: { id: string }) => h.id)).toContain(id)
        expect((await admin.post(`/v1/hosts/${id}/cordon`)).body.state).toBe("cordoned")
        expect((await admin.post(`/v1/hosts/${id}/drain`)).body.state).toBe("draining")
        expect((await admin.post(`/v1/hosts/${id}/uncordon`)).body.state).toBe("ready")
        expect((await admin.get("/v1/hosts/nope-nope")).status).toBe(404)
        expect((await admin.get("/v1/hosts/nope-nope")).body).toMatchObject({ error: "NotFound", entity: "host", id: "nope-nope" })
        expect((await admin.post("/v1/hosts/nope-nope/cordon")).status).toBe(404)
      })
    })

    describe("sessions", () => {
      it("201 when placed, 202 when queued with position and no-fit details, idempotent on id", async () => {
        const h = await addHost(admin, 1024)
        const id = uid("s")
        const placed = await admin.post("/v1/sessions", { id, memMib: 768, vcpus: 1, affinity: [h.id] })
        expect(placed.status).toBe(201)
        expect(placed.body).toEqual({ id, state: "pending", hostId: h.id })
        const again = await admin.post("/v1/sessions", { id, memMib: 768, vcpus: 1, affinity: [h.id] })
        expect(again.status).toBe(201)
        expect(again.body.hostId).toBe(h.id)
        expect((await admin.post("/v1/sessions", { id, memMib: 999, vcpus: 1 })).status).toBe(409)

        // Larger than any host: queued.
        const big = uid("s")
        const queued = await admin.post("/v1/sessions", { id: big, memMib: 10_000_000, vcpus: 1 })
        expect(queued.status).toBe(202)
        expect(queued.body.state).toBe("queued")
        expect(queued.body.position).toBeGreaterThanOrEqual(1)
        expect(queued.body.noFit.find((d: { hostId: string }) => d.hostId === h.id)).toMatchObject({ reason: "ram_full", freeMib: 256 })

        const got = await admin.get(`/v1/sessions/${id}`)
        expect(got.body).toMatchObject({ id, state: "pending", hostId: h.id, budget: { memMib: 768, vcpus: 1 } })
        const queuedList = await admin.get("/v1/sessions?state=queued")
        expect(queuedList.body.map((s: { id: string }) => s.id)).toContain(big)
        const onHost = await admin.get(`/v1/sessions?hostId=${h.id}`)
        expect(onHost.body.map((s: { id: string }) => s.id)).toEqual([id])
        // The host's own agent may list its host's sessions.
        expect((await client(c.url, h.token).get(`/v1/sessions?hostId=${h.id}`)).status).toBe(200)
        expect((await client(c.url, h.token).get(`/v1/sessions`)).status).toBe(403)
        const generated = await admin.post("/v1/sessions", { memMib: 16, vcpus: 1 })
        expect(generated.status).toBe(201)
        expect(generated.body.id).toMatch(/^[0-9a-f-]{36}$/)

        for (const s of [id, big, generated.body.id]) expect((await admin.del(`/v1/sessions/${s}`)).body.state).toBe("ended")
        expect((await admin.del(`/v1/sessions/${id}`)).status).toBe(409)
        expect((await admin.get("/v1/sessions/never-was")).status).toBe(404)
        expect((await admin.del("/v1/sessions/never-was")).status).toBe(404)
      })

      it("life cycle through the agent endpoints: started, idle (gate), resume, descended, 409 on illegal transitions", async () => {
        const h = await addHost(admin, 2048)
        const agent = client(c.url, h.token)
        const id = uid("s")
        expect((await admin.post("/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [h.id] })).status).toBe(201)
        expect((await admin.post(`/v1/sessions/${id}/idle`)).status).toBe(409) // pending cannot idle
        expect((await agent.post(`/v1/sessions/${id}/started`)).body.state).toBe("running")
        const again = await agent.post(`/v1/sessions/${id}/started`)
        expect(again.status).toBe(409)
        expect(again.body).toMatchObject({ error: "IllegalTransition", from: "running", to: "running" })

        const idle = await agent.post(`/v1/sessions/${id}/idle`)
        expect(idle.status).toBe(200)
        expect(idle.body).toEqual({ id, state: "parked" })
        expect((await admin.get(`/v1/hosts/${h.id}`)).body.parks).toBe(1)
        expect((await admin.post(`/v1/sessions/${id}/resume`)).status).toBe(409) // parked, not descended
        await admin.del(`/v1/sessions/${id}`)
      })

      it("while a queued session has no room an idle session descends; descended then resume places it again", async () => {
        const h = await addHost(admin, 2048)
        const agent = client(c.url, h.token)
        const id = uid("s")
        expect((await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })).body.hostId).toBe(h.id)
        await agent.post(`/v1/sessions/${id}/started`)
        // A session that would fit an empty host of the fleet but has no room now (SPEC §12: one too
        // big for every host is unplaceable and does not stop parks). The big host is cordoned after.
        const big = await addHost(admin, 8192)
        const filler = uid("f")
        expect((await admin.post("/v1/sessions", { id: filler, memMib: 4096, vcpus: 1, affinity: [big.id] })).body.hostId).toBe(big.id)
        const waiting = uid("q")
        expect((await admin.post("/v1/sessions", { id: waiting, memMib: 6144, vcpus: 1 })).status).toBe(202)
        expect((await agent.post(`/v1/sessions/${id}/idle`)).body.state).toBe("descending")
        for (const s of [waiting, filler]) await admin.del(`/v1/sessions/${s}`)
        await admin.post(`/v1/hosts/${big.id}/cordon`)
        const assignments = await agent.get(`/v1/hosts/${h.id}/assignments`)
        expect(assignments.body.sessions.find((s: { id: string }) => s.id === id).state).toBe("descending")
        const done = await agent.post(`/v1/sessions/${id}/descended`)
        expect(done.body).toMatchObject({ state: "descended", hostId: null })
        const resumed = await admin.post(`/v1/sessions/${id}/resume`)
        expect(resumed.status).toBe(201)
        expect(resumed.body.state).toBe("pending")
        await admin.del(`/v1/sessions/${id}`)
      })
    })

    describe("agent assignments", () => {
      it("lists the host's sessions; a long-poll returns early when something for the host changes", async () => {
        const h = await addHost(admin, 2048)
        const agent = client(c.url, h.token)
        const first = await agent.get(`/v1/hosts/${h.id}/assignments`)
        expect(first.body).toMatchObject({ hostId: h.id, sessions: [], moves: [] })
        // The move guard's allowance comes from the coordinator (SPEC §9 default here).
        expect(first.body.limits).toEqual({ commitAllowanceMs: 400 })
        const t0 = Date.now()
        const polling = agent.get(`/v1/hosts/${h.id}/assignments?waitMs=20000&since=${first.body.version}`)
        await new Promise((r) => setTimeout(r, 150))
        const id = uid("s")
        await admin.post("/v1/sessions", { id, memMib: 128, vcpus: 1, affinity: [h.id] })
        const woke = await polling
        expect(Date.now() - t0).toBeLessThan(15_000)
        expect(woke.body.sessions.map((s: { id: string }) => s.id)).toEqual([id])
        expect(woke.body.version).not.toBe(first.body.version)
        // A stale `since` answers at once.
        const stale = await agent.get(`/v1/hosts/${h.id}/assignments?waitMs=20000&since=${first.body.version}`)
        expect(stale.body.sessions).toHaveLength(1)
        await admin.del(`/v1/sessions/${id}`)
        expect((await admin.get(`/v1/hosts/nope-${uid("x")}/assignments`)).status).toBe(404)
      })
    })

    describe("moves", () => {
      const runningOn = async (h: { id: string; token: string }, memMib = 256) => {
        const id = uid("s")
        const s = await admin.post("/v1/sessions", { id, memMib, vcpus: 1, affinity: [h.id] })
        expect(s.body.hostId).toBe(h.id)
        await client(c.url, h.token).post(`/v1/sessions/${id}/started`)
        return id
      }
      const findMove = async (source: { id: string; token: string }, sessionId: string) => {
        const agent = client(c.url, source.token)
        let since = ""
        for (let i = 0; i < 50; i++) {
          const a = await agent.get(`/v1/hosts/${source.id}/assignments${since === "" ? "" : `?waitMs=2000&since=${since}`}`)
          const m = a.body.moves.find((x: { sessionId: string }) => x.sessionId === sessionId)
          if (m !== undefined) return m as { id: string; targetHostId: string }
          since = a.body.version
        }
        throw new Error("the move never showed up")
      }

      it("the source agent runs rounds and commits: 200 with the phases; the session runs on the target", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m = await findMove(src, sid)
        expect(m.targetHostId).toBe(dst.id)
        // The target's agent sees it too.
        const targetView = await client(c.url, dst.token).get(`/v1/hosts/${dst.id}/assignments`)
        expect(targetView.body.moves.map((x: { id: string }) => x.id)).toContain(m.id)
        const agent = client(c.url, src.token)
        expect((await client(c.url, dst.token).post(`/v1/moves/${m.id}/rounds`, { kind: "full", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 })).status).toBe(403)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 })).status).toBe(200)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "bogus", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 })).status).toBe(400)
        const committed = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 })
        expect(committed.status).toBe(200)
        const done = await answer
        expect(done.status).toBe(200)
        expect(done.body).toMatchObject({ downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420, move: { id: m.id, state: "committed" } })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
        expect((await admin.get(`/v1/moves/${m.id}`)).body.rounds).toHaveLength(1)
        expect((await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 3, captureMs: 1, sendMs: 1, commitMs: 1 })).status).toBe(409)
        // Phases that do not fit within their downtime are bad input: 400 naming the field.
        const inconsistent = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 1, captureMs: 1, sendMs: 1, commitMs: 1 })
        expect([inconsistent.status, inconsistent.body.field]).toEqual([400, "downtimeMs"])
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("an abort for downtime answers 503 ErrMoveDowntime with the estimate; the session stays on the source", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { maxDowntimeMs: 480 })
        const m = await findMove(src, sid)
        const aborted = await client(c.url, src.token).post(`/v1/moves/${m.id}/abort`, { reason: "ErrMoveDowntime: estimate over budget", estimateMs: 812 })
        expect(aborted.body.state).toBe("aborted")
        const done = await answer
        expect(done.status).toBe(503)
        expect(done.body).toMatchObject({ error: "ErrMoveDowntime", estimateMs: 812, maxDowntimeMs: 480, moveId: m.id })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: src.id })
        await admin.del(`/v1/sessions/${sid}`)
        void dst
      })

      it("no agent acts: the move is aborted with reason timeout and the caller gets 503 MoveTimeout", async () => {
        const src = await addHost(admin, 2048)
        await addHost(admin, 2048)
        const sid = await runningOn(src)
        const done = await admin.post(`/v1/sessions/${sid}/move`, { maxDowntimeMs: 600 })
        expect(done.status).toBe(503)
        expect(done.body.error).toBe("MoveTimeout")
        expect((await admin.get(`/v1/moves/${done.body.moveId}`)).body).toMatchObject({ state: "aborted", abortReason: "timeout" })
        expect((await admin.get(`/v1/sessions/${sid}`)).body.state).toBe("running")
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("a timeout after the final round is recorded does not abort: 503 MoveCommitPending, the move stays pending and the agent's commit lands", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m = await findMove(src, sid)
        const agent = client(c.url, src.token)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 })).status).toBe(200)
        // The source paused and recorded its final round; then it goes quiet past the move timeout.
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 })).status).toBe(200)
        const done = await answer
        expect(done.status).toBe(503)
        expect(done.body).toMatchObject({ error: "MoveCommitPending", moveId: m.id, maxDowntimeMs: 600 })
        expect(done.body.message).toContain(`GET /v1/moves/${m.id}`)
        expect(Number(done.headers.get("retry-after"))).toBeGreaterThanOrEqual(1)
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toMatchObject({ state: "pending", abortReason: null })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "moving", hostId: src.id })
        // The agent's commit still lands; the move's record shows the outcome.
        const committed = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 })
        expect(committed.status).toBe(200)
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toMatchObject({ state: "committed", phases: { downtimeMs: 560 } })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
        expect((await admin.get("/metrics")).body as string).toContain('engram_moves_total{outcome="commit_pending"} 1')
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("refusals: 404 unknown session, 409 not running, 400 bad budget", async () => {
        expect((await admin.post(`/v1/sessions/nope-${uid("s")}/move`, { maxDowntimeMs: 600 })).status).toBe(404)
        const h = await addHost(admin, 2048)
        const id = uid("s")
        await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })
        expect((await admin.post(`/v1/sessions/${id}/move`, { maxDowntimeMs: 600 })).status).toBe(409)
        await client(c.url, h.token).post(`/v1/sessions/${id}/started`)
        expect((await admin.post(`/v1/sessions/${id}/move`, { maxDowntimeMs: -1 })).body).toMatchObject({ field: "maxDowntimeMs" })
        expect((await admin.get(`/v1/moves/nope`)).status).toBe(404)
        await admin.del(`/v1/sessions/${id}`)
      })
    })

    describe("ledger, fleet, ops", () => {
      it("reservations: create, get, list, heartbeat, release; refusals name their check", async () => {
        const h = await addHost(admin, 1024)
        const r = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "ci", memMib: 256, vcpus: 1, description: "test" })
        expect(r.status).toBe(201)
        expect(r.body).toMatchObject({ hostId: h.id, ownerKind: "external", memMib: 256, description: "test" })
        expect((await admin.get(`/v1/reservations/${r.body.id}`)).body.id).toBe(r.body.id)
        expect((await admin.get(`/v1/reservations?hostId=${h.id}`)).body).toHaveLength(1)
        expect((await client(c.url, h.token).post(`/v1/reservations/${r.body.id}/heartbeat`)).status).toBe(200)
        const dup = await admin.post("/v1/reservations", { id: r.body.id, hostId: h.id, ownerKind: "external", ownerId: "ci", memMib: 1, vcpus: 1 })
        expect(dup.status).toBe(409)
        const full = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "ci", memMib: 4096, vcpus: 1 })
        expect(full.status).toBe(409)
        expect(full.body).toMatchObject({ error: "Refused", check: "capacity_exceeded" })
        expect((await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "session", ownerId: "x", memMib: 1, vcpus: 1 })).body).toMatchObject({ field: "ownerKind" })
        expect((await admin.get(`/v1/ledger/summary`)).body.hosts.find((x: { hostId: string }) => x.hostId === h.id)).toMatchObject({ reservedMib: 256 })
        expect((await admin.get(`/v1/ledger/metrics`)).body.reserveFailures).toBeGreaterThanOrEqual(1)
        expect((await admin.del(`/v1/reservations/${r.body.id}`)).body.id).toBe(r.body.id)
        expect((await admin.del(`/v1/reservations/${r.body.id}`)).status).toBe(404)
      })

      it("fleet snapshot, no-fit details, readyz, metrics, openapi", async () => {
        const h = await addHost(admin, 1024)
        const fleet = await admin.get("/v1/fleet")
        expect(fleet.status).toBe(200)
        expect(fleet.body.hosts.total).toBeGreaterThanOrEqual(1)
        expect(fleet.body.queue).toHaveProperty("withoutRoom")
        const nf = await admin.get(`/v1/placement/no-fit?memMib=2048&vcpus=1`)
        expect(nf.body.hosts.find((d: { hostId: string }) => d.hostId === h.id)).toMatchObject({ reason: "ram_full", freeMib: 1024 })
        expect((await admin.get("/readyz")).body).toMatchObject({ ok: true })
        const metrics = await admin.get("/metrics")
        expect(metrics.headers.get("content-type")).toContain("text/plain")
        for (const name of ["engram_placements_total", "engram_queue_length", "engram_parks", "engram_reaper_leader", "engram_reserve_failures", "engram_reaper_pass_duration_seconds_bucket"]) {
          expect(metrics.body as string).toContain(name)
        }
        const spec = await admin.get("/openapi.json")
        expect(spec.body.openapi).toMatch(/^3\./)
        expect(Object.keys(spec.body.paths)).toEqual(expect.arrayContaining(["/v1/sessions", "/v1/hosts/{id}/assignments", "/v1/moves/{id}/commit", "/healthz"]))
      })
    })

    describe("the reaper", () => {
      let r: RunningCoordinator
      let adm: Client
      beforeAll(async () => {
        r = await options.start()
        adm = client(r.url, r.adminToken)
      })
      afterAll(async () => {
        await r?.stop()
      })

      it("a park yields to a queued session with no room, and the queued session places after the descent finishes", async () => {
        const hid = uid("h")
        const token = (await adm.post("/v1/hosts", { id: hid })).body.token as string
        await adm.put(`/v1/hosts/${hid}/report`, report(2048))
        const agent = client(r.url, token)
        const parked = uid("p")
        expect((await adm.post("/v1/sessions", { id: parked, memMib: 1536, vcpus: 1 })).body.hostId).toBe(hid)
        await agent.post(`/v1/sessions/${parked}/started`)
        expect((await agent.post(`/v1/sessions/${parked}/idle`)).body.state).toBe("parked")

        // Nothing waits: the park holds, pass after pass.
        const quiet = await r.reaperPass()
        expect(quiet).toMatchObject({ _tag: "Done", descents: [] })

        const waiting = uid("q")
        const q = await adm.post("/v1/sessions", { id: waiting, memMib: 1024, vcpus: 1 })
        expect(q.status).toBe(202)
        // While a queued session has no room, an idle session may not park.
        const pass = await r.reaperPass()
        expect(pass).toMatchObject({ _tag: "Done", withoutRoom: 1, descents: [{ hostId: hid, sessionId: parked, reason: "demand" }] })
        expect((await adm.get(`/v1/sessions/${parked}`)).body.state).toBe("descending")
        // A descent running counts for the waiting session: no second yield.
        expect(await r.reaperPass()).toMatchObject({ descents: [] })
        expect((await adm.get(`/v1/sessions/${waiting}`)).body.state).toBe("queued")

        const assignments = await agent.get(`/v1/hosts/${hid}/assignments`)
        expect(assignments.body.sessions.find((s: { id: string }) => s.id === parked).state).toBe("descending")
        expect((await agent.post(`/v1/sessions/${parked}/descended`)).body.state).toBe("descended")
        expect((await adm.get(`/v1/sessions/${waiting}`)).body).toMatchObject({ state: "pending", hostId: hid })
        const metrics = (await adm.get("/metrics")).body as string
        expect(metrics).toContain('engram_descents_total{reason="demand"} 1')
      })
    })
  })
