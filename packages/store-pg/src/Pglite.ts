/**
 * The PGlite driver: embedded PostgreSQL in this process (in memory, or in a data directory),
 * behind the store's `Db`. It has one connection, so every call runs alone, in turn. The
 * migrations are applied at open; the database closes with the scope.
 *
 * With `worker: true` PGlite's engine runs in a thread of its own (`worker/pglite-worker.mjs`)
 * and each statement is a message to it: the engine's work runs beside the event loop (the HTTP
 * server, Effect) instead of taking turns with it on one core, at the cost of a message round
 * trip per statement. Everything else (drizzle, the transaction runner, the errors) is the same.
 */
import { existsSync } from "node:fs"
import { Worker } from "node:worker_threads"
import { fileURLToPath } from "node:url"
import { PGlite } from "@electric-sql/pglite"
import { Unavailable } from "@engram/store"
import { drizzle } from "drizzle-orm/pglite"
import { Effect, Semaphore } from "effect"
import type { Scope } from "effect"
import type { SQL } from "drizzle-orm"
import { retryAfterMs, rowsOf } from "./Db.js"
import type { Db, Exec } from "./Db.js"
import { migratePgliteClient, migrationsFolder } from "./Migrate.js"
import * as Transaction from "./Transaction.js"
import type { OpenTx } from "./Transaction.js"

/** Where the embedded database lives. */
export interface ConnectOptions {
  /** A data directory that survives restarts; in memory when absent. */
  readonly dataDir?: string | undefined
  /** Runs PGlite's engine in a worker thread (default false: in this thread). */
  readonly worker?: boolean | undefined
  /**
   * With `worker`: called once if the thread ends while the database is open (a crash, an
   * out-of-memory end), never for a close. Every later statement answers `Unavailable`: the
   * engine is not restarted under a transaction in flight, so a process that cannot go on
   * without its database should stop (the coordinator exits 1; PGlite recovers its data
   * directory at the next open).
   */
  readonly onWorkerExit?: ((why: string) => void) | undefined
  /**
   * Aborted: the engine is dropped where it stands and writes nothing more to its data directory,
   * for a process that learns the directory is no longer its own (another took it over). The
   * worker thread is ended at once, without PGlite's close (whose checkpoint writes); an engine in
   * this thread is left unclosed. Every statement from then on answers `Unavailable`, and the
   * close at the scope's end does nothing. A statement already running in this thread's engine
   * ends first: it cannot be stopped midway.
   */
  readonly abandon?: AbortSignal | undefined
}

/**
 * The `Db` over an open PGlite: its one connection serializes every call, so a transaction
 * holds it from BEGIN to COMMIT and its statements run in turn.
 */
export const makeDb = (client: PGlite): Db => {
  const db = drizzle({ client }) as unknown as Exec
  const inTurn = async (statements: readonly SQL[]): Promise<unknown[][]> => {
    const out: unknown[][] = []
    for (const s of statements) out.push(rowsOf(await db.execute(s)))
    return out
  }
  const begin = async (): Promise<OpenTx> => {
    await client.exec("begin")
    let open = true
    const end = async (statement: "commit" | "rollback"): Promise<void> => {
      if (!open) return
      open = false
      if (statement === "commit") await client.exec("commit")
      else await client.exec("rollback").catch(() => undefined)
    }
    return { exec: db, pipeline: inTurn, commit: () => end("commit"), rollback: () => end("rollback") }
  }
  return Transaction.make({ driver: "pglite", exec: db, pipeline: inTurn, begin, lock: Semaphore.makeUnsafe(1) })
}

/** A statement's error once the database is gone (closed, crashed, abandoned): `CONNECTION_CLOSED`, which `Db.classify` reads as `Unavailable`. */
const closedError = (message: string): Error => Object.assign(new Error(message), { code: "CONNECTION_CLOSED" })

const unavailable = (cause: unknown): Unavailable =>
  new Unavailable({ reason: cause instanceof Error ? cause.message : String(cause), retryAfterMs })

