/**
 * The HTTP server's connections: how many it holds open now (`engram_http_connections_open`).
 */
import type { Server } from "node:http"
import type { Socket } from "node:net"

export interface ConnectionsOptions {
  /** Told the count of open connections each time it changes (the gauge's `set`). */
  readonly open: (count: number) => void
}

/** Counts `server`'s connections; answers `server`. */
export const track = <S extends Server>(server: S, options: ConnectionsOptions): S => {
  let open = 0
  server.on("connection", (socket: Socket) => {
    options.open(++open)
    socket.once("close", () => options.open(--open))
  })
  return server
}
