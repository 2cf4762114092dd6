// A TCP proxy in front of a server that a test can cut, as a network partition or a
// database restart would: every open connection is reset at once, and (while refusing)
// new ones are reset on arrival. It can also stall, as a silent partition does: nothing
// is forwarded either way and new connections are held unanswered, until it heals; or
// black-hole the connections open now for good (a failover to another machine) while new
// ones go through. The
// fault tests of the stores and the coordinator put it between a client and a real PostgreSQL.
import net from "node:net"

export interface CuttableProxy {
  /** The proxy's own port on 127.0.0.1. */
  readonly port: number
  /** Connections currently open through the proxy. */
  readonly open: () => number
  /** Resets every open connection (both sides see ECONNRESET). */
  readonly cut: () => void
  /** While refusing, new connections are reset as soon as they arrive; `false` lets them through again. */
  readonly refuse: (refusing: boolean) => void
  /** Connections reset on arrival while refusing, so far. */
  readonly refused: () => number
  /**
   * While stalled, nothing crosses the proxy in either direction (bytes wait in its buffers)
   * and a new connection is accepted but not forwarded: every client waits, no error comes.
   * `false` heals it: what waited is delivered and held connections are forwarded.
   */
  readonly stall: (stalled: boolean) => void
  /**
   * Every connection open now goes silent for good, as after a failover to another machine or
   * in a network black hole: nothing crosses it either way from now on, and neither side is
   * closed or reset (until `close`), so neither ever learns. New connections are forwarded as
   * usual. `open` no longer counts the silenced ones.
   */
  readonly blackHole: () => void
  /**
   * Every byte crossing the proxy, either way, is delayed by this many ms (0: none, the
   * default): a slow link, where a client may give up on a statement that still reaches the
   * server and commits. Order is kept, also across a change of the delay; `stall` does not hold
   * bytes already on their way.
   */
  readonly delay: (ms: number) => void
  readonly close: () => Promise<void>
}

/** Starts a proxy on a free loopback port that forwards to `target`. */
export async function startCuttableProxy(target: { readonly host?: string; readonly port: number }): Promise<CuttableProxy> {
  const pairs = new Set<readonly [net.Socket, net.Socket]>()
  const held = new Set<net.Socket>()
  const silenced = new Set<net.Socket>()
  let refusing = false
  let refusedCount = 0
  let stalled = false
  let delayMs = 0
  /**
   * Copies `from`'s bytes to `to`, each chunk `delayMs` late while a delay is set, in order even
   * when the delay changes (a chunk is never due before the one ahead of it); the end of the
   * stream follows the last chunk. No backpressure: enough for a database's traffic in tests.
   */
  const relay = (from: net.Socket, to: net.Socket) => {
    let lastDue = 0
    const later = (f: () => void) => {
      const now = Date.now()
      const due = Math.max(now + delayMs, lastDue)
      lastDue = due
      if (due <= now) f()
      else setTimeout(() => (to.destroyed ? undefined : f()), due - now)
    }
    from.on("data", (chunk) => later(() => to.write(chunk)))
    from.on("end", () => later(() => to.end()))
  }
  const reset = (s: net.Socket) => (s.destroyed ? undefined : s.resetAndDestroy())
  const forward = (client: net.Socket) => {
    const upstream = net.connect(target.port, target.host ?? "127.0.0.1")
    const pair = [client, upstream] as const
    pairs.add(pair)
    const drop = () => {
      pairs.delete(pair)
      reset(client)
      reset(upstream)
    }
    client.on("error", drop).on("close", drop)
    upstream.on("error", drop).on("close", drop)
    relay(client, upstream)
    relay(upstream, client)
    client.resume()
  }
  const server = net.createServer((client) => {
    if (refusing) {
      refusedCount++
      client.on("error", () => undefined)
      reset(client)
      return
    }
    if (stalled) {
      held.add(client)
      client.pause()
      const drop = () => {
        held.delete(client)
        reset(client)
      }
      client.on("error", drop).on("close", drop)
      return
    }
    forward(client)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const address = server.address()
  if (address === null || typeof address === "string") throw new Error("proxy: no port")
  const cut = () => {
    for (const [client, upstream] of [...pairs]) {
      reset(client)
      reset(upstream)
    }
    pairs.clear()
    for (const client of [...held]) reset(client)
    held.clear()
    for (const s of [...silenced]) reset(s)
    silenced.clear()
  }
  const blackHole = () => {
    for (const pair of [...pairs]) {
      pairs.delete(pair)
      for (const s of pair) {
        s.pause()
        s.removeAllListeners("data").removeAllListeners("end").removeAllListeners("close").removeAllListeners("error")
        s.on("error", () => undefined)
        silenced.add(s)
      }
    }
  }
  const stall = (value: boolean) => {
    stalled = value
    for (const [client, upstream] of pairs) {
      if (value) {
        client.pause()
        upstream.pause()
      } else {
        client.resume()
        upstream.resume()
      }
    }
    if (!value) {
      for (const client of [...held]) {
        held.delete(client)
        client.removeAllListeners("error").removeAllListeners("close")
        forward(client)
      }
    }
  }
  return {
    port: address.port,
    open: () => pairs.size,
    cut,
    refuse: (value) => {
      refusing = value
    },
    refused: () => refusedCount,
    stall,
    blackHole,
    delay: (ms) => {
      delayMs = ms
    },
    close: () =>
      new Promise<void>((resolve) => {
        cut()
        server.close(() => resolve())
      }),
  }
}

/**
 * A cuttable proxy in front of the server of `databaseUrl`, and the same URL through it (its port
 * the proxy's): the set-up of every fault test that puts the proxy between a client and a real
 * PostgreSQL.
 */
export async function startProxyFor(databaseUrl: string): Promise<{ readonly proxy: CuttableProxy; readonly url: string }> {
  const url = new URL(databaseUrl)
  const proxy = await startCuttableProxy({ host: url.hostname, port: Number(url.port) })
  url.port = String(proxy.port)
  return { proxy, url: url.toString() }
}
