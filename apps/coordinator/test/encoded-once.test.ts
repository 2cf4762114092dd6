// `/openapi.json` and `/docs` never change while the coordinator runs (EncodedOnce): each is
// encoded once, and every request hands Node the same bytes to write. Before, each request
// turned the document into JSON text again and handed Node text, which Node encodes anew.
// Observed where the answer leaves for the socket (`ServerResponse.end`), over real HTTP. Both
// carry a strong ETag and Cache-Control no-cache, and a client holding their bytes gets a 304.
import { EngramApi } from "@engram/api"
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { OpenApi } from "effect/http-api"
import { createHash } from "node:crypto"
import { ServerResponse } from "node:http"
import { connect } from "node:net"
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

/** What the server answers to one `GET path` with `headers`, on its own connection: the status, the headers and the body's bytes. */
const exchange = (base: string, path: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Map<string, string>; body: Buffer }> =>
  new Promise((resolve, reject) => {
    const { hostname, port } = new URL(base)
    const lines = [`GET ${path} HTTP/1.1`, `host: ${hostname}`, "connection: close", ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)]
    const socket = connect(Number(port), hostname, () => socket.write(`${lines.join("\r\n")}\r\n\r\n`))
    const chunks: Buffer[] = []
    socket.on("data", (b: Buffer) => chunks.push(b))
    socket.on("error", reject)
    socket.on("close", () => {
      const all = Buffer.concat(chunks)
      const end = all.indexOf("\r\n\r\n")
      const [status = "", ...fields] = all.subarray(0, end).toString("latin1").split("\r\n")
      const map = new Map(fields.map((f) => [f.slice(0, f.indexOf(":")).toLowerCase(), f.slice(f.indexOf(":") + 1).trim()]))
      resolve({ status: Number(status.split(" ")[1]), headers: map, body: all.subarray(end + 4) })
    })
  })

describe("the API's description and reference page are cached by their clients", () => {
  it("carry a strong ETag of their bytes and Cache-Control no-cache; an If-None-Match naming it is a 304 without a body; no credential", async () => {
    const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken: "encoded-admin-token-0123456789" } })
    try {
      for (const path of ["/openapi.json", "/docs"]) {
        const whole = await exchange(c.url, path)
        expect(whole.status, path).toBe(200)
        const etag = whole.headers.get("etag") ?? ""
        // Strong (no W/), and the hash of exactly the bytes sent (chunked bodies aside: these have a length).
        expect(whole.headers.get("content-length"), path).toBe(String(whole.body.length))
        expect(etag, path).toBe(`"${createHash("sha256").update(whole.body).digest("base64url")}"`)
        expect(whole.headers.get("cache-control"), path).toBe("no-cache")
        // The same bytes and tag again.
        const again = await exchange(c.url, path)
        expect([again.headers.get("etag"), again.body.equals(whole.body)], path).toEqual([etag, true])
        for (const ifNoneMatch of [etag, `W/${etag}`, `"something-else", ${etag}`, "*"]) {
          const held = await exchange(c.url, path, { "if-none-match": ifNoneMatch })
          expect([held.status, held.body.length], `${path} ${ifNoneMatch}`).toEqual([304, 0])
          expect([held.headers.get("etag"), held.headers.get("cache-control")], path).toEqual([etag, "no-cache"])
          // A 304's length, when sent, is the whole answer's (RFC 9110 §8.6): never 0.
          expect([undefined, String(whole.body.length)], path).toContain(held.headers.get("content-length"))
        }
        // A tag of other bytes (an older coordinator's) gets the whole answer.
        const stale = await exchange(c.url, path, { "if-none-match": `"an-older-version"` })
        expect([stale.status, stale.body.equals(whole.body), stale.headers.get("etag")], path).toEqual([200, true, etag])
      }
    } finally {
      await c.stop()
    }
  })
})
