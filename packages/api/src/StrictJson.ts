/**
 * The API's rules for JSON input, shared by every engram server that reads it: the coordinator's
 * API (`StrictInput`, its decode errors) and its replicas' placements, the host agent's peer
 * server and the dashboard's routes. A body is valid UTF-8 and repeats no key within an object
 * (`JSON.parse` keeps the last of `{"id":"a","id":"b"}`, so the sender's meaning is not known); an
 * object takes only its declared
 * keys; a query parameter is one the endpoint declares, given at most once; a body's content type
 * names no charset but UTF-8; an endpoint without a body is sent none. A refusal names the
 * field (a dotted path from the top) and the rule, as `400 {error: "InvalidInput", field, rule, in}`.
 */
import { Result, Schema, SchemaAST, SchemaIssue } from "effect"

/** Where a refused field is: the request's body, query, path or headers. */
export type InputLocation = "body" | "query" | "path" | "headers"

/** A refused field and its rule (the body of a `400 {error: "InvalidInput", field, rule, in}`). */
export interface InputProblem {
  readonly field: string
  readonly rule: string
  readonly in: InputLocation
}

/** A key as a 400 names it: itself, or `""` for the empty key (a field is never named by nothing). */
export const keyName = (key: string): string => (key === "" ? '""' : key)

/** The rule of a key given twice in one JSON object. */
export const repeatedKeyRule = "is given more than once in one object (each key at most once)"

/** The rule of a body whose bytes are not UTF-8. */
export const utf8Rule = "must be valid UTF-8"

/** The rule of a query parameter given twice. */
export const repeatedQueryRule = "is given more than once (each query parameter at most once)"

/**
 * The first key a JSON text repeats within one object (`{"id":"a","id":"b"}`), as a path from the
 * top (`id`; `labels.zone`; `templates.1.name`), or undefined. One pass over the text; it judges
 * nothing else (the decoder refuses what is not JSON). Keys are compared as JSON reads them (`"a"`
 * and `"\u0061"` are one key).
 */
export const repeatedKey = (json: string): string | undefined => {
  // Per open object its keys so far and the last one read; per open array its element's index.
  const open: ({ readonly keys: Set<string>; key: string } | { index: number })[] = []
  let keyNext = false
  const pathTo = (last: string) => [...open.slice(0, -1).map((o) => ("keys" in o ? o.key : String(o.index))), last].join(".")
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i)
    if (c === 34) {
      let j = i + 1
      let escaped = false
      while (j < json.length) {
        const d = json.charCodeAt(j)
        if (d === 92) {
          escaped = true
          j += 2
          continue
        }
        if (d === 34) break
        j++
      }
      const top = open[open.length - 1]
      if (keyNext && top !== undefined && "keys" in top) {
        let key = json.slice(i + 1, j)
        if (escaped) {
          try {
            key = JSON.parse(json.slice(i, j + 1)) as string
          } catch {
            return undefined
          }
        }
        if (top.keys.has(key)) return pathTo(key)
        top.keys.add(key)
        top.key = key
      }
      keyNext = false
      i = j
    } else if (c === 123) {
      open.push({ keys: new Set(), key: "" })
      keyNext = true
    } else if (c === 91) {
      open.push({ index: 0 })
      keyNext = false
    } else if (c === 125 || c === 93) {
      open.pop()
      keyNext = false
    } else if (c === 44) {
      const top = open[open.length - 1]
      if (top !== undefined && "index" in top) top.index++
      keyNext = top !== undefined && "keys" in top
    }
  }
  return undefined
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true })

const notUtf8: InputProblem = { field: "body", rule: utf8Rule, in: "body" }

/** The first key a JSON text repeats within one object, as its problem (`in: "body"`), or undefined. */
const repeatedKeyProblem = (text: string): InputProblem | undefined => {
  const repeated = repeatedKey(text)
  return repeated === undefined ? undefined : { field: keyName(repeated), rule: repeatedKeyRule, in: "body" }
}

/** A body's bytes as text when they are UTF-8, else undefined. */
export const utf8Text = (bytes: Uint8Array | ArrayBuffer): string | undefined => {
  try {
    return utf8.decode(bytes)
  } catch {
    return undefined
  }
}

/**
 * A JSON body by the API's rules: valid UTF-8, JSON, no key repeated within an object. Answers the
 * parsed value, or the problem (`in: "body"`).
 */
