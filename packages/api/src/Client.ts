/**
 * An Effect client of the API: `HttpApiClient` over `EngramApi`, and the auth layer it needs
 * (every request carries `Authorization: Bearer <token>`). Needs an `HttpClient`
 * (`FetchHttpClient.layer`, or a platform's).
 *
 * ```ts
 * const engram = yield* Client.make({ baseUrl: "http://127.0.0.1:7070", token })
 * const fleet = yield* engram.fleet.snapshot()
 * ```
 */
import { Data, Effect, Layer, Redacted, Schema } from "effect"
import { HttpClientRequest } from "effect/http"
import type { HttpClient } from "effect/http"
import { HttpApiClient, HttpApiMiddleware } from "effect/http-api"
import { EngramApi } from "./EngramApi.js"
import { BearerAuth, ScrapeAuth } from "./Security.js"

/** A typed client of every endpoint, by group (`client.sessions.create(…)`; ops at the top: `client.readyz()`). */
export type Client = HttpApiClient.ForApi<typeof EngramApi>

/** The client side of the API's security: `Authorization: Bearer <token>` on every request. */
export const layerAuth = (token: Redacted.Redacted<string> | string): Layer.Layer<HttpApiMiddleware.ForClient<BearerAuth> | HttpApiMiddleware.ForClient<ScrapeAuth>> => {
  const secret = typeof token === "string" ? Redacted.make(token) : token
  const withToken = (request: HttpClientRequest.HttpClientRequest) => HttpClientRequest.bearerToken(request, Redacted.value(secret))
  return Layer.mergeAll(
    HttpApiMiddleware.layerClient(BearerAuth, ({ request, next }) => next(withToken(request))),
    HttpApiMiddleware.layerClient(ScrapeAuth, ({ request, next }) => next(withToken(request))),
  )
}

/** Options of a client. */
export interface Options {
  /** The coordinator's URL, e.g. `http://127.0.0.1:7070`. */
  readonly baseUrl: string | URL
  /** The admin token, a host's token, or (for `/metrics` only) the scrape token. */
  readonly token: Redacted.Redacted<string> | string
}

/**
 * An answer whose body does not decode by the API's schemas (not an engram coordinator's, or one
 * of another version). It is told apart from a `SchemaError`, which this client fails with only
 * when a request does not encode by them: nothing was sent then, and the issue names the field
 * and the rule as the coordinator's 400 would (`StrictJson.issueProblem`).
 */
export class UndecodableAnswer extends Data.TaggedError("UndecodableAnswer")<{ readonly message: string }> {}

const answerErrors = (answer: Effect.Effect<unknown, unknown, unknown>): Effect.Effect<unknown, unknown, unknown> =>
  Effect.mapError(answer, (e) => (Schema.isSchemaError(e) ? new UndecodableAnswer({ message: e.message }) : e))

/** A client with its auth; needs an `HttpClient`. */
export const make = (options: Options): Effect.Effect<Client, never, HttpClient.HttpClient> =>
  HttpApiClient.make(EngramApi, { baseUrl: options.baseUrl, transformResponse: answerErrors }).pipe(Effect.provide(layerAuth(options.token)))
