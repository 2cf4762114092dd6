// The OpenAPI document users read: every operation explained, plain numbers, and the open endpoints marked as such.
import { EngramApi } from "@engram/api"
import { OpenApi } from "effect/http-api"
import { describe, expect, it } from "vitest"

const spec = OpenApi.fromApi(EngramApi) as unknown as {
  readonly info: { readonly title: string; readonly description?: string }
  readonly paths: Record<string, Record<string, { summary?: string; description?: string; security?: unknown[]; operationId: string }>>
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
