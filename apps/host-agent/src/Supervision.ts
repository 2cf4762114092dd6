/**
 * Whether the guests can outlive this agent where it runs. QEMU runs in a session of its own, but
 * in the agent's cgroup and PID namespace: what stops the agent's whole cgroup or namespace ends
 * the guests too, and a restart then finds none of them (they are logged as lost). Two such
 * places are told at start:
 * - a systemd service whose `KillMode` is not `process`: systemd's default (`control-group`)
 *   kills every process of the unit's cgroup on a stop or restart;
 * - the first process of a PID namespace (a container's): when it ends, the kernel kills every
 *   process of the namespace, and a container's stop kills its cgroup anyway.
 */
import { execFile } from "node:child_process"
import { readFile } from "node:fs/promises"
import { Effect } from "effect"

/**
 * The systemd service whose cgroup holds this process, from `/proc/self/cgroup`'s text: the
 * cgroup's own name, where it is a service (a user's session, `user@1000.service/app.slice/…`,
 * is not the agent's unit); undefined outside one.
 */
export const serviceOf = (cgroupText: string): string | undefined => {
  for (const line of cgroupText.split("\n")) {
    // `0::/system.slice/engram-agent.service` (cgroup v2) or `1:name=systemd:/system.slice/…` (v1).
    const m = /^\d+:(?:name=systemd)?:(\/.*)$/.exec(line.trim())
    const unit = m?.[1]?.split("/").at(-1)
    if (unit !== undefined && unit.endsWith(".service") && !unit.startsWith("user@")) return unit
  }
  return undefined
}

/** What stops the agent that would end its guests too, as warnings (none when guests outlive it). */
export interface Findings {
  readonly warnings: readonly { readonly message: string; readonly fields: Record<string, unknown> }[]
}

/** `systemctl show -p KillMode --value <unit>`, or undefined when it cannot be asked (within 3 s). */
const killModeOf = (unit: string): Promise<string | undefined> =>
  new Promise((resolve) => {
    execFile("systemctl", ["show", "--property=KillMode", "--value", unit], { timeout: 3000 }, (e, stdout) => resolve(e === null ? stdout.trim() : undefined))
  })

/**
 * Checks where this agent runs: `pid` (this process's, in its namespace), the text of
 * `/proc/self/cgroup`, and how to ask systemd a unit's `KillMode`.
 */
export const check = (
  pid: number = process.pid,
  cgroupText: () => Promise<string> = () => readFile("/proc/self/cgroup", "utf8"),
  killMode: (unit: string) => Promise<string | undefined> = killModeOf,
): Effect.Effect<Findings> =>
  Effect.promise(async () => {
    const warnings: Findings["warnings"][number][] = []
    if (pid === 1)
      warnings.push({
        message:
          "the agent is the first process of its PID namespace (a container's): its guests end when it does, and a restart finds none of them; run it on the host (a systemd service with KillMode=process)",
        fields: { pid },
      })
    const unit = serviceOf(await cgroupText().catch(() => ""))
    if (unit !== undefined) {
      const mode = await killMode(unit)
      if (mode !== "process")
        warnings.push({
          message: `the agent runs in the systemd service ${unit} with KillMode=${mode ?? "unknown"}: stopping or restarting the service ends its guests too (QEMU runs in the service's cgroup); set KillMode=process in the unit so guests outlive a restart`,
          fields: { unit, killMode: mode ?? null },
        })
    }
    return { warnings }
  })
