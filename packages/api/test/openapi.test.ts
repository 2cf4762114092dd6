// The OpenAPI document users read: every operation explained, plain numbers, and the open endpoints marked as such.
import { EngramApi, Payloads } from "@engram/api"
import { Names } from "@engram/core"
import { Context, Schema } from "effect"
import { HttpApi, OpenApi } from "effect/http-api"
import { describe, expect, it } from "vitest"

const spec = OpenApi.fromApi(EngramApi) as unknown as {
  readonly info: { readonly title: string; readonly description?: string }
  readonly paths: Record<
    string,
    Record<string, { summary?: string; description?: string; security?: unknown[]; operationId: string; requestBody?: { content: Record<string, { schema: JsonSchema }> } }>
  >
  readonly components: { readonly schemas: Record<string, JsonSchema> }
}

interface JsonSchema {
  readonly $ref?: string
  readonly type?: string
  readonly properties?: Record<string, JsonSchema>
  readonly additionalProperties?: boolean | JsonSchema
  readonly items?: JsonSchema
  readonly pattern?: string
  readonly maxItems?: number
  readonly uniqueItems?: boolean
  readonly anyOf?: readonly JsonSchema[]
  readonly oneOf?: readonly JsonSchema[]
}

/** Every object schema under `schema` (refs followed once), with where it was found. */
const objectsIn = (schema: JsonSchema, where: string, seen = new Set<string>()): { where: string; schema: JsonSchema }[] => {
  if (schema.$ref !== undefined) {
    if (seen.has(schema.$ref)) return []
    seen.add(schema.$ref)
    const target = spec.components.schemas[schema.$ref.replace("#/components/schemas/", "")]
    return target === undefined ? [] : objectsIn(target, `${where} → ${schema.$ref}`, seen)
  }
  const nested = [
    ...Object.entries(schema.properties ?? {}).flatMap(([k, s]) => objectsIn(s, `${where}.${k}`, seen)),
    ...(schema.items === undefined ? [] : objectsIn(schema.items, `${where}[]`, seen)),
    ...[...(schema.anyOf ?? []), ...(schema.oneOf ?? [])].flatMap((s) => objectsIn(s, where, seen)),
  ]
  return schema.type === "object" ? [{ where, schema }, ...nested] : nested
}
/** A body schema with its `$ref` followed. */
const bodyOf = (path: string, method: string): JsonSchema => {
  const schema = spec.paths[path]?.[method]?.requestBody?.content["application/json"]?.schema ?? {}
  return schema.$ref === undefined ? schema : (spec.components.schemas[schema.$ref.replace("#/components/schemas/", "")] ?? {})
}
const operations = Object.entries(spec.paths).flatMap(([path, methods]) => Object.entries(methods).map(([method, op]) => ({ path, method, op })))

