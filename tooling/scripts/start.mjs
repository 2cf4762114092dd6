#!/usr/bin/env node
// `pnpm start`: the coordinator and the demo fleet (two simulated hosts and their agents, and
// the tour) as two child processes of this one, from source (tsx). The root script is
// `exec node …`: without `exec`, the shell pnpm runs the script in dies of the Ctrl-C first
// and pnpm reports the script as failed. Ctrl-C (SIGINT to the terminal's process group) or a
// SIGTERM to this process stops the demo first — it ends the sessions on its hosts, which needs
// the coordinator still serving — then the coordinator, waits for both, and exits 0: no
// package-manager noise. The coordinator runs in a process group of its own so that Ctrl-C
// reaches it only through this script, in that order; its IPC channel to this process closes
// however this process ends, and then it stops (apps/coordinator/src/main.ts). If a child stops on its own (a port in
// use, a refused token), the other is stopped and this exits with the child's code.
//
// The coordinator logs warnings and errors only, so the tour is readable; set
// ENGRAM_LOG_LEVEL=info (or ENGRAM_TOUR_VERBOSE=1) to see every line.
// First: on a Node.js older than engram supports, one line and exit 1 (not a silent wait).
import "../../packages/process/check-node.js"
import { spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { createServer } from "node:net"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..")
const env = { ...process.env, INIT_CWD: process.env.INIT_CWD || process.cwd() }
const verbose = env.ENGRAM_TOUR_VERBOSE === "1" || env.ENGRAM_TOUR_VERBOSE === "true"

/** Whether `port` (0: the kernel's choice) can be bound on 127.0.0.1 now: the port bound, or null. */
const bindable = (port) =>
  new Promise((resolve) => {
    const server = createServer()
    server.once("error", () => resolve(null))
    server.listen(port, "127.0.0.1", () => {
      const { port: bound } = server.address()
      server.close(() => resolve(bound))
    })
  })

/**
 * A free TCP port on 127.0.0.1 (for ENGRAM_PORT=0: the demo must know where the coordinator
 * listens), which the coordinator binds seconds later (tsx compiles it first). Picked below the
 * kernel's ephemeral range, as @engram/test-pg's freePort: a port from that range (listen(0)'s)
 * may meanwhile become the local port of any outgoing connection on the machine, and the
 * coordinator would exit with EADDRINUSE. The kernel's choice only where the range starts low.
 */
const freePort = async () => {
  let low = 32768
  try {
    low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]) || low
  } catch {
    // not Linux: its default
  }
  const floor = 20_000
  for (let tries = 0; low - floor >= 2_000 && tries < 64; tries++) {
    const port = await bindable(floor + Math.floor(Math.random() * (low - floor)))
    if (port !== null) return port
  }
  const port = await bindable(0)
  if (port === null) throw new Error("no free TCP port on 127.0.0.1")
  return port
}

const port = env.ENGRAM_PORT === "0" ? String(await freePort()) : env.ENGRAM_PORT || "7070"
const host = env.ENGRAM_HOST || "127.0.0.1"
const url = `http://${host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host}:${port}`

/** Runs a package's source with tsx (resolved from that package's dependencies). */
const start = (name, dir, file, extra, options = {}) =>
  spawn(process.execPath, ["--import", "tsx", "--conditions=@engram/source", file], {
    cwd: join(root, dir),
    env: { ...env, ...extra },
    stdio: "inherit",
    ...options,
  }).on("error", (e) => {
    console.error(`${name}: ${e.message}`)
  })

const coordinator = start(
  "coordinator",
  "apps/coordinator",
  "src/main.ts",
  { ENGRAM_PORT: port, ENGRAM_LOG_LEVEL: env.ENGRAM_LOG_LEVEL || (verbose ? "info" : "warn") },
  // An IPC channel too: the coordinator stops when this process goes away, even SIGKILLed.
  { detached: true, stdio: ["inherit", "inherit", "inherit", "ipc"] },
)
const demo = start("demo", "tooling/demo", "src/demo.ts", { ENGRAM_COORDINATOR_URL: env.ENGRAM_COORDINATOR_URL || url, ENGRAM_PORT: port })
const children = [coordinator, demo]

const running = (c) => c.exitCode === null && c.signalCode === null
const exited = (c) => (running(c) ? new Promise((resolve) => c.once("exit", resolve)) : Promise.resolve())

let stopping = false
let code = 0
const stop = async () => {
  if (stopping) {
    // A second Ctrl-C: do not wait any longer.
    for (const c of children) if (running(c)) c.kill("SIGKILL")
    return
  }
  stopping = true
  if (running(demo)) demo.kill("SIGTERM")
  // The demo ends its sessions through the coordinator: give it that long, then stop the coordinator.
  await Promise.race([exited(demo), new Promise((resolve) => setTimeout(resolve, 15_000).unref())])
  if (running(coordinator)) coordinator.kill("SIGTERM")
}
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => void stop())
// However this process ends, the coordinator (in its own process group) does not outlive it.
process.on("exit", () => {
  if (running(coordinator)) coordinator.kill("SIGKILL")
})

await Promise.all(
  children.map(
    (c) =>
      new Promise((resolve) =>
        c.on("exit", (exitCode, signal) => {
          // A child that stops on its own before we asked: stop the rest and report its code.
          if (!stopping) {
            code = exitCode ?? (signal === null ? 1 : 128)
            void stop()
          } else if (exitCode !== null && exitCode !== 0 && code === 0) code = exitCode
          resolve()
        }),
      ),
  ),
)
process.exit(code)
