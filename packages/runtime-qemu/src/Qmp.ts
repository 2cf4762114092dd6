/**
 * A small typed QMP client (the QEMU Machine Protocol, JSON lines over a unix socket): the
 * greeting, capability negotiation, commands matched to their answers by id, asynchronous
 * events (STOP, RESUME, MIGRATION, MIGRATION_PASS, SHUTDOWN, …) published to subscribers with
 * the time they arrived, and every failure as a tagged error: QEMU's own error answer, a
 * timeout (on Effect's Clock), or a closed connection (QEMU exited).
 */
import { createConnection, type Socket } from "node:net"
import { Deferred, Effect, PubSub, Schema, type Scope } from "effect"
import { nowMs } from "@engram/runtime"

/** QEMU answered a command with an error. */
export class QmpError extends Schema.TaggedError<QmpError>()("QmpError", {
  socket: Schema.String,
  command: Schema.String,
  /** QEMU's error class: `GenericError`, `CommandNotFound`, `DeviceNotActive`, … */
  errorClass: Schema.String,
  message: Schema.String,
}) {}

/** No answer (or no greeting) within the time allowed. */
export class QmpTimeout extends Schema.TaggedError<QmpTimeout>()("QmpTimeout", {
  socket: Schema.String,
  command: Schema.String,
  timeoutMs: Schema.Number,
  message: Schema.String,
}) {}

/** The connection could not be made or closed (QEMU exited). */
export class QmpClosed extends Schema.TaggedError<QmpClosed>()("QmpClosed", {
  socket: Schema.String,
  command: Schema.String,
  message: Schema.String,
}) {}

/** Any failure of a QMP call. */
export type QmpFailure = QmpError | QmpTimeout | QmpClosed

/** An asynchronous event. */
export interface QmpEvent {
  readonly event: string
  readonly data: Readonly<Record<string, unknown>>
  /** QEMU's timestamp (host realtime), ms. */
  readonly qemuAtMs: number
  /** When this client read it, on Effect's Clock (`nowMs`), ms. */
  readonly receivedAtMs: number
}

/** What QEMU says when a client connects. */
export interface QmpGreeting {
  readonly version: { readonly major: number; readonly minor: number; readonly micro: number }
  readonly capabilities: readonly string[]
}

/** A connected, negotiated client. */
export interface QmpClient {
  readonly socket: string
  readonly greeting: QmpGreeting
  /** Runs a command; answers its `return`. */
  readonly execute: <A = unknown>(command: string, args?: Readonly<Record<string, unknown>>, timeoutMs?: number) => Effect.Effect<A, QmpFailure>
  /** The events from now on, for the subscriber's scope. */
  readonly subscribe: Effect.Effect<PubSub.Subscription<QmpEvent>, never, Scope.Scope>
  /** Completes when the connection closes. */
  readonly closed: Effect.Effect<void>
  readonly isClosed: Effect.Effect<boolean>
  /** Closes the connection (QEMU keeps running). */
  readonly close: Effect.Effect<void>
}

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** For the connection, the greeting and negotiation, and the default of each command. Default 10 s. */
  readonly timeoutMs?: number
  /** Where the connection's events are published: a VM's own, kept across its reconnects (`Monitor`). Default: the connection's own. */
  readonly events?: PubSub.PubSub<QmpEvent>
}

interface Pending {
  readonly command: string
  readonly resolve: (answer: { readonly return?: unknown; readonly error?: { readonly class?: string; readonly desc?: string } }) => void
}

