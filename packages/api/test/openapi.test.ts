// The OpenAPI document users read: every operation explained, plain numbers, and the open endpoints marked as such.
import { EngramApi } from "@engram/api"
import { Context } from "effect"
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
})
