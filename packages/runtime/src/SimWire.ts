/**
 * The simulated runtime's data plane: how a source's frames (its captures' descriptions) reach
 * the target's incoming VM. In one process (clock-driven tests, the in-process demo) through a
 * registry of listeners; between processes over TCP, one JSON line per frame, acknowledged.
 * The link's speed is the simulated runtime's model (it sleeps before sending); the wire only
 * carries.
 */
import { createConnection, createServer, type Server } from "node:net"
import { Effect } from "effect"
import { RuntimeError, type RoundKind } from "./Runtime.js"

/** One frame of a simulated move: what a capture held. */
export interface SimFrame {
  readonly vmId: string
  readonly moveId: string
  readonly kind: RoundKind
  /** 0 for the full round, then 1, 2, … */
  readonly seq: number
  readonly apparentBytes: number
  readonly wireBytes: number
  readonly memMib: number
  readonly vcpus: number
}

/** A listener's handler: accepts a frame or refuses it with a message. */
export type FrameHandler = (frame: SimFrame) => Effect.Effect<void, RuntimeError>

/** An open listener. */
export interface SimListener {
  readonly uri: string
  readonly close: Effect.Effect<void>
}

/** How incoming VMs listen and sources send. */
export interface SimWire {
  readonly listen: (vmId: string, handler: FrameHandler) => Effect.Effect<SimListener, RuntimeError>
  /** Sends to a `sim-mem:` or `tcp:` endpoint (any wire can reach either kind it knows). */
  readonly send: (uri: string, frame: SimFrame) => Effect.Effect<void, RuntimeError>
}

// One registry per process: every in-memory wire reaches every other one.
const registry = new Map<string, FrameHandler>()
let nextId = 0

const wireError = (op: string, vmId: string, message: string) => new RuntimeError({ op, vmId, message })

const sendTcp = (uri: string, frame: SimFrame, timeoutMs: number): Effect.Effect<void, RuntimeError> => {
  const m = /^tcp:(.+):(\d+)$/.exec(uri)
  if (m === null || m[1] === undefined || m[2] === undefined) return Effect.fail(wireError("send", frame.vmId, `bad endpoint ${uri}`))
  const host = m[1].replace(/^\[(.*)\]$/, "$1")
  const port = Number(m[2])
  return Effect.callback<void, RuntimeError>((resume) => {
    const socket = createConnection({ host, port })
    let answer = ""
    let done = false
    const finish = (e: RuntimeError | null) => {
      if (done) return
      done = true
      socket.destroy()
      resume(e === null ? Effect.void : Effect.fail(e))
    }
    socket.setTimeout(timeoutMs, () => finish(wireError("send", frame.vmId, `${uri} did not answer in ${timeoutMs} ms`)))
    socket.on("connect", () => socket.write(`${JSON.stringify(frame)}\n`))
    socket.on("data", (d) => {
      answer += d.toString("utf8")
      const nl = answer.indexOf("\n")
      if (nl < 0) return
      const line = answer.slice(0, nl)
      finish(line === "ok" ? null : wireError("send", frame.vmId, `${uri} refused the frame: ${line.replace(/^err /, "")}`))
    })
    socket.on("error", (e) => finish(wireError("send", frame.vmId, `${uri}: ${e.message}`)))
    socket.on("close", () => finish(wireError("send", frame.vmId, `${uri} closed without an answer`)))
    return Effect.sync(() => socket.destroy())
  })
}

const sendAny = (timeoutMs: number) => (uri: string, frame: SimFrame): Effect.Effect<void, RuntimeError> => {
  if (uri.startsWith("tcp:")) return sendTcp(uri, frame, timeoutMs)
  const handler = registry.get(uri)
  return handler === undefined ? Effect.fail(wireError("send", frame.vmId, `no listener at ${uri} in this process`)) : handler(frame)
}

/** The in-process wire: listeners are `sim-mem:<n>` in a registry of this process. */
export const inMemory = (options: { readonly timeoutMs?: number } = {}): SimWire => ({
  listen: (_vmId, handler) =>
    Effect.sync(() => {
      const uri = `sim-mem:${++nextId}`
      registry.set(uri, handler)
      return { uri, close: Effect.sync(() => void registry.delete(uri)) }
    }),
  send: sendAny(options.timeoutMs ?? 30_000),
})

/**
 * The wire between processes: each incoming VM listens on a port of its own on `listenHost`
 * (port 0: the system picks) and advertises `advertiseHost` (default the listen host).
 */
export const tcp = (options: { readonly listenHost?: string; readonly advertiseHost?: string; readonly timeoutMs?: number } = {}): SimWire => {
  const listenHost = options.listenHost ?? "127.0.0.1"
  const advertiseHost = options.advertiseHost ?? listenHost
  const timeoutMs = options.timeoutMs ?? 30_000
  return {
    listen: (vmId, handler) =>
      Effect.gen(function* () {
        const services = yield* Effect.context<never>()
        const run = Effect.runPromiseWith(services)
        const server: Server = createServer((socket) => {
          let buf = ""
          socket.on("data", (d) => {
            buf += d.toString("utf8")
            for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
              const line = buf.slice(0, nl)
              buf = buf.slice(nl + 1)
              let frame: SimFrame
              try {
                frame = JSON.parse(line) as SimFrame
              } catch {
                socket.end("err not JSON\n")
                return
              }
              void run(
                handler(frame).pipe(
                  Effect.match({ onSuccess: () => "ok", onFailure: (e) => `err ${e.message.replace(/\n/g, " ")}` }),
                ),
              ).then((answer) => socket.end(`${answer}\n`))
            }
          })
          socket.on("error", () => socket.destroy())
        })
        const port = yield* Effect.callback<number, RuntimeError>((resume) => {
          server.once("error", (e) => resume(Effect.fail(wireError("listen", vmId, e.message))))
          server.listen(0, listenHost, () => {
            const a = server.address()
            resume(a !== null && typeof a === "object" ? Effect.succeed(a.port) : Effect.fail(wireError("listen", vmId, "no port")))
          })
        })
        const host = advertiseHost.includes(":") ? `[${advertiseHost}]` : advertiseHost
        return { uri: `tcp:${host}:${port}`, close: Effect.sync(() => void server.close()) }
      }),
    send: sendAny(timeoutMs),
  }
}
