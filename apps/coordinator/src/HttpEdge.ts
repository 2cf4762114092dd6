/**
 * What every request meets before and after the API: the request body limit (a declared
 * length over it is refused at once; a streamed body is cut off while it streams, so an
 * oversized body never reaches memory), `503` while the coordinator shuts down, a URL whose
 * percent-escapes are not UTF-8 refused (`400` naming the path parameter or query key), the
 * liveness probes (`/livez`, `/healthz`) answered without the API builder, a JSON
 * body on every error answer (the router's 404, 413, 415, a 503 of an interrupted request, a
 * 500), a request id on every 5xx (an `x-request-id` header and `requestId` in the body, logged
 * with the answer and, for a defect, its cause), and the request metrics (count and duration by
 * method, route template and status). Whatever fails in that handling of an answer, the answer
 * still goes out, with a request id, and the failure is logged. An HTTP/1.1 request without a
 * `Host` header is refused here too (a JSON 400 naming `host`: the server is built with Node's
 * own check off, whose answer was a bare 400 counted nowhere). `onClientError` answers what
 * Node's HTTP parser refuses before any of this runs (an oversized URL or header: a JSON 431),
 * and `onExpectation` an `Expect` other than `100-continue` (a JSON 417); both are counted.
 */
import { EngramApi, Errors, StrictJson } from "@engram/api"
import { Dashboard } from "@engram/dashboard"
import { Cause, Context, Effect, ErrorReporter, Fiber } from "effect"
import type { Layer } from "effect"
import { FindMyWay, HttpEffect, HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { HttpApi } from "effect/http-api"
import { randomUUID } from "node:crypto"
import { maxHeaderSize } from "node:http"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { Socket } from "node:net"
import { placementsPath } from "./Forward.js"
import { keyName } from "./HttpErrors.js"
import * as Parking from "./Parking.js"
import { cutStoreCalls } from "./StoreBound.js"
import type { MetricsShape } from "./Metrics.js"

/** What the edge needs to know. */
export interface EdgeOptions {
  readonly maxBodyBytes: number
  /** True once the coordinator began to shut down: new requests get 503. */
  readonly closing: () => boolean
  /**
   * True while a stopping coordinator waits out `ENGRAM_SHUTDOWN_DELAY_MS` before it closes:
   * `/readyz` answers 503 (the load balancer stops sending it connections), the rest as usual.
   */
  readonly draining?: (() => boolean) | undefined
  readonly metrics: MetricsShape
}

/** The longest path parameter the router matches (the API's `PathId` refuses ids over 256 characters itself). */
export const pathParamMaxLength = 1024

/**
 * The route template of a request (`/v1/sessions/:id`), for metric labels; `unmatched` when none.
 * A HEAD without a route of its own is labelled by the GET route that answers it, as the router
 * matches it (`HttpRouter`: HEAD falls back to GET).
 */
export const routeLabeler = (): ((method: string, url: string) => string) => {
  // As the server's router matches (`Coordinator`'s `routerConfig`): a long id is still its route's.
  const router = FindMyWay.make<string>({ maxParamLength: pathParamMaxLength })
  HttpApi.reflect(EngramApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint }) => router.on(endpoint.method, endpoint.path as FindMyWay.PathInput, endpoint.path),
  })
  router.on("GET", "/docs", "/docs")
  for (const path of ["/", "/ui", "/ui/changes", "/ui/history", ...Dashboard.assetPaths()]) router.on("GET", path as FindMyWay.PathInput, path)
  router.on("POST", placementsPath, placementsPath)
  return (method, url) => {
    const path = url.split("?")[0] ?? url
    return router.find(method, path)?.handler ?? (method === "HEAD" ? router.find("GET", path)?.handler : undefined) ?? "unmatched"
  }
}

const json = (status: number, body: Record<string, unknown>, headers: Record<string, string> = {}) => HttpServerResponse.jsonUnsafe(body, { status, headers })

