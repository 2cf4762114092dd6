/**
 * The answers that never change while the process runs, encoded once: the OpenAPI document
 * (`/openapi.json`, 144 KB of JSON) and the API reference page (`/docs`, 3.3 MB of HTML with
 * Scalar inlined). Every request is handed the same bytes. Before, the document was turned into
 * JSON text for each request, and both answers went to Node as text, which Node encodes to
 * UTF-8 anew for every request (Effect's Node server writes a text body as text): 8 ms of CPU
 * for each view of the page, whose text is not all ASCII.
 */
import { EngramApi } from "@engram/api"
import { Effect, Layer } from "effect"
import { HttpBody, HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { FindMyWay } from "effect/http"
import { HttpApiScalar, OpenApi } from "effect/http-api"

/** `response` with a text body encoded to bytes now; any other body as it is. */
export const asBytes = (response: HttpServerResponse.HttpServerResponse): HttpServerResponse.HttpServerResponse =>
  response.body._tag === "Uint8Array" && response.body.text !== undefined
    ? HttpServerResponse.setBody(response, HttpBody.uint8Array(Buffer.from(response.body.text, "utf8"), response.body.contentType))
    : response

/** The answer of `GET /openapi.json`: `EngramApi`'s OpenAPI document as JSON, encoded once. */
export const openApiAnswer = (): HttpServerResponse.HttpServerResponse => asBytes(HttpServerResponse.jsonUnsafe(OpenApi.fromApi(EngramApi)))

/**
 * The browsable reference at `path` (Scalar, served from this process: no CDN): the page Scalar
 * builds, asked of it once at start and served as bytes. Scalar's page depends on nothing in the
 * request.
 */
export const docsLayer = (path: `/${string}`) =>
  HttpRouter.use((router) =>
    Effect.gen(function* () {
      // Scalar's route on a router of its own, asked for its page once.
      const own = yield* HttpRouter.make
      yield* Layer.build(HttpApiScalar.layer(EngramApi, { path })).pipe(Effect.provideService(HttpRouter.HttpRouter, own))
      const page = yield* own.asHttpEffect().pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, HttpServerRequest.fromWeb(new Request(`http://localhost${path}`))))
      yield* router.add("GET", path as FindMyWay.PathInput, asBytes(page))
    }),
  )