/** What the worker answers for a message. */
type Answer = { readonly id: number; readonly ok: true; readonly result: unknown } | { readonly id: number; readonly ok: false; readonly error: WorkerError }

interface WorkerError {
  readonly message: string
  readonly name: string
  readonly code?: string | undefined
  readonly constraint?: string | undefined
  readonly detail?: string | undefined
}

/** The worker's error as an error of this thread, with the fields `Db.classify` reads (`code`, `constraint`). */
const errorFrom = (e: WorkerError): Error => Object.assign(new Error(e.message), { name: e.name, code: e.code, constraint: e.constraint, detail: e.detail })

/**
 * The worker's script: the package's `worker/pglite-worker.mjs`, or, in `engram`'s single
 * executable (no `node_modules`), its bundle `worker/pglite-worker.cjs` beside the executable's
 * other files.
 */
const workerScript = (): string => {
  const script = fileURLToPath(new URL("../worker/pglite-worker.mjs", import.meta.url))
  const bundled = fileURLToPath(new URL("../worker/pglite-worker.cjs", import.meta.url))
  return !existsSync(script) && existsSync(bundled) ? bundled : script
}

/** How long a worker's PGlite may take to close before its thread is ended. */
const closeBoundMs = 30_000

/** The part of a PGlite client `makeDb` and drizzle's PGlite session use. */
type ClientSurface = Pick<PGlite, "query" | "exec">

/**
 * PGlite in a worker thread: resolves once the worker has opened the database and applied the
 * migrations. The answer speaks the part of PGlite's client the store uses (`query`, `exec`) by
 * messages; `close` closes the database and ends the thread. The thread keeps the process alive
 * only while a call waits on it.
 */
export const startWorker = (
  options: Pick<ConnectOptions, "dataDir" | "onWorkerExit" | "abandon"> = {},
): Promise<{ readonly client: ClientSurface; readonly close: () => Promise<void>; /** The engine's thread (diagnostics, tests). */ readonly thread: Worker }> =>
  new Promise((resolveStart, rejectStart) => {
    const worker = new Worker(workerScript(), {
      // `metaUrl`: the URL the executable's bundle of the script resolves its files from.
      workerData: { dataDir: options.dataDir, migrationsFolder, metaUrl: import.meta.url },
      // The thread runs plain JavaScript: no loader of this process's (tsx, a test runner's).
      execArgv: [],
    })
    const waiting = new Map<number, { readonly resolve: (v: unknown) => void; readonly reject: (e: unknown) => void }>()
    let next = 1
    let gone: Error | undefined
    let started = false
    let closing = false
    const settle = (): void => {
      if (waiting.size === 0) worker.unref()
    }
    worker.on("message", (a: Answer) => {
      if (a.id === 0) {
        if (a.ok) {
          settle()
          started = true
          resolveStart({ client, close, thread: worker })
        } else {
          rejectStart(errorFrom(a.error))
          void worker.terminate()
        }
        return
      }
      const w = waiting.get(a.id)
      if (w === undefined) return
      waiting.delete(a.id)
      settle()
      if (a.ok) w.resolve(a.result)
      else w.reject(errorFrom(a.error))
    })
    const fail = (why: string) => {
      // The thread ended on its own while open: said once, to whoever must act on it.
      if (gone === undefined && started && !closing) options.onWorkerExit?.(`the PGlite worker thread ended: ${why}`)
      gone ??= closedError(`the PGlite worker closed: ${why}`)
      rejectStart(gone)
      for (const w of waiting.values()) w.reject(gone)
      waiting.clear()
    }
    worker.on("error", (e) => fail(e.message))
    worker.on("exit", (code) => fail(`exit code ${code}`))
    const drop = () => {
      closing = true
      fail(`abandoned: ${abandonReason(options.abandon)}`)
      void worker.terminate()
    }
    if (options.abandon?.aborted === true) drop()
    else options.abandon?.addEventListener("abort", drop, { once: true })
    const call = (message: Record<string, unknown>): Promise<unknown> => {
      if (gone !== undefined) return Promise.reject(gone)
      const id = next++
      return new Promise((resolve, reject) => {
        waiting.set(id, { resolve, reject })
        worker.ref()
        worker.postMessage({ ...message, id })
      })
    }
    const client: ClientSurface = {
      query: ((sql: string, params?: unknown[], opts?: { rowMode?: "array" | "object" }) =>
        call({ op: "query", sql, params: params ?? [], rowMode: opts?.rowMode ?? "object" })) as PGlite["query"],
      exec: ((sql: string) => call({ op: "exec", sql }).then(() => [])) as PGlite["exec"],
    }
    // PGlite closes cleanly (its data directory flushed) when the thread answers; a thread that
    // does not within `closeBoundMs` is ended anyway, so a stop never hangs on it.
    const close = async (): Promise<void> => {
      closing = true
      options.abandon?.removeEventListener("abort", drop)
      if (gone === undefined) {
        let timer: NodeJS.Timeout | undefined
        const bound = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, closeBoundMs)
        })
        await Promise.race([call({ op: "close" }).catch(() => undefined), bound])
        clearTimeout(timer)
      }
      await worker.terminate()
    }
  })

