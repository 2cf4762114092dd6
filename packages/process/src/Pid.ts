/**
 * Which process wrote a file, told apart from a later process given the same pid. A pid alone
 * is reused: a container restarted after a crash gives its first process the same small pid as
 * before, and after a reboot a daemon may get the pid an agent had. So an owner is recorded with
 * its start (clock ticks since boot, `/proc/<pid>/stat`'s 22nd field), the boot it started in
 * (`/proc/sys/kernel/random/boot_id`) and its PID namespace (`/proc/self/ns/pid`: a pid means
 * something only in its namespace, and each container has its own), and a recorded owner runs
 * only while a process of that pid runs with the same start in the same boot. An owner in another
 * PID namespace or boot (an earlier boot, or another machine sharing the file's volume) cannot be
 * seen from this one (`judge` says "unseen"): whoever needs to know must learn it otherwise (the
 * coordinator's lock: from the file's refreshes). Where `/proc` cannot
 * tell (not Linux, a hidden process), the pid alone decides, as before: a process of that pid runs.
 */
import { readFileSync, readlinkSync } from "node:fs"

/** A process as recorded by a file it owns: its pid and, where known, its start and boot. */
export interface Owner {
  readonly pid: number
  /** Its start, in clock ticks since boot (digits), where `/proc` tells it. */
  readonly startTicks?: string | undefined
  /** The boot it started in (the kernel's boot id), where `/proc` tells it. */
  readonly bootId?: string | undefined
  /** Its PID namespace (the namespace's inode number), where `/proc` tells it. */
  readonly pidNs?: string | undefined
}

/** Whether a process of `pid` runs on this machine (one we may not signal runs too). */
export const pidRuns = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as { code?: unknown }).code === "EPERM"
  }
}

/** The start of the process `pid` in clock ticks since boot, or undefined where `/proc` cannot tell (or it runs no more). */
export const startTicksOf = (pid: number): string | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    // The fields after the parenthesised command name (which may hold spaces) begin with the
    // state, field 3: the start is field 22.
    const v = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]
    return v !== undefined && /^\d+$/.test(v) ? v : undefined
  } catch {
    return undefined
  }
}

/** This boot's id, or undefined where `/proc` cannot tell. */
export const bootId = (): string | undefined => {
  try {
    const v = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    return /^[0-9a-f-]{8,64}$/.test(v) ? v : undefined
  } catch {
    return undefined
  }
}

/** This process's PID namespace (the inode number of `/proc/self/ns/pid`), or undefined where `/proc` cannot tell. */
export const pidNamespace = (): string | undefined => {
  try {
    return /^pid:\[(\d+)\]$/.exec(readlinkSync("/proc/self/ns/pid"))?.[1]
  } catch {
    return undefined
  }
}

/** This process, as it records itself. */
export const self = (): Owner => ({ pid: process.pid, startTicks: startTicksOf(process.pid), bootId: bootId(), pidNs: pidNamespace() })

/**
 * What this process can tell of `owner`: "runs" (a process of its pid runs and, where both the
 * record and `/proc` tell them, with the same start), "gone", or "unseen": it ran in another
 * PID namespace, which no pid here names, or in another boot id: an earlier boot of this
 * machine, or another machine (a file on a volume several machines mount), which no pid here
 * names either.
 */
export const judge = (owner: Owner): "runs" | "gone" | "unseen" => {
  if (owner.bootId !== undefined) {
    const now = bootId()
    if (now !== undefined && now !== owner.bootId) return "unseen"
  }
  if (owner.pidNs !== undefined) {
    const here = pidNamespace()
    if (here !== undefined && here !== owner.pidNs) return "unseen"
  }
  if (!pidRuns(owner.pid)) return "gone"
  if (owner.startTicks !== undefined) {
    const now = startTicksOf(owner.pid)
    if (now !== undefined && now !== owner.startTicks) return "gone"
  }
  return "runs"
}

/** Whether `owner` runs as far as this process can tell: `judge`'s "runs", and "unseen" too (it may). */
export const runs = (owner: Owner): boolean => judge(owner) !== "gone"

/** An owner as one line: `<pid>`, then its start, boot and PID namespace as far as known (`<pid> <startTicks> <bootId> <pidNs>`). */
export const format = (owner: Owner): string => {
  const known = [owner.startTicks, owner.bootId, owner.pidNs]
  const n = known.findIndex((v) => v === undefined)
  return [owner.pid, ...(n === -1 ? known : known.slice(0, n))].join(" ")
}

/** The owner `format` wrote (a lone pid too: the form of before), or undefined when `text` is not one. */
export const parse = (text: string): Owner | undefined => {
  const m = /^(\d+)(?: (\d+)(?: ([0-9a-f-]{8,64})(?: (\d+))?)?)?$/.exec(text.trim())
  if (m === null) return undefined
  const pid = Number(m[1])
  if (!Number.isSafeInteger(pid) || pid <= 0) return undefined
  return { pid, startTicks: m[2], bootId: m[3], pidNs: m[4] }
}