export const parseBody = (bytes: Uint8Array | ArrayBuffer): Result.Result<unknown, InputProblem> => {
  const text = utf8Text(bytes)
  if (text === undefined) return Result.fail(notUtf8)
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return Result.fail({ field: "body", rule: "must be JSON", in: "body" })
  }
  const repeated = repeatedKeyProblem(text)
  return repeated === undefined ? Result.succeed(value) : Result.fail(repeated)
}

/**
 * A body's bytes by the API's rules before a decoder reads them: valid UTF-8, no key repeated
 * within an object; the problem, or undefined. It judges nothing else (whether it is JSON is the
 * decoder's to say).
 */
export const textProblem = (bytes: Uint8Array | ArrayBuffer): InputProblem | undefined => {
  const text = utf8Text(bytes)
  return text === undefined ? notUtf8 : repeatedKeyProblem(text)
}

/** The keys an object schema declares, for a refusal that says what would have been accepted. */
const knownKeys = (ast: SchemaAST.AST): string => (SchemaAST.isObjects(ast) ? ast.propertySignatures.map((p) => String(p.name)).join(", ") : "")

/** The rule a failed check states: Effect's words, except for a key that is missing or unknown. */
const leafRule =
  (where: InputLocation) =>
  (issue: SchemaIssue.Leaf): string => {
    if (issue._tag === "MissingKey") return "is required"
    if (issue._tag === "UnexpectedKey") {
      const known = knownKeys(issue.ast)
      const what = where === "query" ? "a query parameter of this endpoint" : "a key of this object"
      return known === "" ? `is not ${what}` : `is not ${what} (known: ${known})`
    }
    return SchemaIssue.defaultLeafHook(issue)
  }

const formatters = {
  body: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("body") }),
  query: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("query") }),
  path: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("path") }),
  headers: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("headers") }),
}

/**
 * The first problem a schema's decode failure states, as the field (a dotted path; the location
 * when the whole input fails) and its rule; an unknown key is named with the keys that are known.
 */
export const issueProblem = (issue: SchemaIssue.Issue, where: InputLocation): InputProblem => {
  const first = formatters[where](issue).issues[0]
  const path = first?.path?.map((p) => keyName(typeof p === "object" && p !== null ? String((p as { key: unknown }).key) : String(p))) ?? []
  return { field: path.length > 0 ? path.join(".") : where, rule: first?.message ?? "is invalid", in: where }
}

/**
 * Decodes a JSON body by the API's rules (`parseBody`) as `schema`, refusing keys it does not
 * declare (`onExcessProperty: "error"`, as the API's endpoints do). Answers the value or the first
 * problem.
 */
export const decodeBody = <S extends Schema.ConstraintDecoder<unknown>>(schema: S, bytes: Uint8Array | ArrayBuffer): Result.Result<S["Type"], InputProblem> =>
  Result.flatMap(parseBody(bytes), (value) =>
    Result.mapError(Schema.decodeUnknownResult(schema)(value, { onExcessProperty: "error" }), (e) => issueProblem(e.issue, "body")),
  )

/**
 * The first query parameter that `allowed` does not name, or that is given more than once, as its
 * problem; undefined when none. An empty `allowed`: the endpoint takes no query. No `allowed`: any
 * name (the endpoint's schema judges them), each at most once.
 */
export const paramsProblem = (params: URLSearchParams, allowed?: ReadonlySet<string>): InputProblem | undefined => {
  const seen = new Set<string>()
  for (const key of params.keys()) {
    if (allowed !== undefined && !allowed.has(key)) {
      const rule = allowed.size === 0 ? "is not a query parameter of this endpoint (it takes none)" : `is not a query parameter of this endpoint (known: ${[...allowed].join(", ")})`
      return { field: keyName(key), rule, in: "query" }
    }
    if (seen.has(key)) return { field: keyName(key), rule: repeatedQueryRule, in: "query" }
    seen.add(key)
  }
  return undefined
}

/** `paramsProblem` for the query of a request's `url` (its path and query): a look for `?` when it has none. */
export const queryProblem = (url: string, allowed?: ReadonlySet<string>): InputProblem | undefined => {
  const q = url.indexOf("?")
  return q < 0 || q === url.length - 1 ? undefined : paramsProblem(new URLSearchParams(url.slice(q + 1)), allowed)
}

/** Whether a request's headers say it carries a body (a length above 0, or a chunked one). */
export const declaresBody = (headers: Readonly<Record<string, string | undefined>>): boolean => {
  const length = headers["content-length"]
  return (length !== undefined && length !== "0") || headers["transfer-encoding"] !== undefined
}

