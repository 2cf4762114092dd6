// The HTTP edge over real HTTP: JSON on every error answer (404, 400, 413, 415, 500, 503), a JSON body
// without a content type, the body limit (declared and streamed), the admin-only middleware,
// the scrape token, the request and process metrics (the edge's own answers labelled as the
// router labels them), an answer that goes out even when the edge's handling of it fails, and
// what Node's server answers before the edge (the parser's refusals, a missing Host, an Expect it
// cannot meet): JSON, and counted.
import { it as itEffect } from "@effect/vitest"
import { AdminOnly, EngramApi } from "@engram/api"
import { Config, Coordinator, HttpEdge, LongPolls, Metrics, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import * as StoreModule from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Context, Effect, Fiber, Layer, Logger, References } from "effect"
import { HttpServerRequest, HttpServerResponse } from "effect/http"
import { HttpApi } from "effect/http-api"
import { TestClock } from "effect/testing"
import { Agent, createServer, request as httpRequest } from "node:http"
import { connect } from "node:net"
import type { AddressInfo } from "node:net"
import { setTimeout as delay } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { answered, clockedCoordinator } from "./support/clocked.js"
import { client, logged, uid } from "./support/http.js"

const adminToken = "http-admin-token-0123456789"
const metricsToken = "http-scrape-token-0123456789"
const maxBodyBytes = 4096

/** A request with exactly the given headers (fetch would add a content type of its own). */
const raw = (
  base: string,
  options: { readonly method: string; readonly path: string; readonly headers?: Record<string, string>; readonly body?: string },
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: any }> => // eslint-disable-line @typescript-eslint/no-explicit-any
  new Promise((resolve, reject) => {
    const req = httpRequest(`${base}${options.path}`, { method: options.method, headers: options.headers ?? {} }, (res) => {
      let text = ""
      res.on("data", (c: Buffer) => (text += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text === "" ? null : JSON.parse(text) }))
    })
    req.on("error", reject)
    req.end(options.body)
  })

/** A coordinator on StoreSim whose `clusterSummary` (`GET /v1/ledger/summary`) does `summary` instead: a defect, a hang. */
const withSummary = (
  summary: (store: StoreModule.StoreShape) => ReturnType<StoreModule.StoreShape["clusterSummary"]>,
  options: { readonly logLevel: "None" | "Error" | "Warn"; readonly storeTimeoutMs?: number },
) =>
  startCoordinator({
    store: Layer.effect(
      StoreModule.Store,
      Effect.gen(function* () {
        const store = yield* StoreModule.Store
        return StoreModule.Store.of({ ...store, clusterSummary: () => summary(store) })
      }),
    ).pipe(Layer.provide(StoreSim.layer())),
    reaper: false,
    logLevel: options.logLevel,
    config: { port: 0, adminToken, ...(options.storeTimeoutMs === undefined ? {} : { storeTimeoutMs: options.storeTimeoutMs }) },
  })


let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, metricsToken, maxBodyBytes } })
})
afterAll(() => c?.stop())

describe("JSON bodies and content types", () => {
  it("a JSON body without a content type is accepted", async () => {
    const id = uid("s")
    const r = await raw(c.url, { method: "POST", path: "/v1/sessions", headers: { authorization: `Bearer ${adminToken}` }, body: JSON.stringify({ id, memMib: 64, vcpus: 1 }) })
    expect(r.status).toBe(202)
    expect(r.body).toMatchObject({ id, state: "queued" })
  })

  it("curl's default form content type gets a JSON 415 that says what to send, and changes nothing", async () => {
    const id = uid("s")
    const r = await raw(c.url, {
      method: "POST",
      path: "/v1/sessions",
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/x-www-form-urlencoded" },
      body: JSON.stringify({ id, memMib: 64, vcpus: 1 }),
    })
    expect(r.status).toBe(415)
    expect(r.headers["content-type"]).toContain("application/json")
    expect(r.body).toMatchObject({ error: "UnsupportedMediaType", contentType: "application/x-www-form-urlencoded" })
    expect(r.body.message).toContain("content-type: application/json")
    expect((await client(c.url, adminToken).get(`/v1/sessions/${id}`)).status).toBe(404)
  })

  it("an unknown route is a JSON 404 naming it, with or without a token", async () => {
    for (const token of [undefined, adminToken]) {
      const r = await client(c.url, token).get("/v2/nothing?x=1")
      expect(r.status).toBe(404)
      expect(r.headers.get("content-type")).toContain("application/json")
      expect(r.body).toMatchObject({ error: "NotFound", entity: "route", id: "GET /v2/nothing" })
    }
  })
})

