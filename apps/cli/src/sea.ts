/**
 * The single executable's entry (`pnpm --filter @engram/cli build:sea` makes `dist-sea/engram`,
 * a Node.js single executable application): the command line and both services in one file that
 * needs neither Node.js nor node_modules. What the bundle reads beside itself at run time (store-pg's
 * migrations, the dashboard's page, PGlite's WebAssembly and data, the coordinator's
 * package.json) is carried as the executable's assets and written once to a cache directory,
 * which the bundle's `import.meta.url` points into (see scripts/build-sea.ts).
 */
import "@engram/process/check-node"
import { serviceCommand } from "../bin/services.js"

const main = async (): Promise<void> => {
  const args = process.argv.slice(2)
  const command = serviceCommand(args)
  if (command === null) {
    await import("./main.js")
    return
  }
  if (command._tag !== "Run") {
    ;(command._tag === "Help" ? process.stdout : process.stderr).write(command.text)
    process.exitCode = command._tag === "Help" ? 0 : 2
    return
  }
  process.argv.splice(2)
  if (command.command === "coordinator") await import("@engram/coordinator/main")
  else await import("@engram/host-agent/main")
}

void main()
