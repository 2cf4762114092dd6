/**
 * The agent's coordinator client is `@engram/api`'s HttpApiClient: against a real coordinator
 * (in-process, StoreSim) over real HTTP, every agent call lands, a 409 is `Conflict`, another
 * host's or an unknown session reads as null, and a rejected token is a `CoordinatorError` 401.
 */
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Store, type StoreShape, Unavailable } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { fitReason, makeHttp, retryAfterHeaderMs, type CoordinatorShape } from "../src/Coordinator.js"
import * as Credential from "../src/Credential.js"
import { adminCall } from "./support/Admin.js"

const adminToken = "client-admin-token-0123456789"
let coordinator: RunningCoordinator
const admin = adminCall(() => coordinator.url, adminToken)
const clientOf = (hostId: string, token: string, url = coordinator.url) =>
  Effect.runPromise(makeHttp({ url: `${url}/`, hostId, hostToken: Redacted.make(token) }).pipe(Effect.provide(FetchHttpClient.layer)))
const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(Effect.result(eff))

let a: CoordinatorShape
let tokenB = ""
beforeAll(async () => {
  coordinator = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, moveTimeoutMs: 60_000 } })
  a = await clientOf("a", (await admin("POST", "/v1/hosts", { id: "a" })).body["token"] as string)
  tokenB = (await admin("POST", "/v1/hosts", { id: "b" })).body["token"] as string
})
afterAll(() => coordinator?.stop())

describe("the agent's HTTP client (HttpApiClient over @engram/api)", () => {
  it("reports, heartbeats, reads its assignments and acknowledges a start; a repeat is Conflict", async () => {
    expect((await run(a.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })))._tag).toBe("Success")
    expect((await admin("GET", "/v1/hosts/a")).body).toMatchObject({ measured: true, allocatableMib: 4096 })
    expect((await admin("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["a"] })).status).toBe(201)
    const assigned = await run(a.assignments({ waitMs: 0, since: undefined }))
    expect(assigned._tag === "Success" && assigned.success.sessions.map((s) => [s.id, s.state, s.reservationId !== null])).toEqual([["s1", "pending", true]])
    expect(assigned._tag === "Success" && assigned.success.limits).toEqual({ commitAllowanceMs: 400, heartbeatStaleWindowMs: 120_000 })
    expect(await run(a.heartbeat)).toMatchObject({ _tag: "Success", success: 1 })
    expect((await run(a.started("s1")))._tag).toBe("Success")
    const again = await run(a.started("s1"))
    expect(again._tag === "Failure" && again.failure).toMatchObject({ _tag: "Conflict", op: "started" })
    expect((await run(a.getSession("s1")))._tag === "Success").toBe(true)
  })

  it("a lost guest's report lands in the session's history; one of another host's session, or of an unknown one, is refused", async () => {
    expect((await run(a.guestLost("s1", "VM exited while the agent ran; booted fresh")))._tag).toBe("Success")
    const events = (await admin("GET", "/v1/sessions/s1/events")).body["items"] as { kind: string }[]
    expect(events.at(-1)).toMatchObject({ kind: "guest_lost", hostId: "a", reason: "VM exited while the agent ran; booted fresh" })
    const b = await clientOf("b", tokenB)
    const other = await run(b.guestLost("s1", "x"))
    expect(other._tag === "Failure" && other.failure).toMatchObject({ _tag: "Conflict", op: "guestLost" })
    const unknown = await run(a.guestLost("nobody", "x"))
    expect(unknown._tag === "Failure" && unknown.failure).toMatchObject({ _tag: "CoordinatorError", status: 404, notFound: { entity: "session", id: "nobody" } })
    expect(((await admin("GET", "/v1/sessions/s1/events")).body["items"] as unknown[]).length).toBe(events.length)
  })

  it("a long-poll returns when the assignments change", async () => {
    const first = await run(a.assignments({ waitMs: 0, since: undefined }))
    if (first._tag !== "Success") throw new Error("no assignments")
    const polling = run(a.assignments({ waitMs: 20_000, since: first.success.version }))
    await admin("POST", "/v1/sessions", { id: "s2", memMib: 256, vcpus: 1, affinity: ["a"] })
    const woke = await polling
    expect(woke._tag === "Success" && woke.success.sessions.map((s) => s.id)).toEqual(["s1", "s2"])
  })

  it("moves: rounds and an abort with the estimate as a typed figure; the move reads back", async () => {
    // A move target takes the move only once it has reported (registration is not readiness).
    expect((await admin("PUT", "/v1/hosts/b/report", { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })).status).toBe(200)
    const begun = admin("POST", "/v1/sessions/s1/move", { targetHostId: "b", maxDowntimeMs: 480 })
    let moveId: string | undefined
    for (let i = 0; i < 50 && moveId === undefined; i++) {
      const r = await run(a.assignments({ waitMs: 1000, since: undefined }))
      moveId = r._tag === "Success" ? r.success.moves[0]?.id : undefined
    }
    expect(moveId).toBeDefined()
    expect((await run(a.round(moveId!, { kind: "full", wireBytes: 1e8, apparentBytes: 1e8, sendMs: 100, captureMs: 40 })))._tag).toBe("Success")
    expect((await run(a.abort(moveId!, "ErrMoveDowntime: pre-pause estimate 812 ms > maxDowntimeMs 480 ms", 812)))._tag).toBe("Success")
    const answer = await begun
    expect(answer).toMatchObject({ status: 503, body: { error: "ErrMoveDowntime", estimateMs: 812, moveId } })
    expect(await run(a.getMove(moveId!))).toMatchObject({ _tag: "Success", success: { state: "aborted" } })
    const late = await run(a.commit(moveId!, { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 400 }))
    expect(late._tag === "Failure" && late.failure._tag).toBe("Conflict")
  })

  it("another host's session reads as not visible and an unknown one as null; a rejected token is a CoordinatorError 401", async () => {
    const b = await clientOf("b", tokenB)
    expect((await run(b.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })))._tag).toBe("Success")
    expect((await admin("POST", "/v1/sessions", { id: "sb", memMib: 256, vcpus: 1, affinity: ["b"] })).body).toMatchObject({ hostId: "b" })
    // Another host's session (403) is not visible, not unknown: only the 404 of the session is null.
    expect(await run(a.getSession("sb"))).toMatchObject({ _tag: "Success", success: "notVisible" })
    expect(await run(a.getSession("never-was"))).toMatchObject({ _tag: "Success", success: null })
    expect((await run(b.getSession("sb")))._tag === "Success").toBe(true)
    const stranger = await clientOf("a", "not-a-token-of-anyone-0123456789")
    const refused = await run(stranger.heartbeat)
    expect(refused._tag === "Failure" && refused.failure).toMatchObject({ _tag: "CoordinatorError", op: "heartbeat", status: 401 })
    // Another host's resources: 403, as a CoordinatorError the agent retries later.
    const foreign = await run(a.descended("sb"))
    expect(foreign._tag === "Failure" && foreign.failure).toMatchObject({ _tag: "CoordinatorError", status: 403 })
  })
})

