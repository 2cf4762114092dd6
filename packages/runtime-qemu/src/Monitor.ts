/**
 * A held VM's QMP monitor across reconnects. QEMU's QMP socket (`server=on,wait=off`) takes a
 * new client once the old one is gone, so a connection that closes while QEMU lives (a socket
 * hiccup, a chardev reset, a read error) is no end of the guest: the runtime connects again
 * (`VmHost`'s `watchEnd`) and swaps the new connection in here. Decides what a command meets
 * meanwhile: it waits for the reconnect within its own bound (the wait counts against its
 * timeout) and is sent on the new connection, or fails, not sent, saying the monitor is being
 * reconnected. A command in flight when the connection closes fails (it may have run: it is not
 * sent again). Events come from one PubSub for the VM, so a subscriber follows every connection
 * (what QEMU said while none was up reached no one: `VmHost` reads the VM's run status and a
 * migration in flight again after a reconnect, and says what changed as QEMU would have).
 */
import { Deferred, Effect, Exit, PubSub, Scope } from "effect"
import { nowMs } from "@engram/runtime"
import * as Qmp from "./Qmp.js"

/** One QMP connection of a VM, in a scope of its own (closed when it is replaced or the VM ends). */
export interface Connection {
  readonly client: Qmp.QmpClient
  readonly scope: Scope.Closeable
}

type State =
  | { readonly _tag: "up"; readonly conn: Connection }
  /** Closed while QEMU lives: commands wait for `back`. */
  | { readonly _tag: "lost"; readonly prev: Connection; readonly back: Deferred.Deferred<Qmp.QmpClient, Qmp.QmpClosed> }
  | { readonly _tag: "ended"; readonly why: string }

/** A VM's monitor: commands and events whatever connection serves them. */
export interface Monitor {
  readonly socket: string
  /** The VM's events, published by each of its connections in turn. */
  readonly events: PubSub.PubSub<Qmp.QmpEvent>
  /** Runs a command; while the monitor is being reconnected, waits for it within `timeoutMs` in all. */
  readonly execute: <A = unknown>(command: string, args?: Readonly<Record<string, unknown>>, timeoutMs?: number) => Effect.Effect<A, Qmp.QmpFailure>
  /** The VM's events from now on, for the subscriber's scope. */
  readonly subscribe: Effect.Effect<PubSub.Subscription<Qmp.QmpEvent>, never, Scope.Scope>
  /** Whether a connection is up (open, not lost, the VM not ended). */
  readonly connected: Effect.Effect<boolean>
  /** Completes when the connection up now closes (at once when none is up). */
  readonly closed: Effect.Effect<void>
  /** The connection closed while QEMU lives: commands from now on wait for `reconnected`. */
  readonly lost: Effect.Effect<void>
  /** A new connection, negotiated: swapped in, and the commands that waited go on. False (and it is closed) once the monitor ended. */
  readonly reconnected: (conn: Connection) => Effect.Effect<boolean>
  /** The VM ended (or the runtime let it go): its connection closes, waiting commands fail. */
  readonly end: (why: string) => Effect.Effect<void>
  /** Completes once `end` ran. */
  readonly ended: Effect.Effect<void>
}

/** A monitor on its first connection, whose events go to `events`; `defaultTimeoutMs` bounds a command that names no bound. */
export const make = (first: Connection, events: PubSub.PubSub<Qmp.QmpEvent>, defaultTimeoutMs: number): Monitor => {
  const socket = first.client.socket
  let state: State = { _tag: "up", conn: first }
  const endedSignal = Deferred.makeUnsafe<void>()

  const lost = Effect.suspend(() => {
    if (state._tag !== "up") return Effect.void
    state = { _tag: "lost", prev: state.conn, back: Deferred.makeUnsafe() }
    return Effect.void
  })

  const execute = <A = unknown>(command: string, args?: Readonly<Record<string, unknown>>, timeoutMs = defaultTimeoutMs): Effect.Effect<A, Qmp.QmpFailure> =>
    Effect.gen(function* () {
      // A connection that closed before the runtime saw it is lost already: wait as for one it saw.
      if (state._tag === "up" && (yield* state.conn.client.isClosed)) yield* lost
      const now = state
      if (now._tag === "up") return yield* now.conn.client.execute<A>(command, args, timeoutMs)
      if (now._tag === "ended") return yield* new Qmp.QmpClosed({ socket, command, message: now.why })
      const t0 = yield* nowMs
      const client = yield* Deferred.await(now.back).pipe(
        Effect.timeoutOrElse({
          duration: timeoutMs,
          orElse: () =>
            Effect.fail(
              new Qmp.QmpClosed({
                socket,
                command,
                message: `not sent: the monitor's connection closed while QEMU runs and it was not reconnected within ${timeoutMs} ms (the runtime keeps reconnecting)`,
              }),
            ),
        }),
      )
      return yield* client.execute<A>(command, args, Math.max(1, timeoutMs - ((yield* nowMs) - t0)))
    })

  const reconnected = (conn: Connection) =>
    Effect.gen(function* () {
      const was = state
      if (was._tag === "ended") {
        yield* Scope.close(conn.scope, Exit.void)
        return false
      }
      state = { _tag: "up", conn }
      yield* Scope.close(was._tag === "up" ? was.conn.scope : was.prev.scope, Exit.void)
      if (was._tag === "lost") yield* Deferred.succeed(was.back, conn.client)
      return true
    })

  const end = (why: string) =>
    Effect.gen(function* () {
      const was = state
      if (was._tag === "ended") return
      state = { _tag: "ended", why }
      if (was._tag === "lost") yield* Deferred.fail(was.back, new Qmp.QmpClosed({ socket, command: "reconnect", message: why }))
      yield* Scope.close(was._tag === "up" ? was.conn.scope : was.prev.scope, Exit.void)
      yield* Deferred.succeed(endedSignal, undefined)
    })

  return {
    socket,
    events,
    execute,
    subscribe: PubSub.subscribe(events),
    connected: Effect.suspend(() => (state._tag === "up" ? Effect.map(state.conn.client.isClosed, (c) => !c) : Effect.succeed(false))),
    closed: Effect.suspend(() => (state._tag === "up" ? state.conn.client.closed : Effect.void)),
    lost,
    reconnected,
    end,
    ended: Deferred.await(endedSignal),
  }
}