describe("the request body limit (ENGRAM_MAX_BODY_BYTES)", () => {
  it("a declared body over the limit is refused with 413 naming the limit; nothing changes", async () => {
    const id = uid("s")
    const body = JSON.stringify({ id, memMib: 64, vcpus: 1, affinity: ["x".repeat(maxBodyBytes)] })
    const r = await raw(c.url, { method: "POST", path: "/v1/sessions", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" }, body })
    expect(r.status).toBe(413)
    expect(r.body).toMatchObject({ error: "PayloadTooLarge", limitBytes: maxBodyBytes })
    expect(r.body.message).toContain(`${maxBodyBytes} bytes`)
    expect((await client(c.url, adminToken).get(`/v1/sessions/${id}`)).status).toBe(404)
  })

  it("a streamed body (no length) is cut off while it streams: 413 before the sender is done", async () => {
    const chunk = Buffer.alloc(64 * 1024, 0x20)
    const total = 256 * chunk.length // 16 MiB that never has to arrive
    const answer = await new Promise<{ status: number; body: any; sent: number }>((resolve, reject) => { // eslint-disable-line @typescript-eslint/no-explicit-any
      let sent = 0
      let answered = false
      const req = httpRequest(`${c.url}/v1/sessions`, { method: "POST", headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json", "transfer-encoding": "chunked" } }, (res) => {
        answered = true
        let text = ""
        res.on("data", (b: Buffer) => (text += b.toString()))
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text), sent }))
      })
      // The server may close the connection on us mid-write once it has answered.
      req.on("error", (e) => (answered ? undefined : reject(e)))
      const pump = () => {
        while (!answered && sent < total) {
          sent += chunk.length
          if (!req.write(chunk)) return void req.once("drain", pump)
        }
        if (!answered) req.end()
      }
      req.write("[")
      pump()
    })
    expect(answer.status).toBe(413)
    expect(answer.body).toMatchObject({ error: "PayloadTooLarge", limitBytes: maxBodyBytes })
    expect(answer.sent).toBeLessThan(total)
  })
})

describe("admin-only operations", () => {
  it("every endpoint behind AdminOnly answers a host token 403 before its handler runs", async () => {
    const admin = client(c.url, adminToken)
    const hostId = uid("h")
    const token = (await admin.post("/v1/hosts", { id: hostId })).body.token as string
    const asHost = client(c.url, token)
    const adminOnly: { method: string; path: string }[] = []
    HttpApi.reflect(EngramApi, {
      onGroup: () => {},
      onEndpoint: ({ endpoint, middleware }) => {
        if ([...middleware].some((m) => m.key === AdminOnly.key)) adminOnly.push({ method: endpoint.method, path: endpoint.path.replace(":id", hostId) })
      },
    })
    expect(adminOnly.length).toBeGreaterThanOrEqual(15)
    for (const { method, path } of adminOnly) {
      // A body that would be a 400 for the admin: the 403 comes first.
      const r = method === "GET" ? await asHost.get(path) : method === "DELETE" ? await asHost.del(path) : await asHost.raw(method, path, '{"nonsense": true}')
      expect([r.status, r.body.error], `${method} ${path}`).toEqual([403, "Forbidden"])
    }
    // Nothing was created by the refused POST /v1/hosts.
    expect((await admin.get("/v1/hosts")).body.items.map((h: { id: string }) => h.id)).toEqual([hostId])
  })
})

