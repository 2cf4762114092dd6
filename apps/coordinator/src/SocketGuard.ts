/**
 * Bounds on what one client connection can hold at the HTTP edge, below the Effect server
 * (Node's `http.Server` events), for clients that misbehave rather than die:
 *
 * - **Pipelining.** Node dispatches every request a connection pipelines at once and queues
 *   their answers in memory until the earlier ones are written: one unauthenticated connection
 *   could start unlimited work and hold every answer (a few thousand pipelined `/openapi.json`
 *   took the heap). A connection with more than `maxInFlight` answers unfinished is closed.
 * - **Answers left behind.** When a connection closes, Node tells only the answer attached to
 *   it; the pipelined ones queued behind are told here (`close`), so their handlers are
 *   interrupted (a long-poll frees its slot under the per-credential cap at once, and a stop does
 *   not wait for answers nobody will read).
 * - **Stalled writes.** A client that stops reading an answer (its window closed) keeps the
 *   socket for ever (`server.timeout` is 0: long-polls and move waits legitimately hold an answer
 *   for up to an hour). A connection whose answer has bytes waiting and nothing moved for
 *   `stalledWriteMs` is closed; an idle wait (nothing to write) is not.
 * - **`Upgrade`.** A request that asks to upgrade leaves Node's header and request timeouts
 *   (the socket is handed to the `upgrade` listener the Effect server keeps). The API upgrades
 *   nothing: such a socket is closed after `upgradeIdleMs` without traffic.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http"
import type { Duplex } from "node:stream"

export interface SocketGuardOptions {
  /** Unfinished answers one connection may have at once (1: no pipelining past the answer being written). */
  readonly maxInFlight: number
  /** How long an answer's bytes may wait unread before the connection is closed, ms. */
  readonly stalledWriteMs: number
  /** How long an upgrade's socket may be idle before it is closed, ms. */
  readonly upgradeIdleMs: number
}

/** The defaults: 4 answers in flight per connection; 60 s of a stalled write; 30 s of an idle upgrade. */
export const defaultSocketGuard: SocketGuardOptions = { maxInFlight: 4, stalledWriteMs: 60_000, upgradeIdleMs: 30_000 }

/** Adds the guards to `server` (before its other listeners); answers it. */
export const guard = <S extends Server>(server: S, options: SocketGuardOptions = defaultSocketGuard): S => {
  const open = new WeakMap<Duplex, Set<ServerResponse>>()
  server.prependListener("request", (req: IncomingMessage, res: ServerResponse) => {
    const socket = req.socket
    let answers = open.get(socket)
    if (answers === undefined) {
      const created = new Set<ServerResponse>()
      answers = created
      open.set(socket, created)
      socket.once("close", () => {
        // The answers still queued behind the one Node told: told here, once each.
        for (const r of created) {
          if (r.writableEnded || r.socket !== null) continue
          r.destroy()
          r.emit("close")
        }
        created.clear()
      })
    }
    const set = answers
    set.add(res)
    const done = () => void set.delete(res)
    res.once("finish", done)
    res.once("close", done)
    // Bytes waiting unread with nothing moving: the client stopped reading.
    res.setTimeout(options.stalledWriteMs, () => {
      if (socket.writableLength > 0) socket.destroy()
    })
    if (set.size > options.maxInFlight) socket.destroy()
  })
  server.prependListener("upgrade", (_req: IncomingMessage, socket: Duplex) => {
    if ("setTimeout" in socket && typeof socket.setTimeout === "function") socket.setTimeout(options.upgradeIdleMs, () => socket.destroy())
  })
  return server
}
