/**
 * The answers that never change while the process runs, encoded once: the OpenAPI document
 * (`/openapi.json`, 144 KB of JSON) and the API reference page (`/docs`, 3.3 MB of HTML with
 * Scalar inlined). Every request is handed the same bytes. Before, the document was turned into
 * JSON text for each request, and both answers went to Node as text, which Node encodes to
 * UTF-8 anew for every request (Effect's Node server writes a text body as text): 8 ms of CPU
 * for each view of the page, whose text is not all ASCII.
 *
 * Each carries a strong `ETag` (the SHA-256 of its bytes, computed once) and `Cache-Control:
 * no-cache`: a client may keep the bytes but asks again each time, and a request whose
 * `If-None-Match` names the tag is answered `304` without a body. Not a max-age: the bytes
 * change with the coordinator's version, and during a rolling upgrade the replicas behind one
 * address serve different ones; a revalidation costs a round trip, not the 3.3 MB. Both stay
 * public (SPEC §12: the description and the reference need no credential).
 */
import { EngramApi } from "@engram/api"
import { Effect, Layer } from "effect"
import { HttpBody, HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { FindMyWay } from "effect/http"
import { HttpApiScalar, OpenApi } from "effect/http-api"
import { createHash } from "node:crypto"

/** `response` with a text body encoded to bytes now; any other body as it is. */
export const asBytes = (response: HttpServerResponse.HttpServerResponse): HttpServerResponse.HttpServerResponse =>
  response.body._tag === "Uint8Array" && response.body.text !== undefined
    ? HttpServerResponse.setBody(response, HttpBody.uint8Array(Buffer.from(response.body.text, "utf8"), response.body.contentType))
    : response

/** Revalidate every time (see the module's header): a stale copy is never used unasked. */
export const cacheControl = "no-cache"

/** An answer that never changes while the process runs, with its validator. */
export interface Cached {
  /** The strong entity tag of its bytes (quoted, as the `ETag` header carries it). */
  readonly etag: string
  /** The whole answer, with `ETag` and `Cache-Control`. */
  readonly answer: HttpServerResponse.HttpServerResponse
  /** The `304` to a request that holds these bytes: no body, the same `ETag` and `Cache-Control`. */
  readonly notModified: HttpServerResponse.HttpServerResponse
}

/** `response` (a body of bytes: `asBytes`) with its entity tag, hashed once here. */
export const cached = (response: HttpServerResponse.HttpServerResponse): Cached => {
  const bytes = response.body._tag === "Uint8Array" ? response.body.body : new Uint8Array()
  const etag = `"${createHash("sha256").update(bytes).digest("base64url")}"`
  const headers = { etag, "cache-control": cacheControl }
  return { etag, answer: HttpServerResponse.setHeaders(response, headers), notModified: HttpServerResponse.empty({ status: 304, headers }) }
}

/**
 * Whether an `If-None-Match` value names `etag`: `*`, or a list of entity tags compared weakly
 * (RFC 9110 §13.1.2: `W/"x"` names `"x"` too).
 */
export const matches = (ifNoneMatch: string, etag: string): boolean => {
  for (const part of ifNoneMatch.split(",")) {
    const tag = part.trim()
    if (tag === "*" || (tag.startsWith("W/") ? tag.slice(2) : tag) === etag) return true
  }
  return false
}

/** The answer to a request with this `If-None-Match` (absent: the whole answer). */
export const answerFor = (c: Cached, ifNoneMatch: string | undefined): HttpServerResponse.HttpServerResponse =>
  ifNoneMatch !== undefined && matches(ifNoneMatch, c.etag) ? c.notModified : c.answer

/** The answer of `GET /openapi.json`: `EngramApi`'s OpenAPI document as JSON, encoded and tagged once. */
export const openApiAnswer = (): Cached => cached(asBytes(HttpServerResponse.jsonUnsafe(OpenApi.fromApi(EngramApi))))

/**
 * The browsable reference at `path` (Scalar, served from this process: no CDN): the page Scalar
 * builds, asked of it once at start and served as bytes, tagged once (`cached`). Scalar's page
 * depends on nothing in the request.
 */
export const docsLayer = (path: `/${string}`) =>
  HttpRouter.use((router) =>
    Effect.gen(function* () {
      // Scalar's route on a router of its own, asked for its page once.
      const own = yield* HttpRouter.make
      yield* Layer.build(HttpApiScalar.layer(EngramApi, { path })).pipe(Effect.provideService(HttpRouter.HttpRouter, own))
      const page = yield* own.asHttpEffect().pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(new Request(`http://localhost${path}`))))
      const reference = cached(asBytes(page))
      yield* router.add(
        "GET",
        path as FindMyWay.PathInput,
        Effect.map(Effect.service(HttpServerRequest.HttpServerRequest), (request) => answerFor(reference, request.headers["if-none-match"])),
      )
    }),
  )
