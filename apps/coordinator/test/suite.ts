// The end-to-end suite over real HTTP, a function of how to start a coordinator, run once
// per backend (StoreSim, PGlite, PostgreSQL).
import { it as itEffect } from "@effect/vitest"
import { EngramApi } from "@engram/api"
import { Notifier, startCoordinator } from "@engram/coordinator"
import type { CoordinatorOptions, RunningCoordinator } from "@engram/coordinator"
import { Context, Effect, Fiber } from "effect"
import { HttpApi } from "effect/http-api"
import { TestClock } from "effect/testing"
import { request as httpRequest } from "node:http"
import { setTimeout as delay } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { answered, clockedCoordinator } from "./support/clocked.js"
import { call, client, uid } from "./support/http.js"
import type { Answer, Client } from "./support/http.js"
import { moveParties } from "./support/moveParties.js"

export interface SuiteOptions {
  /**
   * The options of a fresh coordinator of this backend with the reaper loop off (tests drive
   * `reaperPass`): started over real time (`startCoordinator`), or built on a test's clock.
   */
  readonly coordinator: (overrides?: { readonly moveTimeoutMs?: number }) => Promise<CoordinatorOptions>
}

/**
 * The suite's move wait (ENGRAM_MOVE_TIMEOUT_MS): long, so a move the test drives (found, its
 * rounds, its commit or abort) never outlasts it however slow the machine; every such move ends
 * by the agent's or the operator's word. The timeout's own cases run on a test's clock.
 */
const suiteMoveTimeoutMs = 60_000

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


