#!/usr/bin/env node
// `engram`: the command line (`engram status`, `engram hosts ls`, …) and the services it runs
// (`engram coordinator`, `engram agent`). First of all an unsupported Node.js is refused in one
// line. The command line is one bundled file (dist/main.js) that starts in a fraction of a
// second; the services load their own packages only when asked for. In a checkout of the
// repository (`pnpm engram` at its root) the command line is rebuilt when a source it was built
// from changed, and the services run from their sources (through tsx), as `pnpm start` runs them.
import "@engram/process/check-node"
import { spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import module from "node:module"
import { dirname, join } from "node:path"
import process from "node:process"
import { fileURLToPath } from "node:url"
import { staleness } from "./fresh.js"

const packageDir = join(dirname(fileURLToPath(import.meta.url)), "..")
const inCheckout = existsSync(join(packageDir, "tsup.config.ts"))
// pnpm passes `--` through (`pnpm engram -- status`): it is not an argument.
const args = process.argv[2] === "--" ? process.argv.slice(3) : process.argv.slice(2)

/** The services, by command: their package and what `--help` says. */
const services = {
  coordinator: {
    name: "@engram/coordinator",
    source: "../coordinator/src/main.ts",
    help: [
      "engram coordinator: the coordinator (HTTP API, reaper, dashboard at /ui), configured by ENGRAM_* variables:",
      "  ENGRAM_PORT (7070), ENGRAM_HOST (127.0.0.1), ENGRAM_DATA_DIR (./.engram: PGlite and the generated admin token),",
      "  ENGRAM_DATABASE_URL (PostgreSQL instead of PGlite), ENGRAM_ADMIN_TOKEN, ENGRAM_LOG_FORMAT, ENGRAM_LOG_LEVEL.",
      "Every setting: https://www.npmjs.com/package/@engram/coordinator (README, Configuration).",
    ],
  },
  agent: {
    name: "@engram/host-agent",
    source: "../host-agent/src/main.ts",
    help: [
      "engram agent: one host's agent (measures, reports, heartbeats, runs its VMs), configured by ENGRAM_* variables:",
      "  ENGRAM_COORDINATOR_URL, ENGRAM_HOST_ID and ENGRAM_HOST_TOKEN (engram hosts add <id>), ENGRAM_PEER_SECRET,",
      "  ENGRAM_PEERS, ENGRAM_RUNTIME (sim or qemu, with ENGRAM_QEMU_KERNEL or ENGRAM_QEMU_DISK).",
      "Every setting: https://www.npmjs.com/package/@engram/host-agent (README, Configuration).",
    ],
  },
}

const service = Object.hasOwn(services, args[0] ?? "") ? services[args[0]] : undefined
if (service !== undefined) {
  if (args[1] === "--help" || args[1] === "-h") {
    process.stdout.write(`${service.help.join("\n")}\n`)
    process.exit(0)
  }
  if (args.length > 1) {
    process.stderr.write(`engram: ${args[0]} takes no arguments (${args.slice(1).join(" ")}): it reads ENGRAM_* variables (engram ${args[0]} --help)\n`)
    process.exit(2)
  }
  if (inCheckout) {
    // This process becomes the service (same pid: signals reach it as they would reach `engram`).
    const tsx = import.meta.resolve("tsx")
    process.execve(process.execPath, [process.execPath, "--import", tsx, "--conditions=@engram/source", join(packageDir, service.source)], process.env)
  }
  process.argv.splice(2)
  await import(`${service.name}/main`)
} else {
  if (inCheckout) {
    const stale = staleness(packageDir)
    if (stale !== null) {
      process.stderr.write(`engram: building the command first (${stale})…\n`)
      const built = spawnSync(process.execPath, ["--import", import.meta.resolve("tsx"), join(packageDir, "scripts/build-bin.ts")], { cwd: packageDir, stdio: ["ignore", "ignore", "inherit"] })
      if (built.status !== 0) process.exit(built.status ?? 1)
    }
  }
  // V8's compiled code is cached on disk, so every later start skips most of the parsing.
  module.enableCompileCache?.()
  await import("../dist/main.js")
}