describe("/metrics", () => {
  it("takes the scrape token, which opens nothing else", async () => {
    const scraper = client(c.url, metricsToken)
    const m = await scraper.get("/metrics")
    expect(m.status).toBe(200)
    expect(m.headers.get("content-type")).toContain("text/plain")
    expect(m.body as string).toContain("engram_store_up 1")
    expect((await scraper.get("/v1/fleet")).status).toBe(401)
    expect((await scraper.get("/v1/hosts")).status).toBe(401)
    const anon = await client(c.url).get("/metrics")
    expect([anon.status, anon.body.error]).toEqual([401, "Unauthorized"])
    expect((await client(c.url, "not-the-scrape-token-0123456789").get("/metrics")).status).toBe(401)
    expect((await client(c.url, adminToken).get("/metrics")).status).toBe(200)
  })

  it("counts requests by method, route template and status, times them, and shows process metrics", async () => {
    const admin = client(c.url, adminToken)
    const notFound = /^engram_http_requests_total\{method="GET",route="\/v1\/sessions\/:id",status="404"\} (\d+)$/m
    const before = Number(notFound.exec((await admin.get("/metrics")).body as string)?.[1] ?? 0)
    await admin.get("/v1/sessions/never-was")
    await admin.get("/v1/sessions/never-was-either")
    // An id past 100 characters is still its route's (the labeler matches as the server's router).
    await admin.get(`/v1/sessions/${"n".repeat(150)}`)
    const text = (await admin.get("/metrics")).body as string
    expect(Number(notFound.exec(text)?.[1])).toBe(before + 3)
    expect(text).toMatch(/^engram_http_request_duration_seconds_count\{method="GET",route="\/v1\/sessions\/:id"\} \d+$/m)
    expect(text).toMatch(/^engram_http_requests_total\{method="GET",route="unmatched",status="404"\} \d+$/m)
    // A HEAD is answered by its GET route and counted under it (the router's own match labels a request).
    expect((await raw(c.url, { method: "HEAD", path: "/livez" })).status).toBe(200)
    expect((await admin.get("/metrics")).body as string).toMatch(/^engram_http_requests_total\{method="HEAD",route="\/livez",status="200"\} \d+$/m)
    for (const name of ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds", "nodejs_heap_size_used_bytes", "nodejs_eventloop_lag_p99_seconds"]) {
      expect(text).toMatch(new RegExp(`^${name} [0-9.e+-]+$`, "m"))
    }
  })

  it("counts an assignments long-poll under its route template, answered at once or after waiting (held at the edge), and a URL naming assignments under its own route", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "h-labelled" })).status).toBe(201)
    const route = "/v1/hosts/:id/assignments"
    const before = await requestsCounted("GET", route, 200)
    expect((await admin.get("/v1/hosts/h-labelled/assignments")).status).toBe(200)
    // Waits (nothing changes) until its deadline: parked, then answered by the route run again.
    expect((await admin.get("/v1/hosts/h-labelled/assignments?waitMs=200")).status).toBe(200)
    expect(await requestsCounted("GET", route, 200)).toBe(before + 2)
    const sessions = await requestsCounted("GET", "/v1/sessions/:id", 404)
    expect((await admin.get("/v1/sessions/assignments")).status).toBe(404)
    expect(await requestsCounted("GET", "/v1/sessions/:id", 404)).toBe(sessions + 1)
  })

  it("answers the liveness probes at the edge as the API documents them, counted by route; a probe with a query meets the API's strict input", async () => {
    const admin = client(c.url, adminToken)
    const counted = (path: string) => new RegExp(`^engram_http_requests_total\\{method="GET",route="${path.replaceAll("/", "\\/")}",status="200"\\} (\\d+)$`, "m")
    const before = (await admin.get("/metrics")).body as string
    for (const path of ["/livez", "/healthz"]) {
      const answer = await raw(c.url, { method: "GET", path })
      expect(answer.status).toBe(200)
      expect(answer.headers["content-type"]).toBe("application/json")
      expect(answer.body).toEqual({ ok: true })
      const head = await raw(c.url, { method: "HEAD", path })
      expect([head.status, head.body]).toEqual([200, null])
    }
    const after = (await admin.get("/metrics")).body as string
    for (const path of ["/livez", "/healthz"]) expect(Number(counted(path).exec(after)?.[1])).toBe(Number(counted(path).exec(before)?.[1] ?? 0) + 1)
    // Not a probe: the API answers these, as it would without the edge's shortcut.
    expect(await raw(c.url, { method: "GET", path: "/livez?verbose=1" })).toMatchObject({ status: 400, body: { error: "InvalidInput", field: "verbose", in: "query" } })
    expect(await raw(c.url, { method: "POST", path: "/livez" })).toMatchObject({ status: 404, body: { error: "NotFound", entity: "route" } })
    expect(await raw(c.url, { method: "GET", path: "/livez/" })).toMatchObject({ status: 200, body: { ok: true } })
    // A probe with a body is not a probe: the API's strict input refuses the body, and one over the limit is cut off.
    expect(await raw(c.url, { method: "GET", path: "/livez", headers: { "content-type": "application/json", "content-length": "7" }, body: '{"a":1}' })).toMatchObject({
      status: 400,
      body: { error: "InvalidInput", field: "a" },
    })
    expect(await raw(c.url, { method: "GET", path: "/healthz", headers: { "transfer-encoding": "chunked" }, body: "x".repeat(maxBodyBytes * 2) })).toMatchObject({
      status: 413,
      body: { error: "PayloadTooLarge" },
    })
  })
})

describe("kept-alive connections", () => {
  it("the server advertises an idle timeout above the clients' and proxies' (so the client closes an idle socket first), and serves a second request on the same socket", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const get = () =>
        new Promise<{ status: number; keepAlive: string; socket: unknown }>((resolve, reject) => {
          const req = httpRequest(`${c.url}/livez`, { agent }, (res) => {
            res.resume()
            res.on("end", () => resolve({ status: res.statusCode ?? 0, keepAlive: String(res.headers["keep-alive"]), socket: req.socket }))
          })
          req.on("error", reject)
          req.end()
        })
      const first = await get()
      expect(first.status).toBe(200)
      expect(first.keepAlive).toBe(`timeout=${Coordinator.keepAliveTimeoutMs / 1000}`)
      // Above nginx's 75 s, AWS load balancers' 60 s and Go's 90 s idle timeouts.
      expect(Coordinator.keepAliveTimeoutMs).toBeGreaterThan(90_000)
      const second = await get()
      expect(second.status).toBe(200)
      expect(second.socket).toBe(first.socket)
    } finally {
      agent.destroy()
    }
  })
})

