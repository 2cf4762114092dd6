/**
 * fast-check arbitraries built from the API's OpenAPI document (`OpenApi.fromApi(EngramApi)`):
 * for every operation, requests with valid bodies (from the operation's JSON schema), hostile
 * bodies (a field of the wrong type, huge or non-finite numbers, NUL, lone surrogates, deep
 * nesting, huge strings within the body limit, text that is not JSON), hostile path ids and
 * hostile queries. The fuzzer sends them to a real coordinator.
 */
import fc from "fast-check"

/** The part of a JSON schema the API's document uses. */
export interface JsonSchema {
  readonly type?: string | readonly string[]
  readonly properties?: Readonly<Record<string, JsonSchema>>
  readonly required?: readonly string[]
  readonly additionalProperties?: boolean | JsonSchema
  readonly items?: JsonSchema
  readonly enum?: readonly unknown[]
  readonly anyOf?: readonly JsonSchema[]
  readonly oneOf?: readonly JsonSchema[]
  readonly $ref?: string
}

interface Parameter {
  readonly name: string
  readonly in: "path" | "query" | "header" | "cookie"
  readonly required?: boolean
  readonly schema?: JsonSchema
}

/** One operation of the document. */
export interface Operation {
  readonly method: string
  /** The path template, `/v1/sessions/{id}`. */
  readonly path: string
  readonly pathParams: readonly string[]
  readonly query: readonly Parameter[]
  readonly body: JsonSchema | null
}

/** Every operation of an OpenAPI document. */
export const operations = (doc: { readonly paths: Readonly<Record<string, Readonly<Record<string, unknown>>>> }): Operation[] =>
  Object.entries(doc.paths).flatMap(([path, methods]) =>
    Object.entries(methods).map(([method, raw]) => {
      const op = raw as { parameters?: Parameter[]; requestBody?: { content?: Record<string, { schema?: JsonSchema }> } }
      const params = op.parameters ?? []
      return {
        method: method.toUpperCase(),
        path,
        pathParams: params.filter((p) => p.in === "path").map((p) => p.name),
        query: params.filter((p) => p.in === "query"),
        body: op.requestBody?.content?.["application/json"]?.schema ?? null,
      }
    }),
  )

/** A request to send: method, the path with its query, and the body (a value to encode as JSON, or raw text). */
export interface FuzzRequest {
  readonly operation: string
  readonly method: string
  readonly path: string
  readonly body: { readonly json: unknown } | { readonly raw: string } | null
  /** Which credential it carries. */
  readonly auth: "admin" | "host" | "none" | "garbage"
  /**
   * A key the operation does not declare, which the request carries (in its body or its query),
   * or `body` for a body sent to an operation that takes none; null when it carries none. Such
   * a request is never accepted.
   */
  readonly undeclared: string | null
  /** Whether a percent-escape of its path or query is malformed or not UTF-8: never accepted either. */
  readonly badEscape: boolean
}

// ---------------------------------------------------------------------------------------------
// Hostile values
// ---------------------------------------------------------------------------------------------

const NUL = "\u0000"
const LONE_HIGH = "\uD800"
const LONE_LOW = "\uDC00"

/** Strings a store or a parser may choke on. */
export const hostileString: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom("", " ", ".", "..", "/", "a/b", "\\", "%", "%00", "%ZZ", "null", "undefined", "NaN", "-0", "1e309", "{}", "[]", "\"", "'", "' OR 1=1 --"),
  fc.constantFrom(NUL, `a${NUL}b`, LONE_HIGH, LONE_LOW, `x${LONE_HIGH}y`, `${LONE_LOW}${LONE_HIGH}`, "\uFEFF", "\u202E", "é", "👍", "\r\n", "\t"),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.integer({ min: 100, max: 300 }).map((n) => "a".repeat(n)),
  fc.constantFrom("x".repeat(101), "y".repeat(1000), "z".repeat(100)),
)

