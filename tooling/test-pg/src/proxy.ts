// A TCP proxy in front of a server that a test can cut, as a network partition or a
// database restart would: every open connection is reset at once, and (while refusing)
// new ones are reset on arrival. The fault tests of the stores and the coordinator put it
// between a client and a real PostgreSQL.
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
  readonly close: () => Promise<void>
}

/** Starts a proxy on a free loopback port that forwards to `target`. */
export async function startCuttableProxy(target: { readonly host?: string; readonly port: number }): Promise<CuttableProxy> {
  const pairs = new Set<readonly [net.Socket, net.Socket]>()
  let refusing = false
  const reset = (s: net.Socket) => (s.destroyed ? undefined : s.resetAndDestroy())
  const server = net.createServer((client) => {
    if (refusing) {
      client.on("error", () => undefined)
      reset(client)
      return
    }
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
    client.pipe(upstream)
    upstream.pipe(client)
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
  }
  return {
    port: address.port,
    open: () => pairs.size,
    cut,
    refuse: (value) => {
      refusing = value
    },
    close: () =>
      new Promise<void>((resolve) => {
        cut()
        server.close(() => resolve())
      }),
  }
}
