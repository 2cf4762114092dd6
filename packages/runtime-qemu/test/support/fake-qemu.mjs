// A fake qemu-system-x86_64 for the runtime's tests: it speaks enough QMP for the runtime
// (start, park, descend, restore, a move's source) and stalls in scripted ways. Its settings ride
// on the command line as extra arguments (QemuConfig.extraArgs), so each runtime's fakes have
// their own:
//   -fake-mode M      descent-stall: a capture keeps passing but sends nothing and never ends;
//                     descent-slow: a capture sends a little every 100 ms, ends after -fake-steps;
//                     descent-fail: as descent-slow, and it fails (QEMU's error-desc) instead of ending;
//                     load-stall: an incoming stream never ends;
//                     switchover-stall: a move's final round never ends (the target stopped reading);
//                     switchover-mute: as switchover-stall, and the monitor answers nothing more;
//                     cancel-ignored: migrate_cancel is answered and does nothing;
//                     stop-late: a `stop` runs, and is answered, 1.5 s after it was sent.
//   -fake-log F       every command and event, one a line: `<ms> cmd <name>` / `<ms> event <name> <data>`.
//   -fake-pids F      its pid is appended there (the tests end every fake listed: FakeQemu.ts).
//   -fake-wedge-ms N  how long SIGUSR1 holds the monitor (QEMU's main loop busy): no greeting, no answers.
//   (SIGUSR2 closes the monitor's connection, the process living on: a monitor that restarted;
//   as QEMU's `server=on,wait=off` socket, it greets the next client, unless wedged.)
//   -fake-steps N     descent-slow's steps (default 30).
//   -fake-failed-stops N,M  the Nth and Mth `stop` (counted from 1) answer QEMU's error and do nothing.
//   -fake-drop-on-migrate 1  once it has answered a `migrate`, the monitor wedges (as SIGUSR1) and
//                     closes the runtime's connection (as SIGUSR2): what the migration says next
//                     goes to no one until the runtime reconnects, after -fake-wedge-ms.
// As QEMU's QMP socket chardev, it serves one client at a time: another waits in the listen
// backlog, not greeted, until the one before disconnects.
import fs from "node:fs"
import net from "node:net"
import process from "node:process"
import { clearTimeout, setInterval, setTimeout } from "node:timers"

const args = process.argv.slice(2)
if (args[0] === "--version") {
  process.stdout.write("QEMU emulator version 7.2.0 (fake)\n")
  process.exit(0)
}
const opt = (flag) => (args.includes(flag) ? args[args.indexOf(flag) + 1] : undefined)
const socketPath = opt("-qmp").replace(/^unix:/, "").split(",")[0]
const mode = opt("-fake-mode") ?? ""
const logFile = opt("-fake-log")
const wedgeMs = Number(opt("-fake-wedge-ms") ?? 5000)
const steps = Number(opt("-fake-steps") ?? 30)
const dropOnMigrate = opt("-fake-drop-on-migrate") === "1"
const failedStops = new Set((opt("-fake-failed-stops") ?? "").split(",").filter((n) => n !== "").map(Number))
let stops = 0
const log = (line) => logFile !== undefined && fs.appendFileSync(logFile, `${Date.now()} ${line}\n`)
fs.writeFileSync(opt("-pidfile"), String(process.pid))
if (opt("-fake-pids") !== undefined) fs.appendFileSync(opt("-fake-pids"), `${process.pid}\n`)

const MiB = 1 << 20
const incoming = args.includes("-incoming")
let runState = incoming ? "inmigrate" : args.includes("-S") ? "prelaunch" : "running"
const running = () => runState === "running"
let migration // QEMU's MigrationInfo: { status, ram? }
let ranAtMigrate = false // whether the guest ran when the outgoing migration began (QEMU's vm_was_running)
let timers = []
const later = (ms, f) => timers.push(setTimeout(f, ms))
const every = (ms, f) => timers.push(setInterval(f, ms))
const stopTimers = () => {
  // clearTimeout clears intervals too.
  for (const t of timers) clearTimeout(t)
  timers = []
}

// The monitor: muted (answers nothing) for good, or wedged (no greeting, no answer) for a while.
let muted = false
let wedged = false
const wedge = () => {
  wedged = true
  log("wedged")
  setTimeout(() => {
    wedged = false
    log("unwedged")
    serveNext()
  }, wedgeMs)
}
process.on("SIGUSR1", wedge)

process.on("SIGUSR2", () => {
  log("monitor closed")
  client?.destroy()
})

/** The client served, and those waiting in the backlog (not accepted yet: no greeting). */
let client = null
const backlog = []
const clients = () => (client === null ? [] : [client])
const ts = () => {
  const t = Date.now()
  return { seconds: Math.floor(t / 1000), microseconds: (t % 1000) * 1000 }
}
const event = (name, data = {}) => {
  log(`event ${name} ${JSON.stringify(data)}`)
  for (const c of clients()) c.write(`${JSON.stringify({ event: name, data, timestamp: ts() })}\n`)
}
const setRun = (state) => {
  const was = running()
  runState = state
  if (was && !running()) event("STOP")
  if (!was && running()) event("RESUME")
}
const setMigration = (status, ram = migration?.ram) => {
  migration = { status, ...(ram === undefined ? {} : { ram }) }
  event("MIGRATION", { status })
}
const ram = (transferred, remaining) => ({ transferred, remaining, total: 64 * MiB, duplicate: 0, normal: Math.floor(transferred / 4096), "page-size": 4096 })
const ended = () => migration === undefined || ["completed", "failed", "cancelled"].includes(migration.status)