/** A request whose body is exactly these bytes (fetch would encode text as UTF-8). */
const sendBytes = (base: string, token: string, method: string, path: string, body?: Buffer): Promise<{ status: number; body: any }> => // eslint-disable-line @typescript-eslint/no-explicit-any
  new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${path}`, { method, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } }, (res) => {
      let text = ""
      res.on("data", (c: Buffer) => (text += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text === "" ? null : JSON.parse(text) }))
    })
    req.on("error", reject)
    req.end(body)
  })

/** A valid body of every endpoint that takes one, so that one extra key is its only fault. */
const validBodies: Readonly<Record<string, unknown>> = {
  "POST /v1/hosts": { id: "strict-h" },
  "PUT /v1/hosts/:id/report": { totalMib: 2048, allocatableMib: 2048, totalVcpus: 2 },
  "POST /v1/sessions": { memMib: 64, vcpus: 1 },
  "POST /v1/sessions/:id/move": { maxDowntimeMs: 600 },
  "PUT /v1/sessions/:id/ttl": { ttlMs: 60_000 },
  "POST /v1/moves/:id/rounds": { kind: "full", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 },
  "POST /v1/moves/:id/commit": { downtimeMs: 4, captureMs: 1, sendMs: 1, commitMs: 1 },
  "POST /v1/moves/:id/abort": { reason: "test" },
  "POST /v1/moves/:id/resolve": { outcome: "abort", reason: "test" },
  "POST /v1/moves/:id/resend": { owed: false },
  "POST /v1/reservations": { hostId: "strict-h", ownerKind: "external", ownerId: "o", memMib: 1, vcpus: 0 },
  "POST /v1/hosts/:id/guest-lost": { sessionId: "strict-s", reason: "test" },
}

/** The query an endpoint needs before an extra parameter can be its only fault. */
const requiredQueries: Readonly<Record<string, string>> = {
  "GET /v1/sessions/:id/wait": "state=running&timeoutMs=0&",
  "GET /v1/placement/no-fit": "memMib=64&vcpus=1&",
}

/** Every endpoint of the API: method, path template, whether it declares a body and a query. */
const endpoints = (): { method: string; path: string; payload: boolean; query: boolean }[] => {
  const all: { method: string; path: string; payload: boolean; query: boolean }[] = []
  HttpApi.reflect(EngramApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint }) => all.push({ method: endpoint.method, path: endpoint.path, payload: endpoint.payload.size > 0, query: endpoint.query !== undefined }),
  })
  return all
}

export const apiSuite = (name: string, options: SuiteOptions) =>
  describe(`coordinator over HTTP: ${name}`, () => {
    const start = async (overrides?: { readonly moveTimeoutMs?: number }) => startCoordinator(await options.coordinator(overrides))
    let c: RunningCoordinator
    let admin: Client
    let anon: Client
    beforeAll(async () => {
      c = await start({ moveTimeoutMs: suiteMoveTimeoutMs })
      admin = client(c.url, c.adminToken)
      anon = client(c.url)
    })
    afterAll(async () => {
      await c?.stop()
    })

    describe("auth", () => {
      it("liveness, readiness and the API's description need no token and carry no fleet data; everything else answers 401 without one", async () => {
        expect((await anon.get("/healthz")).body).toEqual({ ok: true })
        expect((await anon.get("/livez")).body).toEqual({ ok: true })
        const ready = await anon.get("/readyz")
        expect(ready.status).toBe(200)
        expect(Object.keys(ready.body).sort()).toEqual(["leader", "ok", "store"])
        expect((await anon.get("/openapi.json")).body.openapi).toMatch(/^3\./)
        const docs = await anon.get("/docs")
        expect(docs.status).toBe(200)
        expect(docs.headers.get("content-type")).toContain("text/html")
        for (const [method, path] of [
          ["GET", "/metrics"],
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
        const list = await admin.get("/v1/hosts?limit=1000")
        expect(list.body.items.map((h: { id: string }) => h.id)).toContain(id)
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
        expect(queued.body.tooBig).toBe(true)
        // The fleet signal names it: too big for every host even empty (the cue for a bigger host).
        const signal = (await admin.get("/v1/fleet")).body
        expect(signal.unplaceable.count).toBeGreaterThanOrEqual(1)
        expect(signal.unplaceable.largestMemMib).toBeGreaterThanOrEqual(10_000_000)
        const queuedList = await admin.get("/v1/sessions?state=queued&limit=1000")
        expect(queuedList.body.items.map((s: { id: string }) => s.id)).toContain(big)
        const onHost = await admin.get(`/v1/sessions?hostId=${h.id}`)
        expect(onHost.body).toEqual({ items: [expect.objectContaining({ id })], nextCursor: null })
        // The host's own agent may list its host's sessions.
        expect((await client(c.url, h.token).get(`/v1/sessions?hostId=${h.id}`)).status).toBe(200)
        expect((await client(c.url, h.token).get(`/v1/sessions`)).status).toBe(403)
        const generated = await admin.post("/v1/sessions", { memMib: 16, vcpus: 1 })
        expect(generated.status).toBe(201)
        expect(generated.body.id).toMatch(/^[0-9a-f-]{36}$/)

        for (const s of [id, big, generated.body.id]) expect((await admin.del(`/v1/sessions/${s}`)).body.state).toBe("ended")
        // Ending is idempotent: an ended session is answered as it is.
        const again2 = await admin.del(`/v1/sessions/${id}`)
        expect([again2.status, again2.body]).toEqual([200, expect.objectContaining({ id, state: "ended", hostId: null })])
        // A create repeated after its session ended (a client's retry on the next replica) is not answered as queued.
        const recreate = await admin.post("/v1/sessions", { id, memMib: 768, vcpus: 1, affinity: [h.id] })
        expect([recreate.status, recreate.body]).toEqual([409, expect.objectContaining({ error: "Conflict", entity: "session", id, state: "ended" })])
        expect(recreate.body.message).toContain("is ended")
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
        // Resume is one verb: a park resumes warm, in place.
        const warm = await admin.post(`/v1/sessions/${id}/resume`)
        expect([warm.status, warm.body]).toEqual([200, { id, state: "running", hostId: h.id, resumed: "warm" }])
        const notAgain = await admin.post(`/v1/sessions/${id}/resume`)
        expect(notAgain.status).toBe(409) // running: neither parked nor descended
        expect(notAgain.body).toMatchObject({ error: "IllegalTransition", from: "running" })
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
        // A create repeated now (a client's retry) is neither placed nor queued: 409 naming the state, no placement counted.
        const placements = async () => ((await admin.get("/metrics")).body as string).split("\n").filter((l) => l.startsWith("engram_placements_total"))
        const counted = await placements()
        const recreate = await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })
        expect([recreate.status, recreate.body]).toEqual([409, expect.objectContaining({ error: "Conflict", entity: "session", id, state: "descended" })])
        expect(recreate.body.message).toContain("is descended: a create does not restore it (a resume does)")
        expect(await placements()).toEqual(counted)
        const resumed = await admin.post(`/v1/sessions/${id}/resume`)
        expect(resumed.status).toBe(201)
        expect(resumed.body).toEqual({ id, state: "pending", hostId: h.id, resumed: "cold" })
        await admin.del(`/v1/sessions/${id}`)
      })
    })

    describe("agent assignments", () => {
      it("lists the host's sessions; a long-poll returns early when something for the host changes", async () => {
        const h = await addHost(admin, 2048)
        const agent = client(c.url, h.token)
        const first = await agent.get(`/v1/hosts/${h.id}/assignments`)
        expect(first.body).toMatchObject({ hostId: h.id, sessions: [], moves: [] })
        // The move guard's allowance comes from the coordinator (SPEC §9 default here), and so
        // does the stale window the agent heartbeats within (the default, 2 minutes, here).
        expect(first.body.limits).toEqual({ commitAllowanceMs: 400, heartbeatStaleWindowMs: 120_000 })
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

      it("the source's assignment carries the target's reported peerUrl (targetPeerUrl); a bad peerUrl is a 400 naming it", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const target = client(c.url, dst.token)
        const url = "http://10.1.2.3:7100"
        const reported = await target.put(`/v1/hosts/${dst.id}/report`, { ...report(2048), peerUrl: url })
        expect([reported.status, reported.body.peerUrl]).toEqual([200, url])
        expect((await admin.get(`/v1/hosts/${src.id}`)).body.peerUrl).toBeNull()
        for (const [peerUrl, rule] of [
          ["http://user:pw@10.1.2.3:7100", expect.stringContaining("user:password@, a query or a fragment")],
          ["10.1.2.3:7100", expect.stringContaining("absolute http:// or https:// URL")],
          // A wildcard host: no peer reaches a listener's wildcard.
          ["http://0.0.0.0:7100", expect.stringContaining("naming a host peers reach (not 0.0.0.0 or ::)")],
          ["http://[::]:7100", expect.stringContaining("naming a host peers reach (not 0.0.0.0 or ::)")],
          [42, expect.any(String)],
        ] as const) {
          const bad = await target.put(`/v1/hosts/${dst.id}/report`, { ...report(4096), peerUrl })
          expect([bad.status, bad.body.field, bad.body.rule]).toEqual([400, "peerUrl", rule])
        }
        // Nothing changed: the figures and the URL are the last good report's.
        const kept = (await admin.get(`/v1/hosts/${dst.id}`)).body
        expect([kept.peerUrl, kept.report.allocatableMib]).toEqual([url, report(2048).allocatableMib])

        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m = (await findMove(src, sid)) as { id: string; targetHostId: string; targetPeerUrl?: string | null }
        expect([m.targetHostId, m.targetPeerUrl]).toEqual([dst.id, url])
        // Only the source is told: the target's view of the move carries no address.
        const onTarget = (await target.get(`/v1/hosts/${dst.id}/assignments`)).body.moves.find((x: { id: string }) => x.id === m.id)
        expect(onTarget).toBeDefined()
        expect(onTarget.targetPeerUrl).toBeUndefined()
        // GET /v1/moves/{id} is the move's record, without it.
        expect((await admin.get(`/v1/moves/${m.id}`)).body.targetPeerUrl).toBeUndefined()
        expect((await client(c.url, src.token).post(`/v1/moves/${m.id}/abort`, { reason: "test: no move runs here" })).status).toBe(200)
        expect((await answer).status).not.toBe(201)
      })

      it("a target that reports a new peerUrl wakes the long polls of its pending moves' sources: the source's assignments carry the new URL at once", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const target = client(c.url, dst.token)
        const source = client(c.url, src.token)
        const before = "http://10.1.2.3:7100"
        const after = "http://10.1.2.4:7200"
        expect((await target.put(`/v1/hosts/${dst.id}/report`, { ...report(2048), peerUrl: before })).status).toBe(200)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m = await findMove(src, sid)
        expect((await source.post(`/v1/moves/${m.id}/rounds`, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })).status).toBe(200)
        const first = (await source.get(`/v1/hosts/${src.id}/assignments`)).body
        const urlIn = (a: { moves: { id: string; targetPeerUrl?: string | null }[] }) => a.moves.find((x) => x.id === m.id)?.targetPeerUrl
        expect(urlIn(first)).toBe(before)
        // The same URL again (every report interval) changes nothing the source acts on.
        expect((await target.put(`/v1/hosts/${dst.id}/report`, { ...report(2048), peerUrl: before })).status).toBe(200)
        expect((await source.get(`/v1/hosts/${src.id}/assignments`)).body.version).toBe(first.version)
        // The source waits on its version; the target's agent restarts on another address and reports it.
        const t0 = Date.now()
        const polling = source.get(`/v1/hosts/${src.id}/assignments?waitMs=20000&since=${first.version}`)
        await new Promise((r) => setTimeout(r, 150))
        expect((await target.put(`/v1/hosts/${dst.id}/report`, { ...report(2048), peerUrl: after })).status).toBe(200)
        const woke = (await polling).body
        // Answered well before the 20 s wait (a loaded machine takes seconds, never the wait).
        expect(Date.now() - t0).toBeLessThan(15_000)
        expect(urlIn(woke)).toBe(after)
        expect(woke.version).not.toBe(first.version)
        // A plain read agrees (no copy kept with the old URL).
        expect(urlIn((await source.get(`/v1/hosts/${src.id}/assignments`)).body)).toBe(after)
        // No URL any more (an agent without one): the source is told null.
        expect((await target.put(`/v1/hosts/${dst.id}/report`, report(2048))).status).toBe(200)
        expect(urlIn((await source.get(`/v1/hosts/${src.id}/assignments`)).body)).toBeNull()
        expect((await source.post(`/v1/moves/${m.id}/abort`, { reason: "test: no move runs here" })).status).toBe(200)
        expect((await answer).status).not.toBe(201)
      })

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
        // A round changes nothing an agent acts on: the hosts' assignments keep their version (their
        // long polls are not woken, so their reads do not queue beside the final round's record).
        const versions = async () => Promise.all([src, dst].map(async (h) => (await client(c.url, h.token).get(`/v1/hosts/${h.id}/assignments`)).body.version as string))
        const before = await versions()
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 })).status).toBe(200)
        expect(await versions()).toEqual(before)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "bogus", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 })).status).toBe(400)
        // A round with its position (`seq`) is recorded once: a retry of a recorded position with the
        // same figures is a 200 that changes nothing; other figures, or a gap, a 409 naming the rule;
        // a position that is not an integer >= 0 a 400 naming `seq`.
        const full = { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 }
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { ...full, seq: 0 })).status).toBe(200)
        const other = await agent.post(`/v1/moves/${m.id}/rounds`, { ...full, wireBytes: 1, seq: 0 })
        expect([other.status, other.body.error]).toEqual([409, "Conflict"])
        expect(JSON.stringify(other.body)).toContain("round 0 is recorded with other figures")
        const gap = await agent.post(`/v1/moves/${m.id}/rounds`, { ...full, kind: "delta", seq: 2 })
        expect([gap.status, JSON.stringify(gap.body)]).toEqual([409, expect.stringContaining("round 2 leaves a gap")])
        for (const seq of [-1, 0.5, "1"]) {
          const bad = await agent.post(`/v1/moves/${m.id}/rounds`, { ...full, kind: "delta", seq })
          expect([bad.status, bad.body.field]).toEqual([400, "seq"])
        }
        expect((await admin.get(`/v1/moves/${m.id}`)).body.rounds).toEqual([full])
        // A commit needs the final round recorded (SPEC §12): 409 before it, and no round after it.
        const early = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 })
        expect([early.status, early.body.error]).toEqual([409, "Conflict"])
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40, seq: 1 })).status).toBe(200)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40, seq: 1 })).status).toBe(200)
        expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "delta", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 })).status).toBe(409)
        // Every phase > 0: a phase of 0 is a 400 naming it.
        const zero = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 0, commitMs: 420 })
        expect([zero.status, zero.body.field]).toEqual([400, "sendMs"])
        // The guard's figures: an unknown key in them, or a bad figure, is a 400 naming it.
        const guard = { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: 590 }
        const strange = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420, guard: { ...guard, zzUnknown: 1 } })
        expect([strange.status, strange.body.field]).toEqual([400, "guard.zzUnknown"])
        const badSource = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420, guard: { ...guard, allowanceSamples: 2 } })
        expect([badSource.status, badSource.body.field]).toEqual([400, "guard.allowanceSamples"])
        expect((await admin.get(`/v1/moves/${m.id}`)).body.state).toBe("pending")
        const committed = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420, guard })
        expect(committed.status).toBe(200)
        expect(committed.body.guard).toEqual({ ...guard, estimateErrorMs: 30, allowanceErrorMs: -20 })
        const pairs = (await agent.get(`/v1/hosts/${src.id}/allowances`)).body
        expect(pairs).toEqual({
          hostId: src.id,
          priorMs: 400,
          horizonMs: 3_600_000,
          items: [expect.objectContaining({ targetHostId: dst.id, allowanceMs: 420, source: "learned", samples: 1, commitsMs: [420], recordedAtMs: [expect.any(Number)] })],
        })
        // A pair without commits of its own, asked for by target, is listed; one commit into that
        // target is too few to pool (a pool counts from 5): the prior.
        const third = await addHost(admin, 2048)
        const pooled = (await admin.get(`/v1/hosts/${third.id}/allowances?targetHostId=${dst.id}`)).body
        expect(pooled.items).toEqual([{ sourceHostId: third.id, targetHostId: dst.id, allowanceMs: 400, source: "prior", samples: 0, commitsMs: [], recordedAtMs: [], updatedAt: null }])
        const done = await answer
        expect(done.status).toBe(200)
        expect(done.body).toMatchObject({ downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420, move: { id: m.id, state: "committed" } })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
        expect((await admin.get(`/v1/moves/${m.id}`)).body.rounds).toHaveLength(2)
        expect((await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 3, captureMs: 1, sendMs: 1, commitMs: 1 })).status).toBe(409)
        // Phases that do not fit within their downtime are bad input: 400 naming the field.
        const inconsistent = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 1, captureMs: 1, sendMs: 1, commitMs: 1 })
        expect([inconsistent.status, inconsistent.body.field]).toEqual([400, "downtimeMs"])
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("an in-doubt move is resolved over HTTP: the target's report commits it (no phases), an operator aborts another; other hosts and early commits are refused", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const other = await addHost(admin, 2048)
        const final = { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 }
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m = await findMove(src, sid)
        const target = client(c.url, dst.token)
        // Before the final round the target cannot run the guest: 409, nothing changed.
        expect((await target.post(`/v1/moves/${m.id}/resolve`, { outcome: "commit", reason: "runs here" })).status).toBe(409)
        const inDoubtBefore = (await admin.get("/v1/fleet")).body.movesInDoubt as number
        expect((await client(c.url, src.token).post(`/v1/moves/${m.id}/rounds`, final)).status).toBe(200)
        // The fleet signal shows the move in doubt until it is resolved.
        expect((await admin.get("/v1/fleet")).body.movesInDoubt).toBe(inDoubtBefore + 1)
        expect((await client(c.url, other.token).post(`/v1/moves/${m.id}/resolve`, { outcome: "commit", reason: "runs here" })).status).toBe(403)
        // A target may report that it runs the guest; an abort is the operator's word only.
        expect((await target.post(`/v1/moves/${m.id}/resolve`, { outcome: "abort", reason: "no" })).status).toBe(403)
        const bad = await target.post(`/v1/moves/${m.id}/resolve`, { outcome: "maybe", reason: "x" })
        expect([bad.status, bad.body.field]).toEqual([400, "outcome"])
        const committed = await target.post(`/v1/moves/${m.id}/resolve`, { outcome: "commit", reason: "the target runs the guest" })
        expect(committed.status).toBe(200)
        expect(committed.body).toMatchObject({ state: "committed", phases: null, resendOwed: false })
        expect((await admin.get("/v1/fleet")).body.movesInDoubt).toBe(inDoubtBefore)
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
        const events = (await admin.get(`/v1/sessions/${sid}/events`)).body.items as { kind: string; phases?: unknown }[]
        expect(events.find((e) => e.kind === "moved")).toMatchObject({ phases: null })
        // The source's resend mark on the move committed without phases: its own token (or the
        // admin's) only, strict input; the move's record carries it (`resendOwed`), as its read,
        // the list and its source's answer show it, so an operator sees that the source holds
        // the guest's only copy and owes the stream.
        const source = client(c.url, src.token)
        expect((await target.post(`/v1/moves/${m.id}/resend`, { owed: true })).status).toBe(403)
        const badMark = await source.post(`/v1/moves/${m.id}/resend`, { owed: "yes" })
        expect([badMark.status, badMark.body.field]).toEqual([400, "owed"])
        expect((await admin.get(`/v1/moves/${m.id}`)).body.resendOwed).toBe(false)
        const marked = await source.post(`/v1/moves/${m.id}/resend`, { owed: true })
        expect([marked.status, marked.body]).toEqual([200, { ...committed.body, resendOwed: true }])
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toEqual({ ...committed.body, resendOwed: true })
        const listed = (await admin.get(`/v1/moves?hostId=${src.id}&state=committed`)).body.items as { id: string; resendOwed: boolean }[]
        expect(listed.find((x) => x.id === m.id)?.resendOwed).toBe(true)
        // The target reads it too (a move's target may read it).
        expect((await target.get(`/v1/moves/${m.id}`)).body.resendOwed).toBe(true)
        // An operator's commit or abort of the marked move is refused: it is committed already.
        expect((await admin.post(`/v1/moves/${m.id}/resolve`, { outcome: "commit", reason: "again" })).status).toBe(409)
        expect((await admin.post(`/v1/moves/${m.id}/resolve`, { outcome: "abort", reason: "back" })).status).toBe(409)
        const cleared = await source.post(`/v1/moves/${m.id}/resend`, { owed: false })
        expect([cleared.status, cleared.body.resendOwed]).toEqual([200, false])
        // Every clear counts (`resendClears`); nothing else of the record changes.
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toEqual({ ...committed.body, resendClears: 1 })
        // A tell naming the clears its source read before the clear (one its client gave up on,
        // reaching the coordinator late) changes nothing: 200 with the move as it is.
        const late = await source.post(`/v1/moves/${m.id}/resend`, { owed: true, seenClears: 0 })
        expect([late.status, late.body]).toEqual([200, { ...committed.body, resendClears: 1 }])
        const badCount = await source.post(`/v1/moves/${m.id}/resend`, { owed: true, seenClears: -1 })
        expect([badCount.status, badCount.body.field]).toEqual([400, "seenClears"])
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toEqual({ ...committed.body, resendClears: 1 })
        // Naming the clears it read, or none (an older source's agent): set.
        expect((await source.post(`/v1/moves/${m.id}/resend`, { owed: true, seenClears: 1 })).body).toEqual({ ...committed.body, resendOwed: true, resendClears: 1 })
        expect((await target.post(`/v1/moves/${m.id}/resend`, { owed: false })).body).toEqual({ ...committed.body, resendClears: 2 })
        expect((await source.post(`/v1/moves/${m.id}/resend`, { owed: true })).body.resendOwed).toBe(true)
        expect((await source.post(`/v1/moves/${m.id}/resend`, { owed: false })).body).toEqual({ ...committed.body, resendClears: 3 })
        expect((await source.post(`/v1/moves/missing-move/resend`, { owed: true })).status).toBe(404)
        await answer
        await admin.del(`/v1/sessions/${sid}`)

        const sid2 = await runningOn(src)
        const answer2 = admin.post(`/v1/sessions/${sid2}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        const m2 = await findMove(src, sid2)
        expect((await client(c.url, src.token).post(`/v1/moves/${m2.id}/rounds`, final)).status).toBe(200)
        const aborted = await admin.post(`/v1/moves/${m2.id}/resolve`, { outcome: "abort", reason: "the target host is gone" })
        expect(aborted.status).toBe(200)
        expect(aborted.body).toMatchObject({ state: "aborted", abortReason: "resolved by operator: the target host is gone" })
        expect((await admin.get(`/v1/sessions/${sid2}`)).body).toMatchObject({ state: "running", hostId: src.id })
        expect((await admin.post(`/v1/moves/${m2.id}/resolve`, { outcome: "commit", reason: "late" })).status).toBe(409)
        // An aborted move owes no resend: 409.
        expect((await client(c.url, src.token).post(`/v1/moves/${m2.id}/resend`, { owed: true })).status).toBe(409)
        await answer2
        await admin.del(`/v1/sessions/${sid2}`)
      })

      it("the move request answers its move's resolution: committed by the target's report or an operator's word, 200 with the move and null figures (its pause not measured); aborted by an operator, 503 MoveAborted naming the reason", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const final = { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 }
        const source = client(c.url, src.token)
        /** A move of a session running on `src` to `dst`, its final round recorded; its request's answer not awaited. */
        const inDoubt = async () => {
          const sid = await runningOn(src)
          const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
          const m = await findMove(src, sid)
          expect((await source.post(`/v1/moves/${m.id}/rounds`, final)).status).toBe(200)
          return { sid, moveId: m.id, answer }
        }
        const unmeasured = { downtimeMs: null, captureMs: null, sendMs: null, commitMs: null }

        // The target's report that it runs the guest. Before: 503 MoveAborted ("aborted"), a
        // committed move told as failed (the waiter read a commit without phases as an abort).
        const byTarget = await inDoubt()
        expect((await client(c.url, dst.token).post(`/v1/moves/${byTarget.moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
        const committed = await byTarget.answer
        expect(committed.status).toBe(200)
        expect(committed.body).toEqual({ move: (await admin.get(`/v1/moves/${byTarget.moveId}`)).body, ...unmeasured })
        expect(committed.body.move).toMatchObject({ id: byTarget.moveId, state: "committed", phases: null, targetHostId: dst.id })
        expect((await admin.get(`/v1/sessions/${byTarget.sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })

        // An operator's commit (past the final round: its word stands whatever the source reports).
        const byOperator = await inDoubt()
        expect((await admin.post(`/v1/moves/${byOperator.moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
        const operatorCommitted = await byOperator.answer
        expect(operatorCommitted.status).toBe(200)
        expect(operatorCommitted.body).toMatchObject({ move: { id: byOperator.moveId, state: "committed", phases: null }, ...unmeasured })

        // An operator's abort: the abort error, naming the resolution; the session stays on the source.
        const aborted = await inDoubt()
        expect((await admin.post(`/v1/moves/${aborted.moveId}/resolve`, { outcome: "abort", reason: "the target host is gone" })).status).toBe(200)
        const failed = await aborted.answer
        expect(failed.status).toBe(503)
        expect(failed.body).toMatchObject({ error: "MoveAborted", message: "resolved by operator: the target host is gone", moveId: aborted.moveId, maxDowntimeMs: 600 })
        expect((await admin.get(`/v1/sessions/${aborted.sid}`)).body).toMatchObject({ state: "running", hostId: src.id })

        for (const { sid } of [byTarget, byOperator, aborted]) await admin.del(`/v1/sessions/${sid}`)
      })

      it("a move's source and target read its session wherever it is placed, while theirs is its latest move; any other host is refused 403, and every other step stays its host's; the target may clear the resend mark, never set it", async () => {
        await moveParties(c.url, admin, { resendMark: true })
      })

      it("an abort for downtime answers 503 ErrMoveDowntime with the estimate; the session stays on the source", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 480 })
        const m = await findMove(src, sid)
        const aborted = await client(c.url, src.token).post(`/v1/moves/${m.id}/abort`, { reason: "ErrMoveDowntime: estimate over budget", estimateMs: 812 })
        expect(aborted.body.state).toBe("aborted")
        const done = await answer
        expect(done.status).toBe(503)
        expect(done.body).toMatchObject({ error: "ErrMoveDowntime", estimateMs: 812, maxDowntimeMs: 480, moveId: m.id })
        expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: src.id })
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("an abort's estimate past 2^53 - 1 (1e21) is a 400 naming estimateMs and changes nothing; a fractional one reads back exactly", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const sid = await runningOn(src)
        const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 480 })
        const m = await findMove(src, sid)
        const agent = client(c.url, src.token)
        const huge = await agent.post(`/v1/moves/${m.id}/abort`, { reason: "ErrMoveDowntime: estimate over budget", estimateMs: 1e21 })
        expect([huge.status, huge.body.field]).toEqual([400, "estimateMs"])
        expect((await admin.get(`/v1/moves/${m.id}`)).body.state).toBe("pending")
        const aborted = await agent.post(`/v1/moves/${m.id}/abort`, { reason: "ErrMoveDowntime: estimate over budget", estimateMs: 812.25 })
        expect(aborted.status).toBe(200)
        expect((await admin.get(`/v1/moves/${m.id}`)).body).toMatchObject({ state: "aborted", abortEstimateMs: 812.25 })
        expect((await answer).body).toMatchObject({ error: "ErrMoveDowntime", estimateMs: 812.25 })
        await admin.del(`/v1/sessions/${sid}`)
      })

      describe("the move wait's timeout (TestClock)", () => {
        // A coordinator of this backend of its own, on the test's clock: the move wait's deadline
        // (2.5 s) comes when the test moves the clock, after what the agent does before it, however
        // slow the machine.
        const moveTimeoutMs = 2500
        const clocked = Effect.gen(function* () {
          const built = yield* clockedCoordinator(yield* Effect.promise(() => options.coordinator({ moveTimeoutMs })))
          const adm = client(built.url, built.adminToken)
          const notifier = Context.get(built.context, Notifier)
          const http = <A>(request: () => Promise<A>) => Effect.promise(request)
          /** Two measured hosts and a session running on the first. */
          const running = http(async () => {
            const src = await addHost(adm, 2048)
            const dst = await addHost(adm, 2048)
            const sid = uid("s")
            expect((await adm.post("/v1/sessions", { id: sid, memMib: 256, vcpus: 1, affinity: [src.id] })).body.hostId).toBe(src.id)
            await client(built.url, src.token).post(`/v1/sessions/${sid}/started`)
            return { src, dst, sid }
          })
          /**
           * Sends the move; answers its request's fiber once its wait waits on its deadline (read
           * from the clock before). The request is in the test's scope: a test that fails with it
           * held leaves it (the coordinator, which stops next, does not wait on it).
           */
          const moving = (sid: string, targetHostId: string) =>
            Effect.gen(function* () {
              const timed = notifier.timed()
              const answer = yield* Effect.forkScoped(
                Effect.promise((signal) => call(built.url, "POST", `/v1/sessions/${sid}/move`, { token: built.adminToken, body: { targetHostId, maxDowntimeMs: 600 }, signal })),
              )
              for (let i = 0; i < 1500 && notifier.timed() === timed; i++) yield* http(() => delay(20))
              expect(notifier.timed()).toBe(timed + 1)
              return answer
            })
          return { url: built.url, adm, http, running, moving }
        })

        itEffect.effect("no agent acts: the move is aborted with reason timeout and the caller gets 503 MoveTimeout", () =>
          Effect.gen(function* () {
            const { adm, http, running, moving } = yield* clocked
            const { dst, sid } = yield* running
            const answer = yield* moving(sid, dst.id)
            yield* TestClock.adjust(moveTimeoutMs)
            const done = yield* answered("the move's request past its timeout", Fiber.join(answer))
            expect(done.status).toBe(503)
            expect(done.body.error).toBe("MoveTimeout")
            yield* http(async () => {
              expect((await adm.get(`/v1/moves/${done.body.moveId}`)).body).toMatchObject({ state: "aborted", abortReason: "timeout" })
              expect((await adm.get(`/v1/sessions/${sid}`)).body.state).toBe("running")
              await adm.del(`/v1/sessions/${sid}`)
            })
          }).pipe(Effect.scoped),
        )

        itEffect.effect("a timeout after the final round is recorded does not abort: 503 MoveCommitPending, the move stays pending and the agent's commit lands", () =>
          Effect.gen(function* () {
            const { url, adm, http, running, moving } = yield* clocked
            const { src, dst, sid } = yield* running
            const answer = yield* moving(sid, dst.id)
            const agent = client(url, src.token)
            const m = (yield* http(() => agent.get(`/v1/moves?hostId=${src.id}&state=pending`))).body.items.find((x: { sessionId: string }) => x.sessionId === sid) as { id: string }
            expect(m).toBeDefined()
            yield* http(async () => {
              expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 })).status).toBe(200)
              // The source paused and recorded its final round; then it goes quiet past the move timeout.
              expect((await agent.post(`/v1/moves/${m.id}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 })).status).toBe(200)
            })
            yield* TestClock.adjust(moveTimeoutMs)
            const done = yield* answered("the move's request past its timeout", Fiber.join(answer))
            yield* http(async () => {
              expect(done.status).toBe(503)
              expect(done.body).toMatchObject({ error: "MoveCommitPending", moveId: m.id, maxDowntimeMs: 600 })
              expect(done.body.message).toContain(`GET /v1/moves/${m.id}`)
              expect(Number(done.headers.get("retry-after"))).toBeGreaterThanOrEqual(1)
              expect((await adm.get(`/v1/moves/${m.id}`)).body).toMatchObject({ state: "pending", abortReason: null })
              expect((await adm.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "moving", hostId: src.id })
              // The agent's commit still lands; the move's record shows the outcome.
              const committed = await agent.post(`/v1/moves/${m.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 })
              expect(committed.status).toBe(200)
              expect((await adm.get(`/v1/moves/${m.id}`)).body).toMatchObject({ state: "committed", phases: { downtimeMs: 560 } })
              expect((await adm.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
              expect((await adm.get("/metrics")).body as string).toContain('engram_moves_total{outcome="commit_pending"} 1')
              await adm.del(`/v1/sessions/${sid}`)
            })
          }).pipe(Effect.scoped),
        )
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
        expect((await admin.get(`/v1/reservations?hostId=${h.id}`)).body).toEqual({ items: [expect.objectContaining({ id: r.body.id })], nextCursor: null })
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
        for (const name of ["engram_placements_total", "engram_queue_length", "engram_parks", "engram_reaper_leader", "engram_lease_unrenewed_seconds", "engram_reserve_failures", "engram_reaper_pass_duration_seconds_bucket"]) {
          expect(metrics.body as string).toContain(name)
        }
        const spec = await admin.get("/openapi.json")
        expect(spec.body.openapi).toMatch(/^3\./)
        expect(Object.keys(spec.body.paths)).toEqual(expect.arrayContaining(["/v1/sessions", "/v1/hosts/{id}/assignments", "/v1/moves/{id}/commit", "/healthz"]))
      })
    })

    describe("the whole life cycle over HTTP", () => {
      /** Every item of a list, following its cursors `limit` at a time. */
      const follow = async (path: string, limit: number) => {
        const items: { id: string }[] = []
        let cursor: string | null = null
        for (let pages = 1; ; pages++) {
          const sep = path.includes("?") ? "&" : "?"
          const page: Answer<{ items: { id: string }[]; nextCursor: string | null }> = await admin.get(
            `${path}${sep}limit=${limit}${cursor === null ? "" : `&cursor=${encodeURIComponent(cursor)}`}`,
          )
          expect(page.status, `${path} page ${pages}`).toBe(200)
          expect(page.body.items.length).toBeLessThanOrEqual(limit)
          items.push(...page.body.items)
          cursor = page.body.nextCursor
          if (cursor === null) return { items, pages }
          if (pages > 500) throw new Error(`${path}: the cursors never end`)
        }
      }

      it("idle → parked → resume → running on the same host, warm (200, no queue, no placement); its agent sees it running", async () => {
        const h = await addHost(admin, 2048)
        const agent = client(c.url, h.token)
        const id = uid("w")
        expect((await admin.post("/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [h.id] })).status).toBe(201)
        await agent.post(`/v1/sessions/${id}/started`)
        expect((await agent.post(`/v1/sessions/${id}/idle`)).body.state).toBe("parked")
        const before = (await admin.get(`/v1/sessions/${id}`)).body
        const warm = await admin.post(`/v1/sessions/${id}/resume`)
        expect(warm.status).toBe(200)
        expect(warm.body).toEqual({ id, state: "running", hostId: h.id, resumed: "warm" })
        const after = (await admin.get(`/v1/sessions/${id}`)).body
        expect(after).toMatchObject({ state: "running", hostId: h.id, reservationId: before.reservationId, parkedAt: null, queue: null })
        const host = (await admin.get(`/v1/hosts/${h.id}`)).body
        expect([host.parks, host.entries, host.reservedMib]).toEqual([0, 1, 512])
        const assigned = (await agent.get(`/v1/hosts/${h.id}/assignments`)).body.sessions.find((x: { id: string }) => x.id === id)
        expect(assigned.state).toBe("running")
        const kinds = (await admin.get(`/v1/sessions/${id}/events`)).body.items.map((e: { kind: string }) => e.kind)
        expect(kinds).toEqual(["created", "placed", "running", "parked", "resumed"])
        expect((await admin.get("/metrics")).body as string).toMatch(/engram_resumes_total\{resumed="warm"\} [1-9]/)
        await admin.del(`/v1/sessions/${id}`)
      })

      it("descended → resume → restored cold: 202 queued with where it stands while no host has room, then placed when room appears; waits wake on each step", async () => {
        // A host bigger than any other of this suite: only it can hold these sessions.
        const big = await addHost(admin, 100_000, 64)
        const agent = client(c.url, big.token)
        const id = uid("d")
        const filler = uid("f")
        expect((await admin.post("/v1/sessions", { id, memMib: 60_000, vcpus: 1 })).body.hostId).toBe(big.id)
        await agent.post(`/v1/sessions/${id}/started`)
        // A queued session without room makes the idle session descend rather than park.
        const blocker = uid("b")
        expect((await admin.post("/v1/sessions", { id: blocker, memMib: 50_000, vcpus: 1 })).status).toBe(202)
        expect((await agent.post(`/v1/sessions/${id}/idle`)).body.state).toBe("descending")
        await admin.del(`/v1/sessions/${blocker}`)
        expect((await agent.post(`/v1/sessions/${id}/descended`)).body.state).toBe("descended")
        expect((await admin.post("/v1/sessions", { id: filler, memMib: 60_000, vcpus: 1 })).body.hostId).toBe(big.id)

        const cold = await admin.post(`/v1/sessions/${id}/resume`)
        expect(cold.status).toBe(202)
        expect(cold.body).toMatchObject({ id, state: "queued", resumed: "cold", tooBig: false })
        expect(cold.body.noFit.find((d: { hostId: string }) => d.hostId === big.id)).toMatchObject({ reason: "ram_full", freeMib: 40_000 })
        const queued = (await admin.get(`/v1/sessions/${id}`)).body
        expect(queued.state).toBe("queued")
        expect(queued.queue.position).toBeGreaterThanOrEqual(1)
        expect(queued.queue.tooBig).toBe(false)
        expect(queued.queue.noFit.find((d: { hostId: string }) => d.hostId === big.id).reason).toBe("ram_full")
        // The queue lists it with the same standing.
        const inQueue = (await follow("/v1/queue", 50)).items.find((x) => x.id === id) as unknown as { queue: { position: number } }
        expect(inQueue.queue).toEqual(queued.queue)

        // Waiting for pending: the end of the filler frees the room, the drain places it and wakes the wait.
        const waiting = admin.get(`/v1/sessions/${id}/wait?state=pending&timeoutMs=30000`)
        await admin.del(`/v1/sessions/${filler}`)
        const placed = await waiting
        expect(placed.status).toBe(200)
        expect(placed.body).toMatchObject({ id, state: "pending", hostId: big.id, queue: null })
        // Waiting for running: the agent's acknowledgement wakes it.
        const running = admin.get(`/v1/sessions/${id}/wait?state=running&timeoutMs=30000`)
        await agent.post(`/v1/sessions/${id}/started`)
        expect((await running).body).toMatchObject({ state: "running", hostId: big.id })
        const kinds = (await admin.get(`/v1/sessions/${id}/events`)).body.items.map((e: { kind: string }) => e.kind)
        expect(kinds).toEqual(["created", "placed", "running", "descending", "descended", "resumed", "queued", "placed", "running"])
        await admin.del(`/v1/sessions/${id}`)
      })

      it("wait: 200 at once when the state holds, 408 WaitTimeout naming the state, 409 Unreachable once it can no longer come, 400 past 60 s", async () => {
        const h = await addHost(admin, 2048)
        const id = uid("s")
        await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })
        expect((await admin.get(`/v1/sessions/${id}/wait?state=pending`)).body.state).toBe("pending")
        const timedOut = await admin.get(`/v1/sessions/${id}/wait?state=running&timeoutMs=20`)
        expect(timedOut.status).toBe(408)
        expect(timedOut.body).toMatchObject({ error: "WaitTimeout", state: "pending" })
        const tooLong = await admin.get(`/v1/sessions/${id}/wait?state=running&timeoutMs=60001`)
        expect([tooLong.status, tooLong.body.field]).toEqual([400, "timeoutMs"])
        expect((await admin.get(`/v1/sessions/${id}/wait?state=sleepy`)).status).toBe(400)
        // An end while a wait is in flight answers it at once: running can no longer come.
        const waiting = admin.get(`/v1/sessions/${id}/wait?state=running&timeoutMs=30000`)
        await admin.del(`/v1/sessions/${id}`)
        const unreachable = await waiting
        expect(unreachable.status).toBe(409)
        expect(unreachable.body).toMatchObject({ error: "Unreachable", from: "ended", to: "running" })
        expect((await admin.get(`/v1/sessions/${id}/wait?state=ended`)).status).toBe(200)
        expect((await admin.get(`/v1/sessions/never-${uid("x")}/wait?state=running`)).status).toBe(404)
        // A host token waits only for its own host's sessions.
        const other = await addHost(admin, 1024)
        const mine = uid("s")
        await admin.post("/v1/sessions", { id: mine, memMib: 64, vcpus: 1, affinity: [h.id] })
        expect((await client(c.url, other.token).get(`/v1/sessions/${mine}/wait?state=pending`)).status).toBe(403)
        expect((await client(c.url, h.token).get(`/v1/sessions/${mine}/wait?state=pending`)).status).toBe(200)
        await admin.del(`/v1/sessions/${mine}`)
      })

      it("events: a move committed with its phases and one refused with its estimate, in order, a page at a time", async () => {
        const src = await addHost(admin, 2048)
        const dst = await addHost(admin, 2048)
        const id = uid("m")
        await admin.post("/v1/sessions", { id, memMib: 256, vcpus: 1, affinity: [src.id] })
        await client(c.url, src.token).post(`/v1/sessions/${id}/started`)
        const agent = client(c.url, src.token)
        const movesOf = async () => (await agent.get(`/v1/moves?hostId=${src.id}&state=pending`)).body.items as { id: string; sessionId: string }[]
        // Refused for downtime: the source aborts with the estimate.
        const refusedAnswer = admin.post(`/v1/sessions/${id}/move`, { targetHostId: dst.id, maxDowntimeMs: 480 })
        let m: { id: string } | undefined
        for (let i = 0; i < 200 && m === undefined; i++) m = (await movesOf()).find((x) => x.sessionId === id)
        expect(m).toBeDefined()
        await agent.post(`/v1/moves/${m!.id}/abort`, { reason: "ErrMoveDowntime: estimate 812 ms > 480 ms", estimateMs: 812 })
        expect((await refusedAnswer).status).toBe(503)
        // Committed with its phases.
        const movedAnswer = admin.post(`/v1/sessions/${id}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
        let m2: { id: string } | undefined
        for (let i = 0; i < 200 && m2 === undefined; i++) m2 = (await movesOf()).find((x) => x.sessionId === id)
        await agent.post(`/v1/moves/${m2!.id}/rounds`, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 })
        await agent.post(`/v1/moves/${m2!.id}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 })
        expect((await movedAnswer).status).toBe(200)
        const all = await follow(`/v1/sessions/${id}/events`, 2)
        expect(all.pages).toBe(4)
        const events = all.items as unknown as { seq: number; at: number; kind: string; [k: string]: unknown }[]
        expect(events.map((e) => e.seq)).toEqual([1, 2, 3, 4, 5, 6, 7])
        expect(events.map((e) => e.kind)).toEqual(["created", "placed", "running", "move_begun", "move_aborted", "move_begun", "moved"])
        expect(events[4]).toMatchObject({ kind: "move_aborted", moveId: m!.id, hostId: src.id, estimateMs: 812 })
        expect(events[6]).toMatchObject({
          kind: "moved",
          moveId: m2!.id,
          fromHostId: src.id,
          toHostId: dst.id,
          hostId: dst.id,
          phases: { downtimeMs: 560, captureMs: 40, sendMs: 90, commitMs: 420 },
        })
        expect(events.every((e) => typeof e.at === "number")).toBe(true)
        // The moves list pages too, by host and state.
        const moves = await follow(`/v1/moves?hostId=${dst.id}`, 1)
        expect(moves.items.map((x) => x.id)).toEqual([m!.id, m2!.id])
        expect((await agent.get("/v1/moves")).status).toBe(403)
        await admin.del(`/v1/sessions/${id}`)
      })

      it("pagination: every list pages with limit and cursor, each item once in a stable order; a bad cursor or limit is a 400 naming it", async () => {
        const h = await addHost(admin, 65_536, 64)
        const ids: string[] = []
        for (let i = 0; i < 5; i++) {
          const id = uid("pg")
          ids.push(id)
          await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })
          await admin.post("/v1/reservations", { id: uid("r"), hostId: h.id, ownerKind: "external", ownerId: "pages", memMib: 32, vcpus: 0 })
        }
        const onHost = await follow(`/v1/sessions?hostId=${h.id}`, 2)
        expect(onHost.items.map((x) => x.id)).toEqual(ids)
        expect(onHost.pages).toBe(3)
        const all = await follow("/v1/sessions", 7)
        expect(new Set(all.items.map((x) => x.id)).size).toBe(all.items.length)
        expect(all.items.map((x) => x.id)).toEqual(expect.arrayContaining(ids))
        const hosts = await follow("/v1/hosts", 3)
        const hostIds = hosts.items.map((x) => x.id)
        expect(hostIds).toEqual([...hostIds].sort())
        expect(hostIds).toContain(h.id)
        const reservations = await follow(`/v1/reservations?hostId=${h.id}`, 4)
        expect(reservations.items).toHaveLength(10)
        expect(reservations.items.map((x) => x.id)).toEqual(reservations.items.map((x) => x.id).sort())
        for (const path of ["/v1/sessions", "/v1/hosts", "/v1/reservations", "/v1/moves", "/v1/queue", `/v1/sessions/${ids[0]}/events`]) {
          const badCursor = await admin.get(`${path}?cursor=not-a-cursor`)
          expect([badCursor.status, badCursor.body.field], path).toEqual([400, "cursor"])
          const badLimit = await admin.get(`${path}?limit=0`)
          expect([badLimit.status, badLimit.body.field], path).toEqual([400, "limit"])
        }
        // A cursor of one list is no cursor of another.
        const hostCursor = (await admin.get("/v1/hosts?limit=1")).body.nextCursor as string
        expect((await admin.get(`/v1/sessions?cursor=${encodeURIComponent(hostCursor)}`)).body.field).toBe("cursor")
        for (const id of ids) await admin.del(`/v1/sessions/${id}`)
        for (const r of reservations.items) await admin.del(`/v1/reservations/${r.id}`)
      })

      it("a create with onNoRoom refuse that fits nowhere is 409 NoRoom with the reasons, and nothing is stored", async () => {
        const h = await addHost(admin, 1024)
        const id = uid("nr")
        const refused = await admin.post("/v1/sessions", { id, memMib: 10_000_000, vcpus: 1, onNoRoom: "refuse" })
        expect(refused.status).toBe(409)
        expect(refused.body).toMatchObject({ error: "NoRoom", id, tooBig: true })
        expect(refused.body.noFit.find((d: { hostId: string }) => d.hostId === h.id)).toMatchObject({ reason: "ram_full" })
        expect((await admin.get(`/v1/sessions/${id}`)).status).toBe(404)
        const fits = await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id], onNoRoom: "refuse" })
        expect(fits.status).toBe(201)
        expect((await admin.post("/v1/sessions", { memMib: 64, vcpus: 1, onNoRoom: "later" })).body.field).toBe("onNoRoom")
        await admin.del(`/v1/sessions/${id}`)
      })

      it("host removal: 409 while it holds a session or a reservation, then 200; it is gone, and its token with it", async () => {
        const h = await addHost(admin, 2048)
        const id = uid("s")
        await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1, affinity: [h.id] })
        const busy = await admin.del(`/v1/hosts/${h.id}`)
        expect(busy.status).toBe(409)
        expect(busy.body).toMatchObject({ error: "Refused", check: "host_in_use" })
        expect((await client(c.url, h.token).del(`/v1/hosts/${h.id}`)).status).toBe(403)
        await admin.del(`/v1/sessions/${id}`)
        const removed = await admin.del(`/v1/hosts/${h.id}`)
        expect(removed.status).toBe(200)
        expect(removed.body).toMatchObject({ id: h.id, entries: 0 })
        expect((await admin.get(`/v1/hosts/${h.id}`)).status).toBe(404)
        expect((await admin.del(`/v1/hosts/${h.id}`)).status).toBe(404)
        expect((await client(c.url, h.token).get(`/v1/hosts/${h.id}/assignments`)).status).toBe(401)
        // The session's history outlives its host.
        expect((await admin.get(`/v1/sessions/${id}/events`)).body.items.at(-1)).toMatchObject({ kind: "ended", hostId: h.id })
      })

      it("token rotation: the new token works and the old one stops at once; admin only", async () => {
        const h = await addHost(admin, 1024)
        const old = client(c.url, h.token)
        expect((await old.get(`/v1/hosts/${h.id}`)).status).toBe(200)
        expect((await old.post(`/v1/hosts/${h.id}/token`)).status).toBe(403)
        const rotated = await admin.post(`/v1/hosts/${h.id}/token`)
        expect(rotated.status).toBe(200)
        expect(rotated.body.id).toBe(h.id)
        expect(rotated.body.token).toMatch(/^[A-Za-z0-9_-]{43}$/)
        expect(rotated.body.token).not.toBe(h.token)
        expect((await old.get(`/v1/hosts/${h.id}`)).status).toBe(401)
        expect((await client(c.url, rotated.body.token).get(`/v1/hosts/${h.id}/assignments`)).status).toBe(200)
        expect((await admin.post(`/v1/hosts/nope-${uid("x")}/token`)).status).toBe(404)
      })

      it("registration is not readiness: a registered host takes nothing until its first report; 0 allocatable is full, null or absent unmeasured", async () => {
        const id = uid("fresh")
        await admin.post("/v1/hosts", { id })
        const s = uid("s")
        const q = await admin.post("/v1/sessions", { id: s, memMib: 64, vcpus: 1, affinity: [id], onNoRoom: "queue" })
        // Other hosts of the suite may take it; never the one that has not reported.
        if (q.status === 201) expect(q.body.hostId).not.toBe(id)
        else expect(q.body.noFit.find((d: { hostId: string }) => d.hostId === id)).toMatchObject({ reason: "unmeasured" })
        expect((await admin.get(`/v1/hosts/${id}`)).body).toMatchObject({ entries: 0, reportedAt: null })
        await admin.del(`/v1/sessions/${s}`)
        const zero = await admin.put(`/v1/hosts/${id}/report`, { totalMib: 4096, allocatableMib: 0, totalVcpus: 4 })
        expect(zero.body).toMatchObject({ measured: true, reportedAllocatableMib: 0 })
        const nf = await admin.get(`/v1/placement/no-fit?memMib=1&vcpus=1`)
        expect(nf.body.hosts.find((d: { hostId: string }) => d.hostId === id).reason).toBe("ram_full")
        const absent = await admin.put(`/v1/hosts/${id}/report`, { totalVcpus: 4 })
        expect(absent.status).toBe(200)
        expect(absent.body).toMatchObject({ measured: false, allocatableMib: null, report: { totalMib: null, allocatableMib: null, totalVcpus: 4 } })
        await admin.del(`/v1/hosts/${id}`)
      })
    })

    describe("a host registered while sessions are queued", () => {
      it("takes none of them before its first report, whatever drains the queue meanwhile; its report places them", async () => {
        const hid = uid("late")
        const queued = [uid("q"), uid("q"), uid("q")]
        for (const id of queued) {
          // Bigger than any other host of the suite (in RAM and in vCPUs: a host the suite left
          // unmeasured gates no RAM): only the late host can take them.
          const q = await admin.post("/v1/sessions", { id, memMib: 100_000, vcpus: 500, affinity: [hid] })
          expect(q.status).toBe(202)
        }
        const token = (await admin.post("/v1/hosts", { id: hid })).body.token as string
        // A heartbeat, and an uncordon (which drains the queue): still nothing on the host.
        expect((await client(c.url, token).post(`/v1/hosts/${hid}/heartbeat`)).status).toBe(200)
        expect((await admin.post(`/v1/hosts/${hid}/uncordon`)).status).toBe(200)
        for (const id of queued) expect((await admin.get(`/v1/sessions/${id}`)).body).toMatchObject({ state: "queued", hostId: null })
        expect((await admin.get(`/v1/hosts/${hid}`)).body).toMatchObject({ entries: 0, reservedMib: 0 })
        // The first report makes it ready: the queue drains onto it.
        expect((await admin.put(`/v1/hosts/${hid}/report`, report(400_000, 512))).status).toBe(200)
        for (const id of queued) expect((await admin.get(`/v1/sessions/${id}`)).body).toMatchObject({ state: "pending", hostId: hid })
        for (const id of queued) await admin.del(`/v1/sessions/${id}`)
      })
    })

    describe("strict input: what the API does not know, or a store cannot hold, is a 400 naming it; nothing changes", () => {
      /** What a refused request must leave as it was. */
      const everything = async () =>
        JSON.stringify(await Promise.all(["/v1/sessions", "/v1/hosts", "/v1/reservations", "/v1/moves"].map(async (p) => (await admin.get(`${p}?limit=1000`)).body)))

      it("an unknown key in any body, or an unknown query parameter of any endpoint, is named with the rule (the API description's additionalProperties: false holds)", async () => {
        const before = await everything()
        const all = endpoints()
        expect(all.length).toBeGreaterThanOrEqual(36)
        for (const e of all) {
          const key = `${e.method} ${e.path}`
          const path = e.path.replace(":id", "strict-nope")
          if (e.payload) {
            const valid = validBodies[key]
            expect(valid, `a valid body for ${key} (add it to validBodies)`).toBeDefined()
            const r = await admin.raw(e.method, path, JSON.stringify({ ...(valid as object), zzUnknown: 1 }))
            expect([r.status, r.body.field, r.body.in], key).toEqual([400, "zzUnknown", "body"])
            expect(r.body.rule, key).toMatch(/^is not a key of this object \(known: /)
          } else if (e.method !== "GET") {
            // An endpoint without a body takes none: a key sent anyway is unknown.
            const r = await admin.raw(e.method, path, JSON.stringify({ zzUnknown: 1 }))
            expect([r.status, r.body.field, r.body.in], key).toEqual([400, "zzUnknown", "body"])
          }
          const withQuery = `${path}?${requiredQueries[key] ?? ""}zzUnknown=1`
          const q = e.method === "GET" ? await admin.get(withQuery) : await admin.raw(e.method, withQuery, JSON.stringify(validBodies[key] ?? {}))
          expect([q.status, q.body.field, q.body.in], key).toEqual([400, "zzUnknown", "query"])
          expect(q.body.rule, key).toMatch(/^is not a query parameter of this endpoint/)
        }
        // The empty key is named too, as "".
        expect((await admin.raw("POST", "/v1/sessions", '{"memMib":64,"vcpus":1,"":1}')).body).toMatchObject({ field: '""', in: "body" })
        expect((await admin.get("/v1/fleet?=1")).body).toMatchObject({ field: '""', in: "query" })
        expect(await everything()).toBe(before)
      })

      it("a key repeated in one body object, or a query parameter given twice, is a 400 naming it (JSON.parse would keep the last); a host id that selects keeps the id rule; nothing changes", async () => {
        const h = await addHost(admin, 2048)
        const before = await everything()
        const id = uid("dup")
        for (const [path, body, field] of [
          ["/v1/hosts", `{"id":"${id}","id":"${id}-2"}`, "id"],
          ["/v1/hosts", `{"id":"${id}","labels":{"zone":"a","zone":"b"}}`, "labels.zone"],
          ["/v1/sessions", `{"id":"${id}","memMib":64,"vcpus":1,"memMib":1024}`, "memMib"],
          ["/v1/sessions", `{"id":"${id}","memMib":64,"vcpus":1,"\u0069d":"${id}-2"}`, "id"],
        ] as const) {
          const r = await admin.raw("POST", path, body)
          expect([r.status, r.body.error, r.body.field, r.body.in], body).toEqual([400, "InvalidInput", field, "body"])
          expect(r.body.rule, body).toMatch(/^is given more than once in one object/)
        }
        for (const [path, field] of [
          ["/v1/sessions?limit=2&limit=3", "limit"],
          [`/v1/sessions?hostId=${h.id}&hostId=${h.id}`, "hostId"],
          ["/v1/moves?state=pending&state=aborted", "state"],
        ] as const) {
          const r = await admin.get(path)
          expect([r.status, r.body.field, r.body.in], path).toEqual([400, field, "query"])
          expect(r.body.rule, path).toMatch(/^is given more than once/)
        }
        for (const path of ["/v1/sessions?limit=0x10", "/v1/sessions?limit=1e2", "/v1/sessions?limit=%2010", "/v1/hosts?limit="]) {
          const r = await admin.get(path)
          expect([r.status, r.body.field, r.body.in], path).toEqual([400, "limit", "query"])
          expect(r.body.rule, path).toBe("must be an integer of at most 15 decimal digits")
        }
        for (const path of ["/v1/sessions?hostId=", "/v1/moves?hostId=a%2Fb", "/v1/reservations?hostId=..", `/v1/hosts/${h.id}/allowances?targetHostId=${"x".repeat(101)}`]) {
          const r = await admin.get(path)
          expect([r.status, r.body.in], path).toEqual([400, "query"])
          expect(r.body.field, path).toMatch(/^(hostId|targetHostId)$/)
          expect(r.body.rule, path).toContain("must be 1-100 characters of [A-Za-z0-9._-]")
        }
        // An agent's stated bound is a whole number of ms, given once: anything else is refused by name.
        for (const value of ["banana", "0", "-5", "30000, 30000"]) {
          const r = await fetch(`${c.url}/v1/hosts/${h.id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${h.token}`, "engram-agent-call-timeout-ms": value } })
          expect([r.status, ((await r.json()) as { field?: string }).field], value).toEqual([400, "engram-agent-call-timeout-ms"])
        }
        const beat = await fetch(`${c.url}/v1/hosts/${h.id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${h.token}`, "engram-agent-call-timeout-ms": "30000" } })
        expect(beat.status).toBe(200)
        // A body is read as UTF-8: a content type naming another charset is refused, not misread.
        const latin1 = await fetch(`${c.url}/v1/hosts`, { method: "POST", headers: { authorization: `Bearer ${c.adminToken}`, "content-type": "application/json; charset=latin1" }, body: `{"id":"${id}"}` })
        expect([latin1.status, ((await latin1.json()) as { field?: string }).field]).toEqual([400, "content-type"])
        const utf8 = await fetch(`${c.url}/v1/hosts`, { method: "POST", headers: { authorization: `Bearer ${c.adminToken}`, "content-type": "application/json; charset=UTF-8" }, body: `{"id":"${id}-utf8"}` })
        expect(utf8.status).toBe(201)
        await admin.del(`/v1/hosts/${id}-utf8`)
        // A reason is kept and shown: at most 4,000 characters.
        const long = await admin.post("/v1/moves/strict-nope/abort", { reason: "r".repeat(4001) })
        expect([long.status, long.body.field, long.body.in]).toEqual([400, "reason", "body"])
        // The dashboard's change feed keeps the same rules (it is served beside the API).
        for (const [query, field] of [["waitMs=abc", "waitMs"], ["waitMs=-5", "waitMs"], ["waitMs=1e3", "waitMs"], ["waitMs=25001", "waitMs"], ["since=a&since=b", "since"], ["waitMs=0&bogus=1", "bogus"]] as const) {
          const r = await admin.get(`/ui/changes?${query}`)
          expect([r.status, r.body.error, r.body.field, r.body.in], query).toEqual([400, "InvalidInput", field, "query"])
        }
        expect((await admin.get("/ui/changes?since=&waitMs=0")).body).toMatchObject({ version: expect.any(String) })
        // The charts' history takes no query parameter and no body; the bearer is read as the API reads it.
        expect((await admin.get("/ui/history?x=1")).body).toEqual({ error: "InvalidInput", field: "x", rule: "is not a query parameter of this endpoint (it takes none)", in: "query" })
        for (const path of ["/ui/history", "/ui/changes?since=&waitMs=0"]) {
          const r = await new Promise<{ status: number; body: unknown }>((resolve, reject) => {
            const u = new URL(`${c.url}${path}`)
            const req = httpRequest({ host: u.hostname, port: u.port, path: `${u.pathname}${u.search}`, method: "GET", headers: { authorization: `Bearer ${c.adminToken}`, "content-type": "application/json", "content-length": "2" } }, (res) => {
              let text = ""
              res.on("data", (d: Buffer) => (text += d.toString()))
              res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as unknown }))
            })
            req.on("error", reject)
            req.end("{}")
          })
          expect(r, path).toEqual({ status: 400, body: { error: "InvalidInput", field: "body", rule: "must be empty: this endpoint takes no body", in: "body" } })
        }
        const history = (authorization: string) => fetch(`${c.url}/ui/history`, { headers: { authorization } }).then((r) => r.status)
        expect(await history(`bearer ${c.adminToken}`)).toBe(200)
        expect(await history(`Bearer\t${c.adminToken}`)).toBe(401)
        expect(await fetch(`${c.url}/v1/fleet`, { headers: { authorization: `Bearer\t${c.adminToken}` } }).then((r) => r.status)).toBe(401)
        expect(await everything()).toBe(before)
        // The same keys once each are taken.
        expect((await admin.raw("POST", "/v1/sessions", `{"id":"${id}","memMib":64,"vcpus":1}`)).status).toBe(201)
        await admin.del(`/v1/sessions/${id}`)
      })

      it("a create with a misspelt onNoRoom is refused, not placed or queued as if it were absent; an empty body or {} still does for an endpoint that takes none", async () => {
        const h = await addHost(admin, 1024)
        const id = uid("typo")
        const r = await admin.post("/v1/sessions", { id, memMib: 10_000_000, vcpus: 1, onNoroom: "refuse" })
        expect([r.status, r.body.field]).toEqual([400, "onNoroom"])
        expect(r.body.rule).toContain("onNoRoom")
        expect((await admin.get(`/v1/sessions/${id}`)).status).toBe(404)
        expect((await admin.raw("POST", `/v1/hosts/${h.id}/heartbeat`, "{}")).status).toBe(200)
        expect((await admin.raw("POST", `/v1/hosts/${h.id}/heartbeat`, "")).status).toBe(200)
        expect((await admin.raw("POST", `/v1/hosts/${h.id}/heartbeat`, "[1]")).body).toMatchObject({ error: "InvalidInput", field: "body" })
      })

      it("a report with misspelt keys, or allocatableMib above totalMib, is a 400 naming it; the host keeps its last report and nothing too big places on it", async () => {
        const h = await addHost(admin, 1024)
        const last = (await admin.get(`/v1/hosts/${h.id}`)).body
        const misspelt = await admin.put(`/v1/hosts/${h.id}/report`, { totalMb: 2048, allocatableMb: 2048, totalVcpus: 8 })
        expect([misspelt.status, misspelt.body.field]).toEqual([400, "totalMb"])
        const inflated = await admin.put(`/v1/hosts/${h.id}/report`, { totalMib: 1024, allocatableMib: 500_000, totalVcpus: 8 })
        expect([inflated.status, inflated.body.field, inflated.body.rule]).toEqual([400, "allocatableMib", "must be <= totalMib (1024)"])
        expect((await admin.get(`/v1/hosts/${h.id}`)).body).toEqual(last)
        for (const memMib of [500_000, 99_000_000_000]) {
          const id = uid("big")
          const s = await admin.post("/v1/sessions", { id, memMib, vcpus: 1, affinity: [h.id], onNoRoom: "refuse" })
          expect(s.status, String(memMib)).toBe(409)
        }
      })

      it("a well-formed cursor with a key no list holds (1.5, 1e19, 1e308, a NUL) is a 400 naming cursor on every list, never a 5xx", async () => {
        const sid = uid("cur")
        await admin.post("/v1/sessions", { id: sid, memMib: 64, vcpus: 1 })
        const made = (...parts: unknown[]) => encodeURIComponent(Buffer.from(JSON.stringify(parts)).toString("base64url"))
        const lists: [string, string, boolean][] = [
          ["/v1/sessions", "sessions", true],
          ["/v1/moves", "moves", true],
          ["/v1/queue", "queue", true],
          ["/v1/hosts", "hosts", false],
          ["/v1/reservations", "reservations", false],
          [`/v1/sessions/${sid}/events`, "events", false],
        ]
        for (const [path, list, timed] of lists) {
          const keys: unknown[][] = list === "events" ? [[1.5], [1e19], [1e308], [2 ** 31]] : timed ? [1.5, 1e19, 1e308, -1e19].map((t) => [t, "x"]).concat([[1, "a\u0000"]]) : [["a\u0000"], [7]]
          for (const key of keys) {
            const r = await admin.get(`${path}?cursor=${made(list, ...key)}`)
            expect([r.status, r.body.field], `${path} ${JSON.stringify(key)}`).toEqual([400, "cursor"])
          }
        }
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("a reservation whose expiry has passed (-1, or a minute ago) is a 400 naming expiresAt; nothing is stored", async () => {
        const h = await addHost(admin, 2048)
        for (const expiresAt of [-1, Date.now() - 60_000]) {
          const id = uid("exp")
          const r = await admin.post("/v1/reservations", { id, hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, expiresAt })
          expect([r.status, r.body.field], String(expiresAt)).toEqual([400, "expiresAt"])
          expect((await admin.get(`/v1/reservations/${id}`)).status).toBe(404)
        }
        const later = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, expiresAt: Date.now() + 60_000 })
        expect(later.status).toBe(201)
        await admin.del(`/v1/reservations/${later.body.id}`)
      })

      it("expiresInMs: an expiry from now on the coordinator's clock (the store's); beside expiresAt, or not an integer from 1 ms to 10 years, a 400 naming it, nothing stored", async () => {
        const h = await addHost(admin, 2048)
        const before = Date.now()
        const r = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, expiresInMs: 10 * 60_000 })
        expect(r.status).toBe(201)
        // The coordinator runs on this machine (its store's clock, the database's here too): within the request's time of ours.
        expect(r.body.expiresAt).toBeGreaterThanOrEqual(before + 10 * 60_000 - 5_000)
        expect(r.body.expiresAt).toBeLessThanOrEqual(Date.now() + 10 * 60_000 + 5_000)
        await admin.del(`/v1/reservations/${r.body.id}`)
        for (const bad of [{ expiresInMs: 0 }, { expiresInMs: 1.5 }, { expiresInMs: -60_000 }, { expiresInMs: 60_000, expiresAt: Date.now() + 60_000 }, { expiresInMs: 60_000, expiresAt: null }]) {
          const id = uid("expin")
          const refused = await admin.post("/v1/reservations", { id, hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, ...bad })
          expect([refused.status, refused.body.field], JSON.stringify(bad)).toEqual([400, "expiresInMs"])
          expect((await admin.get(`/v1/reservations/${id}`)).status).toBe(404)
        }
      })

      it("invalid UTF-8 in a body, a path id or a query value is a 400 naming it, never stored as U+FFFD", async () => {
        const h = await addHost(admin, 2048)
        const before = await everything()
        const invalid = Buffer.concat([Buffer.from(`{"hostId":"${h.id}","ownerKind":"external","ownerId":"x","memMib":1,"vcpus":0,"description":"caf`), Buffer.from([0xe9]), Buffer.from('"}')])
        const body = await sendBytes(c.url, c.adminToken, "POST", "/v1/reservations", invalid)
        expect([body.status, body.body.field, body.body.rule]).toEqual([400, "body", "must be valid UTF-8"])
        const labels = Buffer.concat([Buffer.from(`{"id":"${uid("h")}","labels":{"zone":"`), Buffer.from([0xff, 0xfe]), Buffer.from('"}}')])
        expect((await sendBytes(c.url, c.adminToken, "POST", "/v1/hosts", labels)).body).toMatchObject({ error: "InvalidInput", field: "body" })
        for (const [method, path, field, where] of [
          ["GET", "/v1/sessions/%FF", "id", "path"],
          ["PUT", `/v1/hosts/${h.id}%C3/report`, "id", "path"],
          ["GET", "/v1/sessions?hostId=%FF", "hostId", "query"],
          ["GET", "/v1/reservations?hostId=a%E9b", "hostId", "query"],
        ] as const) {
          const r = method === "GET" ? await admin.get(path) : await admin.raw(method, path, JSON.stringify({ totalMib: 1, allocatableMib: 1, totalVcpus: 1 }))
          expect([r.status, r.body.field, r.body.in], path).toEqual([400, field, where])
        }
        // The same text, valid UTF-8, is taken as it was sent (U+FFFD included).
        const valid = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, description: "café \ufffd" })
        expect([valid.status, valid.body.description]).toEqual([201, "café \ufffd"])
        await admin.del(`/v1/reservations/${valid.body.id}`)
        expect(await everything()).toBe(before)
      })
    })

    describe("bad input never reaches the store as a 500", () => {
      it("NUL and lone surrogates in affinity, labels, a reservation's hostId, a reason and list filters are 400 naming the field; nothing is stored", async () => {
        const h = await addHost(admin, 2048)
        const before = (await admin.get("/v1/sessions?limit=1000")).body.items.length
        const cases: [string, string, unknown, string][] = [
          ["POST", "/v1/sessions", { memMib: 64, vcpus: 1, affinity: ["a\u0000b"] }, "affinity.0"],
          ["POST", "/v1/sessions", { memMib: 64, vcpus: 1, affinity: [h.id, "\ud800"] }, "affinity.1"],
          ["POST", "/v1/hosts", { id: uid("h"), labels: { zone: "a\u0000" } }, "labels"],
          ["POST", "/v1/hosts", { id: uid("h"), labels: { "\udc00": "a" } }, "labels"],
          ["POST", "/v1/reservations", { hostId: "h\u0000", ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0 }, "hostId"],
          ["POST", "/v1/reservations", { hostId: "\ud83d", ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0 }, "hostId"],
          ["POST", "/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, description: "d\ud800" }, "description"],
        ]
        for (const [method, path, body, field] of cases) {
          const r = await admin.raw(method, path, JSON.stringify(body))
          expect([r.status, r.body.field], `${path} ${JSON.stringify(body)}`).toEqual([400, field])
        }
        // (A query string cannot carry a lone surrogate: percent-decoding UTF-8 never makes one.)
        for (const path of ["/v1/sessions?hostId=%00", "/v1/reservations?hostId=%00", "/v1/moves?hostId=%00", "/v1/sessions?hostId=a%00b&state=queued"]) {
          const r = await admin.get(path)
          expect(r.status, path).toBe(400)
          expect(r.body.field, path).toBe("hostId")
        }
        expect((await admin.get("/v1/sessions?limit=1000")).body.items.length).toBe(before)
      })

      it("the one id rule: 1-100 of [A-Za-z0-9._-], not . or ..; a path id no record can have is a 404, never a 500", async () => {
        for (const id of ["x".repeat(101), ".", "..", "a:b", "a/b", "é"]) {
          const s = await admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1 })
          expect([s.status, s.body.field], id).toEqual([400, "id"])
          const h = await admin.post("/v1/hosts", { id })
          expect([h.status, h.body.field], id).toEqual([400, "id"])
          const r = await admin.post("/v1/reservations", { id, hostId: "h", ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0 })
          expect([r.status, r.body.field], id).toEqual([400, "id"])
        }
        const ok = `${"x".repeat(96)}.-_9`
        expect((await admin.post("/v1/sessions", { id: ok, memMib: 64, vcpus: 1 })).status).toBeLessThan(300)
        expect((await admin.get(`/v1/sessions/${ok}`)).body.id).toBe(ok)
        expect((await admin.del(`/v1/sessions/${ok}`)).status).toBe(200)
        for (const path of [`/v1/sessions/${"y".repeat(101)}`, `/v1/hosts/${"y".repeat(300)}`, `/v1/moves/${"z".repeat(101)}/commit`, "/v1/sessions/%ED%A0%80", "/v1/sessions/%00"]) {
          const r = path.endsWith("/commit") ? await admin.post(path, { downtimeMs: 3, captureMs: 1, sendMs: 1, commitMs: 1 }) : await admin.get(path)
          expect([400, 404], `${path}: ${r.status}`).toContain(r.status)
          expect(typeof r.body.error, path).toBe("string")
        }
        // Past the router's default 100 characters an id still reaches its route: judged there, not "no endpoint".
        const long = await admin.get(`/v1/sessions/${"y".repeat(101)}`)
        expect(long.status).toBe(404)
        expect(long.body.message).toMatch(/session y+ not found/)
        const longer = await admin.get(`/v1/hosts/${"y".repeat(300)}`)
        expect([longer.status, longer.body.field, longer.body.in]).toEqual([400, "id", "path"])
      })

      it("figures are finite and exact: an estimate, a downtime budget or an expiry past 2^53 - 1 is a 400 naming it", async () => {
        const src = await addHost(admin, 2048)
        await addHost(admin, 2048)
        const sid = uid("s")
        await admin.post("/v1/sessions", { id: sid, memMib: 64, vcpus: 1, affinity: [src.id] })
        await client(c.url, src.token).post(`/v1/sessions/${sid}/started`)
        expect((await admin.post(`/v1/sessions/${sid}/move`, { maxDowntimeMs: 1e21 })).body.field).toBe("maxDowntimeMs")
        const r = await admin.post("/v1/reservations", { hostId: src.id, ownerKind: "external", ownerId: "x", memMib: 1, vcpus: 0, expiresAt: 1e21 })
        expect([r.status, r.body.field]).toEqual([400, "expiresAt"])
        await admin.del(`/v1/sessions/${sid}`)
      })

      it("an external reservation lands only on a ready host: 409 naming its state", async () => {
        const h = await addHost(admin, 2048)
        await admin.post(`/v1/hosts/${h.id}/cordon`)
        const r = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "external", ownerId: "x", memMib: 64, vcpus: 0 })
        expect(r.status).toBe(409)
        expect(r.body).toMatchObject({ error: "Refused", check: "host_not_ready" })
        expect(r.body.message).toContain("cordoned")
        const capture = await admin.post("/v1/reservations", { hostId: h.id, ownerKind: "capture", ownerId: "x", memMib: 64, vcpus: 0 })
        expect(capture.status).toBe(201)
        await admin.del(`/v1/reservations/${capture.body.id}`)
      })
    })

    describe("the reaper", () => {
      let r: RunningCoordinator
      let adm: Client
      beforeAll(async () => {
        r = await start()
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

      /** Reaper passes until the session leaves `state` (a deadline of a millisecond or so passes meanwhile); answers its state. */
      const passUntilNot = async (id: string, state: string) => {
        for (let i = 0; i < 10_000; i++) {
          const now = (await adm.get(`/v1/sessions/${id}`)).body.state as string
          if (now !== state) return now
          await r.reaperPass()
        }
        return state
      }

      it("a session created with a short idle timeout goes idle by itself: the reaper's pass parks it, with no idle call; the agent's report carries activity", async () => {
        const hid = uid("h")
        const token = (await adm.post("/v1/hosts", { id: hid })).body.token as string
        await adm.put(`/v1/hosts/${hid}/report`, report(8192))
        const agent = client(r.url, token)
        const quick = uid("s")
        expect((await adm.post("/v1/sessions", { id: quick, memMib: 1024, vcpus: 1, idleTimeoutMs: 1, affinity: [hid] })).body.hostId).toBe(hid)
        const long = uid("s")
        expect((await adm.post("/v1/sessions", { id: long, memMib: 1024, vcpus: 1, idleTimeoutMs: 3_600_000, affinity: [hid] })).status).toBe(201)
        await agent.post(`/v1/sessions/${quick}/started`)
        await agent.post(`/v1/sessions/${long}/started`)
        expect((await adm.get(`/v1/sessions/${long}`)).body).toMatchObject({ idleTimeoutMs: 3_600_000, endsAt: null })
        // Activity rides on the agent's report; a bad list refuses the whole report, by name.
        const bad = await agent.put(`/v1/hosts/${hid}/report`, { ...report(4096), activeSessions: ["no spaces"] })
        expect(bad.status).toBe(400)
        expect(JSON.stringify(bad.body)).toContain("activeSessions.0")
        expect((await adm.get(`/v1/hosts/${hid}`)).body.reportedAllocatableMib).toBe(8192 + 1024)
        expect((await agent.put(`/v1/hosts/${hid}/report`, { ...report(8192), activeSessions: [long] })).status).toBe(200)
        expect(await passUntilNot(quick, "running")).toBe("parked")
        const events = (await adm.get(`/v1/sessions/${quick}/events`)).body.items.map((e: { kind: string }) => e.kind)
        expect(events).toEqual(["created", "placed", "running", "parked"])
        expect((await adm.get(`/v1/sessions/${long}`)).body.state).toBe("running")
      })

      it("a TTL ends a parked session, and says so in its history; a new TTL moves the deadline; bad lifetimes are refused by name", async () => {
        const hid = uid("h")
        const token = (await adm.post("/v1/hosts", { id: hid })).body.token as string
        await adm.put(`/v1/hosts/${hid}/report`, report(8192))
        const agent = client(r.url, token)
        for (const [field, value] of [["idleTimeoutMs", 0], ["ttlMs", 1.5], ["ttlMs", "2h"]] as const) {
          const refused = await adm.post("/v1/sessions", { id: uid("bad"), memMib: 64, vcpus: 1, [field]: value })
          expect(refused.status).toBe(400)
          expect(JSON.stringify(refused.body)).toContain(field)
        }
        const id = uid("s")
        await adm.post("/v1/sessions", { id, memMib: 1024, vcpus: 1, ttlMs: 3_600_000, affinity: [hid] })
        await agent.post(`/v1/sessions/${id}/started`)
        expect((await agent.post(`/v1/sessions/${id}/idle`)).body.state).toBe("parked")
        const endsAt = (await adm.get(`/v1/sessions/${id}`)).body.endsAt as number
        expect((await r.reaperPass()) as unknown).toMatchObject({ expired: [] })
        const refused = await adm.put(`/v1/sessions/${id}/ttl`, { ttlMs: 0 })
        expect(refused.status).toBe(400)
        expect(JSON.stringify(refused.body)).toContain("ttlMs")
        expect((await adm.get(`/v1/sessions/${id}`)).body.endsAt).toBe(endsAt)
        const set = await adm.put(`/v1/sessions/${id}/ttl`, { ttlMs: 1 })
        expect(set.status).toBe(200)
        expect(set.body.endsAt).toBeLessThan(endsAt)
        expect(await passUntilNot(id, "parked")).toBe("ended")
        const items = (await adm.get(`/v1/sessions/${id}/events`)).body.items
        expect(items.at(-2)).toMatchObject({ kind: "ttl_set" })
        expect(items.at(-1)).toMatchObject({ kind: "ended", hostId: hid, reason: "ttl expired" })
        expect((await adm.put(`/v1/sessions/${id}/ttl`, { ttlMs: 1000 })).status).toBe(409)
      })
    })
  })
