/**
 * Host measurement (SPEC §1): total RAM and MemAvailable from `/proc/meminfo`, lowered to the
 * cgroup (v2 or v1) memory limit when that is lower; vCPUs from the CPU set, lowered to the
 * cgroup CPU quota. `allocatableMib` = MemAvailable + the RAM of the resident VMs (their RAM
 * is already counted in their reservations). A dimension that cannot be read is reported as
 * `null` (unmeasured) rather than guessed.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { Context, Effect, Layer } from "effect"

/** The report the agent sends (`PUT /v1/hosts/{id}/report`). */
export interface HostReport {
  readonly totalMib: number | null
  readonly allocatableMib: number | null
  readonly totalVcpus: number | null
  /** The templates the runtime holds (the agent adds them to what the meter measured). */
  readonly templates?: readonly { readonly name: string; readonly memMib: number; readonly vcpus: number }[]
  /** Where the agent serves its peers (the agent adds it; null: none advertised). */
  readonly peerUrl?: string | null
}

/** The host meter: measures the host given the RAM of the VMs resident on it. */
export class HostMeter extends Context.Service<
  HostMeter,
  { readonly measure: (residentMib: number) => Effect.Effect<HostReport> }
>()("@engram/host-agent/HostMeter") {}

/** Where the meter reads: `/proc` and `/sys` roots, injectable for fixture trees in tests. */
export interface Roots {
  readonly proc: string
  readonly sys: string
}

const KiB_PER_MiB = 1024
const MiB = 1024 * 1024
/** cgroup v1 reports "no limit" as a huge page-aligned number. */
const UNLIMITED_BYTES = 2 ** 60

/** Parses `/proc/meminfo`: MemTotal and MemAvailable in MiB; null when either is missing. */
export const parseMeminfo = (text: string): { totalMib: number; availableMib: number } | null => {
  const field = (name: string) => {
    const m = new RegExp(`^${name}:\\s+(\\d+)\\s*kB`, "m").exec(text)
    return m?.[1] === undefined ? null : Number(m[1]) / KiB_PER_MiB
  }
  const total = field("MemTotal")
  const available = field("MemAvailable")
  return total === null || available === null || !(total > 0) ? null : { totalMib: total, availableMib: available }
}

/** Parses a CPU list (`0-3,6,8-9`): how many CPUs it names; null when malformed or empty. */
export const parseCpuList = (text: string): number | null => {
  const s = text.trim()
  if (s === "") return null
  let n = 0
  for (const part of s.split(",")) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim())
    if (m === null || m[1] === undefined) return null
    const lo = Number(m[1])
    const hi = m[2] === undefined ? lo : Number(m[2])
    if (hi < lo) return null
    n += hi - lo + 1
  }
  return n > 0 ? n : null
}

/** Parses cgroup v2 `cpu.max` (`max 100000` or `200000 100000`): CPUs allowed, null = no quota. */
export const parseCpuMax = (text: string): number | null => {
  const [quota, period] = text.trim().split(/\s+/)
  if (quota === undefined || quota === "max" || period === undefined) return null
  const q = Number(quota)
  const p = Number(period)
  return q > 0 && p > 0 ? q / p : null
}

/** Parses a memory limit in bytes (`max` or a number) to MiB; null = no limit. */
export const parseMemLimit = (text: string): number | null => {
  const s = text.trim()
  if (s === "max" || s === "") return null
  const b = Number(s)
  return Number.isFinite(b) && b > 0 && b < UNLIMITED_BYTES ? b / MiB : null
}

const read = (path: string) =>
  Effect.tryPromise(() => readFile(path, "utf8")).pipe(Effect.option, Effect.map((o) => (o._tag === "Some" ? o.value : null)))

const firstOf = (paths: readonly string[]) =>
  Effect.gen(function* () {
    for (const p of paths) {
      const text = yield* read(p)
      if (text !== null) return text
    }
    return null
  })

