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
import { serviceCommand } from "./services.js"

const packageDir = join(dirname(fileURLToPath(import.meta.url)), "..")
const inCheckout = existsSync(join(packageDir, "tsup.config.ts"))
// pnpm passes `--` through (`pnpm engram -- status`): it is not an argument.
const args = process.argv[2] === "--" ? process.argv.slice(3) : process.argv.slice(2)

const command = serviceCommand(args)
if (command !== null) {
  if (command._tag === "Help") {
    process.stdout.write(command.text)
    process.exit(0)
  }
  if (command._tag === "Usage") {
    process.stderr.write(command.text)
    process.exit(2)
  }
  const service = command.service
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
