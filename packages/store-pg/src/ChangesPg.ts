/**
 * Change notices (`@engram/store`'s `Changes`) across every process sharing one PostgreSQL:
 * `pg_notify` out, `LISTEN` in, on one dedicated connection per process.
 *
 * - A publish reaches this process's subscribers at once; its topics also go out through
 *   `pg_notify` (coalesced: the topics published while one statement is in flight leave with
 *   the next), retried until sent, so a database that blinks after a write delays the notice but
 *   does not lose it.
 * - Every `checkMs` one statement on the listening connection proves it alive (a silent
 *   partition shows as a check that does not answer) and reads which processes listen
 *   (`pg_stat_activity`, by `application_name`). A listener that went away without saying it
 *   left cleanly may have died between a write and its notice: every subscriber is told notices
 *   may have been missed, once. So are they when this process's own listener is back after a
 *   loss. Between those, nothing is read: waiters and caches rest on the notices alone.
 * - A process that stops with notices unsent (its listener down, or the database slow) sends
 *   them on a connection of its own, once, and leaves without a clean leave, so the others
 *   re-read; only when that fails too are they lost (and said so in the log).
 */
import { Changes, makeHub } from "@engram/store"
import type { ChangesShape } from "@engram/store"
import postgres from "@engram/postgres"
import { Effect, Layer, Scope } from "effect"
import { randomUUID } from "node:crypto"
import { sessionAttrsFor } from "./SessionAttrs.js"

/** The channel processes notify each other on. */
export const channel = "engram_wake"

/** The `application_name` of each process's listening connection (so operators and tests find it). */
export const applicationName = "engram-wakeups"

/** The longest `pg_notify` payload sent (PostgreSQL refuses 8,000 bytes and more). */
const maxPayloadBytes = 7000

/** The default interval of the listener's check. */
export const defaultCheckMs = 2000

/** How to reach the database and how often to check the listener. */
export interface Options {
  /** `postgres://user:pass@host:port/db` */
  readonly url: string
  /** How often (real ms) the listening connection is checked and the listening processes read (default 2000). */
  readonly checkMs?: number | undefined
}

/** What a process's notices did so far (tests and benches). */
export interface Stats {
  /** `pg_notify` statements sent. */
  readonly sent: number
  /** Notices heard from other processes. */
  readonly heard: number
  /** Times subscribers were told notices may have been missed. */
  readonly missed: number
  /** Checks of the listening connection run. */
  readonly checks: number
}

/** Splits topics into `pg_notify` payloads (`<process> <topic> <topic>…`) under the size limit. */
export const payloadsOf = (from: string, topics: Iterable<string>): string[] => {
  const out: string[] = []
  let current = from
  for (const t of topics) {
    if (Buffer.byteLength(current) + 1 + Buffer.byteLength(t) > maxPayloadBytes && current !== from) {
      out.push(current)
      current = from
    }
    current += ` ${t}`
  }
  if (current !== from) out.push(current)
  return out
}

/** The marker of a clean leave: `<process> !left <pid>`. */
const leftMarker = "!left"

// Real time, not the Effect Clock: a coordinator under test may run on a TestClock.
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))
const withTimeout = <A>(p: Promise<A>, ms: number): Promise<A> =>
  new Promise<A>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)
    p.then(
      (a) => {
        clearTimeout(timer)
        resolve(a)
      },
      (e: unknown) => {
        clearTimeout(timer)
        reject(e instanceof Error ? e : new Error(String(e)))
      },
    )
  })

/** One listening connection: its client and a promise settled when it is lost. */
interface Listening {
  readonly sql: postgres.Sql
  readonly lost: Promise<void>
  readonly pid: number
}