/** Connects to the QMP socket at `path` and negotiates capabilities. The connection lives in the scope. */
export const connect = (path: string, options: ConnectOptions = {}): Effect.Effect<QmpClient, QmpClosed | QmpTimeout, Scope.Scope> =>
  Effect.gen(function* () {
    const defaultTimeoutMs = options.timeoutMs ?? 10_000
    const events = options.events ?? (yield* PubSub.unbounded<QmpEvent>())
    const closedSignal = yield* Deferred.make<void>()
    const greeted = yield* Deferred.make<QmpGreeting, QmpClosed>()
    const services = yield* Effect.context<never>()
    const runSync = Effect.runSyncWith(services)
    const pending = new Map<number, Pending>()
    let nextId = 0
    let closed = false
    let closeReason = "connection closed"

    const socket: Socket = yield* Effect.callback<Socket, QmpClosed>((resume) => {
      const s = createConnection(path)
      const onError = (e: Error) => resume(Effect.fail(new QmpClosed({ socket: path, command: "connect", message: e.message })))
      s.once("error", onError)
      s.once("connect", () => {
        s.off("error", onError)
        resume(Effect.succeed(s))
      })
      return Effect.sync(() => s.destroy())
    }).pipe(
      Effect.timeoutOrElse({
        duration: defaultTimeoutMs,
        orElse: () => Effect.fail(new QmpTimeout({ socket: path, command: "connect", timeoutMs: defaultTimeoutMs, message: "no connection" })),
      }),
    )

    const onLine = (line: string) => {
      let msg: Record<string, unknown>
      try {
        msg = JSON.parse(line) as Record<string, unknown>
      } catch {
        return
      }
      if ("QMP" in msg) {
        const q = msg["QMP"] as { version?: { qemu?: { major?: number; minor?: number; micro?: number } }; capabilities?: string[] }
        const v = q.version?.qemu ?? {}
        runSync(Deferred.succeed(greeted, { version: { major: v.major ?? 0, minor: v.minor ?? 0, micro: v.micro ?? 0 }, capabilities: q.capabilities ?? [] }))
      } else if (typeof msg["event"] === "string") {
        const ts = msg["timestamp"] as { seconds?: number; microseconds?: number } | undefined
        const event: QmpEvent = {
          event: msg["event"],
          data: (msg["data"] as Record<string, unknown> | undefined) ?? {},
          qemuAtMs: (ts?.seconds ?? 0) * 1000 + (ts?.microseconds ?? 0) / 1000,
          receivedAtMs: runSync(nowMs),
        }
        runSync(PubSub.publish(events, event))
      } else if (typeof msg["id"] === "number") {
        const p = pending.get(msg["id"])
        if (p !== undefined) {
          pending.delete(msg["id"])
          p.resolve(msg as Parameters<Pending["resolve"]>[0])
        }
      }
    }

    let buffer = ""
    socket.setEncoding("utf8")
    socket.on("data", (chunk: string) => {
      buffer += chunk
      for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
        const line = buffer.slice(0, nl).trim()
        buffer = buffer.slice(nl + 1)
        if (line !== "") onLine(line)
      }
    })
    socket.on("error", (e) => {
      closeReason = e.message
    })
    socket.on("close", () => {
      closed = true
      for (const p of pending.values()) p.resolve({ error: { class: "__closed", desc: closeReason } })
      pending.clear()
      runSync(Deferred.fail(greeted, new QmpClosed({ socket: path, command: "greeting", message: closeReason })))
      runSync(Deferred.succeed(closedSignal, undefined))
    })
    const close = Effect.sync(() => {
      if (!closed) socket.destroy()
    })
    yield* Effect.addFinalizer(() => close)

    const execute = <A = unknown>(command: string, args?: Readonly<Record<string, unknown>>, timeoutMs = defaultTimeoutMs): Effect.Effect<A, QmpFailure> =>
      Effect.callback<A, QmpFailure>((resume) => {
        if (closed) {
          resume(Effect.fail(new QmpClosed({ socket: path, command, message: closeReason })))
          return
        }
        const id = ++nextId
        pending.set(id, {
          command,
          resolve: (answer) => {
            if (answer.error === undefined) return resume(Effect.succeed(answer.return as A))
            if (answer.error.class === "__closed") return resume(Effect.fail(new QmpClosed({ socket: path, command, message: answer.error.desc ?? "closed" })))
            resume(Effect.fail(new QmpError({ socket: path, command, errorClass: answer.error.class ?? "GenericError", message: answer.error.desc ?? "" })))
          },
        })
        socket.write(`${JSON.stringify({ execute: command, ...(args === undefined ? {} : { arguments: args }), id })}\n`)
        return Effect.sync(() => void pending.delete(id))
      }).pipe(
        Effect.timeoutOrElse({
          duration: timeoutMs,
          orElse: () => Effect.fail(new QmpTimeout({ socket: path, command, timeoutMs, message: `no answer to ${command} in ${timeoutMs} ms` })),
        }),
      )

    const greeting = yield* Deferred.await(greeted).pipe(
      Effect.timeoutOrElse({
        duration: defaultTimeoutMs,
        orElse: () => Effect.fail(new QmpTimeout({ socket: path, command: "greeting", timeoutMs: defaultTimeoutMs, message: "no QMP greeting" })),
      }),
    )
    yield* execute("qmp_capabilities").pipe(
      Effect.catchTag("QmpError", (e) => Effect.fail(new QmpClosed({ socket: path, command: "qmp_capabilities", message: e.message }))),
    )

    return {
      socket: path,
      greeting,
      execute,
      subscribe: PubSub.subscribe(events),
      closed: Deferred.await(closedSignal),
      isClosed: Effect.sync(() => closed),
      close,
    } satisfies QmpClient
  })

/**
 * Takes events from `subscription` until `pick` answers a value for one, within `timeoutMs`
 * (on Effect's Clock). Events `pick` passes over are dropped.
 */
export const awaitEvent = <A>(
  subscription: PubSub.Subscription<QmpEvent>,
  pick: (e: QmpEvent) => A | undefined,
  timeoutMs: number,
  what: string,
  socket = "",
): Effect.Effect<A, QmpTimeout> =>
  Effect.gen(function* () {
    for (;;) {
      const e = yield* PubSub.take(subscription)
      const a = pick(e)
      if (a !== undefined) return a
    }
  }).pipe(
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.fail(new QmpTimeout({ socket, command: what, timeoutMs, message: `no ${what} in ${timeoutMs} ms` })),
    }),
  )
