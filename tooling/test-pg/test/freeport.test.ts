// freePort: a port a child process binds a moment later. It must come from below the kernel's
// ephemeral range, where no outgoing connection's local port (and no listen(0)) can take it in
// that moment: the replicas end-to-end test lost its whole file to `EADDRINUSE` on a port the
// kernel had handed out again.
import { readFileSync } from "node:fs"
import { createServer, type Server } from "node:net"
import { describe, expect, it } from "vitest"
import { freePort } from "../src/index.js"

const ephemeralLow = (): number => Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])

const listen = (port: number) =>
  new Promise<Server>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(port, "127.0.0.1", () => resolve(server))
  })

describe("freePort", () => {
  it("hands out distinct ports below the kernel's ephemeral range, each bindable, even while the earlier ones are held", async () => {
    const low = ephemeralLow()
    const held: Server[] = []
    const ports: number[] = []
    try {
      for (let i = 0; i < 40; i++) {
        const port = await freePort()
        ports.push(port)
        held.push(await listen(port))
      }
      expect(new Set(ports).size).toBe(ports.length)
      for (const port of ports) {
        expect(port).toBeGreaterThanOrEqual(1024)
        expect(port).toBeLessThan(low)
      }
    } finally {
      await Promise.all(held.map((s) => new Promise((r) => s.close(r))))
    }
  })

  it("never hands out one port twice, even when it was closed again between the calls", async () => {
    const ports = await Promise.all(Array.from({ length: 40 }, () => freePort()))
    expect(new Set(ports).size).toBe(ports.length)
  })
})