/** Builds the notices of this process on `url`; closed with the scope. */
export const make = (options: Options): Effect.Effect<{ readonly changes: ChangesShape; readonly stats: () => Stats }, never, Scope.Scope> =>
  Effect.gen(function* () {
    const hub = makeHub()
    const checkMs = options.checkMs ?? defaultCheckMs
    // Our own notices come back to us: recognised by this id and skipped (delivered at publish).
    const self = randomUUID().slice(0, 8)
    const stats = { sent: 0, heard: 0, missed: 0, checks: 0 }
    let closing = false
    let current: Listening | null = null
    const cleanlyLeft = new Set<number>()
    const miss = () => {
      stats.missed++
      hub.miss()
    }

    const connect = async (): Promise<Listening> => {
      let markLost: () => void = () => undefined
      const lost = new Promise<void>((resolve) => (markLost = resolve))
      // `onnotify` is postgres.js's own option (used by its `listen`), missing from its types.
      const connectionOptions: postgres.Options<Record<string, never>> & { readonly onnotify: (channel: string, payload: string) => void } = {
        max: 1,
        idle_timeout: 0,
        max_lifetime: null,
        connect_timeout: 5,
        fetch_types: false,
        ...sessionAttrsFor(options.url),
        connection: { application_name: applicationName },
        onnotice: () => undefined,
        onnotify: (_channel, payload) => {
          const [from, ...topics] = payload.split(" ")
          if (from === self) return
          if (topics[0] === leftMarker) {
            cleanlyLeft.add(Number(topics[1]))
            return
          }
          stats.heard++
          hub.deliver(topics)
        },
        onclose: () => markLost(),
      }
      const sql = postgres(options.url, connectionOptions)
      try {
        await withTimeout(sql.unsafe(`listen ${channel}`), 10_000)
        const [row] = await withTimeout(sql<{ pid: number }[]>`select pg_backend_pid() as pid`, 10_000)
        return { sql, lost, pid: row?.pid ?? -1 }
      } catch (e) {
        await sql.end({ timeout: 0 }).catch(() => undefined)
        throw e
      }
    }

    /** Which processes listen now; a listener gone without a clean leave means notices may be lost. */
    let listeners: ReadonlySet<number> = new Set()
    const check = async (l: Listening): Promise<void> => {
      const rows = await withTimeout(
        l.sql<{ pid: number }[]>`select pid from pg_stat_activity where application_name = ${applicationName} and datname = current_database()`,
        Math.max(checkMs, 5000),
      )
      stats.checks++
      const now = new Set(rows.map((r) => r.pid))
      const vanished = [...listeners].filter((p) => !now.has(p) && !cleanlyLeft.has(p))
      for (const p of cleanlyLeft) if (!now.has(p)) cleanlyLeft.delete(p)
      listeners = now
      if (vanished.length > 0) miss()
    }

    // Connect, listen, check until lost; then say so, connect again (backoff), and tell every
    // subscriber that what was notified meanwhile may be lost.
    const supervise = async (log: (level: "info" | "warn", message: string, error?: unknown) => void): Promise<void> => {
      let failures = 0
      let wasLost = false
      while (!closing) {
        let l: Listening
        try {
          l = await connect()
        } catch (e) {
          if (failures === 0) log("warn", "change listener could not connect; until it does, waiters are woken only by this process's changes and by their deadlines", e)
          failures++
          await sleep(Math.min(5000, 100 * 2 ** Math.min(failures, 6)))
          continue
        }
        failures = 0
        current = l
        listeners = new Set()
        if (wasLost) {
          log("info", "change listener re-established: other processes' changes wake the waiters again")
          miss()
        }
        try {
          await check(l)
          for (;;) {
            const outcome = await Promise.race([l.lost.then(() => "lost" as const), sleep(checkMs).then(() => "tick" as const)])
            if (outcome === "lost" || closing) break
            await check(l)
          }
        } catch (e) {
          if (!closing) log("warn", "change listener check failed; reconnecting", e)
        }
        current = null
        await l.sql.end({ timeout: 0 }).catch(() => undefined)
        if (closing) return
        wasLost = true
        log("warn", "change listener lost its connection: until it is back, waiters are woken only by this process's changes and by their deadlines")
      }
    }

    // Publishing: topics gather while a pg_notify is in flight and leave together with the next;
    // a failed send keeps them for the next try.
    const pending = new Set<string>()
    let sending = false
    const startFlush = (): void => {
      if (sending || closing) return
      sending = true
      void flush().finally(() => {
        sending = false
        // Published after the loop saw nothing pending, before this ran.
        if (pending.size > 0) startFlush()
      })
    }
    const flush = async (): Promise<void> => {
      let failures = 0
      while (pending.size > 0 && !closing) {
        const l = current
        if (l === null) {
          await sleep(50)
          continue
        }
        const batch = [...pending]
        pending.clear()
        try {
          for (const payload of payloadsOf(self, batch)) {
            await withTimeout(l.sql`select pg_notify(${channel}, ${payload})`, 10_000)
            stats.sent++
          }
          failures = 0
        } catch {
          for (const t of batch) pending.add(t)
          failures++
          await sleep(Math.min(1000, 10 * 2 ** Math.min(failures, 7)))
        }
      }
    }

    /** Sends `topics` on a connection opened for it (2 s to connect, 2 s per payload): the last try at close. */
    const sendOnce = async (topics: readonly string[]): Promise<boolean> => {
      const sql = postgres(options.url, {
        max: 1,
        connect_timeout: 2,
        fetch_types: false,
        ...sessionAttrsFor(options.url),
        onnotice: () => undefined,
      })
      try {
        for (const payload of payloadsOf(self, topics)) {
          await withTimeout(sql`select pg_notify(${channel}, ${payload})`, 2000)
          stats.sent++
        }
        return true
      } catch {
        return false
      } finally {
        await sql.end({ timeout: 0 }).catch(() => undefined)
      }
    }

    const scope = yield* Effect.scope
    const context = yield* Effect.context<never>()
    const log = (level: "info" | "warn", message: string, error?: unknown) => {
      const fields = { channel, ...(error === undefined ? {} : { error: error instanceof Error ? error.message : String(error) }) }
      Effect.runFork((level === "info" ? Effect.logInfo(message, fields) : Effect.logWarning(message, fields)).pipe(Effect.provideContext(context)))
    }
    const supervised = supervise(log)
    yield* Scope.addFinalizer(
      scope,
      Effect.promise(async () => {
        // Whatever is pending goes out first (briefly); then a clean leave, so others need not re-read.
        const deadline = Date.now() + 2000
        while ((pending.size > 0 || sending) && Date.now() < deadline && current !== null) await sleep(10)
        closing = true
        const l = current
        // A clean leave only once every notice went out: a process that leaves notices unsent
        // leaves as a killed one does, so the others re-read.
        if (l !== null && pending.size === 0 && !sending) {
          await withTimeout(l.sql`select pg_notify(${channel}, ${`${self} ${leftMarker} ${l.pid}`})`, 1000).catch(() => undefined)
        }
        if (l !== null) await l.sql.end({ timeout: 2 }).catch(() => undefined)
        await supervised.catch(() => undefined)
        // A send cut by the close puts its topics back before the loop ends (within about 1 s).
        const flushEnds = Date.now() + 1500
        while (sending && Date.now() < flushEnds) await sleep(10)
        // Notices still unsent (this process's listener was down, or the database slow): the
        // others heard nothing of these writes, and, when the listener was already gone before
        // them, were told of nothing missed after it. One last try on a connection of its own.
        if (pending.size > 0) {
          const left = [...pending]
          pending.clear()
          const sent = await sendOnce(left)
          if (!sent) log("warn", `${left.length} change notices could not be sent before stopping: other processes' waiters wake at their deadlines, their caches at the next change`)
        }
        // A publish after the close began (a write finishing during shutdown) is said, not sent.
        if (pending.size > 0) log("warn", `${pending.size} change notices published while stopping were not sent: other processes' waiters wake at their deadlines, their caches at the next change`)
      }),
    )
    // The first LISTEN is in place before the layer is up (within a bound), so nothing is missed from the start.
    const startedBy = Date.now() + 10_000
    while (current === null && Date.now() < startedBy && !closing) yield* Effect.promise(() => sleep(10))

    const changes: ChangesShape = {
      publish: (topics) =>
        Effect.sync(() => {
          const ts = [...new Set(topics)]
          if (ts.length === 0) return
          hub.deliver(ts)
          for (const t of ts) pending.add(t)
          startFlush()
        }),
      subscribe: hub.subscribe,
      live: () => current !== null,
    }
    return { changes, stats: () => ({ ...stats }) }
  })

/** Change notices across every process on the PostgreSQL at `options.url`. */
export const layer = (options: Options): Layer.Layer<Changes> => Layer.effect(Changes, Effect.map(make(options), (m) => m.changes))
