// The Effect client over real HTTP against a plain Node server: the auth layer sends the token,
// and error answers decode to the API's typed errors.
import { Client, Forbidden, ServiceUnavailable } from "@engram/api"
import { Effect, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { createServer } from "node:http"
import type { IncomingHttpHeaders } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

interface Seen {
  readonly method: string
  readonly url: string
  readonly headers: IncomingHttpHeaders
  readonly body: string
}
const seen: Seen[] = []
const fleet = {
  hosts: { total: 1, ready: 1, measured: 1, cordoned: 0, draining: 0 },
  capacityMib: 4096,
  reservedMib: 0,
  freeMib: 4096,
  cpuBudget: 16,
  reservedVcpus: 0,
  freeVcpus: 16,
  queue: { sessions: 0, memMib: 0, vcpus: 0, withoutRoom: 0 },
  unplaceable: { count: 0, largestMemMib: 0, largestVcpus: 0 },
  parks: 0,
  descentsRunning: 0,
  readAt: 1,
}
const server = createServer((req, res) => {
  let body = ""
  req.on("data", (c: Buffer) => (body += c.toString()))
  req.on("end", () => {
    seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body })
    const json = (status: number, value: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { "content-type": "application/json", ...headers })
      res.end(JSON.stringify(value))
    }
    if (req.url === "/v1/fleet") return json(200, fleet)
    if (req.url === "/v1/sessions/s1/idle") return json(403, { error: "Forbidden", message: "the token of host h2 does not act for this resource" })
    if (req.url === "/v1/sessions") return json(503, { error: "Unavailable", message: "store down", retryAfterMs: 2000 }, { "retry-after": "2" })
    return json(404, { error: "NotFound", entity: "route", id: `${req.method} ${req.url}`, message: "no such route" })
  })
})
let baseUrl = ""
beforeAll(async () => {
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>((r) => server.close(() => r())))

const run = <A, E>(f: (c: Client.Client) => Effect.Effect<A, E>) =>
  Effect.runPromise(
    Client.make({ baseUrl, token: Redacted.make("a-secret-token-0123456789") }).pipe(
      Effect.flatMap((c) => Effect.result(f(c))),
      Effect.provide(FetchHttpClient.layer),
    ),
  )

describe("Client", () => {
  it("sends the bearer token and decodes the answer", async () => {
    const r = await run((c) => c.fleet.snapshot())
    expect(r._tag).toBe("Success")
    if (r._tag === "Success") expect(r.success.freeMib).toBe(4096)
    expect(seen.at(-1)?.headers.authorization).toBe("Bearer a-secret-token-0123456789")
  })

  it("a JSON body goes out with its content type", async () => {
    await run((c) => c.sessions.create({ payload: { memMib: 512, vcpus: 1 } }))
    const last = seen.at(-1)!
    expect([last.method, last.url, last.headers["content-type"]]).toEqual(["POST", "/v1/sessions", "application/json"])
    expect(JSON.parse(last.body)).toEqual({ memMib: 512, vcpus: 1 })
  })

  it("error answers decode to the API's typed errors, with their figures", async () => {
    const forbidden = await run((c) => c.sessions.idle({ params: { id: "s1" } }))
    const f = forbidden._tag === "Failure" ? forbidden.failure : undefined
    expect(f).toBeInstanceOf(Forbidden)
    expect(f?._tag).toBe("Forbidden")
    expect(f).toMatchObject({ error: "Forbidden", message: "the token of host h2 does not act for this resource" })
    const unavailable = await run((c) => c.sessions.create({ payload: { memMib: 1, vcpus: 1 } }))
    const u = unavailable._tag === "Failure" ? unavailable.failure : undefined
    expect(u).toBeInstanceOf(ServiceUnavailable)
    // Typed errors are caught by tag, as any Effect error.
    const caught = await run((c) => c.sessions.create({ payload: { memMib: 1, vcpus: 1 } }).pipe(Effect.catchTag("ServiceUnavailable", (e) => Effect.succeed(e.retryAfterMs))))
    expect(caught._tag === "Success" && caught.success).toBe(2000)
    expect(u).toMatchObject({ error: "Unavailable", message: "store down", retryAfterMs: 2000 })
  })
})