/** Numbers at and beyond every edge. */
export const hostileNumber: fc.Arbitrary<number> = fc.oneof(
  fc.constantFrom(0, -0, -1, 1e21, -1e21, 1e308, -1e308, Number.MAX_SAFE_INTEGER + 2, Number.MIN_VALUE, 0.5, 2 ** 53, 2 ** 63, 2 ** 31, -(2 ** 31)),
  fc.double({ noNaN: true, noDefaultInfinity: true }),
)

/** A value of any JSON type, nested deep or not. */
const anyJson: fc.Arbitrary<unknown> = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  hostileNumber,
  hostileString,
  fc.array(fc.oneof(fc.integer(), hostileString), { maxLength: 5 }),
  fc.dictionary(hostileString, fc.oneof(fc.integer(), hostileString), { maxKeys: 4 }),
)

/** Nested arrays or objects, as values (deep enough for a recursive validator, shallow enough to stringify). */
const deep: fc.Arbitrary<unknown> = fc.tuple(fc.integer({ min: 50, max: 500 }), fc.boolean()).map(([depth, arrays]) => {
  let v: unknown = 1
  for (let i = 0; i < depth; i++) v = arrays ? [v] : { a: v }
  return v
})

/** Body texts that are not (valid) JSON, or JSON of the wrong shape. */
const hostileRaw: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom("", "{", "}", "[", "{\"a\":", "null", "true", "0", "\"text\"", "[]", "{}", "\uFEFF{}", "{\"__proto__\":{\"polluted\":1}}", "{\"constructor\":{\"prototype\":{}}}", "NaN", "1e999"),
  fc.string({ unit: "binary", maxLength: 60 }),
  // Huge, but within the 1 MiB body limit.
  fc.integer({ min: 200_000, max: 900_000 }).map((n) => JSON.stringify({ id: "h".repeat(n) })),
  fc.integer({ min: 20_000, max: 100_000 }).map((n) => `[${"1,".repeat(n)}1]`),
  // Nested far deeper than any recursive parser's stack, as text.
  fc.tuple(fc.integer({ min: 5_000, max: 100_000 }), fc.boolean()).map(([d, arrays]) => (arrays ? `${"[".repeat(d)}1${"]".repeat(d)}` : `${'{"a":'.repeat(d)}1${"}".repeat(d)}`)),
)

// ---------------------------------------------------------------------------------------------
// Valid values from a schema
// ---------------------------------------------------------------------------------------------

/** Arbitraries for valid values of `schema`; `ids` are ids that exist (strings are drawn from them half the time). */
export const valid = (schema: JsonSchema, ids: readonly string[], field = ""): fc.Arbitrary<unknown> => {
  if (schema.enum !== undefined) return fc.constantFrom(...schema.enum)
  const alternatives = schema.anyOf ?? schema.oneOf
  if (alternatives !== undefined) return fc.oneof(...alternatives.map((s) => valid(s, ids, field)))
  const type = Array.isArray(schema.type) ? schema.type[0] : schema.type
  switch (type) {
    case "string":
      return ids.length > 0 ? fc.oneof(fc.constantFrom(...ids), idString) : idString
    case "number":
    case "integer":
      // Budgets and figures: small positive numbers mostly, an edge sometimes.
      return fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 1, max: 4096 }) }, { weight: 1, arbitrary: fc.constantFrom(0, 1, 0.5, 8192) })
    case "boolean":
      return fc.boolean()
    case "null":
      return fc.constant(null)
    case "array":
      return fc.array(valid(schema.items ?? {}, ids, field), { maxLength: 3 })
    case "object": {
      const props = schema.properties ?? {}
      const required = new Set(schema.required ?? [])
      const record: Record<string, fc.Arbitrary<unknown>> = {}
      for (const [k, s] of Object.entries(props)) record[k] = valid(s, ids, k)
      if (Object.keys(props).length === 0 && typeof schema.additionalProperties === "object") {
        return fc.dictionary(idString, valid(schema.additionalProperties, ids), { maxKeys: 3 })
      }
      return fc.record(record, { requiredKeys: [...required] })
    }
    default:
      return anyJson
  }
}

