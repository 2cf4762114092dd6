/**
 * The HTTP server's connections: how many it holds open now (`engram_http_connections_open`),
 * and the cap on them (`ENGRAM_MAX_CONNECTIONS`, Node's `server.maxConnections`). Node closes a
 * connection past the cap as soon as it accepts it, telling nothing but the server's `drop`
 * event: each is counted (`engram_http_connections_refused_total`) and a warning names the cap
 * at most once a minute (a fleet reconnecting past it would otherwise be thousands of lines):
 * the first at once, those held back within the minute in one line at its end.
 *
 * At the file-descriptor limit (`ulimit -n`) there is nothing to hear: libuv accepts the waiting
 * connections on a descriptor it keeps spare and closes them at once, and Node is told of none
 * (measured on Node 22.23 with `ulimit -n 40`: no `error`, no `drop`, no `connection`). Only
 * when libuv could not keep that spare descriptor does Node emit the server's `error` (`accept
 * EMFILE`), and no listener is added for it: with none the process exits (its supervisor
 * restarts it), whereas libuv, told nothing, tries the next accept at once and a listener that
 * let it go on could spin on the same error. The cap is how to see the limit coming: below it,
 * the connections past the cap are refused, counted and logged, and the store keeps
 * descriptors to open its files with.
 */
import type { Server } from "node:http"
import type { Socket } from "node:net"
import { readFileSync } from "node:fs"

/** How often at most the refusals at the cap are logged, ms. */
export const warnEveryMs = 60_000

export interface ConnectionsOptions {
  /** The cap (`ENGRAM_MAX_CONNECTIONS`); 0: none. */
  readonly maxConnections: number
  /** Told the count of open connections each time it changes (the gauge's `set`). */
  readonly open: (count: number) => void
  /** Told of each connection refused at the cap (the counter's `inc`). */
  readonly refused: () => void
  /** Logs a warning (at most once every `warnEveryMs`). */
  readonly warn: (message: string, fields: Readonly<Record<string, unknown>>) => void
  /** The time, ms (default `performance.now`). */
  readonly now?: (() => number) | undefined
  /** Runs `run` in `ms` (default an unref'd `setTimeout`); answers a cancel. */
  readonly schedule?: ((run: () => void, ms: number) => () => void) | undefined
}

const laterByTimer = (run: () => void, ms: number): (() => void) => {
  const timer = setTimeout(run, ms)
  timer.unref()
  return () => clearTimeout(timer)
}

/** The warning for connections refused at the cap: `refused` since the last one. */
export const refusedWarning = (maxConnections: number, refused: number): string =>
  `refused ${refused} ${refused === 1 ? "connection" : "connections"}: this coordinator already holds its cap of ${maxConnections} open connections (ENGRAM_MAX_CONNECTIONS); ` +
  `a connection past it is closed as soon as it is accepted (each counted in engram_http_connections_refused_total; this warning at most once a minute). ` +
  `A host agent holds 2 or 3 connections: raise the cap, with the file-descriptor limit (ulimit -n) above it, or add a replica`

/** Counts `server`'s connections and applies the cap; answers `server`. */
export const track = <S extends Server>(server: S, options: ConnectionsOptions): S => {
  const now = options.now ?? (() => performance.now())
  let open = 0
  server.on("connection", (socket: Socket) => {
    options.open(++open)
    socket.once("close", () => options.open(--open))
  })
  if (options.maxConnections > 0) {
    server.maxConnections = options.maxConnections
    const schedule = options.schedule ?? laterByTimer
    let lastWarnedAt: number | undefined
    let unsaid = 0
    /** The warning of the refusals held back within the minute, due at its end (a cancel), or null. */
    let flush: (() => void) | null = null
    const say = () => {
      // Said now: a line still due for the same refusals is not said again.
      flush?.()
      flush = null
      if (unsaid === 0) return
      lastWarnedAt = now()
      options.warn(refusedWarning(options.maxConnections, unsaid), { maxConnections: options.maxConnections, refused: unsaid })
      unsaid = 0
    }
    server.on("drop", () => {
      options.refused()
      unsaid++
      const t = now()
      if (lastWarnedAt === undefined || t - lastWarnedAt >= warnEveryMs) return say()
      // Held back: said when the minute is up, whether or not another refusal comes then.
      flush ??= schedule(() => {
        flush = null
        say()
      }, lastWarnedAt + warnEveryMs - t)
    })
    // Closing: the refusals held back are said now, not dropped with the timer.
    server.once("close", say)
  }
  return server
}

/**
 * This process's file-descriptor limit (the soft `Max open files` of `path`; Node raises it to
 * the hard limit at start), or undefined where it cannot be read (not Linux) or is unlimited.
 */
export const readFdLimit = (path = "/proc/self/limits"): number | undefined => {
  try {
    const n = Number(/^Max open files\s+(\d+)\s/m.exec(readFileSync(path, "utf8"))?.[1])
    return Number.isInteger(n) && n > 0 ? n : undefined
  } catch {
    return undefined
  }
}

/**
 * The start-up warning when the cap cannot act: it is not `fdHeadroom` below the
 * file-descriptor limit, so the limit is reached first and connections past it are closed
 * unseen. Undefined otherwise (no cap, the limit unknown, or the cap far enough below it).
 */
export const fdLimitWarning = (maxConnections: number, fdLimit: number | undefined): string | undefined =>
  maxConnections === 0 || fdLimit === undefined || maxConnections + fdHeadroom <= fdLimit
    ? undefined
    : `ENGRAM_MAX_CONNECTIONS (${maxConnections}) is within ${fdHeadroom} of this process's file-descriptor limit (ulimit -n: ${fdLimit}): ` +
      `it leaves the store and the process too few descriptors, and at the limit connections are closed as they arrive with no log and no count; ` +
      `raise the limit (ulimit -n, LimitNOFILE=) or set the cap below it, less the descriptors the store needs`

/** The descriptors kept beside the cap for everything but the HTTP server's connections (the store's pool, files, the listener). */
export const fdHeadroom = 256
