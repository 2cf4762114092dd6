// The HTTP server's connections (Connections): the open-connections gauge, over real sockets
// against a coordinator.
import { Metrics, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { Effect } from "effect"
import { request as httpRequest } from "node:http"
import { connect } from "node:net"
import type { Socket } from "node:net"
import { afterEach, describe, expect, it, vi } from "vitest"

const adminToken = "connections-admin-token-0123456789"

/** A raw connection that sends nothing, with a promise of its close. */
const open = (url: string): { readonly socket: Socket; readonly closed: Promise<void> } => {
  const { hostname, port } = new URL(url)
  const socket = connect({ host: hostname, port: Number(port) })
  socket.on("error", () => undefined)
  return { socket, closed: new Promise<void>((resolve) => socket.once("close", () => resolve())) }
}

/** A GET on a connection of its own, closed after the answer (no kept-alive socket left behind). */
const get = (url: string, path: string, token?: string): Promise<{ readonly status: number; readonly body: string }> =>
  new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, { agent: false, headers: token === undefined ? {} : { authorization: `Bearer ${token}` } }, (res) => {
      let body = ""
      res.on("data", (c: Buffer) => (body += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on("error", reject)
    req.end()
  })

const gauge = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(Metrics), (m) => m.connectionsOpen.get()))
const exposed = (text: string, name: string) => Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text)?.[1])

const running: RunningCoordinator[] = []
const sockets: Socket[] = []
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy()
  await Promise.all(running.splice(0).map((c) => c.stop()))
})
const start = async () => {
  const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken } })
  running.push(c)
  return c
}
const connection = (url: string) => {
  const c = open(url)
  sockets.push(c.socket)
  return c
}

describe("engram_http_connections_open", () => {
  it("is the HTTP server's open connections now: up as raw connections open, the scrape's own counted, down as they close", async () => {
    const c = await start()
    const before = await gauge(c)
    const held = [connection(c.url), connection(c.url), connection(c.url)]
    await vi.waitFor(async () => expect(await gauge(c)).toBe(before + 3), { timeout: 30_000, interval: 10 })
    const scrape = await get(c.url, "/metrics", adminToken)
    expect(scrape.status).toBe(200)
    expect(scrape.body).toContain("# HELP engram_http_connections_open ")
    expect(exposed(scrape.body, "engram_http_connections_open")).toBe(before + 4)
    for (const h of held) h.socket.destroy()
    await vi.waitFor(async () => expect(await gauge(c)).toBe(before), { timeout: 30_000, interval: 10 })
  })
})