/** The edge's own answers while the coordinator stops: to a new request, and to one the stop cut. */
const shutdownMessage = "the coordinator is shutting down; retry"
const cutMessage = "the coordinator is shutting down or the request was cut off; retry"

/** Readiness while a stopping coordinator waits out its shutdown delay. */
const drainingMessage = "the coordinator is stopping: not ready, still serving until ENGRAM_SHUTDOWN_DELAY_MS has passed"

const unavailable = (message: string, retryAfterMs = 1000, headers: Record<string, string> = {}) =>
  json(503, { error: "Unavailable", message, retryAfterMs }, { "retry-after": String(Errors.retryAfterSeconds(retryAfterMs)), ...headers })

const tooLarge = (limit: number) =>
  json(413, { error: "PayloadTooLarge", message: `the request body is larger than ${limit} bytes (ENGRAM_MAX_BODY_BYTES)`, limitBytes: limit }, { connection: "close" })

/** Whether an answer already has a JSON body (the API's own answers do). */
const isJson = (r: HttpServerResponse.HttpServerResponse) =>
  (("contentType" in r.body ? r.body.contentType : undefined) ?? r.headers["content-type"] ?? "").includes("json")

/** The JSON answer for an error answer the API did not shape itself (the router's, the server's). */
const asJson = (r: HttpServerResponse.HttpServerResponse, request: HttpServerRequest.HttpServerRequest, limit: number): HttpServerResponse.HttpServerResponse => {
  if (r.status < 400 || r.status === 499 || isJson(r)) return r
  const path = request.url.split("?")[0] ?? request.url
  switch (r.status) {
    case 400:
      return json(400, { error: "InvalidInput", field: "body", rule: "must be a readable request body", in: "body" })
    case 404:
      return json(404, { error: "NotFound", entity: "route", id: `${request.method} ${path}`, message: `no endpoint ${request.method} ${path}; the API reference is at /docs` })
    case 413:
      return tooLarge(limit)
    case 415:
      return json(415, StrictJson.unsupportedMediaType(request.headers["content-type"], "send the body as JSON: `content-type: application/json` (or no content type at all)"))
    case 503:
      return unavailable(cutMessage)
    default:
      return json(r.status, { error: r.status >= 500 ? "Internal" : "HttpError", message: r.status >= 500 ? "internal error" : `HTTP ${r.status}` })
  }
}

/**
 * Whether a request is HTTP/1.1 without a `Host` header, which RFC 9112 §3.2 says to refuse
 * with a 400. Node's own check (`requireHostHeader`) answers before any listener runs, with a
 * bare 400 that no metric counts; the server is built with it off and the edge refuses here.
 */
const lacksHost = (request: HttpServerRequest.HttpServerRequest): boolean =>
  request.headers["host"] === undefined && (request.source as { readonly httpVersion?: unknown }).httpVersion === "1.1"

const noHostAnswer = () =>
  json(400, { error: "InvalidInput", field: "host", rule: "must be present: an HTTP/1.1 request names its host (RFC 9112 §3.2)", in: "headers" }, { connection: "close" })

/**
 * Whether a request may be an assignments long-poll, whose route parks (`ParkedPoll`) when the
 * edge holds it (`Parking.hold`; a route not held waits in its fiber instead).
 */
const mayPark = (request: HttpServerRequest.HttpServerRequest): boolean => request.url.includes("/assignments")

/** The liveness probes the edge answers itself (`{ok: true}`, as the API documents them). */
const probePaths: ReadonlySet<string> = new Set(["/livez", "/healthz"])

// ---- percent-encoding ------------------------------------------------------------------------

const decodes = (s: string): boolean => {
  try {
    decodeURIComponent(s)
    return true
  } catch {
    return false
  }
}

const badUrlRule = "must be percent-encoded UTF-8"

/**
 * The part of a URL whose percent-escapes are malformed or not UTF-8 (which a decoder would
 * read as U+FFFD): `{field, in}` naming the route's parameter or the query key, or null.
 */
