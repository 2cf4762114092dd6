/**
 * What every request meets before and after the API: the request body limit (a declared
 * length over it is refused at once; a streamed body is cut off while it streams, so an
 * oversized body never reaches memory), `503` while the coordinator shuts down, a JSON body on
 * every error answer (the router's 404, 413, 415, a 503 of an interrupted request, a 500), and
 * the request metrics (count and duration by method, route template and status).
 */
import { EngramApi, Errors } from "@engram/api"
import { Dashboard } from "@engram/dashboard"
import { ByteSize, Effect } from "effect"
import { FindMyWay, HttpEffect, HttpIncomingMessage, HttpServerRequest, HttpServerResponse } from "effect/http"
import { HttpApi } from "effect/http-api"
import type { MetricsShape } from "./Metrics.js"

/** What the edge needs to know. */
export interface EdgeOptions {
  readonly maxBodyBytes: number
  /** True once the coordinator began to shut down: new requests get 503. */
  readonly closing: () => boolean
  readonly metrics: MetricsShape
}

/** The route template of a request (`/v1/sessions/:id`), for metric labels; `unmatched` when none. */
export const routeLabeler = (): ((method: string, url: string) => string) => {
  const router = FindMyWay.make<string>()
  HttpApi.reflect(EngramApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint }) => router.on(endpoint.method, endpoint.path as FindMyWay.PathInput, endpoint.path),
  })
  router.on("GET", "/docs", "/docs")
  for (const path of ["/", "/ui", "/ui/changes", "/ui/history", ...Dashboard.assetPaths()]) router.on("GET", path as FindMyWay.PathInput, path)
  return (method, url) => router.find(method, url.split("?")[0] ?? url)?.handler ?? "unmatched"
}

const json = (status: number, body: Record<string, unknown>, headers: Record<string, string> = {}) => HttpServerResponse.jsonUnsafe(body, { status, headers })

const unavailable = (message: string, retryAfterMs = 1000) =>
  json(503, { error: "Unavailable", message, retryAfterMs }, { "retry-after": String(Errors.retryAfterSeconds(retryAfterMs)) })

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
      return json(415, {
        error: "UnsupportedMediaType",
        message: "send the body as JSON: `content-type: application/json` (or no content type at all)",
        contentType: request.headers["content-type"] ?? "",
      })
    case 503:
      return unavailable("the coordinator is shutting down or the request was cut off; retry")
    default:
      return json(r.status, { error: r.status >= 500 ? "Internal" : "HttpError", message: r.status >= 500 ? "internal error" : `HTTP ${r.status}` })
  }
}

/**
 * The server middleware (`HttpRouter.serve({middleware})`): shutdown 503s and a declared body
 * over the limit are answered here; every other request runs with the body limit in force and a
 * pre-response hook that gives its error answer a JSON body and counts it. (The hook sees every
 * answer the server sends, the router's 404 and an interrupted request's 503 included.)
 */
export const edge = (options: EdgeOptions) => {
  const routeOf = routeLabeler()
  const limit = ByteSize.bytes(options.maxBodyBytes)
  return <E, R>(app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
    Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      const startedAt = performance.now()
      const answered = (response: HttpServerResponse.HttpServerResponse) => {
        options.metrics.observeRequest(request.method, routeOf(request.method, request.url), response.status, (performance.now() - startedAt) / 1000)
        return response
      }
      if (options.closing()) return answered(unavailable("the coordinator is shutting down; retry"))
      const declared = Number(request.headers["content-length"] ?? "0")
      if (Number.isFinite(declared) && declared > options.maxBodyBytes) return answered(tooLarge(options.maxBodyBytes))
      yield* HttpEffect.appendPreResponseHandler((req, response) => Effect.sync(() => answered(asJson(response, req, options.maxBodyBytes))))
      return yield* app.pipe(Effect.provideService(HttpIncomingMessage.MaxBodySize, limit))
    })
}