describe("the total cap on open long-polls (ENGRAM_MAX_WAITS)", () => {
  // The coordinator runs whole on the test's clock: the held waits' deadlines come only when the
  // test moves the clock, after the refused one, however slow the machine.
  itEffect.effect("beyond it a long-poll is a 429 TooManyWaits naming this coordinator's cap; once one answers, another may open", () =>
    Effect.gen(function* () {
      const { url, context } = yield* clockedCoordinator({ store: StoreSim.layer(), reaper: false, config: { port: 0, adminToken, maxWaits: 2 } })
      const admin = client(url, adminToken)
      const longPolls = Context.get(context, LongPolls)
      /** Until `n` long-polls are open (up to a generous real bound). */
      const openAre = (n: number) =>
        Effect.gen(function* () {
          for (let i = 0; i < 1500 && longPolls.open() !== n; i++) yield* Effect.promise(() => delay(20))
          expect(longPolls.open()).toBe(n)
        })
      expect((yield* Effect.promise(() => admin.post("/v1/sessions", { id: "capped", memMib: 64, vcpus: 1 }))).status).toBe(202)
      const wait = () => Effect.promise(() => admin.get("/v1/sessions/capped/wait?state=running&timeoutMs=2000"))
      const open = yield* Effect.forkChild(Effect.all([wait(), wait()], { concurrency: "unbounded" }))
      yield* openAre(2)
      const refused = yield* answered("the wait beyond the cap", wait())
      expect([refused.status, refused.body.error, refused.body.limit]).toEqual([429, "TooManyWaits", 2])
      expect(refused.body.message).toMatch(/this coordinator already holds 2 open long-polls/)
      // The held waits' deadline: only now.
      yield* TestClock.adjust(2000)
      yield* answered("the held waits past their deadline", Fiber.join(open))
      expect(longPolls.open()).toBe(0)
      // Admitted now: it is held (open) until the clock passes its deadline in turn (a 429 would answer at once).
      const another = yield* Effect.forkChild(wait())
      yield* Effect.raceFirst(openAre(1), Fiber.await(another))
      yield* TestClock.adjust(2000)
      expect((yield* answered("the wait after one answered", Fiber.join(another))).status).not.toBe(429)
    }).pipe(Effect.scoped),
  )
})

describe("the kept-alive idle timeout (ENGRAM_HTTP_KEEP_ALIVE_MS)", () => {
  it("is what the server advertises: 620 s behind Google Cloud's load balancer (600 s), 95 s by default; outside 1 s to 1 h it is refused naming the variable", async () => {
    const parsed = Config.parse({ ENGRAM_HTTP_KEEP_ALIVE_MS: "620000" })
    expect(parsed._tag === "Valid" && parsed.config.httpKeepAliveMs).toBe(620_000)
    const byDefault = Config.parse({})
    expect(byDefault._tag === "Valid" && byDefault.config.httpKeepAliveMs).toBe(95_000)
    for (const bad of ["999", "3600001", "1.5"]) {
      const refused = Config.parse({ ENGRAM_HTTP_KEEP_ALIVE_MS: bad })
      expect(refused._tag === "Invalid" && refused.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_HTTP_KEEP_ALIVE_MS", "must be an integer from 1000 to 3600000"]])
    }
    const behindGoogle = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken, httpKeepAliveMs: 620_000 } })
    try {
      const answer = await fetch(`${behindGoogle.url}/livez`)
      expect(answer.headers.get("keep-alive")).toBe("timeout=620")
      await answer.body?.cancel()
    } finally {
      await behindGoogle.stop()
    }
  })
})