export const badPercentEncoding = (
  method: string,
  url: string,
  routeOf: (method: string, url: string) => string,
): { readonly field: string; readonly in: "path" | "query" } | null => {
  const q = url.indexOf("?")
  const path = q < 0 ? url : url.slice(0, q)
  if (path.includes("%")) {
    const segments = path.split("/")
    const i = segments.findIndex((s) => !decodes(s))
    if (i >= 0) {
      // Which parameter it is: the route the path takes with that segment readable.
      const template = routeOf(method, segments.map((s, j) => (j === i ? "x" : s)).join("/")).split("/")
      const name = template[i]
      return { field: name !== undefined && name.startsWith(":") ? name.slice(1) : "path", in: "path" }
    }
  }
  if (q >= 0 && url.includes("%", q)) {
    for (const pair of url.slice(q + 1).split("&")) {
      const eq = pair.indexOf("=")
      const key = eq < 0 ? pair : pair.slice(0, eq)
      if (!decodes(key)) return { field: "query", in: "query" }
      if (eq >= 0 && !decodes(pair.slice(eq + 1))) return { field: keyName(decodeURIComponent(key.replaceAll("+", " "))), in: "query" }
    }
  }
  return null
}

// ---- request ids on 5xx -----------------------------------------------------------------------

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

/** The id of a request: a proxy's `x-request-id` when it is a plain token, else a new one. */
const requestIdOf = (request: HttpServerRequest.HttpServerRequest): string => {
  const given = request.headers["x-request-id"]
  return given !== undefined && REQUEST_ID.test(given) ? given : randomUUID()
}

/** The JSON object an answer carries, or null (another body). */
const jsonBody = (r: HttpServerResponse.HttpServerResponse): Record<string, unknown> | null => {
  if (r.body._tag !== "Uint8Array") return null
  try {
    const parsed: unknown = JSON.parse(Buffer.from(r.body.body).toString("utf8"))
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : null
  } catch {
    return null
  }
}

/** A 5xx answer with its request id in an `x-request-id` header and, when it is a JSON object, in its body. */
const withRequestId = (r: HttpServerResponse.HttpServerResponse, body: Record<string, unknown> | null, requestId: string): HttpServerResponse.HttpServerResponse =>
  body === null ? HttpServerResponse.setHeader(r, "x-request-id", requestId) : json(r.status, { ...body, requestId }, { ...r.headers, "x-request-id": requestId })

/**
 * The defect a request died of, by request: the server reports a failure before it turns it
 * into the 500 the edge's pre-response hook sees, so the hook can log its cause.
 */
const defects = new WeakMap<HttpServerRequest.HttpServerRequest, Cause.Cause<unknown>>()

/**
 * The error reporter that keeps a request's defect for its 5xx log line (provided to the
 * server). Typed failures (the API's 4xx and 503 answers) are reported too; they are skipped
 * at the cost of one look at the cause, as their answer's body already says what they were.
 */
export const defectReporter: Layer.Layer<never> = ErrorReporter.layer(
  [
    {
      [ErrorReporter.TypeId]: ErrorReporter.TypeId,
      report: ({ cause, fiber }) => {
        if (!cause.reasons.some((r) => r._tag === "Die")) return
        const request = Context.getOrUndefined(fiber.context, HttpServerRequest.HttpServerRequest)
        if (request !== undefined) defects.set(request, cause)
      },
    },
  ],
  { mergeWithExisting: true },
)

/**
 * Logs a 5xx with its request id: a move refused by the downtime guard (`ErrMoveDowntime`, an
 * expected outcome) as info, another 503 (the store away, a move's outcome, shutdown) as a
 * warning, else as an error with its cause; `quiet` (the shutdown's 503s after its first) at debug.
 */
