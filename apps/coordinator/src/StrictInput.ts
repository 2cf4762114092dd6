/**
 * The API's `StrictInput` middleware: what the endpoint schemas cannot refuse themselves. An
 * endpoint that declares no query takes no query parameter, one that declares no body takes none
 * (an empty body or `{}`), and a body must be valid UTF-8. Decided once per endpoint when the
 * server is built, so a request pays only for the checks its endpoint needs: a query check is a
 * look for `?` in the URL, a body check one validation of bytes already read for the decoder.
 */
import { BadRequest, StrictInput } from "@engram/api"
import { Effect, Layer } from "effect"
import { HttpServerRequest } from "effect/http"
import { isUtf8 } from "node:buffer"
import { keyName } from "./HttpErrors.js"

const bad = (field: string, rule: string, where: "body" | "query") => new BadRequest({ error: "InvalidInput", field, rule, in: where })

/** The first query parameter of a URL, or undefined when it has none. */
const firstQueryKey = (url: string): string | undefined => {
  const q = url.indexOf("?")
  if (q < 0 || q === url.length - 1) return undefined
  for (const key of new URLSearchParams(url.slice(q + 1)).keys()) return key
  return undefined
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
  return key === undefined ? null : bad(keyName(key), "is not a key of this object (this endpoint takes no body)", "body")
}

/** A body the endpoint's decoder will read must be valid UTF-8 (read once here; the decoder reuses it). */
const notUtf8 = (bytes: ArrayBuffer): BadRequest | null => (isUtf8(bytes) ? null : bad("body", "must be valid UTF-8", "body"))

/**
 * The checks of an endpoint, as one step per request: no query parameter where it declares no
 * query, and a body read only when the request says it has one.
 */
const checks = (takesQuery: boolean, takesBody: boolean) => {
  const judgeBody = takesBody ? notUtf8 : strayBody
  return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const key = takesQuery ? undefined : firstQueryKey(request.url)
    if (key !== undefined) return Effect.fail(bad(keyName(key), "is not a query parameter of this endpoint (it takes none)", "query"))
    if (!declaresBody(request)) return Effect.void
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
