/**
 * How a call reaches the coordinator. Two roads, one error mapping: `@engram/api`'s
 * `HttpApiClient` for the endpoints whose shapes are settled, and a plain JSON request for the
 * ones of the session-lifecycle contract (paginated lists, waits, events, resume's warm answer,
 * host removal and token rotation, the no-room refusal), decoded with the API's record
 * schemas. Every failure becomes one of `Errors`' classes through `Errors.fromAnswer`.
 */
import { Client } from "@engram/api"
import { Effect, Redacted, Schema } from "effect"
import { HttpClient, HttpClientRequest } from "effect/http"
import * as Errors from "../Errors.js"

/** Where the coordinator is and who calls it. */
export interface Target {
  readonly baseUrl: string
  readonly token: Redacted.Redacted<string>
}

/** A JSON request of the contract road. */
export interface Request {
  readonly method: "GET" | "POST" | "PUT" | "DELETE"
  readonly path: string
  readonly query?: Readonly<Record<string, string | number | boolean | undefined>> | undefined
  readonly body?: unknown
}

/** A 2xx answer: its status and JSON body. */
export interface Answered {
  readonly status: number
  readonly body: unknown
}

/** The base URL without trailing slashes, as a string. */
export const normalizeBaseUrl = (url: string | URL): string => String(url).replace(/\/+$/, "")

const messageOf = (e: unknown): string => {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause
    const code = typeof cause === "object" && cause !== null && "code" in cause ? String((cause as { code: unknown }).code) : undefined
    const inner = cause instanceof Error ? cause.message : undefined
    return [code, inner ?? e.message].filter((x) => x !== undefined && x !== "").join(" ")
  }
  return String(e)
}

const asRecord = (v: unknown): Readonly<Record<string, unknown>> | null => (typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null)

/** Sends a JSON request; a 2xx answers its body, anything else fails with the error its status and body name. */
export const send = (target: Target, r: Request): Effect.Effect<Answered, Errors.ClientError, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const url = new URL(`${target.baseUrl}${r.path}`)
    for (const [k, v] of Object.entries(r.query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v))
    let request = HttpClientRequest.make(r.method)(url).pipe(HttpClientRequest.bearerToken(Redacted.value(target.token)), HttpClientRequest.acceptJson)
    if (r.body !== undefined) request = HttpClientRequest.bodyJsonUnsafe(request, r.body)
    const response = yield* HttpClient.execute(request).pipe(Effect.mapError((e) => new Errors.TransportError(target.baseUrl, messageOf(e.reason.cause ?? e))))
    const text = yield* response.text.pipe(Effect.mapError((e) => new Errors.TransportError(target.baseUrl, messageOf(e))))
    let body: unknown = null
    if (text !== "") {
      try {
        body = JSON.parse(text)
      } catch {
        return yield* Effect.fail(new Errors.UnexpectedAnswer({ status: response.status, body: null }, `not JSON (is ${target.baseUrl} an engram coordinator?): ${text.replace(/\s+/g, " ").slice(0, 80)}`))
      }
    }
    if (response.status >= 200 && response.status < 300) return { status: response.status, body }
    return yield* Effect.fail(Errors.fromAnswer({ status: response.status, body: asRecord(body) }))
  })

/** Decodes an answer's body with a schema; a body of another shape is an `UnexpectedAnswer`. */
export const decode =
  <S extends Schema.Codec<unknown, unknown>>(schema: S) =>
  (a: Answered): Effect.Effect<S["Type"], Errors.UnexpectedAnswer> =>
    Schema.decodeUnknownEffect(schema)(a.body).pipe(
      Effect.mapError((e) => new Errors.UnexpectedAnswer({ status: a.status, body: asRecord(a.body) }, e.message)),
    ) as Effect.Effect<S["Type"], Errors.UnexpectedAnswer>

/** The status of each of the API's error classes (their `_tag`). */
const statusOfTag: Readonly<Record<string, number>> = {
  BadRequest: 400,
  Unauthorized: 401,
  Forbidden: 403,
  NotFoundError: 404,
  ConflictError: 409,
  PayloadTooLarge: 413,
  UnsupportedMediaType: 415,
  ServiceUnavailable: 503,
}

/** A failure of `HttpApiClient` as one of this client's errors. */
export const fromApiFailure = (baseUrl: string, e: unknown): Errors.ClientError => {
  const tag = typeof e === "object" && e !== null && "_tag" in e ? String((e as { _tag: unknown })._tag) : ""
  const status = statusOfTag[tag]
  if (status !== undefined) {
    const { _tag: _, ...body } = { ...(e as Record<string, unknown>) }
    return Errors.fromAnswer({ status, body })
  }
  if (tag === "HttpClientError") {
    const reason = (e as { reason: { _tag: string; cause?: unknown; response?: { status: number } } }).reason
    if (reason._tag === "TransportError") return new Errors.TransportError(baseUrl, messageOf(reason.cause ?? e))
    return new Errors.UnexpectedAnswer({ status: reason.response?.status ?? null, body: null }, messageOf(e))
  }
  return new Errors.UnexpectedAnswer({ status: null, body: null }, messageOf(e))
}

/** The API's typed client (HttpApiClient over `EngramApi`) with the bearer token. */
export const apiClient = (target: Target): Effect.Effect<Client.Client, never, HttpClient.HttpClient> =>
  Client.make({ baseUrl: target.baseUrl, token: target.token })

/** Runs a call of the typed client with this client's errors. */
export const viaApi = <A, E, R>(baseUrl: string, call: Effect.Effect<A, E, R>): Effect.Effect<A, Errors.ClientError, R> =>
  Effect.mapError(call, (e) => fromApiFailure(baseUrl, e))