/** Memory: total and available MiB after the cgroup limit; null when /proc/meminfo fails. */
export const readMemory = (roots: Roots) =>
  Effect.gen(function* () {
    const meminfo = yield* read(join(roots.proc, "meminfo"))
    const parsed = meminfo === null ? null : parseMeminfo(meminfo)
    if (parsed === null) return null
    const cg = join(roots.sys, "fs/cgroup")
    const v2Limit = yield* read(join(cg, "memory.max"))
    const limitText = v2Limit ?? (yield* read(join(cg, "memory/memory.limit_in_bytes")))
    const limitMib = limitText === null ? null : parseMemLimit(limitText)
    if (limitMib === null || limitMib >= parsed.totalMib) return parsed
    const usageText = v2Limit !== null ? yield* read(join(cg, "memory.current")) : yield* read(join(cg, "memory/memory.usage_in_bytes"))
    const usageMib = usageText === null ? null : parseMemLimit(usageText)
    // Inside a lower limit, what is available is what the limit leaves (never more than the host's).
    const leftMib = usageMib === null ? limitMib : Math.max(0, limitMib - usageMib)
    return { totalMib: limitMib, availableMib: Math.min(parsed.availableMib, leftMib) }
  })

/** vCPUs: the CPU set, lowered to the cgroup quota (floored, at least 1); null when unreadable. */
export const readVcpus = (roots: Roots) =>
  Effect.gen(function* () {
    const cg = join(roots.sys, "fs/cgroup")
    const setText = yield* firstOf([
      join(cg, "cpuset.cpus.effective"),
      join(cg, "cpuset/cpuset.effective_cpus"),
      join(roots.sys, "devices/system/cpu/online"),
    ])
    const setCount = setText === null ? null : parseCpuList(setText)
    if (setCount === null) return null
    const v2 = yield* read(join(cg, "cpu.max"))
    let quota: number | null = v2 === null ? null : parseCpuMax(v2)
    if (v2 === null) {
      const q = yield* read(join(cg, "cpu/cpu.cfs_quota_us"))
      const p = yield* read(join(cg, "cpu/cpu.cfs_period_us"))
      quota = q !== null && p !== null && Number(q) > 0 && Number(p) > 0 ? Number(q) / Number(p) : null
    }
    return quota === null ? setCount : Math.max(1, Math.min(setCount, Math.floor(quota)))
  })

/** Measures a real host under `roots`. */
export const measureHost = (roots: Roots, residentMib: number): Effect.Effect<HostReport> =>
  Effect.gen(function* () {
    const mem = yield* readMemory(roots)
    const vcpus = yield* readVcpus(roots)
    return {
      totalMib: mem === null ? null : Math.floor(mem.totalMib),
      allocatableMib: mem === null ? null : Math.floor(Math.min(mem.totalMib, mem.availableMib + residentMib)),
      totalVcpus: vcpus,
    }
  })

/** The meter of this machine (or of a fixture tree). */
export const layerProc = (roots: Roots = { proc: "/proc", sys: "/sys" }) =>
  Layer.succeed(HostMeter, HostMeter.of({ measure: (residentMib) => measureHost(roots, residentMib) }))

/**
 * A simulated host of fixed size: `osMib` used by the system, the resident VMs' RAM in use,
 * so `allocatableMib` stays `totalMib − osMib` whatever runs. For the demo and tests, so a
 * simulated host never reports this machine's RAM.
 */
export const layerFixed = (host: { readonly totalMib: number; readonly osMib: number; readonly vcpus: number }) =>
  Layer.succeed(
    HostMeter,
    HostMeter.of({
      measure: (residentMib) => {
        const availableMib = Math.max(0, host.totalMib - host.osMib - residentMib)
        // Resident VMs reserved past the host's RAM still leave it no more than it has (the coordinator refuses more).
        return Effect.succeed({ totalMib: host.totalMib, allocatableMib: Math.min(host.totalMib, availableMib + residentMib), totalVcpus: host.vcpus })
      },
    }),
  )