const log5xx = (
  status: number,
  body: Record<string, unknown> | null,
  request: HttpServerRequest.HttpServerRequest,
  route: string,
  requestId: string,
  cause: Cause.Cause<unknown> | undefined,
  quiet = false,
) => {
  const fields = {
    requestId,
    status,
    method: request.method,
    route,
    error: typeof body?.["error"] === "string" ? body["error"] : null,
    message: typeof body?.["message"] === "string" ? body["message"] : null,
    ...(cause === undefined || status === 503 ? {} : { cause: Cause.pretty(cause) }),
  }
  if (quiet) return Effect.logDebug(`answered ${status}`, fields)
  if (status === 503 && fields.error === "ErrMoveDowntime") return Effect.logInfo(`answered ${status}`, fields)
  return status === 503 ? Effect.logWarning(`answered ${status}`, fields) : Effect.logError(`answered ${status}`, fields)
}

/**
 * The answer when the edge's own handling of an answer failed: the answer as it was, with a
 * request id (`x-request-id`), and one error log line with that id and the cause.
 */
const hookFailed = (
  request: HttpServerRequest.HttpServerRequest,
  response: HttpServerResponse.HttpServerResponse,
  cause: Cause.Cause<unknown>,
): Effect.Effect<HttpServerResponse.HttpServerResponse> => {
  const requestId = requestIdOf(request)
  return Effect.as(
    Effect.logError("the edge failed to finish an answer; answered it as it was", {
      requestId,
      status: response.status,
      method: request.method,
      path: request.url.split("?")[0] ?? request.url,
      cause: Cause.pretty(cause),
    }),
    HttpServerResponse.setHeader(response, "x-request-id", requestId),
  )
}

/**
 * The route template the router matched for the request being answered (`/v1/sessions/:id`), or
 * `unmatched`. Read from the request fiber's context, where the router left its match: a request
 * is routed once, not again for its metric label. (The pre-response hook runs before the server
 * restores the fiber's context; an answer given before the router ran — the edge's own, a 404 —
 * finds no match there.)
 */
const matchedRoute = (): string => {
  const fiber = Fiber.getCurrent()
  const matched = fiber === undefined ? undefined : Context.getOrUndefined(fiber.context, HttpRouter.RouteContext)
  return matched === undefined ? "unmatched" : String(matched.route.path)
}

/**
 * The edge, as the router's global middleware (`HttpRouter.middleware(edge(…), { global: true })`,
 * so it wraps every route and the router's 404, and the server keeps its one-frame path for a
 * request, which a server middleware turns off): shutdown 503s, a declared body over the limit
 * and a URL that is not percent-encoded UTF-8 are answered here; every other request runs with
 * the body limit in force and a pre-response hook that gives its error answer a JSON body, a 5xx
 * its request id and a log line, and counts it. (The hook sees every answer the server sends,
 * the router's 404 and an interrupted request's 503 included.)
 */