describe("the OpenAPI document", () => {
  it("lists every endpoint of the coordinator", () => {
    expect(operations.length).toBeGreaterThanOrEqual(36)
    expect(Object.keys(spec.paths)).toEqual(
      expect.arrayContaining(["/livez", "/readyz", "/metrics", "/openapi.json", "/v1/sessions", "/v1/hosts/{id}/assignments", "/v1/moves/{id}/commit", "/v1/ledger/summary"]),
    )
  })

  it("every operation has a summary and a description", () => {
    for (const { path, method, op } of operations) {
      expect(op.summary, `${method} ${path}`).toMatch(/\S/)
      expect(op.description?.length ?? 0, `${method} ${path}`).toBeGreaterThan(20)
    }
  })

  it("every request body is closed (additionalProperties: false), and the server decodes bodies and queries refusing what they do not declare", () => {
    let bodies = 0
    for (const { path, method, op } of operations) {
      const body = op.requestBody?.content["application/json"]?.schema
      if (body === undefined) continue
      bodies++
      for (const { where, schema } of objectsIn(body, `${method} ${path}`)) {
        // A record (labels) declares what its values are; a struct admits no other key.
        if (Object.keys(schema.properties ?? {}).length > 0 || schema.additionalProperties === undefined) expect(schema.additionalProperties, where).toBe(false)
      }
    }
    expect(bodies).toBeGreaterThanOrEqual(8)
    HttpApi.reflect(EngramApi, {
      onGroup: () => {},
      onEndpoint: ({ endpoint, mergedAnnotations }) => {
        const fallback = Context.getOrUndefined(mergedAnnotations, HttpApi.ParseOptions)
        const payload = Context.getOrUndefined(mergedAnnotations, HttpApi.PayloadParseOptions) ?? fallback
        const query = Context.getOrUndefined(mergedAnnotations, HttpApi.QueryParseOptions) ?? fallback
        expect([payload?.onExcessProperty, query?.onExcessProperty], `${endpoint.method} ${endpoint.path}`).toEqual(["error", "error"])
      },
    })
  })

  it("numbers are plain JSON numbers: no Infinity or NaN strings anywhere", () => {
    const text = JSON.stringify(spec)
    expect(text).not.toContain('"Infinity"')
    expect(text).not.toContain('"NaN"')
  })

  it("the bearer scheme is written `bearer`, as readers of the document compare it (Scalar's samples otherwise say Basic)", () => {
    const schemes = (spec as unknown as { components: { securitySchemes: Record<string, unknown> } }).components.securitySchemes
    expect(schemes).toEqual({ bearer: { type: "http", scheme: "bearer" } })
  })

  it("liveness, readiness and the document itself need no credential; everything else names the bearer scheme", () => {
    const open = new Set(["GET /livez", "GET /healthz", "GET /readyz", "GET /openapi.json"])
    for (const { path, method, op } of operations) {
      const key = `${method.toUpperCase()} ${path}`
      if (open.has(key)) expect(op.security ?? [], key).toEqual([])
      else expect(op.security, key).toEqual([{ bearer: [] }])
    }
  })

  it("states the id rule, and the affinity's 64-host bound and uniqueness, as the server enforces them: one Schema decodes and publishes each", () => {
    const reserve = bodyOf("/v1/reservations", "post").properties ?? {}
    const idSchema = { type: "string", pattern: Names.idPattern.source, minLength: 1, maxLength: Names.idMaxLength }
    // Every id a client chooses: a reservation's and the host it names, a host's, a session's.
    expect([reserve["id"], reserve["hostId"], bodyOf("/v1/hosts", "post").properties?.["id"], bodyOf("/v1/sessions", "post").properties?.["id"]]).toMatchObject([
      idSchema,
      idSchema,
      idSchema,
      idSchema,
    ])
    expect(reserve["ownerId"]).toMatchObject({ type: "string", minLength: 1 })
    const affinity = bodyOf("/v1/sessions", "post").properties?.["affinity"]
    expect(affinity).toMatchObject({ type: "array", maxItems: Names.maxAffinityHosts, uniqueItems: true, items: idSchema })
    expect(Names.maxAffinityHosts).toBe(64)
    // No lookaround: RE2-based readers (Go's regexp) refuse `(?=`, `(?!`, `(?<=` and `(?<!`.
    expect(Names.idPattern.source).not.toMatch(/\(\?<?[=!]/)
    // The published pattern and lengths are the id rule: a reader's validator (ECMA-262) agrees with the server on every edge.
    const published = new RegExp(Names.idPattern.source, "u")
    const readerTakes = (id: string) => id.length >= idSchema.minLength && id.length <= idSchema.maxLength && published.test(id)
    for (const id of ["h1", "a.b_c-D", ".a", "a..", "..a", "...", "....", "x".repeat(100), ".".repeat(100), "", ".", "..", "h1:x", " h1", "x".repeat(101), ".".repeat(101), "é", "a\n"]) {
      expect(readerTakes(id), JSON.stringify(id)).toBe(Names.isId(id))
    }
    for (const id of ["h1", ".a", "a..", "...", "x".repeat(100)]) expect(Names.isId(id), id).toBe(true)
    for (const id of ["", ".", "..", "x".repeat(101), "a b", "a\n"]) expect(Names.isId(id), JSON.stringify(id)).toBe(false)
    // The decoder refuses by the same Schema, in the store's words and at the store's paths.
    const decode = (schema: Schema.Top, input: unknown) => Schema.decodeUnknownExit(schema as Schema.Codec<unknown, unknown>)(input)
    const asked = { hostId: "h1", ownerKind: "external", ownerId: "job", memMib: 1, vcpus: 0 }
    expect(String(decode(Payloads.Reserve, { ...asked, hostId: "h1:x" }))).toContain(Names.idRule)
    expect(String(decode(Payloads.Reserve, { ...asked, id: ".." }))).toContain(Names.idRule)
    expect(decode(Payloads.Reserve, asked)._tag).toBe("Success")
    expect(String(decode(Payloads.Reserve, { ...asked, ownerId: "" }))).toContain(Names.ownerIdRule)
    expect(String(decode(Payloads.Reserve, { ...asked, ownerId: "a\u0000b" }))).toContain(Names.ownerIdRule)
    expect(String(decode(Payloads.CreateHost, { id: "." }))).toContain(Names.idRule)
    expect(String(decode(Payloads.CreateHost, { id: "x".repeat(101) }))).toContain(Names.idRule)
    expect(String(decode(Payloads.CreateSession, { id: "s/1", memMib: 1, vcpus: 1 }))).toContain(Names.idRule)
    expect(decode(Payloads.CreateSession, { id: "s.1", memMib: 1, vcpus: 1 })._tag).toBe("Success")
    const session = { memMib: 1, vcpus: 1 }
    expect(String(decode(Payloads.CreateSession, { ...session, affinity: Array.from({ length: 65 }, (_, i) => `h${i}`) }))).toContain(Names.affinityRule)
    expect(String(decode(Payloads.CreateSession, { ...session, affinity: ["h1", "h2", "h1"] }))).toContain(Names.affinityRepeatRule(0))
    expect(decode(Payloads.CreateSession, { ...session, affinity: Array.from({ length: 64 }, (_, i) => `h${i}`) })._tag).toBe("Success")
  })
})
