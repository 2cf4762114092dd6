/**
 * What the reaper remembers from one pass to the next: the park gate's memory (the hosts held
 * for starving sessions), the moves it began to make room (to time them out and to learn how
 * each ended), the moves that ended aborted within the cooldown (core's `MakeRoom.cooling`: not
 * begun again meanwhile) and the recent demand for room, measured from the store's cumulative
 * `totalReservedMib` (every replica's placements count, not only this one's).
 *
 * Leader-local: a new leader starts empty, and the gate rebuilds its holds within a few passes.
 * What must not be lost with the leader is read from the store instead: the aborted moves once
 * (`abortedRead` false: a fresh memory, or `relead` when this replica leads again), and the
 * timeouts of moves begun elsewhere by the leader's safety net (a pending move older than twice
 * the timeout is aborted whoever began it).
 */
import { ParkGate, ParkPolicy as Policy, Placement, Reclaim } from "@engram/core"
import type { MakeRoom, ParkPolicy } from "@engram/core"

/** The meter's knobs. */
export interface MeterOptions {
  /** The recent demand is the rate over this much time. */
  readonly windowMs: number
  /** No rate until the samples span at least this long. */
  readonly minSpanMs: number
}

/** A five-minute window, answered after thirty seconds of samples. */
export const defaultMeterOptions: MeterOptions = Object.freeze({ windowMs: 5 * 60 * 1000, minSpanMs: 30 * 1000 })

/** Samples closer than this to the last one are merged into it: at most one per 5 s (the default reaper interval). */
const sampleMergeMs = 5_000

/** The dispersion needs at least this many intervals of `sampleMergeMs` (a minute at the default interval). */
const minIntervals = 12

/** The rate of new reservations from samples of the store's cumulative reserved MiB. */
export class DemandMeter {
  private readonly t: number[] = []
  private readonly mib: number[] = []
  constructor(readonly options: MeterOptions = defaultMeterOptions) {}

  /** Records the store's cumulative reserved MiB at `now`. A counter that went back (a reset) restarts the meter. */
  sample(now: number, totalReservedMib: number): void {
    const last = this.mib[this.mib.length - 1]
    if (last !== undefined && totalReservedMib < last) this.clear()
    this.t.push(now)
    this.mib.push(totalReservedMib)
    // Keep one sample at or before the window's start, so the rate spans the whole window.
    while (this.t.length > 2 && (this.t[1] as number) <= now - this.options.windowMs) {
      this.t.shift()
      this.mib.shift()
    }
  }

  /**
   * MiB reserved per second over the window, or undefined before the samples span `minSpanMs`;
   * with the dispersion of the MiB reserved per interval (`dispersion`) once it is measured.
   */
  rate(): ParkPolicy.Recent | undefined {
    const n = this.t.length
    if (n < 2) return undefined
    const span = (this.t[n - 1] as number) - (this.t[0] as number)
    if (span < this.options.minSpanMs) return undefined
    const reservedMibPerSec = (((this.mib[n - 1] as number) - (this.mib[0] as number)) / span) * 1000
    const dispersion = this.dispersion()
    return dispersion === undefined ? { reservedMibPerSec } : { reservedMibPerSec, reservedMibDispersion: dispersion }
  }

  /**
   * The dispersion of the MiB reserved over the window (core's `Recent.reservedMibDispersion`):
   * their variance per second over their mean per second, in MiB. The samples are cut into
   * intervals of at least 5 s (closer samples merge, so a group placed over two close passes
   * counts once), and the variance comes from successive intervals' differences of rate (each
   * pair's squared difference over the sum of 1 ÷ its two lengths: unequal intervals weigh as
   * their lengths say), not from one mean over the window: a rate that changes within the window
   * (a diurnal ramp, a flash crowd starting) adds to one pair, where a window's mean would count
   * the change as variance in every interval. Undefined with fewer than `minIntervals` intervals
   * or no MiB reserved.
   */
  dispersion(): number | undefined {
    const seconds: number[] = []
    const mib: number[] = []
    let t0 = this.t[0] as number
    let m0 = this.mib[0] as number
    for (let i = 1; i < this.t.length; i++) {
      const t = this.t[i] as number
      if (t - t0 < sampleMergeMs) continue
      const m = this.mib[i] as number
      seconds.push((t - t0) / 1000)
      mib.push(m - m0)
      t0 = t
      m0 = m
    }
    const k = seconds.length
    if (k < minIntervals) return undefined
    let totalMib = 0
    let totalS = 0
    for (let i = 0; i < k; i++) {
      totalMib += mib[i] as number
      totalS += seconds[i] as number
    }
    const mean = totalMib / totalS
    if (!(mean > 0)) return undefined
    let sum = 0
    for (let i = 1; i < k; i++) {
      const a = seconds[i - 1] as number
      const b = seconds[i] as number
      const d = (mib[i] as number) / b - (mib[i - 1] as number) / a
      // Var(rate over s seconds) = σ² ÷ s for a compound Poisson stream of variance σ² per second.
      sum += (d * d) / (1 / a + 1 / b)
    }
    return sum / (k - 1) / mean
  }

  clear(): void {
    this.t.length = 0
    this.mib.length = 0
  }
}


/**
 * The queue's peaks per size class within a recent window (core's `ParkPolicy.Recent.queuedPeaks`):
 * each pass samples how many sessions of each class queued since the last sample (sizes no host
 * could take aside).
 */