export const edge = (options: EdgeOptions) => {
  const routeOf = routeLabeler()
  // The liveness probes' one answer (immutable: every probe gets the same value).
  const aliveAnswer = json(200, { ok: true })
  // Whether a 503 was logged since shutdown began: a coordinator stopping under a fleet cuts every
  // open long-poll (10,000 with 10,000 agents), and one warning says it; the rest are at debug.
  let shutdownLogged = false
  // Called when the answer is ready: counts it, and gives a 5xx its request id and log line.
  const answered = (
    request: HttpServerRequest.HttpServerRequest,
    startedAt: number,
    route: string,
    response: HttpServerResponse.HttpServerResponse,
  ): Effect.Effect<HttpServerResponse.HttpServerResponse> => {
    const seconds = (performance.now() - startedAt) / 1000
    options.metrics.observeRequest(request.method, route, response.status, seconds)
    if (response.status === 499) return abandoned(request, route, seconds, response)
    if (response.status < 500) return Effect.succeed(response)
    const requestId = requestIdOf(request)
    const body = jsonBody(response)
    // Only the stop's own 503s: a store outage or a move's outcome during a slow stop is logged as ever.
    const stopping = response.status === 503 && options.closing() && (body?.["message"] === shutdownMessage || body?.["message"] === cutMessage)
    const first = stopping && !shutdownLogged
    if (stopping) shutdownLogged = true
    const logged = first
      ? Effect.logWarning("answered 503: the coordinator is shutting down (requests that arrive now, and those still open when its drain ends, are answered 503 so their clients go to another replica; the rest are logged at debug)", {
          requestId,
          method: request.method,
          route,
          message: body?.["message"] ?? null,
        })
      : log5xx(response.status, body, request, route, requestId, defects.get(request), stopping)
    return Effect.as(logged, withRequestId(response, body, requestId))
  }
  // The client left before the answer (499: the server interrupted the request). While a store
  // call of its own had not answered, the stall the client saw (an agent whose bound is shorter
  // than the store's, which logs "replica unreachable") is logged at info and counted; else
  // (a long-poll the client gave up, a client that left early) at debug. While the coordinator
  // stops, its clients leaving are its stop's doing: at debug.
  const abandoned = (
    request: HttpServerRequest.HttpServerRequest,
    route: string,
    seconds: number,
    response: HttpServerResponse.HttpServerResponse,
  ): Effect.Effect<HttpServerResponse.HttpServerResponse> => {
    const cut = cutStoreCalls.get(request)
    const fields = { method: request.method, route, afterMs: Math.round(seconds * 1000) }
    if (cut === undefined || options.closing()) return Effect.as(Effect.logDebug("the client left before the answer", fields), response)
    options.metrics.requestsAbandoned.inc({ method: request.method, route })
    return Effect.as(
      Effect.logInfo(
        `the client left before the answer, after ${fields.afterMs} ms: the store had not answered ${cut.operation} (waiting ${cut.waitedMs} ms of ENGRAM_STORE_TIMEOUT_MS)`,
        { ...fields, operation: cut.operation, storeWaitedMs: cut.waitedMs },
      ),
      response,
    )
  }
  // Total: whatever throws or fails in it (a metrics observer, a body that does not encode), the
  // request is still answered — as the edge shaped it, or as it was if the shaping failed — with
  // a request id, and the failure logged once; a hook that failed would leave the request
  // unanswered. `routed`: the hook's request (the answer is shaped, its route the router's
  // match), or null for the edge's own early answers (labelled by `routeOf`).
  const answeredTotal = (
    request: HttpServerRequest.HttpServerRequest,
    startedAt: number,
    response: HttpServerResponse.HttpServerResponse,
    routed: HttpServerRequest.HttpServerRequest | null,
    label?: string,
  ): Effect.Effect<HttpServerResponse.HttpServerResponse> => {
    let shaped = response
    try {
      shaped = routed === null ? response : asJson(response, routed, options.maxBodyBytes)
      const answer = shaped
      const route = label ?? (routed === null ? routeOf(request.method, request.url) : matchedRoute())
      return Effect.catchCause(answered(request, startedAt, route, answer), (cause) => hookFailed(request, answer, cause))
    } catch (e) {
      return hookFailed(request, shaped, Cause.die(e))
    }
  }
  // Every request passes here: no generator, no closure but the hook's, no second routing.
  return <E, R>(app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
    Effect.withFiber((fiber) => {
      const request = Context.getUnsafe(fiber.context, HttpServerRequest.HttpServerRequest)
      const startedAt = performance.now()
      // Closing the connection too: a proxy then stops reusing it for this replica.
      if (options.closing()) return answeredTotal(request, startedAt, unavailable(shutdownMessage, 1000, { connection: "close" }), null)
      if (options.draining?.() === true && (request.url === "/readyz" || request.url.startsWith("/readyz?")))
        return answeredTotal(request, startedAt, unavailable(drainingMessage), null)
      if (lacksHost(request)) return answeredTotal(request, startedAt, noHostAnswer(), null)
      const length = request.headers["content-length"]
      if (length !== undefined) {
        const declared = Number(length)
        if (Number.isFinite(declared) && declared > options.maxBodyBytes) return answeredTotal(request, startedAt, tooLarge(options.maxBodyBytes), null)
      }
      // A liveness probe (`GET` or `HEAD` of `/livez` or `/healthz`, nothing after the path, no
      // body) is answered here: it has no input to decode and no credential to check, and the API
      // builder would cost it more than the rest of the request (it merges the handlers' whole
      // context into the request's on every request). With a query or a body it goes to the API,
      // which refuses it (strict input: a `400`; a body over the limit: a `413`).
      if (probePaths.has(request.url) && (request.method === "GET" || request.method === "HEAD") && (length === undefined || length === "0") && request.headers["transfer-encoding"] === undefined) {
        return answeredTotal(request, startedAt, aliveAnswer, null, request.url)
      }
      if (request.url.includes("%")) {
        const bad = badPercentEncoding(request.method, request.url, routeOf)
        if (bad !== null) return answeredTotal(request, startedAt, json(400, { error: "InvalidInput", field: bad.field, rule: badUrlRule, in: bad.in }), null)
      }
      // The body limit itself (`HttpIncomingMessage.MaxBodySize`) is set once on the server.
      // An agent's assignments long-poll parks no fiber while it waits (`Parking`): held here, at
      // the request's outermost frame, and its route run again once the poll is woken. Its route
      // runs in a context of its own (`Parking`'s `aside`), gone with the router's match by the
      // time the answer goes: labelled by routing its URL again (`routeOf`), as the edge's own answers.
      if (mayPark(request)) {
        HttpEffect.appendPreResponseHandlerUnsafe(fiber.context, (req, response) => answeredTotal(request, startedAt, response, req, routeOf(request.method, request.url)))
        return Parking.hold(request, app)
      }
      HttpEffect.appendPreResponseHandlerUnsafe(fiber.context, (req, response) => answeredTotal(request, startedAt, response, req))
      return app
    })
}

/**
 * The `clientError` listener of the HTTP server: what Node's parser refuses (an oversized URL
 * or header, a malformed request line) is answered with a JSON body, as every other error
 * answer is, then the connection is closed (Node's own answer would be a bare status line): the
 * API's one answer (`StrictJson.answerClientError`, the agents' peer servers' too), counted.
 */
export const onClientError = (metrics: MetricsShape) => (error: Error & { readonly code?: string }, socket: Socket): void => {
  const status = StrictJson.answerClientError(error, socket, maxHeaderSize)
  if (status !== null) counted(metrics, "unknown", "unmatched", status)
}

/**
 * The `checkExpectation` listener of the HTTP server: a request whose `Expect` is not
 * `100-continue` (the one expectation Node meets) gets a JSON 417 naming it, counted by its
 * route as the edge's own answers are (Node's own answer would be a bare 417, counted nowhere).
 * The connection closes: whether the client then sends the body it held back is not known, so
 * where its next request would start is not either.
 */
export const onExpectation =
  (metrics: MetricsShape, routeOf: (method: string, url: string) => string = routeLabeler()) =>
  (request: IncomingMessage, response: ServerResponse): void => {
    const method = request.method ?? "unknown"
    const body = JSON.stringify({
      error: "ExpectationFailed",
      message: "the coordinator meets no expectation but `100-continue`: send the request without this `Expect` header",
      expect: request.headers.expect ?? "",
    })
    response.writeHead(417, { "content-type": "application/json", "content-length": Buffer.byteLength(body), connection: "close" })
    response.end(body)
    counted(metrics, method, routeOf(method, request.url ?? "/"), 417)
  }

/**
 * Counts an answer Node's server sent outside the edge, after it went out. These listeners run
 * inside Node's socket handling, where a throw would end the process: a metric that fails is
 * left uncounted.
 */
const counted = (metrics: MetricsShape, method: string, route: string, status: number): void => {
  try {
    metrics.observeRequest(method, route, status, 0)
  } catch {
    // The answer went out; the metric is not worth the process.
  }
}