describe("the edge while the coordinator stops", () => {
  it("a request that arrives once shutdown began gets a JSON 503 with Retry-After", async () => {
    const response = await Effect.runPromise(
      Effect.gen(function* () {
        const metrics = yield* Metrics
        const app = HttpEdge.edge({ maxBodyBytes, closing: () => true, metrics })(Effect.succeed(HttpServerResponse.text("never")))
        return yield* app.pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(new Request("http://x/v1/fleet"))))
      }).pipe(Effect.provide(Layer.fresh(Metrics.layer)), Effect.scoped),
    )
    expect(response.status).toBe(503)
    expect(response.headers["retry-after"]).toBe("1")
    const web = HttpServerResponse.toWeb(response)
    expect(await web.json()).toMatchObject({ error: "Unavailable", retryAfterMs: 1000 })
  })

  it("a shutdown's 503s are one warning, the rest at debug (a fleet's open long-polls are not thousands of warnings)", async () => {
    const lines: string[] = []
    const capture = Logger.layer([Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`))])
    const statuses = await Effect.runPromise(
      Effect.gen(function* () {
        const metrics = yield* Metrics
        const app = HttpEdge.edge({ maxBodyBytes, closing: () => true, metrics })(Effect.succeed(HttpServerResponse.text("never")))
        const out: number[] = []
        for (let i = 0; i < 3; i++) {
          const r = yield* app.pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(new Request("http://x/v1/hosts/h/assignments"))))
          out.push(r.status)
        }
        return out
      }).pipe(Effect.provide(Layer.fresh(Metrics.layer)), Effect.provide(capture), Effect.provideService(References.MinimumLogLevel, "Debug"), Effect.scoped),
    )
    expect(statuses).toEqual([503, 503, 503])
    expect(lines.filter((l) => l.startsWith("Warn"))).toEqual([
      "Warn answered 503: the coordinator is shutting down (requests that arrive now, and those still open when its drain ends, are answered 503 so their clients go to another replica; the rest are logged at debug)",
    ])
    expect(lines.filter((l) => l === "Debug answered 503")).toHaveLength(2)
  })
})

describe("every error answer has a JSON body", () => {
  it("a known path with a method it does not take is a JSON error naming the method and path", async () => {
    const r = await raw(c.url, { method: "PATCH", path: "/v1/sessions", headers: { authorization: `Bearer ${adminToken}` } })
    expect(r.status).toBe(404)
    expect(r.headers["content-type"]).toContain("application/json")
    expect(r.body).toMatchObject({ error: "NotFound", entity: "route", id: "PATCH /v1/sessions" })
  })

  it("a body that is not JSON is a JSON 400 naming the body, and changes nothing", async () => {
    const before = (await client(c.url, adminToken).get("/v1/sessions?limit=1000")).body.items.length
    const r = await raw(c.url, {
      method: "POST",
      path: "/v1/sessions",
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
      body: '{"memMib": 64, "vcpus": ',
    })
    expect(r.status).toBe(400)
    expect(r.headers["content-type"]).toContain("application/json")
    expect(r.body).toMatchObject({ error: "InvalidInput", field: "body" })
    expect((await client(c.url, adminToken).get("/v1/sessions?limit=1000")).body.items.length).toBe(before)
  })

  it("a defect inside a handler is a JSON 500, never an empty body", async () => {
    const broken = await withSummary(() => Effect.die(new Error("boom (test)")), { logLevel: "None" })
    try {
      const r = await raw(broken.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } })
      expect(r.status).toBe(500)
      expect(r.headers["content-type"]).toContain("application/json")
      expect(r.body).toMatchObject({ error: "Internal" })
      expect(JSON.stringify(r.body)).not.toContain("boom")
    } finally {
      await broken.stop()
    }
  })

  it("a long-poll still waiting when the coordinator stops is answered (JSON), not dropped", async () => {
    const stopping = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken } })
    const admin = client(stopping.url, adminToken)
    expect((await admin.post("/v1/sessions", { id: "waits", memMib: 64, vcpus: 1 })).status).toBe(202)
    const waiting = raw(stopping.url, { method: "GET", path: "/v1/sessions/waits/wait?state=running&timeoutMs=60000", headers: { authorization: `Bearer ${adminToken}` } })
    // The wait is registered once the server holds the request; a read through the same server orders it.
    await admin.get("/v1/sessions/waits")
    await stopping.stop()
    const r = await waiting
    expect([408, 503]).toContain(r.status)
    expect(r.headers["content-type"]).toContain("application/json")
    expect(r.body).toMatchObject({ error: expect.any(String) })
  })

  it("with ENGRAM_SHUTDOWN_DELAY_MS a stopping coordinator answers /readyz 503 and serves the rest until the delay has passed, then closes; its shutdown 503s close their connection", async () => {
    const delayed = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken, shutdownDelayMs: 15_000 } })
    expect((await fetch(`${delayed.url}/readyz`)).status).toBe(200)
    const stopped = delayed.stop()
    let notReady = await raw(delayed.url, { method: "GET", path: "/readyz" })
    for (let i = 0; i < 100 && notReady.status === 200; i++) notReady = await raw(delayed.url, { method: "GET", path: "/readyz" })
    expect([notReady.status, notReady.body.error]).toEqual([503, "Unavailable"])
    expect(notReady.body.message).toMatch(/stopping: not ready, still serving until ENGRAM_SHUTDOWN_DELAY_MS/)
    // Still serving meanwhile: an ordinary request and a liveness probe.
    expect((await client(delayed.url, adminToken).get("/v1/fleet")).status).toBe(200)
    expect((await raw(delayed.url, { method: "GET", path: "/livez" })).status).toBe(200)
    await stopped
    await expect(fetch(`${delayed.url}/livez`)).rejects.toThrow()
  }, 120_000)

  it("a shutdown's 503 closes its connection (a proxy stops reusing it for this replica)", async () => {
    const metrics = await Effect.runPromise(Effect.scoped(Effect.map(Effect.service(Metrics), (m) => m)).pipe(Effect.provide(Layer.fresh(Metrics.layer))))
    const response = await Effect.runPromise(
      HttpEdge.edge({ maxBodyBytes, closing: () => true, metrics })(Effect.succeed(HttpServerResponse.text("never"))).pipe(
        Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(new Request("http://x/v1/fleet"))),
      ),
    )
    expect([response.status, response.headers["connection"]]).toEqual([503, "close"])
  })
})

/** What a server answers to exactly these bytes on a fresh connection (the request as written, not as a client would build it). */
const rawExchange = (base: string, request: Buffer): Promise<string> =>
  new Promise((resolve, reject) => {
    const { hostname, port } = new URL(base)
    const socket = connect(Number(port), hostname, () => socket.end(request))
    let text = ""
    socket.on("data", (b: Buffer) => (text += b.toString("latin1")))
    socket.on("close", () => resolve(text))
    socket.on("error", reject)
  })

/** The status line and JSON body of a raw HTTP answer. */
const parseAnswer = (text: string) => {
  const [head = "", body = ""] = text.split("\r\n\r\n")
  return { status: Number(head.split(" ")[1]), head: head.toLowerCase(), body: JSON.parse(body) as Record<string, unknown> }
}

/** How many answers `/metrics` counts under these labels (`engram_http_requests_total`; 0 when none yet). */
const requestsCounted = async (method: string, route: string, status: number): Promise<number> => {
  const text = (await client(c.url, adminToken).get("/metrics")).body as string
  const line = text.split("\n").find((l) => l.startsWith(`engram_http_requests_total{method="${method}",route="${route}",status="${status}"} `))
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1))
}

describe("what Node's HTTP parser refuses is answered in JSON too", () => {
  it("an oversized URL or header is a JSON 431 naming the limit, counted; the coordinator serves on", async () => {
    const before = await requestsCounted("unknown", "unmatched", 431)
    const url = await rawExchange(c.url, Buffer.from(`GET /v1/sessions?cursor=${"x".repeat(20_000)} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${adminToken}\r\n\r\n`))
    const header = await rawExchange(c.url, Buffer.from(`GET /v1/fleet HTTP/1.1\r\nhost: x\r\nx-big: ${"y".repeat(20_000)}\r\n\r\n`))
    for (const text of [url, header]) {
      const a = parseAnswer(text)
      expect(a.status).toBe(431)
      expect(a.head).toContain("content-type: application/json")
      expect(a.body).toMatchObject({ error: "HeadersTooLarge", limitBytes: expect.any(Number) })
    }
    expect(await requestsCounted("unknown", "unmatched", 431)).toBe(before + 2)
    expect((await client(c.url, adminToken).get("/v1/fleet")).status).toBe(200)
  })

  it("a URL with bytes outside ASCII is a JSON 400 that says to percent-encode them, counted", async () => {
    const before = await requestsCounted("unknown", "unmatched", 400)
    const a = parseAnswer(await rawExchange(c.url, Buffer.concat([Buffer.from("GET /v1/sessions/caf"), Buffer.from([0xc3, 0xa9, 0xff]), Buffer.from(" HTTP/1.1\r\nhost: x\r\n\r\n")])))
    expect(a.status).toBe(400)
    expect(a.body).toMatchObject({ error: "InvalidInput", field: "request" })
    expect(String(a.body["rule"])).toContain("percent-encode")
    expect(await requestsCounted("unknown", "unmatched", 400)).toBe(before + 1)
  })

  it("an HTTP/1.1 request without a Host header is a JSON 400 naming the header, counted by its route; HTTP/1.0 needs none", async () => {
    const before = await requestsCounted("GET", "/v1/fleet", 400)
    const a = parseAnswer(await rawExchange(c.url, Buffer.from(`GET /v1/fleet HTTP/1.1\r\nauthorization: Bearer ${adminToken}\r\n\r\n`)))
    expect(a.status).toBe(400)
    expect(a.head).toContain("content-type: application/json")
    expect(a.head).toContain("connection: close")
    expect(a.body).toMatchObject({ error: "InvalidInput", field: "host", in: "headers" })
    expect(String(a.body["rule"])).toContain("must be present")
    // Before, Node answered it itself: a bare 400 with an empty body, counted nowhere.
    expect(await requestsCounted("GET", "/v1/fleet", 400)).toBe(before + 1)
    const older = parseAnswer(await rawExchange(c.url, Buffer.from("GET /livez HTTP/1.0\r\n\r\n")))
    expect([older.status, older.body]).toEqual([200, { ok: true }])
  })

  it("an Expect other than 100-continue is a JSON 417 naming it, counted by its route; nothing is created", async () => {
    const before = await requestsCounted("POST", "/v1/sessions", 417)
    const id = uid("s")
    const body = JSON.stringify({ id, memMib: 64, vcpus: 1 })
    const request = `POST /v1/sessions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${adminToken}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nexpect: 200-ok\r\n\r\n${body}`
    const a = parseAnswer(await rawExchange(c.url, Buffer.from(request)))
    expect(a.status).toBe(417)
    expect(a.head).toContain("content-type: application/json")
    expect(a.head).toContain("connection: close")
    expect(a.body).toMatchObject({ error: "ExpectationFailed", expect: "200-ok" })
    expect(String(a.body["message"])).toContain("100-continue")
    // Before, Node answered it itself: a bare 417 with an empty body, counted nowhere.
    expect(await requestsCounted("POST", "/v1/sessions", 417)).toBe(before + 1)
    expect((await client(c.url, adminToken).get(`/v1/sessions/${id}`)).status).toBe(404)
  })

  it("a metric that fails leaves the parser's and the expectation's answers as they went, and the server serving", async () => {
    const failing = { observeRequest: () => { throw new Error("metric broke (test)") } } as unknown as Parameters<typeof HttpEdge.onClientError>[0]
    const server = createServer((_, res) => res.end("ok")).on("clientError", HttpEdge.onClientError(failing)).on("checkExpectation", HttpEdge.onExpectation(failing, () => "/x"))
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    try {
      const bad = parseAnswer(await rawExchange(base, Buffer.from("GET /a b HTTP/1.1\r\nhost: x\r\n\r\n")))
      expect([bad.status, bad.body["error"]]).toEqual([400, "InvalidInput"])
      const expectation = parseAnswer(await rawExchange(base, Buffer.from("GET /x HTTP/1.1\r\nhost: x\r\nexpect: nothing\r\n\r\n")))
      expect([expectation.status, expectation.body["error"]]).toEqual([417, "ExpectationFailed"])
      expect(await (await fetch(`${base}/x`)).text()).toBe("ok")
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})

describe("every 5xx carries a request id, in its header and body, and is logged with it", () => {
  it("a defect: 500 with x-request-id and requestId, logged as an error with the id and its cause; a proxy's own x-request-id is kept", async () => {
    const broken = await withSummary(() => Effect.die(new Error("boom (test)")), { logLevel: "Error" })
    try {
      const { result: r, lines } = await logged(() => raw(broken.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } }))
      expect(r.status).toBe(500)
      const id = r.headers["x-request-id"]
      expect(id).toMatch(/^[0-9a-f-]{36}$/)
      expect(r.body).toEqual({ error: "Internal", message: "internal error", requestId: id })
      const line = lines.split("\n").find((l) => l.includes(String(id)))
      expect(line, lines).toBeDefined()
      expect(line).toContain("answered 500")
      expect(line).toContain("boom (test)")
      expect(line).toContain("/v1/ledger/summary")
      const proxied = await raw(broken.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}`, "x-request-id": "edge-proxy.42" } })
      expect([proxied.headers["x-request-id"], proxied.body.requestId]).toEqual(["edge-proxy.42", "edge-proxy.42"])
    } finally {
      await broken.stop()
    }
  })

  it("a 503 (the store did not answer in time) carries its id and is logged as a warning with it; a 4xx carries none", async () => {
    const stuck = await withSummary(() => Effect.never, { logLevel: "Warn", storeTimeoutMs: 200 })
    try {
      const { result: r, lines } = await logged(() => raw(stuck.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } }))
      expect(r.status).toBe(503)
      const id = String(r.headers["x-request-id"])
      expect(r.body).toMatchObject({ error: "Unavailable", requestId: id })
      const line = lines.split("\n").find((l) => l.includes(id))
      expect(line, lines).toContain("answered 503")
      const notFound = await raw(stuck.url, { method: "GET", path: "/v1/sessions/nope", headers: { authorization: `Bearer ${adminToken}` } })
      expect([notFound.status, notFound.headers["x-request-id"], notFound.body.requestId]).toEqual([404, undefined, undefined])
    } finally {
      await stuck.stop()
    }
  })
})

