// `/openapi.json` and `/docs` never change while the coordinator runs (EncodedOnce): each is
// encoded once, and every request hands Node the same bytes to write. Before, each request
// turned the document into JSON text again and handed Node text, which Node encodes anew.
// Observed where the answer leaves for the socket (`ServerResponse.end`), over real HTTP.
import { EngramApi } from "@engram/api"
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { OpenApi } from "effect/http-api"
import { ServerResponse } from "node:http"
import { describe, expect, it, vi } from "vitest"

describe("the API's description and reference page", () => {
  it("are encoded once: every request hands Node the same bytes, never text; the answers are those of before", async () => {
    const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken: "encoded-admin-token-0123456789" } })
    const paths = ["/openapi.json", "/docs"] as const
    const written = new Map<string, unknown[]>(paths.map((p) => [p, []]))
    const end = ServerResponse.prototype.end
    const spy = vi.spyOn(ServerResponse.prototype, "end").mockImplementation(function (this: ServerResponse, ...args: unknown[]) {
      written.get(this.req.url ?? "")?.push(args[0])
      return (end as (...a: unknown[]) => ServerResponse).apply(this, args)
    })
    const answers: { path: string; status: number; type: string | null; body: string }[] = []
    try {
      for (let i = 0; i < 2; i++)
        for (const path of paths) {
          const r = await fetch(`${c.url}${path}`)
          answers.push({ path, status: r.status, type: r.headers.get("content-type"), body: await r.text() })
        }
    } finally {
      spy.mockRestore()
      await c.stop()
    }
    for (const path of paths) {
      const [first, second, ...rest] = written.get(path) ?? []
      expect(first, path).toBeInstanceOf(Uint8Array)
      expect(second, path).toBe(first)
      expect(rest, path).toEqual([])
    }
    const [spec, page, specAgain, pageAgain] = answers
    expect([spec?.status, spec?.type, page?.status, page?.type]).toEqual([200, "application/json", 200, "text/html"])
    expect(JSON.parse(spec?.body ?? "")).toEqual(JSON.parse(JSON.stringify(OpenApi.fromApi(EngramApi))))
    expect(page?.body).toMatch(/^<!doctype html>/)
    expect(page?.body).toContain("api-reference-container")
    expect([specAgain?.body, pageAgain?.body]).toEqual([spec?.body, page?.body])
  })
})
