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
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..")
const env = { ...process.env, INIT_CWD: process.env.INIT_CWD || process.cwd() }
const verbose = env.ENGRAM_TOUR_VERBOSE === "1" || env.ENGRAM_TOUR_VERBOSE === "true"

// ENGRAM_PORT=0: the coordinator takes the port the kernel gives it and tells this process over
// the IPC channel (apps/coordinator/src/main.ts); the demo starts once it knows where.
const port = env.ENGRAM_PORT || "7070"
const host = env.ENGRAM_HOST || "127.0.0.1"
const urlOn = (p) => `http://${host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host}:${p}`

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
/** The coordinator's URL: at once for a fixed port; for port 0 once it says where it listens (null: it ended first). */
const listening =
  port === "0"
    ? new Promise((resolve) => {
        coordinator.on("message", (m) => {
          if (m !== null && typeof m === "object" && m._tag === "engram-coordinator-listening" && Number.isInteger(m.port)) resolve(urlOn(m.port))
        })
        coordinator.once("exit", () => resolve(null))
      })
    : Promise.resolve(urlOn(port))
/** The children running or ended (the demo joins once the coordinator's URL is known). */
const children = [coordinator]
let demo = null
const startDemo = (url) => {
  demo = start("demo", "tooling/demo", "src/demo.ts", { ENGRAM_COORDINATOR_URL: env.ENGRAM_COORDINATOR_URL || url, ENGRAM_PORT: new URL(url).port || port })
  children.push(demo)
  return demo
}

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
  if (demo !== null && running(demo)) demo.kill("SIGTERM")
  // The demo ends its sessions through the coordinator: give it that long, then stop the coordinator.
  if (demo !== null) await Promise.race([exited(demo), new Promise((resolve) => setTimeout(resolve, 15_000).unref())])
  if (running(coordinator)) coordinator.kill("SIGTERM")
}
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => void stop())
// However this process ends, the coordinator (in its own process group) does not outlive it.
process.on("exit", () => {
  if (running(coordinator)) coordinator.kill("SIGKILL")
})

/** Resolves when `c` exits; one that stops on its own before we asked stops the rest, and its code is reported. */
const watch = (c) =>
  new Promise((resolve) =>
    c.on("exit", (exitCode, signal) => {
      if (!stopping) {
        code = exitCode ?? (signal === null ? 1 : 128)
        void stop()
      } else if (exitCode !== null && exitCode !== 0 && code === 0) code = exitCode
      resolve()
    }),
  )
const coordinatorExited = watch(coordinator)
const url = await listening
// Not when the coordinator ended first (a port in use, a refused token), nor after a Ctrl-C.
const demoExited = url !== null && !stopping ? watch(startDemo(url)) : Promise.resolve()
await Promise.all([coordinatorExited, demoExited])
process.exit(code)
