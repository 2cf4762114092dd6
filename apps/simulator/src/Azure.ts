/**
 * A converter from the Azure public VM trace (AzurePublicDataset V1/V2) to the simulator's
 * trace format. The VM table (`vmtable.csv`, no header: vmid, subscriptionid, deploymentid,
 * vmcreated, vmdeleted, maxcpu, avgcpu, p95maxcpu, vmcategory, vmcorecountbucket,
 * vmmemorybucket; times in seconds) gives each session's arrival, end and size; the 5-minute CPU
 * readings (`vm_cpu_readings-file-*.csv`: timestamp, vmid, mincpu, maxcpu, avgcpu) give its idle
 * periods: a run of readings whose max CPU stays under `idleCpuPct` for at least `minIdleMin`
 * minutes is an idle period (the VM could have been parked), the time between is active.
 *
 * Sizes are bucket bounds: a bucket `8` is 8 cores or 8 GiB; an open bucket `>24` counts as
 * twice its bound (48). The trace has no resident memory: descents and restores cost the budget.
 * The builder takes lines one at a time, so a converter can stream files far larger than memory;
 * only the kept VMs are held.
 */
import { Order } from "@engram/core"
import { OPEN } from "./Workload.js"
import type { Script, Workload } from "./Workload.js"

/** The converter's knobs. */
export interface AzureOptions {
  /** Keep VMs alive in [fromS, fromS + hours); times are shifted so `fromS` is 0. */
  readonly fromS: number
  readonly hours: number
  /** A reading whose max CPU is under this (percent) is idle. */
  readonly idleCpuPct: number
  /** Idle runs shorter than this are active time (a pause too short to park). */
  readonly minIdleMin: number
  /** Keep at most this many VMs (the first met in the table), or all. */
  readonly maxVms: number | null
}

/** A day from the start, idle under 5 % CPU for 15 minutes or more. */
export const defaultAzureOptions: AzureOptions = Object.freeze({ fromS: 0, hours: 24, idleCpuPct: 5, minIdleMin: 15, maxVms: null })

const READING_S = 300

/** A bucket's size: its bound, or twice the bound of an open bucket (`>64`). */
export const bucketSize = (raw: string): number | null => {
  const t = raw.trim()
  const open = t.startsWith(">")
  const n = Number(open ? t.slice(1) : t)
  if (!Number.isFinite(n) || n <= 0) return null
  return open ? 2 * n : n
}

interface Vm {
  readonly id: string
  readonly createdS: number
  readonly deletedS: number
  readonly cores: number
  readonly memMib: number
  /** Idle runs found so far, [startS, endS). */
  readonly idle: [number, number][]
  /** The idle run being read: its start and the end of its last reading. */
  runStart: number | null
  runEnd: number
}

/** Builds a workload from the VM table's lines, then the CPU readings' lines. */
export class AzureBuilder {
  private readonly vms = new Map<string, Vm>()
  /** Lines skipped as malformed (or a header), by file kind. */
  readonly skipped = { vms: 0, readings: 0 }
  private readonly endS: number

  constructor(readonly options: AzureOptions = defaultAzureOptions) {
    this.endS = options.fromS + options.hours * 3600
  }

  /** One line of the VM table. */
  addVm(line: string): void {
    const f = line.split(",")
    if (f.length < 11) {
      if (line.trim() !== "") this.skipped.vms++
      return
    }
    const createdS = Number(f[3])
    const deletedS = Number(f[4])
    const cores = bucketSize(f[9] as string)
    const memGiB = bucketSize(f[10] as string)
    if (!Number.isFinite(createdS) || !Number.isFinite(deletedS) || cores === null || memGiB === null || deletedS < createdS) {
      this.skipped.vms++
      return
    }
    // Alive at some time in the window.
    if (deletedS <= this.options.fromS || createdS >= this.endS) return
    if (this.options.maxVms !== null && this.vms.size >= this.options.maxVms) return
    const id = (f[0] as string).trim()
    if (this.vms.has(id)) return
    this.vms.set(id, { id, createdS, deletedS, cores: Math.ceil(cores), memMib: Math.round(memGiB * 1024), idle: [], runStart: null, runEnd: 0 })
  }

  /** One CPU reading (in time order per VM; files in time order). */
  addReading(line: string): void {
    const f = line.split(",")
    if (f.length < 5) {
      if (line.trim() !== "") this.skipped.readings++
      return
    }
    const vm = this.vms.get((f[1] as string).trim())
    if (vm === undefined) return
    const t = Number(f[0])
    const maxCpu = Number(f[3])
    if (!Number.isFinite(t) || !Number.isFinite(maxCpu)) {
      this.skipped.readings++
      return
    }
    if (maxCpu < this.options.idleCpuPct) {
      // A gap in the readings ends the run: only what was seen idle counts.
      if (vm.runStart === null || t > vm.runEnd) {
        this.closeRun(vm)
        vm.runStart = t
      }
      vm.runEnd = t + READING_S
    } else {
      this.closeRun(vm)
    }
  }

  private closeRun(vm: Vm): void {
    if (vm.runStart !== null && vm.runEnd - vm.runStart >= this.options.minIdleMin * 60) vm.idle.push([vm.runStart, vm.runEnd])
    vm.runStart = null
  }

  /** The workload: one script per kept VM, sorted by arrival. */
  workload(): Workload {
    const from = this.options.fromS
    const horizonMs = this.options.hours * 3_600_000
    const ms = (s: number): number => Math.round((s - from) * 1000)
    const scripts: Script[] = []
    for (const vm of this.vms.values()) {
      this.closeRun(vm)
      const start = Math.max(vm.createdS, from)
      const stop = Math.min(vm.deletedS, this.endS)
      // Idle runs inside the VM's life in the window, not touching its start (it boots active).
      const idle = vm.idle
        .map(([a, b]) => [Math.max(a, start), Math.min(b, stop)] as const)
        .filter(([a, b]) => b - a >= this.options.minIdleMin * 60 && a > start)
      const activeMs: number[] = []
      const idleMs: number[] = []
      let t = start
      for (const [a, b] of idle) {
        activeMs.push(Math.max(1, ms(a) - ms(t)))
        idleMs.push(Math.max(1, ms(b) - ms(a)))
        t = b
      }
      const endsIdle = idle.length > 0 && (idle[idle.length - 1] as readonly [number, number])[1] >= stop
      const runsOn = vm.deletedS >= this.endS
      if (!endsIdle) activeMs.push(runsOn ? OPEN : Math.max(1, ms(stop) - ms(t)))
      else if (runsOn) idleMs[idleMs.length - 1] = OPEN
      scripts.push({ id: vm.id, arriveAtMs: ms(start), budget: { memMib: vm.memMib, vcpus: vm.cores }, activeMs, idleMs, endAfterIdle: endsIdle })
    }
    scripts.sort((a, b) => a.arriveAtMs - b.arriveAtMs || Order.byId(a, b))
    return { scripts, horizonMs }
  }
}