/** `exec:cat > 'path'`: the file a capture writes. */
const captureFile = (uri) => /^exec:cat > '(.*)'$/.exec(uri)?.[1]?.replaceAll(`'\\''`, "'")

const commands = {
  "qmp_capabilities": () => ({}),
  "query-status": () => ({ status: runState, running: running() }),
  "stop": () => {
    stops += 1
    if (failedStops.has(stops)) return { error: { class: "GenericError", desc: `fake: stop ${stops} failed` } }
    setRun(runState === "running" ? "paused" : runState)
    return {}
  },
  "cont": () => (setRun("running"), {}),
  "query-migrate": () => migration ?? {},
  "migrate-set-capabilities": () => ({}),
  "migrate-set-parameters": () => ({}),
  "migrate": (a) => {
    if (!ended()) return { error: { class: "GenericError", desc: "There's a migration process in progress" } }
    // As QEMU 7.2 (migrate_prepare).
    if (runState === "postmigrate") return { error: { class: "GenericError", desc: "Can't migrate the vm that was paused due to previous migration" } }
    ranAtMigrate = running()
    const file = captureFile(a.uri)
    setMigration("setup", ram(0, 64 * MiB))
    setMigration("active")
    if (mode === "descent-stall") {
      let n = 0
      every(100, () => event("MIGRATION_PASS", { pass: ++n }))
    } else if (mode === "descent-slow" || mode === "descent-fail") {
      let n = 0
      every(100, () => {
        n += 1
        migration = { ...migration, ram: ram(n * MiB, (steps - n) * MiB) }
        event("MIGRATION_PASS", { pass: n })
        if (n < steps) return
        if (mode === "descent-slow") complete(file)
        else {
          stopTimers()
          migration = { status: "failed", ram: migration.ram, "error-desc": "fake: Unable to write to command: Broken pipe" }
          event("MIGRATION", { status: "failed" })
        }
      })
    } else if (mode === "switchover-stall" || mode === "switchover-mute") {
      event("MIGRATION_PASS", { pass: 1 })
      later(50, () => {
        migration = { ...migration, ram: ram(64 * MiB, 4096) }
        event("MIGRATION_PASS", { pass: 2 })
        later(30, () => {
          setRun("finish-migrate")
          setMigration("pre-switchover")
        })
      })
    } else later(20, () => complete(file))
    return {}
  },
  "migrate-continue": () => {
    setMigration("device")
    // The target stopped reading: the final round never ends.
    if (mode === "switchover-mute") muted = true
    return {}
  },
  "migrate_cancel": () => {
    if (mode === "cancel-ignored" || ended()) return {}
    stopTimers()
    // QEMU resumes a guest it stopped for the migration (pre-switchover, device) if it ran when
    // the migration began; one that was stopped already stays stopped, in postmigrate.
    if (runState === "finish-migrate") setRun(ranAtMigrate ? "running" : "postmigrate")
    setMigration("cancelled")
    return {}
  },
  "migrate-incoming": () => {
    setMigration("setup")
    setMigration("active")
    if (mode !== "load-stall")
      later(20, () => {
        setMigration("completed")
        runState = "paused"
      })
    return {}
  },
  "quit": () => (later(10, () => process.exit(0)), {}),
}

function complete(file) {
  stopTimers()
  if (file !== undefined) fs.writeFileSync(file, "fake QEMU state\n")
  // As QEMU: the guest stays stopped after a completed outgoing migration.
  setRun("postmigrate")
  setMigration("completed")
}

const serve = (c) => {
  client = c
  c.write(`${JSON.stringify({ QMP: { version: { qemu: { major: 7, minor: 2, micro: 0 } }, capabilities: [] } })}\n`)
  let buffer = ""
  c.on("data", (chunk) => {
    buffer += chunk
    for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
      const line = buffer.slice(0, nl).trim()
      buffer = buffer.slice(nl + 1)
      if (line === "") continue
      const m = JSON.parse(line)
      log(`cmd ${m.execute}${muted ? " (muted: no answer)" : ""}`)
      if (muted) continue
      const run = () => {
        const answer = (commands[m.execute] ?? (() => ({})))(m.arguments ?? {})
        c.write(`${JSON.stringify("error" in answer ? { error: answer.error, id: m.id } : { return: answer, id: m.id })}\n`)
        if (dropOnMigrate && m.execute === "migrate" && !("error" in answer)) {
          wedge()
          log("monitor closed")
          // After the answer: `end` sends what was written first.
          c.end()
        }
      }
      // stop-late: a `stop` runs (and is answered) 1.5 s late, after the runtime's 1 s timeout.
      if (mode === "stop-late" && m.execute === "stop") setTimeout(run, 1500)
      else run()
    }
  })
}
const serveNext = () => {
  if (wedged || client !== null) return
  for (let c = backlog.shift(); c !== undefined; c = backlog.shift()) {
    if (c.destroyed) continue
    serve(c)
    return
  }
}
const server = net.createServer((c) => {
  c.setEncoding("utf8")
  c.on("error", () => undefined)
  c.on("close", () => {
    if (backlog.includes(c)) backlog.splice(backlog.indexOf(c), 1)
    if (client === c) {
      client = null
      serveNext()
    }
  })
  // QEMU listens with a backlog of 1: a client or two wait, more are refused.
  if (backlog.length >= 2) {
    log("connection refused: backlog full")
    c.destroy()
    return
  }
  backlog.push(c)
  if (wedged || client !== null) log("connection waits in the backlog")
  serveNext()
})
fs.rmSync(socketPath, { force: true })
server.listen(socketPath)
process.on("SIGTERM", () => {
  log("SIGTERM")
  process.exit(0)
})