/** Opens PGlite (in memory, or in `dataDir`) and applies the migrations; closed with the scope. */
export const open = (options: ConnectOptions = {}): Effect.Effect<Db, Unavailable, Scope.Scope> =>
  options.worker === true ? openInWorker(options) : openHere(options)

const openInWorker = (options: ConnectOptions): Effect.Effect<Db, Unavailable, Scope.Scope> =>
  Effect.map(
    Effect.acquireRelease(
      Effect.tryPromise({ try: () => startWorker(options), catch: unavailable }),
      (w) => Effect.promise(() => w.close()),
    ),
    (w) => makeDb(w.client as PGlite),
  )

const openHere = (options: ConnectOptions): Effect.Effect<Db, Unavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const client = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const c = options.dataDir === undefined ? new PGlite() : new PGlite(options.dataDir)
          await c.waitReady
          return c
        },
        catch: unavailable,
      }),
      // Abandoned: left unclosed (PGlite's close writes a checkpoint to the directory).
      (c) => Effect.promise(() => (c.closed || options.abandon?.aborted === true ? Promise.resolve() : c.close())),
    )
    yield* Effect.tryPromise({ try: () => migratePgliteClient(client), catch: unavailable })
    return makeDb(options.abandon === undefined ? client : (refusedOnceAbandoned(client, options.abandon) as PGlite))
  })

/** Why `signal` was aborted, in words. */
const abandonReason = (signal: AbortSignal | undefined): string => {
  const r: unknown = signal?.reason
  return r instanceof Error ? r.message : typeof r === "string" ? r : "the data directory is no longer this process's"
}

/**
 * `client`'s statements, refused (as a closed connection: `Unavailable`) once `signal` is
 * aborted. They go to the engine one at a time, each as the one before it ended (PGlite runs them
 * so anyway), so the abort is judged as each starts: none waits inside the engine's own queue to
 * write after it.
 */
const refusedOnceAbandoned = (client: ClientSurface, signal: AbortSignal): ClientSurface => {
  const refused = () => Promise.reject(closedError(`the embedded database was abandoned: ${abandonReason(signal)}`))
  // Settled, never rejected: the previous statement's end, whatever its outcome.
  let tail: Promise<unknown> = Promise.resolve()
  const inTurn = <A>(run: () => Promise<A>): Promise<A> => {
    const next = tail.then(() => (signal.aborted ? refused() : run()))
    tail = next.catch(() => undefined)
    return next
  }
  return {
    query: ((...args: Parameters<PGlite["query"]>) => inTurn(() => client.query(...args))) as PGlite["query"],
    exec: ((...args: Parameters<PGlite["exec"]>) => inTurn(() => client.exec(...args))) as PGlite["exec"],
  }
}