describe("the client as the agent's main runs it, watched for a refused token (Credential.guard)", () => {
  it("a report through the guard carries the active sessions: the coordinator records the guest's activity", async () => {
    const g = Credential.guard(a, "a", coordinator.url, Effect.runSync(Deferred.make<string>()))
    expect((await run(g.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })))._tag).toBe("Success")
    expect((await admin("POST", "/v1/sessions", { id: "busy", memMib: 64, vcpus: 1, affinity: ["a"] })).body).toMatchObject({ hostId: "a" })
    expect((await run(g.started("busy")))._tag).toBe("Success")
    const before = (await admin("GET", "/v1/sessions/busy")).body["lastActiveAt"] as number
    await new Promise((resolve) => setTimeout(resolve, 20))
    expect((await run(g.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 }, ["busy"])))._tag).toBe("Success")
    const after = (await admin("GET", "/v1/sessions/busy")).body["lastActiveAt"] as number
    expect(after, "the coordinator recorded no activity for the session the report named").toBeGreaterThan(before)
  })
})

describe("the coordinator's back-off advice reaches the agent (it waits at least that long)", () => {
  it("a long-poll over the host token's cap is a CoordinatorError 429 with the coordinator's retryAfterMs", async () => {
    const capped = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, maxWaitsPerHostToken: 1 } })
    try {
      const registered = await fetch(`${capped.url}/v1/hosts`, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body: JSON.stringify({ id: "h" }) })
      const h = await clientOf("h", ((await registered.json()) as { token: string }).token, capped.url)
      expect((await run(h.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })))._tag).toBe("Success")
      const first = await run(h.assignments({ waitMs: 0, since: undefined }))
      if (first._tag !== "Success") throw new Error("no assignments")
      // The host token's one long-poll, held open; a second is refused.
      const open = run(h.assignments({ waitMs: 20_000, since: first.success.version }))
      let refused: Awaited<ReturnType<typeof run>> | undefined
      for (let i = 0; i < 50 && refused?._tag !== "Failure"; i++) refused = await run(h.assignments({ waitMs: 1000, since: first.success.version }))
      expect(refused?._tag === "Failure" && refused.failure).toMatchObject({ _tag: "CoordinatorError", op: "assignments", status: 429, retryAfterMs: 1000 })
      await fetch(`${capped.url}/v1/sessions`, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body: JSON.stringify({ id: "wake", memMib: 64, vcpus: 1, affinity: ["h"] }) })
      expect(await open).toMatchObject({ _tag: "Success" })
    } finally {
      await capped.stop()
    }
  })

  it("a request while the store is away is a CoordinatorError 503 with the store's retryAfterMs", async () => {
    let away = false
    // The store of a real coordinator whose every call fails while `away` (a store outage, as the store reports it).
    const flaky = Layer.effect(
      Store,
      Effect.gen(function* () {
        const store = yield* Store
        const wrapped: Record<string, unknown> = {}
        for (const [k, v] of Object.entries(store)) {
          wrapped[k] =
            typeof v === "function"
              ? (...args: unknown[]) => (away ? Effect.fail(new Unavailable({ reason: "away (test)", retryAfterMs: 7000 })) : (v as (...a: unknown[]) => unknown).apply(store, args))
              : v
        }
        return wrapped as unknown as StoreShape
      }),
    ).pipe(Layer.provide(StoreSim.layer()))
    const c = await startCoordinator({ store: flaky, reaper: false, logLevel: "None", config: { port: 0, adminToken } })
    try {
      const registered = await fetch(`${c.url}/v1/hosts`, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body: JSON.stringify({ id: "h" }) })
      const h = await clientOf("h", ((await registered.json()) as { token: string }).token, c.url)
      expect((await run(h.heartbeat))._tag).toBe("Success")
      away = true
      const refused = await run(h.heartbeat)
      expect(refused._tag === "Failure" && refused.failure).toMatchObject({ _tag: "CoordinatorError", op: "heartbeat", status: 503, retryAfterMs: 7000 })
      away = false
      expect((await run(h.heartbeat))._tag).toBe("Success")
    } finally {
      await c.stop()
    }
  })

  it("an answer the API does not describe (a proxy's 503) is a CoordinatorError with its Retry-After header, in ms", async () => {
    const proxy = createServer((_req, res) => res.writeHead(503, { "retry-after": "7", "content-type": "text/html" }).end("<h1>upstream away</h1>"))
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve))
    try {
      const h = await clientOf("h", "a-token-of-nobody-0123456789", `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`)
      const refused = await run(h.heartbeat)
      expect(refused._tag === "Failure" && refused.failure).toMatchObject({ _tag: "CoordinatorError", op: "heartbeat", status: 503, retryAfterMs: 7000 })
    } finally {
      await new Promise((resolve) => proxy.close(resolve))
    }
  })

  it("a report's peerUrl is kept by the coordinator; one older than peer URLs (400 naming peerUrl) gets the report again without it", async () => {
    expect((await run(a.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4, peerUrl: "http://10.0.0.1:7100" })))._tag).toBe("Success")
    expect((await admin("GET", "/v1/hosts/a")).body["peerUrl"]).toBe("http://10.0.0.1:7100")
    // An older coordinator: the real one behind a proxy that refuses the key as it would (unknown key, 400 naming it).
    const bodies: string[] = []
    const older = createServer((req, res) => {
      let body = ""
      req.on("data", (c: Buffer) => (body += c.toString()))
      req.on("end", () => {
        bodies.push(body)
        if (body.includes("peerUrl")) {
          res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ error: "InvalidInput", field: "peerUrl", rule: "is not a known key", in: "body" }))
          return
        }
        void fetch(`${coordinator.url}${req.url}`, { method: req.method!, headers: { authorization: req.headers.authorization!, "content-type": "application/json" }, body }).then(async (r) =>
          res.writeHead(r.status, { "content-type": "application/json" }).end(await r.text()),
        )
      })
    })
    await new Promise<void>((resolve) => older.listen(0, "127.0.0.1", resolve))
    try {
      const token = (await admin("POST", "/v1/hosts", { id: "c" })).body["token"] as string
      const viaOlder = await clientOf("c", token, `http://127.0.0.1:${(older.address() as AddressInfo).port}`)
      expect((await run(viaOlder.report({ totalMib: 8192, allocatableMib: 4096, totalVcpus: 4, peerUrl: "http://10.0.0.2:7100" })))._tag).toBe("Success")
      expect(bodies.map((b) => "peerUrl" in (JSON.parse(b) as object))).toEqual([true, false])
      // The report landed without the URL (the real coordinator, told none, clears the host's).
      expect((await admin("GET", "/v1/hosts/c")).body).toMatchObject({ peerUrl: null, report: { allocatableMib: 4096 } })
    } finally {
      await new Promise((resolve) => older.close(resolve))
    }
  })

  it("a descent that left no image says so (image=none): the session names no image host; a coordinator older than the word (400 naming image) hears the descent again without it", async () => {
    // e1 and e2 descend on e, the only host taking sessions: a queued session with no room makes each descend rather than park.
    for (const id of ["a", "b", "c"]) expect((await admin("POST", `/v1/hosts/${id}/cordon`)).status).toBe(200)
    const token = (await admin("POST", "/v1/hosts", { id: "e" })).body["token"] as string
    const e = await clientOf("e", token)
    expect((await run(e.report({ totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })))._tag).toBe("Success")
    const descending = async (id: string) => {
      expect((await admin("POST", "/v1/sessions", { id, memMib: 1024, vcpus: 1, affinity: ["e"] })).body["hostId"]).toBe("e")
      expect((await run(e.started(id)))._tag).toBe("Success")
      expect((await admin("POST", "/v1/sessions", { id: `${id}q`, memMib: 1536, vcpus: 1 })).status).toBe(202)
      expect((await admin("POST", `/v1/sessions/${id}/idle`)).body["state"]).toBe("descending")
      expect((await admin("DELETE", `/v1/sessions/${id}q`)).status).toBe(200)
    }
    await descending("e1")
    expect((await run(e.descended("e1", { imageless: true })))._tag).toBe("Success")
    expect((await admin("GET", "/v1/sessions/e1")).body).toMatchObject({ state: "descended", imageHostId: null })
    // An older coordinator: the real one behind a proxy that refuses the query as it would (its endpoint takes none: 400 naming it).
    const urls: string[] = []
    const older = createServer((req, res) => {
      urls.push(req.url!)
      if (req.url!.includes("?")) {
        res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ error: "InvalidInput", field: "image", rule: "is not a query parameter of this endpoint (it takes none)", in: "query" }))
        return
      }
      void fetch(`${coordinator.url}${req.url}`, { method: req.method!, headers: { authorization: req.headers.authorization! } }).then(async (r) =>
        res.writeHead(r.status, { "content-type": "application/json" }).end(await r.text()),
      )
    })
    await new Promise<void>((resolve) => older.listen(0, "127.0.0.1", resolve))
    try {
      await descending("e2")
      const viaOlder = await clientOf("e", token, `http://127.0.0.1:${(older.address() as AddressInfo).port}`)
      expect((await run(viaOlder.descended("e2", { imageless: true })))._tag).toBe("Success")
      expect(urls).toEqual(["/v1/sessions/e2/descended?image=none", "/v1/sessions/e2/descended"])
      // Landed without the word: as an older coordinator would, it names e.
      expect((await admin("GET", "/v1/sessions/e2")).body).toMatchObject({ state: "descended", imageHostId: "e" })
    } finally {
      await new Promise((resolve) => older.close(resolve))
    }
  })

  it("Retry-After reads as delta-seconds or an HTTP date; anything else is no advice", () => {
    const now = Date.parse("Thu, 03 Dec 2026 07:00:00 GMT")
    expect(retryAfterHeaderMs("7", now)).toBe(7000)
    expect(retryAfterHeaderMs("Thu, 03 Dec 2026 07:00:30 GMT", now)).toBe(30_000)
    expect(retryAfterHeaderMs("Thu, 03 Dec 2026 06:00:00 GMT", now)).toBe(0)
    expect(retryAfterHeaderMs("soon", now)).toBeUndefined()
    expect(retryAfterHeaderMs(undefined, now)).toBeUndefined()
  })
})

describe("fitReason", () => {
  it("a reason over the API's 4,000 characters (a long error) is cut to them, marked; a shorter one is sent as it is", () => {
    const cut = fitReason(`move failed: ${"e".repeat(5000)}`)
    expect(cut.length).toBe(4000)
    expect(cut.startsWith("move failed: ")).toBe(true)
    expect(cut.endsWith("…")).toBe(true)
    expect(fitReason("a short reason")).toBe("a short reason")
    expect(fitReason("x".repeat(4000))).toBe("x".repeat(4000))
    // An emoji across the cut is dropped whole, never left as a lone surrogate (which the API refuses).
    const emoji = fitReason(`${"x".repeat(3998)}😀${"y".repeat(100)}`)
    expect(emoji).toBe(`${"x".repeat(3998)}…`)
  })
})
