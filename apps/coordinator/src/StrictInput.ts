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
import { isUtf8 } from "node:buffer"

const bad = (field: string, rule: string, where: "body" | "query") => new BadRequest({ error: "InvalidInput", field, rule, in: where })

/** The first query parameter of a URL, or undefined when it has none. */
const firstQueryKey = (url: string): string | undefined => {
  const q = url.indexOf("?")
  if (q < 0 || q === url.length - 1) return undefined
  for (const key of new URLSearchParams(url.slice(q + 1)).keys()) return key
  return undefined
}

/** The first query parameter a URL gives more than once, or undefined. */
const repeatedQueryKey = (url: string): string | undefined => {
  const q = url.indexOf("?")
  if (q < 0 || q === url.length - 1) return undefined
  const seen = new Set<string>()
  for (const key of new URLSearchParams(url.slice(q + 1)).keys()) {
    if (seen.has(key)) return key
    seen.add(key)
  }
  return undefined
}

/** The charset a content type names (`application/json; charset=latin1`: `latin1`), lower case; undefined when it names none. */
const charsetOf = (contentType: string | undefined): string | undefined => {
  const m = contentType === undefined ? null : /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(contentType)
  return m === null ? undefined : (m[1] ?? "").toLowerCase()
}

/** Whether a request says it carries a body (a length above 0, or a chunked one). */
const declaresBody = (request: HttpServerRequest.HttpServerRequest): boolean => {
  const length = request.headers["content-length"]
  return (length !== undefined && length !== "0") || request.headers["transfer-encoding"] !== undefined
}

// Body read failures (a body over the limit, a client gone) stay defects, as they are when the
// API's own decoder reads the body: the edge answers them (413, 499).
const bodyBytes = (request: HttpServerRequest.HttpServerRequest) => Effect.orDie(request.arrayBuffer)

/** What a body sent to an endpoint that takes none may be: nothing or `{}`; else its first key is named, or the body. */
const strayBody = (bytes: ArrayBuffer): BadRequest | null => {
  const text = isUtf8(bytes) ? Buffer.from(bytes).toString("utf8").trim() : null
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

/** A body the endpoint's decoder will read must be valid UTF-8 and repeat no key (read once here; the decoder reuses it). */
const notUtf8 = (bytes: ArrayBuffer): BadRequest | null => {
  if (!isUtf8(bytes)) return bad("body", StrictJson.utf8Rule, "body")
  const repeated = StrictJson.repeatedKey(Buffer.from(bytes).toString("utf8"))
  return repeated === undefined ? null : bad(StrictJson.keyName(repeated), StrictJson.repeatedKeyRule, "body")
}

/**
 * The checks of an endpoint, as one step per request: no query parameter where it declares no
 * query, and a body read only when the request says it has one.
 */
const checks = (takesQuery: boolean, takesBody: boolean) => {
  const judgeBody = takesBody ? notUtf8 : strayBody
  return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    // An agent's stated bound (`AgentBound`): absent, or a whole number of ms from 1 (given twice, Node joins the values: refused).
    const bound = request.headers[ApiErrors.agentCallTimeoutHeader]
    if (bound !== undefined && agentCallMsOf(request.headers) === null)
      return Effect.fail(new BadRequest({ error: "InvalidInput", field: ApiErrors.agentCallTimeoutHeader, rule: "must be a whole number of milliseconds from 1 to 999999999, given once", in: "headers" }))
    const key = takesQuery ? undefined : firstQueryKey(request.url)
    if (key !== undefined) return Effect.fail(bad(StrictJson.keyName(key), "is not a query parameter of this endpoint (it takes none)", "query"))
    const repeated = takesQuery ? repeatedQueryKey(request.url) : undefined
    if (repeated !== undefined) return Effect.fail(bad(StrictJson.keyName(repeated), StrictJson.repeatedQueryRule, "query"))
    if (!declaresBody(request)) return Effect.void
    const charset = takesBody ? charsetOf(request.headers["content-type"]) : undefined
    if (charset !== undefined && charset !== "utf-8" && charset !== "utf8")
      return Effect.fail(new BadRequest({ error: "InvalidInput", field: "content-type", rule: `a body's charset must be utf-8 (it is read as UTF-8), not ${charset}`, in: "headers" }))
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
