// What one misbehaving connection can hold at the HTTP edge (SocketGuard): pipelined answers
// past a bound close the connection, and the answers queued behind are told; a write nobody
// reads is cut, an idle wait is not; an upgrade's socket is closed once idle. Real sockets, a
// bare node:http server with short bounds, then the coordinator itself.
import { createServer, type Server, type ServerResponse } from "node:http"
import { connect, type Socket } from "node:net"
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import * as SocketGuard from "../src/SocketGuard.js"

const bounds = { maxInFlight: 4, stalledWriteMs: 300 }

/** A raw client: what it received, and a promise of its close. */
const client = (port: number, options: { readonly read?: boolean } = {}) => {
  const socket: Socket = connect({ host: "127.0.0.1", port })
  let received = ""
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  socket.on("error", () => undefined)
  if (options.read === false) socket.pause()
  else socket.on("data", (c: Buffer) => (received += c.toString("latin1")))
  return { socket, closed, received: () => received }
}

const get = (path: string, extra = "") => `GET ${path} HTTP/1.1\r\nhost: x\r\n${extra}\r\n`

describe("SocketGuard on a node:http server", () => {
  let server: Server
  let port: number
  const hanging: ServerResponse[] = []
  let closedHanging = 0
  // The server's side of each connection, with a promise of its close (a client that reads
  // nothing never sees the close: the bytes left for it stay in the kernel).
  const accepted = new Map<number, Promise<void>>()
  /** The close of the server's side of `client`'s connection, once accepted. */
  const serverSideOf = (c: Socket) =>
    new Promise<Promise<void>>((resolve) => {
      const check = () => {
        const found = c.localPort === undefined ? undefined : accepted.get(c.localPort)
        if (found !== undefined) resolve(found)
        else setTimeout(check, 5)
      }
      check()
    })

  let upgrades = 0
  beforeAll(async () => {
    server = SocketGuard.guard(
      // Node's request timeout short here (the coordinator's is 2 minutes), checked often.
      createServer({ requestTimeout: 400, headersTimeout: 400, connectionsCheckingInterval: 50 }, (req, res) => {
        if (req.url === "/hang") {
          hanging.push(res)
          res.once("close", () => closedHanging++)
          return
        }
        if (req.url === "/big") {
          res.writeHead(200, { "content-type": "application/octet-stream" })
          // More than the kernel buffers of both ends hold.
          res.end(Buffer.alloc(32 * 1024 * 1024))
          return
        }
        if (req.url === "/body") {
          req.resume()
          req.once("end", () => res.end("read"))
          return
        }
        if (req.url === "/slow") {
          setTimeout(() => res.end("late"), bounds.stalledWriteMs * 3)
          return
        }
        res.end(req.url)
      }),
      bounds,
    )
    // As the Effect server does: an upgrade listener that takes the socket.
    server.on("upgrade", () => void upgrades++)
    server.on("connection", (socket: Socket) => accepted.set(socket.remotePort ?? -1, new Promise<void>((resolve) => socket.once("close", () => resolve()))))
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()))
    port = (server.address() as { port: number }).port
  })
  afterAll(async () => {
    server.closeAllConnections()
    await new Promise((r) => server.close(r))
  })
  afterEach(() => {
    hanging.length = 0
    closedHanging = 0
  })

  it("answers pipelined requests within the bound, in order", async () => {
    const c = client(port)
    c.socket.write(get("/a") + get("/b") + get("/c") + get("/d"))
    await new Promise<void>((resolve) => {
      const check = () => (c.received().includes("/d") ? resolve() : setTimeout(check, 10))
      check()
    })
    expect([...c.received().matchAll(/\r\n\r\n(\/[a-d])/g)].map((m) => m[1])).toStrictEqual(["/a", "/b", "/c", "/d"])
    c.socket.destroy()
  })

  it("closes a connection that pipelines more unfinished answers than the bound, and tells every answer it held", async () => {
    const c = client(port)
    c.socket.write(get("/hang").repeat(bounds.maxInFlight + 2))
    await c.closed
    await new Promise<void>((resolve) => {
      const check = () => (closedHanging === hanging.length && hanging.length > 0 ? resolve() : setTimeout(check, 10))
      check()
    })
    // Each answer Node dispatched was told the connection closed (not only the one attached to it).
    expect(hanging.length).toBeGreaterThan(bounds.maxInFlight)
    expect(closedHanging).toBe(hanging.length)
  })

  it("cuts a connection whose answer waits unread, but not an idle wait", async () => {
    const idle = client(port)
    idle.socket.write(get("/slow"))
    const stalled = client(port, { read: false })
    stalled.socket.write(get("/big"))
    const serverSide = await serverSideOf(stalled.socket)
    await serverSide
    stalled.socket.destroy()
    // The wait three times the bound long, nothing to write meanwhile: answered.
    await new Promise<void>((resolve) => {
      const check = () => (idle.received().includes("late") ? resolve() : setTimeout(check, 10))
      check()
    })
    expect(idle.received()).toMatch(/^HTTP\/1\.1 200/)
    idle.socket.destroy()
  })

  it("serves a request with an Upgrade header as an ordinary one: answered, and under the request timeout (the API upgrades nothing)", async () => {
    const answered = client(port)
    answered.socket.write(get("/x", "connection: upgrade\r\nupgrade: h2c\r\n"))
    await new Promise<void>((resolve) => {
      const check = () => (answered.received().includes("/x") ? resolve() : setTimeout(check, 10))
      check()
    })
    expect(answered.received()).toMatch(/^HTTP\/1\.1 200/)
    answered.socket.destroy()
    // A body announced and never sent: cut by the request timeout, as without the header.
    const stalled = client(port)
    stalled.socket.write(get("/body", "connection: upgrade\r\nupgrade: x\r\ncontent-length: 100\r\n"))
    await stalled.closed
    expect(stalled.received()).toMatch(/^HTTP\/1\.1 408/)
    expect(upgrades).toBe(0)
  })
})

describe("the coordinator's edge", () => {
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0 } })
  })
  afterAll(() => c?.stop())

  it("closes a connection that pipelines many requests without reading their answers; others are served", async () => {
    const pipelined = client(c.port)
    pipelined.socket.write(get("/openapi.json").repeat(64))
    await pipelined.closed
    // Closed as the fifth arrived: no answer of the 64 went out.
    expect(pipelined.received().match(/HTTP\/1\.1 /g)?.length ?? 0).toBeLessThanOrEqual(SocketGuard.defaultSocketGuard.maxInFlight)
    const other = client(c.port)
    other.socket.write(get("/livez", "connection: close\r\n"))
    await other.closed
    expect(other.received()).toMatch(/^HTTP\/1\.1 200/)
    // With an Upgrade header (curl --http2 to an http:// URL sends one): an ordinary answer.
    const upgrading = client(c.port)
    upgrading.socket.write(get("/livez", "connection: upgrade, close\r\nupgrade: h2c\r\n"))
    await upgrading.closed
    expect(upgrading.received()).toMatch(/^HTTP\/1\.1 200/)
  })
})
