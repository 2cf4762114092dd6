/**
 * The API's `StrictInput` middleware: what the endpoint schemas cannot refuse themselves. An
 * endpoint that declares no query takes no query parameter, and one that does takes each at most
 * once (a decoder sees an array it would refuse without saying why); one that declares no body
 * takes none (an empty body or `{}`); a body must be valid UTF-8 (and its content type name no
 * other charset) and repeat no key within an object (`JSON.parse` keeps the last of
 * `{"id":"a","id":"b"}`, so the client's meaning is not known); an agent's stated bound
 * (`engram-agent-call-timeout-ms`), when given, must be one. Decided once per endpoint when the
 * server is built, so a request pays only for the checks its endpoint needs: a header lookup, a
 * query check is a look for `?` in the URL, a body check one pass over bytes already read for
 * the decoder.
 */
import { BadRequest, Errors as ApiErrors, StrictInput, StrictJson } from "@engram/api"
import { agentCallMsOf } from "./AgentBound.js"
import { Effect, Layer } from "effect"
import { HttpServerRequest } from "effect/http"

const bad = (field: string, rule: string, where: "body" | "query") => new BadRequest({ error: "InvalidInput", field, rule, in: where })

const noQuery: ReadonlySet<string> = new Set()

// Body read failures (a body over the limit, a client gone) stay defects, as they are when the
// API's own decoder reads the body: the edge answers them (413, 499).
const bodyBytes = (request: HttpServerRequest.HttpServerRequest) => Effect.orDie(request.arrayBuffer)

/** What a body sent to an endpoint that takes none may be: nothing or `{}`; else its first key is named, or the body. */
const strayBody = (bytes: ArrayBuffer): BadRequest | null => {
  const text = StrictJson.utf8Text(bytes)?.trim() ?? null
  if (text === "") return null
  let parsed: unknown = undefined
  try {
    if (text !== null) parsed = JSON.parse(text)
  } catch {
    // not JSON: refused below as a body this endpoint does not take
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return bad("body", "must be empty or {}: this endpoint takes no body", "body")
  const key = Object.keys(parsed)[0]
  return key === undefined ? null : bad(StrictJson.keyName(key), "is not a key of this object (this endpoint takes no body)", "body")
}

/** A body the endpoint's decoder will read must be valid UTF-8 and repeat no key (`StrictJson.textProblem`; read once here, the decoder reuses it). */
const badText = (bytes: ArrayBuffer): BadRequest | null => {
  const problem = StrictJson.textProblem(bytes)
  return problem === undefined ? null : new BadRequest({ error: "InvalidInput", ...problem })
}

/**
 * The checks of an endpoint, as one step per request: no query parameter where it declares no
 * query, and a body read only when the request says it has one.
 */
const checks = (takesQuery: boolean, takesBody: boolean) => {
  const judgeBody = takesBody ? badText : strayBody
  return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    // An agent's stated bound (`AgentBound`): absent, or a whole number of ms from 1 (given twice, Node joins the values: refused).
    const bound = request.headers[ApiErrors.agentCallTimeoutHeader]
    if (bound !== undefined && agentCallMsOf(request.headers) === null)
      return Effect.fail(new BadRequest({ error: "InvalidInput", field: ApiErrors.agentCallTimeoutHeader, rule: "must be a whole number of milliseconds from 1 to 999999999, given once", in: "headers" }))
    // No query parameter where the endpoint declares none; where it does, each at most once (its schema judges the names).
    const query = StrictJson.queryProblem(request.url, takesQuery ? undefined : noQuery)
    if (query !== undefined) return Effect.fail(new BadRequest({ error: "InvalidInput", ...query }))
    if (!StrictJson.declaresBody(request.headers)) return Effect.void
    const charset = takesBody ? StrictJson.charsetProblem(request.headers["content-type"]) : undefined
    if (charset !== undefined) return Effect.fail(new BadRequest({ error: "InvalidInput", ...charset }))
    return Effect.flatMap(bodyBytes(request), (bytes) => {
      const refused = judgeBody(bytes)
      return refused === null ? Effect.void : Effect.fail(refused)
    })
  })
}

/** `StrictInput`: per endpoint, the checks its declaration calls for, before its own decoding. */
export const StrictInputLive: Layer.Layer<StrictInput> = Layer.succeed(
  StrictInput,
  StrictInput.of((httpEffect, { endpoint }) => Effect.andThen(checks(endpoint.query !== undefined, endpoint.payload.size > 0), httpEffect)),
)