export class QueuePeaks {
  private readonly samples: { readonly at: number; readonly peaks: readonly Policy.ClassPeak[] }[] = []
  /** The last sample's time: only sessions queued after it are new arrivals. */
  private lastAt = Number.NEGATIVE_INFINITY

  /**
   * Records the sessions that queued since the last sample (arrivals that found no room: a
   * group's), by size class, at `now`, forgetting samples older than `holdMs`. A queue that only
   * grew slowly (a backlog) is no group: each pass sees few new arrivals.
   */
  sample(now: number, fleet: ParkGate.FleetView, holdMs: number): void {
    while (this.samples.length > 0 && (this.samples[0] as { at: number }).at <= now - holdMs) this.samples.shift()
    const since = this.lastAt
    this.lastAt = now
    // The first sample (a fresh reaper, a new leader) has no last one: the queue it finds may be a
    // backlog of any age, no group; it only marks where the next sample's arrivals begin.
    if (holdMs <= 0 || fleet.queue.length === 0 || since === Number.NEGATIVE_INFINITY) return
    const tooBig = Placement.tooBigFor(fleet.hosts)
    const byClass = new Map<number, { sizeClass: number; memMib: number; vcpus: number; count: number }>()
    for (const q of fleet.queue) {
      // Queued before the last sample's read: seen then (one queued at that very ms may be counted twice).
      if (q.queuedAt < since || tooBig(q.budget)) continue
      const k = Policy.sizeClass(q.budget.memMib)
      const c = byClass.get(k)
      if (c === undefined) byClass.set(k, { sizeClass: k, memMib: q.budget.memMib, vcpus: q.budget.vcpus, count: 1 })
      else {
        c.count++
        if (q.budget.memMib > c.memMib) c.memMib = q.budget.memMib
        if (q.budget.vcpus > c.vcpus) c.vcpus = q.budget.vcpus
      }
    }
    if (byClass.size === 0) return
    // One sample per 5 s at most (a short reaper interval would keep one per pass): the arrivals
    // of passes within 5 s of the last sample add to it.
    const last = this.samples[this.samples.length - 1]
    if (last !== undefined && now - last.at < sampleMergeMs) {
      const merged = new Map(last.peaks.map((p) => [p.sizeClass, { ...p }]))
      for (const p of byClass.values()) {
        const m = merged.get(p.sizeClass)
        merged.set(p.sizeClass, m === undefined ? p : { sizeClass: p.sizeClass, memMib: Math.max(m.memMib, p.memMib), vcpus: Math.max(m.vcpus, p.vcpus), count: m.count + p.count })
      }
      this.samples[this.samples.length - 1] = { at: last.at, peaks: [...merged.values()] }
      return
    }
    this.samples.push({ at: now, peaks: [...byClass.values()] })
  }

  /** The most sessions of each class that queued between two samples, over the samples kept. */
  peaks(): Policy.ClassPeak[] {
    const out = new Map<number, Policy.ClassPeak>()
    for (const s of this.samples)
      for (const p of s.peaks) {
        const o = out.get(p.sizeClass)
        out.set(p.sizeClass, o === undefined ? p : { sizeClass: p.sizeClass, memMib: Math.max(o.memMib, p.memMib), vcpus: Math.max(o.vcpus, p.vcpus), count: Math.max(o.count, p.count) })
      }
    return [...out.values()]
  }

  clear(): void {
    this.samples.length = 0
    this.lastAt = Number.NEGATIVE_INFINITY
  }
}

/** The reaper's memory. Mutable: the pass and the immediate reaction update it. */
export interface ReaperState {
  /** What the gate answered last (`ParkGate.Decision.holds`). */
  memory: ParkGate.Memory
  /** The open moves the passes began for starving sessions (`Reaper.Options.moves`), by id. */
  readonly moves: Set<string>
  /** Moves that ended aborted, kept while they cool down (`MakeRoom.cooling`). */
  aborted: MakeRoom.Aborted[]
  /** Whether `aborted` holds the store's (read once per leadership) as well as this replica's. */
  abortedRead: boolean
  /**
   * The failover grace (core's `Reclaim.Grace`, `Reaper.Options.reclaimGraceMs`): when it
   * started and the last contact with the store as leader; it starts at a leadership's first
   * contact (a fresh memory, `relead`) and after a gap.
   */
  grace: Reclaim.Grace
  /** The retention step waits until this time (the store's time, `nowOf`, ms) after a prune that deleted nothing; 0: no wait. */
  pruneAfter: number
  readonly meter: DemandMeter
  readonly queuePeaks: QueuePeaks
}

/** A fresh memory. */
export const make = (meter: MeterOptions = defaultMeterOptions): ReaperState => ({
  memory: ParkGate.noMemory,
  moves: new Set(),
  aborted: [],
  abortedRead: false,
  pruneAfter: 0,
  grace: Reclaim.graceRestart,
  meter: new DemandMeter(meter),
  queuePeaks: new QueuePeaks(),
})

/**
 * This replica leads again: moves may have ended aborted under another leader meanwhile, so the
 * next moves step reads them from the store before it plans; and the next retention step runs
 * at once (this replica's wait was from its last leadership); and the failover grace starts
 * again at its first pass (no heartbeat could land while no replica led, or another led).
 */
export const relead = (state: ReaperState): void => {
  state.abortedRead = false
  state.pruneAfter = 0
  state.grace = Reclaim.graceRestart
}
