// The services `engram` runs (`engram coordinator`, `engram agent`): their packages, what their
// `--help` says, and how a command line naming one is read. Shared by the installed command
// (bin/engram.js) and the single executable (src/sea.ts).

/** The services, by command: their package and what `--help` says. */
export const services = {
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
      "  ENGRAM_AGENT_HOST (or ENGRAM_AGENT_PEER_URL: where peers reach it for moves), ENGRAM_RUNTIME (sim or qemu, with ENGRAM_QEMU_KERNEL or ENGRAM_QEMU_DISK).",
      "Every setting: https://www.npmjs.com/package/@engram/host-agent (README, Configuration).",
    ],
  },
}

/**
 * What a command line (without node and the script) asks of the services: null when it names
 * none (the command line's own commands), else print the help (exit 0), refuse arguments (exit
 * 2: a service reads ENGRAM_* variables only), or run the service.
 */
export const serviceCommand = (args) => {
  const command = args[0] ?? ""
  if (!Object.hasOwn(services, command)) return null
  const service = services[command]
  if (args[1] === "--help" || args[1] === "-h") return { _tag: "Help", text: `${service.help.join("\n")}\n` }
  if (args.length > 1) {
    return { _tag: "Usage", text: `engram: ${command} takes no arguments (${args.slice(1).join(" ")}): it reads ENGRAM_* variables (engram ${command} --help)\n` }
  }
  return { _tag: "Run", command, service }
}
