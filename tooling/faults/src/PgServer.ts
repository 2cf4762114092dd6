/**
 * A PostgreSQL server a scenario can stop and start again on the same data directory: an
 * embedded server of its own (`@engram/test-pg`), whose postmaster is stopped with SIGINT (fast
 * shutdown: every client gets "terminating connection due to administrator command", as an
 * operator's restart does) and started again with the same settings, port and data, as the
 * data directory's owner.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { readFileSync, statSync } from "node:fs"
import { join } from "node:path"
import { setTimeout as delay } from "node:timers/promises"
import { startEmbeddedPostgres, type EmbeddedPostgresServer } from "@engram/test-pg"

/** A server and its stop and start. */
export interface RestartablePostgres {
  readonly server: EmbeddedPostgresServer
  /** Fast shutdown; resolves once the postmaster exited. */
  readonly stop: () => Promise<void>
  /** Starts it again; resolves once it accepts connections. */
  readonly start: () => Promise<void>
  /** Stops it for good and deletes its files. */
  readonly close: () => Promise<void>
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** Starts a server of the scenario's own (never the test run's shared one). */
export const startRestartablePostgres = async (): Promise<RestartablePostgres> => {
  const server = await startEmbeddedPostgres()
  const owner = statSync(server.dataDir)
  let child: ChildProcess | undefined
  const stop = async () => {
    const pid = Number(readFileSync(join(server.dataDir, "postmaster.pid"), "utf8").split("\n")[0])
    process.kill(pid, "SIGINT")
    for (let i = 0; i < 300 && alive(pid); i++) await delay(50)
    if (alive(pid)) throw new Error(`postgres ${pid} did not stop`)
  }
  const start = () =>
    new Promise<void>((resolve, reject) => {
      const settings = ["listen_addresses=127.0.0.1", `unix_socket_directories=${server.rootDir}`, "max_connections=200", "fsync=off", "synchronous_commit=off", "full_page_writes=off"]
      child = spawn(join(server.binDir, "postgres"), ["-D", server.dataDir, "-p", String(server.port), ...settings.flatMap((s) => ["-c", s])], {
        ...(process.getuid?.() === 0 ? { uid: owner.uid, gid: owner.gid } : {}),
        env: { ...process.env, LC_ALL: "C", LC_MESSAGES: "C" },
        stdio: ["ignore", "pipe", "pipe"],
      })
      let log = ""
      const onData = (b: Buffer) => {
        log += b.toString()
        if (log.includes("database system is ready to accept connections")) resolve()
      }
      child.stdout?.on("data", onData)
      child.stderr?.on("data", onData)
      child.once("exit", (code) => reject(new Error(`postgres exited with ${code}:\n${log}`)))
    })
  return {
    server,
    stop,
    start,
    close: async () => {
      if (child !== undefined && child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child?.once("exit", r))
        child.kill("SIGINT")
        await exited
      }
      await server.stop()
    },
  }
}
