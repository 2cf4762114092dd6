/**
 * What the agent's real-QEMU tests share: whether QEMU is here, a guest's console (its counter
 * lines tell "continued" from "rebooted"), and the QEMU processes of an agent's VM directory
 * (read from /proc, so a test sees what really runs, whatever the agent believes).
 */
import { readdirSync, readFileSync } from "node:fs"
import { consoleTicks, type Tick } from "@engram/guest"

export { boots, consoleTicks, haveQemu, runQemuTests } from "@engram/guest"
import { QemuProcess } from "@engram/runtime-qemu"

/** The serial console of `vmId` under a QEMU state directory (a restore or an incoming move starts a new one). */
export const consolePath = (stateDir: string, vmId: string) => QemuProcess.pathsOf(stateDir, vmId).console

/** The last counter line of a console; throws when there is none. */
export const lastTick = (path: string): Tick => {
  const t = consoleTicks(path).at(-1)
  if (t === undefined) throw new Error(`no counter line in ${path} yet`)
  return t
}

/** The guest continued: the same boot, a higher counter. */
export const continuedFrom = (before: Tick) => (t: Tick | undefined) => t !== undefined && t.bootId === before.bootId && t.n > before.n

/** The live QEMU processes whose command line names `dir` (a VM directory), by pid. */
export const qemuProcesses = (dir: string): { readonly pid: number; readonly vmName: string }[] => {
  const out: { pid: number; vmName: string }[] = []
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    const pid = Number(entry)
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")
      if (!(argv[0] ?? "").includes("qemu-system") || !argv.some((a) => a.includes(dir)) || !QemuProcess.alive(pid)) continue
      const name = argv[argv.indexOf("-name") + 1] ?? ""
      out.push({ pid, vmName: name.replace(/^engram-/, "") })
    } catch {
      // gone meanwhile
    }
  }
  return out
}

/** Ends every QEMU process of `dir` (a test's cleanup: they outlive their agents by design). */
export const killQemus = (dir: string): number => {
  const found = qemuProcesses(dir)
  for (const p of found) {
    try {
      process.kill(p.pid, "SIGKILL")
    } catch {
      // already gone
    }
  }
  return found.length
}