/** Ids by the one id rule (SPEC §12). */
const idString: fc.Arbitrary<string> = fc.stringMatching(/^[A-Za-z0-9._-]{1,24}$/).filter((s) => s !== "." && s !== "..")

/** A body for `schema`: valid, valid with one field made hostile, wrong altogether, or raw text. */
export const body = (schema: JsonSchema, ids: readonly string[]): fc.Arbitrary<{ json: unknown } | { raw: string }> => {
  const ok = valid(schema, ids)
  const fields = Object.keys(schema.properties ?? {})
  const mutated =
    fields.length === 0
      ? ok
      : fc
          .tuple(ok, fc.constantFrom(...fields, "unknownField"), fc.oneof(anyJson, deep))
          .map(([v, k, bad]) => (typeof v === "object" && v !== null ? { ...(v as object), [k]: bad } : v))
  return fc.oneof(
    { weight: 3, arbitrary: ok.map((json) => ({ json })) },
    { weight: 4, arbitrary: mutated.map((json) => ({ json })) },
    { weight: 1, arbitrary: fc.oneof(anyJson, deep).map((json) => ({ json })) },
    { weight: 1, arbitrary: hostileRaw.map((raw) => ({ raw })) },
  )
}

/** A path id: an existing one, a valid new one, or hostile text (sent encoded, or raw as typed). */
export const pathId = (ids: readonly string[]): fc.Arbitrary<string> =>
  fc.oneof(
    { weight: 3, arbitrary: ids.length > 0 ? fc.constantFrom(...ids).map(encodeURIComponent) : idString },
    { weight: 1, arbitrary: idString },
    { weight: 3, arbitrary: hostileString.map(encodeURIComponentLoose) },
    { weight: 1, arbitrary: fc.constantFrom("%00", "%ZZ", "%", "%E0%A4%A", "%ED%A0%80", "%FF", "a%C3", "%C3%A9", "..", ".", "%2e%2e", "a%2Fb", "%20", "x".repeat(2000)) },
  )

/** A query string for `params`: each absent, valid or hostile; sometimes a repeated or an unknown one. */
export const query = (params: readonly Parameter[], ids: readonly string[]): fc.Arbitrary<string> => {
  // An undeclared parameter now and then (always refused): most requests should reach the handlers.
  if (params.length === 0) return fc.oneof({ weight: 4, arbitrary: fc.constant("") }, { weight: 1, arbitrary: fc.constantFrom("?x=1", "?%ZZ=%00") })
  const each = params.map((p) =>
    fc.option(
      fc.oneof(
        { weight: 3, arbitrary: validQueryValue(p, ids) },
        { weight: 2, arbitrary: fc.oneof(hostileString, hostileNumber.map(String)).map(encodeURIComponentLoose) },
        { weight: 1, arbitrary: fc.constantFrom("%00", "%ZZ", "%ED%A0%80", "%FF", "caf%E9", "", "1e309", "-1", "1.5", "NaN", "Infinity") },
      ),
      { freq: 2 },
    ),
  )
  return fc.tuple(fc.tuple(...each), fc.boolean(), fc.nat({ max: 4 }).map((n) => n === 0)).map(([values, repeat, unknown]) => {
    const parts: string[] = []
    values.forEach((v, i) => {
      if (v === null) return
      parts.push(`${params[i]!.name}=${v}`)
      if (repeat) parts.push(`${params[i]!.name}=${v}`)
    })
    if (unknown) parts.push("unknown=%00")
    return parts.length === 0 ? "" : `?${parts.join("&")}`
  })
}