/** The rule of a body sent to an endpoint that takes none (a GET's). */
export const noBodyRule = "must be empty: this endpoint takes no body"

/**
 * The charset a content type names, lower case, or undefined when it names none: the value of its
 * first `charset` parameter, quoted or not, up to a quote, `;` or space (`application/json;
 * charset="UTF-8"`: `utf-8`; `charset=` or `charset=""` names none).
 */
export const charsetOf = (contentType: string | undefined): string | undefined => {
  const m = contentType === undefined ? null : /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(contentType)
  return m === null ? undefined : (m[1] ?? "").toLowerCase()
}

/** A content type whose charset (`charsetOf`) is not UTF-8 (`utf-8` or `utf8`), as its problem: a body is read as UTF-8. Undefined when it names none or UTF-8. */
export const charsetProblem = (contentType: string | undefined): InputProblem | undefined => {
  const charset = charsetOf(contentType)
  return charset === undefined || charset === "utf-8" || charset === "utf8"
    ? undefined
    : { field: "content-type", rule: `a body's charset must be utf-8 (it is read as UTF-8), not ${charset}`, in: "headers" }
}

/** Whether a content type's media type is `application/json` (any case, whatever its parameters): else a server answers 415 `UnsupportedMediaType`. */
export const isJson = (contentType: string | undefined): boolean =>
  contentType !== undefined && (contentType.split(";", 1)[0] ?? "").trim().toLowerCase() === "application/json"

/** The body of a 415 (`Errors.UnsupportedMediaType`): a request body that is not JSON, its content type as given. */
export const unsupportedMediaType = (contentType: string | undefined, message: string) => ({ error: "UnsupportedMediaType", message, contentType: contentType ?? "" })

/**
 * What a server answers for a request Node's HTTP parser refused (its `clientError`): the
 * status, reason phrase and JSON body. An oversized request line or headers is a 431 naming
 * `maxHeaderBytes`; anything else malformed a 400 `InvalidInput`.
 */
export const clientErrorAnswer = (
  code: string | undefined,
  maxHeaderBytes: number,
): { readonly status: number; readonly reason: string; readonly body: Record<string, unknown> } => {
  switch (code) {
    case "HPE_HEADER_OVERFLOW":
      return {
        status: 431,
        reason: "Request Header Fields Too Large",
        body: { error: "HeadersTooLarge", message: `the request line and headers are larger than ${maxHeaderBytes} bytes`, limitBytes: maxHeaderBytes },
      }
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW":
      return { status: 413, reason: "Payload Too Large", body: { error: "PayloadTooLarge", message: "the chunk extensions of the request body are too large" } }
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return { status: 408, reason: "Request Timeout", body: { error: "RequestTimeout", message: "the request did not arrive in time" } }
    default:
      return {
        status: 400,
        reason: "Bad Request",
        body: { error: "InvalidInput", field: "request", rule: "must be a valid HTTP/1.1 request (a URL of ASCII characters: percent-encode the rest)", in: "headers" },
      }
  }
}

/** The socket of a Node HTTP server's `clientError` (`node:net`'s `Socket`, as far as answering needs it). */
export interface ClientErrorSocket {
  readonly writable: boolean
  end(data: string): unknown
  destroy(): unknown
}

/**
 * A Node HTTP server's `clientError` listener's work: answers what the parser refused
 * (`clientErrorAnswer`) with a JSON body, then closes the connection (Node's own answer is a bare
 * status line), and gives the status; null when nothing can be answered (the peer reset, the
 * socket is closed, an answer was already begun): the socket is destroyed.
 */
export const answerClientError = (error: Error & { readonly code?: string }, socket: ClientErrorSocket, maxHeaderBytes: number): number | null => {
  const response = (socket as ClientErrorSocket & { _httpMessage?: { headersSent?: boolean } })._httpMessage
  if (error.code === "ECONNRESET" || !socket.writable || response?.headersSent === true) {
    socket.destroy()
    return null
  }
  const answer = clientErrorAnswer(error.code, maxHeaderBytes)
  const body = JSON.stringify(answer.body)
  socket.end(
    `HTTP/1.1 ${answer.status} ${answer.reason}\r\ncontent-type: application/json\r\ncontent-length: ${new TextEncoder().encode(body).length}\r\nconnection: close\r\n\r\n${body}`,
  )
  return answer.status
}