describe("a move refused by the downtime guard", () => {
  it("answers 503 ErrMoveDowntime with its estimate and no Retry-After (retrying cannot help), logged at info, not as a warning", async () => {
    const info = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Info", config: { port: 0, adminToken } })
    try {
      const admin = client(info.url, adminToken)
      const hosts: Array<{ id: string; token: string }> = []
      for (let i = 0; i < 2; i++) {
        const id = uid("h")
        const created = await admin.post("/v1/hosts", { id })
        expect((await admin.put(`/v1/hosts/${id}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })).status).toBe(200)
        hosts.push({ id, token: created.body.token as string })
      }
      const [src, dst] = hosts as [{ id: string; token: string }, { id: string; token: string }]
      const sid = uid("s")
      expect((await admin.post("/v1/sessions", { id: sid, memMib: 256, vcpus: 1, affinity: [src.id] })).body.hostId).toBe(src.id)
      const agent = client(info.url, src.token)
      await agent.post(`/v1/sessions/${sid}/started`)
      const answer = raw(info.url, {
        method: "POST",
        path: `/v1/sessions/${sid}/move`,
        headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
        body: JSON.stringify({ targetHostId: dst.id, maxDowntimeMs: 480 }),
      })
      let moveId: string | undefined
      for (let i = 0; i < 50 && moveId === undefined; i++) {
        const a = await agent.get(`/v1/hosts/${src.id}/assignments${i === 0 ? "" : "?waitMs=2000"}`)
        moveId = a.body.moves.find((m: { sessionId: string }) => m.sessionId === sid)?.id
      }
      expect(moveId).toBeDefined()
      const { result: r, lines } = await logged(async () => {
        expect((await agent.post(`/v1/moves/${moveId}/abort`, { reason: "ErrMoveDowntime: estimate over budget", estimateMs: 812 })).status).toBe(200)
        return answer
      })
      expect(r.status).toBe(503)
      expect(r.body).toMatchObject({ error: "ErrMoveDowntime", estimateMs: 812, maxDowntimeMs: 480, moveId })
      expect(r.body.retryAfterMs).toBeUndefined()
      expect(r.headers["retry-after"]).toBeUndefined()
      const line = lines.split("\n").find((l) => l.includes(String(r.headers["x-request-id"])))
      expect(line, lines).toContain("answered 503")
      expect(JSON.parse(line ?? "{}")).toMatchObject({ level: "info", error: "ErrMoveDowntime" })
    } finally {
      await info.stop()
    }
  })
})

describe("every store call answers within ENGRAM_STORE_TIMEOUT_MS, whatever the backend", () => {
  it("a store call that never answers is a JSON 503 Unavailable with Retry-After naming the bound; the next call is served", async () => {
    let hang = true
    const stuck = await withSummary((store) => (hang ? Effect.never : store.clusterSummary()), { logLevel: "None", storeTimeoutMs: 300 })
    try {
      const r = await raw(stuck.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } })
      expect(r.status).toBe(503)
      expect(Number(r.headers["retry-after"])).toBeGreaterThan(0)
      expect(r.body).toMatchObject({ error: "Unavailable", retryAfterMs: expect.any(Number) })
      expect(r.body.message).toContain("ENGRAM_STORE_TIMEOUT_MS")
      hang = false
      expect((await raw(stuck.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } })).status).toBe(200)
    } finally {
      await stuck.stop()
    }
  })

  it("the call that ran past its bound is interrupted once the 503 is given, and a call whose client left is interrupted too", async () => {
    let started = 0
    let interrupted = 0
    const never = Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => void interrupted++)))
    const stuck = await withSummary(() => Effect.suspend(() => (started++, never)), { logLevel: "None", storeTimeoutMs: 300 })
    try {
      // Past the bound: the answer is the 503, and the call goes (a stuck call holds nothing).
      expect((await raw(stuck.url, { method: "GET", path: "/v1/ledger/summary", headers: { authorization: `Bearer ${adminToken}` } })).status).toBe(503)
      await vi.waitFor(() => expect(interrupted).toBe(1))
    } finally {
      await stuck.stop()
    }
    const waiting = await withSummary(() => Effect.suspend(() => (started++, never)), { logLevel: "None", storeTimeoutMs: 600_000 })
    try {
      // Within the bound, the client leaves: its request's call is interrupted, not left running.
      const leaving = new AbortController()
      const answer = fetch(`${waiting.url}/v1/ledger/summary`, { headers: { authorization: `Bearer ${adminToken}` }, signal: leaving.signal }).catch(() => "left")
      await vi.waitFor(() => expect(started).toBe(2))
      leaving.abort()
      expect(await answer).toBe("left")
      await vi.waitFor(() => expect(interrupted).toBe(2))
    } finally {
      await waiting.stop()
    }
  })
})

describe("the edge's own answers are labelled like the router's", () => {
  it("a HEAD the edge refuses (a declared body too large) counts under the GET route that answers it; a peer route under its own", async () => {
    const admin = client(c.url, adminToken)
    const big = "x".repeat(maxBodyBytes + 1)
    const head = await raw(c.url, { method: "HEAD", path: "/v1/fleet", headers: { "content-length": String(big.length) }, body: big })
    expect(head.status).toBe(413)
    const peer = await raw(c.url, { method: "POST", path: "/internal/v1/placements", headers: { "content-length": String(big.length) }, body: big })
    expect(peer.status).toBe(413)
    const text = (await admin.get("/metrics")).body as string
    expect(text).toMatch(/^engram_http_requests_total\{method="HEAD",route="\/v1\/fleet",status="413"\} \d+$/m)
    expect(text).toMatch(/^engram_http_requests_total\{method="POST",route="\/internal\/v1\/placements",status="413"\} \d+$/m)
  })
})

describe("the edge's answer hook is total", () => {
  it("a metrics observer that throws: every request is still answered as it would have been, and the failure logged once per request", async () => {
    const own = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, maxBodyBytes } })
    const metrics = await own.run(Effect.service(Metrics))
    const broken = vi.spyOn(metrics, "observeRequest").mockImplementation(() => {
      throw new Error("observer broke (test)")
    })
    try {
      const big = "x".repeat(maxBodyBytes + 1)
      const { result, lines } = await logged(async () => [
        // Answered by a route (the hook), by the router's 404 (the hook), by the edge itself (413).
        await raw(own.url, { method: "GET", path: "/livez" }),
        await raw(own.url, { method: "GET", path: "/v1/nowhere" }),
        await raw(own.url, { method: "POST", path: "/v1/sessions", headers: { "content-length": String(big.length) }, body: big }),
      ])
      expect(result.map((r) => r.status)).toStrictEqual([200, 404, 413])
      expect(result[1]?.body).toMatchObject({ error: "NotFound", entity: "route" })
      expect(result[2]?.body).toMatchObject({ error: "PayloadTooLarge", limitBytes: maxBodyBytes })
      const failures = lines.split("\n").filter((l) => l.includes("observer broke (test)"))
      expect(failures, lines).toHaveLength(3)
      for (const r of result) expect(failures.filter((l) => l.includes(String(r.headers["x-request-id"])))).toHaveLength(1)
      expect(broken).toHaveBeenCalledTimes(3)
    } finally {
      broken.mockRestore()
      await own.stop()
    }
  }, 60_000)
})

describe("what a request carries", () => {
  // effect copies a request's whole context more than once per request (the API builder's merge
  // of the handlers' context): the coordinator's services stay out of it (`HandlerGroup`), the
  // handlers hold what they call. Read from inside a store call a request makes.
  it("a request's context holds none of the coordinator's services, only the middlewares, what they provide, Metrics and Stalls", async () => {
    let keys: ReadonlyArray<string> = []
    const own = await withSummary(
      (store) =>
        Effect.withFiber((fiber) => {
          keys = [...fiber.context.mapUnsafe.keys()]
          return store.clusterSummary()
        }),
      { logLevel: "None" },
    )
    try {
      const r = await fetch(`${own.url}/v1/ledger/summary`, { headers: { authorization: `Bearer ${adminToken}` } })
      expect(r.status).toBe(200)
      expect(keys).toContain("effect/http/HttpServerRequest")
      const perRequest = [
        "@engram/coordinator/Metrics",
        // What an agent's timed-out store call reads to tell a stalled database (`HttpErrors.api`).
        "@engram/coordinator/Stalls",
        "@engram/api/BearerAuth",
        "@engram/api/AdminOnly",
        "@engram/api/ScrapeAuth",
        "@engram/api/InputErrors",
        "@engram/api/StrictInput",
        "@engram/api/CurrentPrincipal",
        "@engram/coordinator/CurrentCredential",
      ]
      expect(keys.filter((k) => k.startsWith("@engram/") && !perRequest.includes(k))).toEqual([])
    } finally {
      await own.stop()
    }
  })
})
