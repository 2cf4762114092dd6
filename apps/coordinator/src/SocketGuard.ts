/**
 * Bounds on what one client connection can hold at the HTTP edge, below the Effect server
 * (Node's `http.Server` events), for clients that misbehave rather than die. Nothing here runs
 * per ordinary request beyond one check: the work is per pipelined request, per connection, and
 * one sweep of the connections every half `stalledWriteMs`.
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
 *   for up to an hour). A connection with bytes waiting to be written and none written for
 *   `stalledWriteMs` is closed; an idle wait (nothing to write) is not.
 * - **`Upgrade`.** A request that asks to upgrade left Node's header and request timeouts (the
 *   socket was handed to the `upgrade` listener the Effect server keeps, and its body read with
 *   no deadline). The API upgrades nothing: Node is told of no `upgrade` listener, so it serves
 *   such a request as an ordinary one (a `curl --http2` to an `http://` URL sends `Upgrade: h2c`).
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http"
import type { Socket } from "node:net"
import type { Duplex } from "node:stream"

export interface SocketGuardOptions {
  /** Unfinished answers one connection may have at once (the one being written and those queued behind it). */
  readonly maxInFlight: number
  /** How long a connection's bytes may wait unwritten, with none written, before it is closed, ms. */
  readonly stalledWriteMs: number
  /** The time, ms (default `performance.now`). */
  readonly now?: (() => number) | undefined
}

/** The defaults: 4 answers in flight per connection; 60 s of a stalled write. */
export const defaultSocketGuard: SocketGuardOptions = { maxInFlight: 4, stalledWriteMs: 60_000 }

/** Bytes a socket still has to write, as libuv sees them (they shrink while the peer reads), else as the stream does. */
const unwritten = (socket: Socket): number => {
  const queued = (socket as Socket & { readonly _handle?: { readonly writeQueueSize?: unknown } | null })._handle?.writeQueueSize
  return typeof queued === "number" ? queued + socket.writableLength : socket.writableLength
}

/** Adds the guards to `server` (before its other listeners); answers it. */
export const guard = <S extends Server>(server: S, options: SocketGuardOptions = defaultSocketGuard): S => {
  const now = options.now ?? (() => performance.now())
  // Answers queued behind the one a connection is writing (pipelined), by connection.
  const queued = new WeakMap<Duplex, Set<ServerResponse>>()
  server.prependListener("request", (req: IncomingMessage, res: ServerResponse) => {
    // An ordinary request has the connection to itself: nothing to do.
    if (res.socket !== null) return
    const socket = req.socket
    let behind = queued.get(socket)
    if (behind === undefined) {
      const created = new Set<ServerResponse>()
      behind = created
      queued.set(socket, created)
      socket.once("close", () => {
        // Node told the answer attached to the connection; these, queued behind it, are told here.
        for (const r of created) {
          if (r.writableEnded || r.socket !== null) continue
          r.destroy()
          r.emit("close")
        }
        created.clear()
      })
    }
    const set = behind
    set.add(res)
    const attached = () => void set.delete(res)
    res.once("socket", attached)
    res.once("close", attached)
    // The answer being written, and those queued behind it.
    if (set.size + 1 > options.maxInFlight) socket.destroy()
  })

  // Stalled writes: one sweep of the open connections every half bound.
  const open = new Set<Socket>()
  const marks = new WeakMap<Socket, { readonly unwritten: number; readonly sent: number; readonly since: number }>()
  server.on("connection", (socket: Socket) => {
    open.add(socket)
    socket.once("close", () => open.delete(socket))
  })
  const sweep = () => {
    const t = now()
    for (const socket of open) {
      const left = socket.writableLength === 0 ? 0 : unwritten(socket)
      if (left === 0) {
        marks.delete(socket)
        continue
      }
      // Progress is bytes written out, or new bytes queued (`bytesWritten` counts them too).
      const sent = socket.bytesWritten
      const mark = marks.get(socket)
      if (mark === undefined || mark.unwritten !== left || mark.sent !== sent) marks.set(socket, { unwritten: left, sent, since: t })
      else if (t - mark.since >= options.stalledWriteMs) socket.destroy()
    }
  }
  const timer = setInterval(sweep, Math.max(10, Math.floor(options.stalledWriteMs / 2)))
  timer.unref()
  server.once("close", () => clearInterval(timer))

  // Node hands a request with an `Upgrade` header to the server's `upgrade` listeners (the
  // Effect server keeps one) only when it counts some; told none, it serves it as an ordinary
  // request, under the header and request timeouts like any other.
  const count = server.listenerCount.bind(server)
  server.listenerCount = ((event: string | symbol, listener?: (...args: unknown[]) => unknown) =>
    event === "upgrade" ? 0 : count(event, listener)) as typeof server.listenerCount
  return server
}