const validQueryValue = (p: Parameter, ids: readonly string[]): fc.Arbitrary<string> => {
  // Long-polls: bounded so a valid wait answers in a second or two (the fuzzer bounds every request).
  if (p.name === "timeoutMs" || p.name === "waitMs") return fc.integer({ min: 0, max: 1500 }).map(String)
  if (p.name === "limit") return fc.integer({ min: 1, max: 1000 }).map(String)
  const v = valid(p.schema ?? { type: "string" }, ids, p.name)
  return v.map((x) => encodeURIComponent(typeof x === "string" ? x : JSON.stringify(x)))
}

/** `encodeURIComponent`, except that a lone surrogate (which it refuses) is sent as its raw UTF-8 bytes' escapes. */
const encodeURIComponentLoose = (s: string): string => {
  try {
    return encodeURIComponent(s)
  } catch {
    return [...s]
      .map((ch) => {
        const code = ch.charCodeAt(0)
        if (ch.length === 1 && code >= 0xd800 && code <= 0xdfff) {
          return `%${(0xe0 | (code >> 12)).toString(16).toUpperCase()}%${(0x80 | ((code >> 6) & 0x3f)).toString(16).toUpperCase()}%${(0x80 | (code & 0x3f)).toString(16).toUpperCase()}`
        }
        return encodeURIComponent(ch)
      })
      .join("")
  }
}

/** Whether some percent-escape of a URL's path segments or query parts is malformed or not UTF-8. */
const hasBadEscape = (url: string): boolean =>
  url.split(/[/?&=]/).some((part) => {
    try {
      decodeURIComponent(part)
      return false
    } catch {
      return true
    }
  })

/** The first key of `req` that `op` does not declare (see `FuzzRequest.undeclared`). */
const undeclaredIn = (op: Operation, query: string, body: FuzzRequest["body"]): string | null => {
  const params = new Set(op.query.map((p) => p.name))
  for (const key of new URLSearchParams(query.replace(/^\?/, "")).keys()) if (!params.has(key)) return key
  if (body === null) return null
  if (op.body === null) {
    const text = "json" in body ? JSON.stringify(body.json) : body.raw
    return text.trim() === "" || text.trim() === "{}" ? null : "body"
  }
  const json = "json" in body ? body.json : undefined
  const declared = op.body.properties
  if (declared === undefined || typeof json !== "object" || json === null || Array.isArray(json)) return null
  return Object.keys(json).find((k) => !(k in declared)) ?? null
}

/** A request for `op`: its path ids, its query and its body, with a credential. */
export const request = (op: Operation, ids: readonly string[]): fc.Arbitrary<FuzzRequest> =>
  fc
    .tuple(
      fc.tuple(...op.pathParams.map(() => pathId(ids))),
      query(op.query, ids),
      // GET and HEAD carry no body (fetch cannot send one); other bodiless operations get a stray one now and then.
      op.body !== null
        ? body(op.body, ids)
        : op.method === "GET" || op.method === "HEAD"
          ? fc.constant(null)
          : fc.oneof({ weight: 5, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: hostileRaw.map((raw) => ({ raw })) }),
      fc.constantFrom<FuzzRequest["auth"]>("admin", "admin", "admin", "admin", "host", "none", "garbage"),
    )
    .map(([pathValues, q, b, auth]) => {
      let path = op.path
      op.pathParams.forEach((name, i) => {
        path = path.replace(`{${name}}`, pathValues[i]!)
      })
      return { operation: `${op.method} ${op.path}`, method: op.method, path: `${path}${q}`, body: b, auth, undeclared: undeclaredIn(op, q, b), badEscape: hasBadEscape(`${path}${q}`) }
    })

/** A request for any operation of `ops`. */
export const anyRequest = (ops: readonly Operation[], ids: readonly string[]): fc.Arbitrary<FuzzRequest> => fc.oneof(...ops.map((op) => request(op, ids)))
