/**
 * The fleet simulator's engine: a discrete-event loop that plays a workload against the real
 * decisions. Every placement, state change, descent, drain and ledger operation runs in
 * `@engram/store-sim` (which decides through `@engram/core`, its park policy the run's), on a
 * simulated Effect Clock; the reaper pass and the immediate reaction to a queued session are
 * `@engram/reaper`'s own functions, the ones the coordinator runs, with the park policy as their
 * parameter. The loop keeps no state machine of its own: what a session is doing is what the
 * store answers (a step the session's state refuses is simply not taken). It only models what
 * happens outside the store: users, VM start and restore times, descents that take time, host
 * agents' heartbeats and when the reaper runs.
 */
import { Headroom, Limits, MakeRoom, ParkPolicy, Placement } from "@engram/core"
import type { Budget, FleetView, SessionState } from "@engram/core"
import { CoalescingWindow, defaultTriggerWindowMs, Reaper, ReaperEvents, ReaperState } from "@engram/reaper"
import type { Event } from "@engram/reaper"
import { Store } from "@engram/store"
import type { IllegalTransition, PlaceOutcome } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Exit } from "effect"
import { EventHeap } from "./EventHeap.js"
import { Rng } from "./Rng.js"
import * as SimClock from "./SimClock.js"
import type { Script, Workload } from "./Workload.js"

/** A kind of host: how many, the RAM each reports as allocatable (MiB) and its cores. */
export interface HostShape {
  readonly count: number
  readonly memMib: number
  readonly vcpus: number
}

/** The fleet and the timings of everything the store does not model. */
export interface FleetConfig {
  /** Hosts of one shape (`hosts × hostMib, hostVcpus`), unless `shapes` is set. */
  readonly hosts: number
  /** What each host reports as allocatable RAM (MiB); capacity is this less the system reserve, times the ratio. */
  readonly hostMib: number
  readonly hostVcpus: number
  /** A heterogeneous fleet: every shape's hosts, in order (overrides `hosts`, `hostMib`, `hostVcpus`). */
  readonly shapes: readonly HostShape[] | null
  /** A descent captures resident RAM at this rate (MiB/s): a 8 GiB park takes 8 s at 1024. */
  readonly descentMibPerSec: number
  /** A cold resume restores resident RAM at this rate (MiB/s), after `restoreBaseMs`. */
  readonly restoreMibPerSec: number
  readonly restoreBaseMs: number
  /** A warm resume (unpausing a park). */
  readonly warmResumeMs: number
  /** A new session's VM boot. */
  readonly startMs: number
  /**
   * Host agents heartbeat their reservations this often (must stay under the stale window),
   * and report their hosts as often (a host whose agent stops reporting for a stale window is
   * silent and takes no placements, `Placement.isSilent`). `0` models agents that never fail: no
   * heartbeat or report traffic, no reservation ever goes stale and no host silent (the reaper
   * still runs its reclaim every pass). Heartbeats cost a store call per
   * host per interval, which dominates a 1,000-host day, so they are off by default.
   */
  readonly heartbeatIntervalMs: number
  /**
   * Drain the queue whenever room appears (SPEC §2), not only at reaper passes. Off, queued
   * sessions wait for the next pass even when room is free (a coordinator that drains only
   * from its reaper), which is where judging the queue cumulatively matters.
   */
  readonly drainOnRelease: boolean
  /**
   * The immediate reaction (`@engram/reaper` `Trigger`): when a request queues, the gate runs
   * at the end of this coalescing window instead of waiting for the next pass. `0`: off.
   */
  readonly reactWindowMs: number
  readonly limits: Limits.Limits
  readonly policyOptions: ParkPolicy.Options
  /** The reaper's meter of recent demand (demand-reserve sizes its reserve from it). */
  readonly meter: ReaperState.MeterOptions
  /** Figures per time window of this length. */
  readonly windowMs: number
  /** How many of the longest-waiting sessions to name. */
  readonly worstSessions: number
  /**
   * Each host's disk and network (MiB/s), shared by its descents and restores: together they
   * move at most this much, each at most at its own rate (`descentMibPerSec`,
   * `restoreMibPerSec`); transfers take the link in turn. `0`: no shared limit (each runs at its
   * own rate, however many run at once).
   */
  readonly hostTransferMibPerSec: number
  /**
   * Users' patience: a queued request gives up after a lognormal time with this median (s) and
   * shape `patienceSigma`, drawn per request from a seeded stream; the session ends (lost
   * demand, `gaveUp`). `0`: users wait for ever.
   */
  readonly patienceMedianS: number
  readonly patienceSigma: number
  /**
   * What a VM costs its host beyond its session's RAM budget (MiB): QEMU's own memory, page
   * tables. Every running or parked VM reserves its budget plus this, through the store and
   * core's room rules like the budget itself; a descended session holds none. `0`: none.
   */
  readonly vmOverheadMib: number
  /**
   * A warm start: before the trace's first arrival, the trace's last `warmStartMs` (at most the
   * whole trace) is played as a burn-in whose figures are not counted, so the fleet begins in
   * the steady state the trace itself leads to. `0`: the fleet starts empty.
   */
  readonly warmStartMs: number
  /**
   * Moves as a policy action (the reaper pass's moves step, `@engram/reaper`'s `Options.moves`,
   * which the coordinator runs with `ENGRAM_MAKE_ROOM_MOVES=1`; core's `MakeRoom.forHolds`
   * decides): a session starving on a held host whose parks alone cannot make its room gets it
   * from running sessions moved off that host (to hosts neither held nor claimed for another
   * session), while the fleet's free RAM covers the queue (`MakeRoom.roomIsSplit`: the room
   * exists but is split). A move reserves its target at once (both hosts hold the session's RAM
   * during the copy), copies at `moveCosts.copyMibPerSec` over both hosts' links (shared with
   * descents and restores when `hostTransferMibPerSec` is on) and costs its session the guard's
   * downtime estimate. `false`: no moves. On by default, as in the coordinator
   * (`ENGRAM_MAKE_ROOM_MOVES`): with the starvation limit they bound the longest wait of a session
   * the fleet's free RAM could take (the README's "The default over every workload").
   */
  readonly moves: boolean
  /** At most this many moves begun by one pass (the coordinator's `ENGRAM_MAKE_ROOM_MOVES_PER_PASS`). */
  readonly movesPerPass: number
  /** What a move costs (`MakeRoom.Costs`): copy rate, dirty rate, rounds, allowance, downtime budget. */
  readonly moveCosts: MakeRoom.Costs
}

/**
 * Defaults: 1,000 hosts of 64 GiB and 16 cores, SPEC §9 limits, the reaper's own defaults. The
 * descent, restore and warm-resume costs are `@engram/runtime-qemu`'s bench (mapped snapshots,
 * 1 GiB guests that filled their RAM, TCG on a loaded 2-core machine, 2026-12-02; its README):
 * a descent's p95 362 ms per GiB, a cold resume to the guest's ready line 238–358 ms (median,
 * 256 MiB to 1 GiB: the RAM file is mapped, not read, so the size barely shows), a warm resume
 * to the guest's next line 134–145 ms.
 */
export const defaultFleet: FleetConfig = Object.freeze({
  hosts: 1000,
  hostMib: 65_536,
  hostVcpus: 16,
  shapes: null,
  descentMibPerSec: 2800,
  restoreMibPerSec: 65_536,
  restoreBaseMs: 300,
  warmResumeMs: 140,
  startMs: 2000,
  heartbeatIntervalMs: 0,
  drainOnRelease: true,
  reactWindowMs: defaultTriggerWindowMs,
  limits: Limits.defaults,
  policyOptions: ParkPolicy.defaultOptions,
  meter: ReaperState.defaultMeterOptions,
  windowMs: 3_600_000,
  worstSessions: 10,
  hostTransferMibPerSec: 0,
  patienceMedianS: 0,
  patienceSigma: 1,
  vmOverheadMib: 0,
  warmStartMs: 0,
  moves: true,
  movesPerPass: 16,
  moveCosts: MakeRoom.defaultCosts,
})

/** The host shapes of a fleet, in order. */
export const shapesOf = (fleet: FleetConfig): readonly HostShape[] =>
  fleet.shapes ?? [{ count: fleet.hosts, memMib: fleet.hostMib, vcpus: fleet.hostVcpus }]

/** Hosts in the fleet. */
export const hostCount = (fleet: FleetConfig): number => shapesOf(fleet).reduce((a, s) => a + s.count, 0)

/** Quantiles of a set of waits (ms). */
export interface Quantiles {
  readonly p50: number
  readonly p95: number
  readonly p99: number
  readonly max: number
  readonly mean: number
}

/** One sample per reaper pass, for the plot. */
export interface Series {
  readonly tMs: number[]
  readonly queue: number[]
  readonly parks: number[]
  readonly reservedPct: number[]
}

/** The figures of one time window. */
export interface WindowFigures {
  readonly startMs: number
  /** Requests that began in the window. */
  readonly requests: number
  readonly queued: number
  /** Queue waits of the requests that began in the window. */
  readonly waitP99Ms: number
  readonly waitMaxMs: number
  /** Resumes in the window: warm, cold. */
  readonly warm: number
  readonly cold: number
  /** Descents started in the window. */
  readonly descents: number
}

/** A session that waited long, by name. */
export interface LongWait {
  readonly sessionId: string
  readonly memMib: number
  readonly vcpus: number
  /** Its longest wait for room (ms); a request still queued at the end counts what it waited. */
  readonly waitMs: number
  /** When that request began. */
  readonly requestAtMs: number
  readonly request: "create" | "resume"
  readonly stillQueued: boolean
}

/** The waits of the requests of one size class (`ParkPolicy.sizeClass`: the nearest power of two of GiB on a log scale). */
export interface SizeWaits {
  /** The largest RAM budget of the class's sessions (MiB). */
  readonly memMib: number
  readonly requests: number
  readonly queued: number
  readonly p99Ms: number
  readonly maxMs: number
}

/**
 * The most warm resumes any policy could give on this workload under the hard TTL: resumes
 * after an idle period short enough for a park to last it (at most the hard TTL plus one reaper
 * interval, when the pass that ages a park out runs). A park past the TTL yields, and a resume
 * during or after its descent is cold; a wait only pushes resumes later, out of the run.
 */
export const ttlWarmBound = (workload: Workload, limits: Limits.Limits): number => {
  const longest = limits.parkHardTtlMs + limits.reaperIntervalMs
  let bound = 0
  for (const s of workload.scripts) {
    // Idle period k is followed by a resume when another active period follows it.
    for (let k = 0; k < s.idleMs.length && k + 1 < s.activeMs.length; k++) if ((s.idleMs[k] as number) <= longest) bound++
  }
  return bound
}

/** What one run measured. */
export interface Result {
  readonly policy: ParkPolicy.Name
  readonly hosts: number
  readonly sessions: number
  readonly horizonMs: number
  /** Creates and resumes: every time a user asked for a running VM. */
  readonly requests: number
  /**
   * Time each request spent queued for room (0 when it placed or unparked at once); still-queued
   * requests count their wait so far. Requests of unplaceable sessions are left out (they can
   * never place; see `unplaceable`).
   */
  readonly queueWait: Quantiles
  /** Requests that queued at all. */
  readonly queued: number
  /** Requests still queued when the run ended. */
  readonly stillQueued: number
  /** Sessions too big for every host even when empty (SPEC §12 `too_big`): they queue for ever. */
  readonly unplaceable: number
  /** From a resume request to a running VM (warm: the unpause; cold: queue wait plus restore). */
  readonly resumeToRun: Quantiles
  readonly warmResumes: number
  readonly coldResumes: number
  readonly parks: number
  /** Every descent started: idle sessions that could not park plus parks that yielded. */
  readonly descents: number
  readonly idleDescents: number
  readonly yields: Readonly<Record<ParkPolicy.Reason, number>>
  /** Descents after whose finish no queued session placed on their host up to the next pass's drain. */
  readonly wastedDescents: number
  /** Immediate reactions run (one per coalescing window in which a request queued). */
  readonly reactions: number
  /** Mean over passes of Σ reserved / Σ capacity. */
  readonly meanReservedPct: number
  readonly peakQueue: number
  /** Host-batches where Σ reserved exceeded the RAM capacity or the CPU budget (must be 0). */
  readonly overCommits: number
  /** Passes where the store's reserved figures differed from the simulator's own sums (must be 0). */
  readonly ledgerDrift: number
  /** Store operations that failed (must be 0). */
  readonly storeErrors: number
  readonly firstStoreError: string | null
  readonly lostSessions: number
  readonly passes: number
  /** Events processed (arrivals, user actions, VM starts, descents, passes, reactions, heartbeats). */
  readonly events: number
  readonly series: Series
  readonly windows: readonly WindowFigures[]
  /** The longest-waiting sessions, longest first. */
  readonly longestWaits: readonly LongWait[]
  /** Queue waits per size class, smallest first (unplaceable sessions left out). */
  readonly waitsBySize: readonly SizeWaits[]
  /** `ttlWarmBound`: no policy keeps more resumes warm on this workload. */
  readonly warmBoundTtl: number
  /** Queued requests whose user gave up waiting (`patienceMedianS`): the session ended, lost demand. */
  readonly gaveUp: number
  /** Moves started to make room for starving sessions (`moves`), and those committed. */
  readonly moves: number
  readonly movesCommitted: number
  /** RAM of the committed moves' sessions (MiB). */
  readonly movedMib: number
  /** The pause each committed move cost its session (the guard's estimate). */
  readonly moveDowntime: Quantiles
}

/** Options of one run. */
export interface RunOptions {
  readonly policy: ParkPolicy.Name
  readonly fleet?: Partial<FleetConfig> | undefined
  /** Called now and then with the share of simulated time done (0..1). */
  readonly onProgress?: ((done: number) => void) | undefined
}

// Event kinds on the heap.
const START = 0
const IDLE = 1
const RESUME = 2
const END = 3
const DESCENT_DONE = 4
const PASS = 5
const HEARTBEAT = 6
const ARRIVE = 7
const REACT = 8
const GIVE_UP = 9
const MOVE_DONE = 10

const emptyQuantiles: Quantiles = { p50: 0, p95: 0, p99: 0, max: 0, mean: 0 }

/** Nearest-rank quantiles of `xs` (sorted in place). */
export const quantiles = (xs: Float64Array): Quantiles => {
  if (xs.length === 0) return emptyQuantiles
  xs.sort()
  const at = (q: number): number => xs[Math.min(xs.length - 1, Math.max(0, Math.ceil(q * xs.length) - 1))] as number
  let sum = 0
  for (const x of xs) sum += x
  return { p50: at(0.5), p95: at(0.95), p99: at(0.99), max: xs[xs.length - 1] as number, mean: sum / xs.length }
}

/** A growable list of numbers. */
class Samples {
  private buf = new Float64Array(1024)
  length = 0
  push(x: number): void {
    if (this.length === this.buf.length) {
      const next = new Float64Array(this.buf.length * 2)
      next.set(this.buf)
      this.buf = next
    }
    this.buf[this.length++] = x
  }
  values(): Float64Array {
    return this.buf.slice(0, this.length)
  }
}

/** Per-window accumulators. */
class Windows {
  private readonly waits: Samples[] = []
  private readonly counts: { requests: number; queued: number; warm: number; cold: number; descents: number }[] = []
  constructor(
    private readonly windowMs: number,
    private readonly horizonMs: number,
  ) {}
  private at(t: number) {
    const k = Math.max(0, Math.min(Math.floor(t / this.windowMs), Math.ceil(this.horizonMs / this.windowMs) - 1))
    while (this.counts.length <= k) {
      this.counts.push({ requests: 0, queued: 0, warm: 0, cold: 0, descents: 0 })
      this.waits.push(new Samples())
    }
    return k
  }
  count(t: number, what: "requests" | "queued" | "warm" | "cold" | "descents"): void {
    const k = this.at(t)
    const c = this.counts[k] as { [K in typeof what]: number }
    c[what]++
  }
  wait(requestAt: number, waitMs: number): void {
    ;(this.waits[this.at(requestAt)] as Samples).push(waitMs)
  }
  figures(): WindowFigures[] {
    this.at(this.horizonMs - 1)
    return this.counts.map((c, k) => {
      const q = quantiles((this.waits[k] as Samples).values())
      return { startMs: k * this.windowMs, ...c, waitP99Ms: q.p99, waitMaxMs: q.max }
    })
  }
}

/** The scripts a run plays: a burn-in first (maybe none), then the trace's, shifted to start at `startMs`. */
export interface Played {
  readonly scripts: readonly Script[]
  /** Where the trace's time 0 falls on the run's clock: figures count from here. */
  readonly startMs: number
  /** Scripts of the burn-in (the first ones). */
  readonly burnIn: number
}

/**
 * A burn-in of `warmStartMs` before the trace: the sessions that arrive in the trace's last
 * `warmStartMs` (at most the whole trace) arrive again before its start, as if the trace had
 * run once already, so a day-long trace begins at the hour of day it follows (a diurnal fleet
 * starts at its midnight state, not at its noon one). The trace starts on a reaper pass
 * (`startMs` a multiple of `passMs`), as it does without a burn-in. Burn-in ids are the trace's
 * with a `warm.` prefix.
 */
export const withBurnIn = (workload: Workload, warmStartMs: number, passMs: number): Played => {
  const span = Math.min(warmStartMs, workload.horizonMs)
  if (!(span > 0)) return { scripts: workload.scripts, startMs: 0, burnIn: 0 }
  const startMs = Math.ceil(span / passMs) * passMs
  // The trace's end falls on the run's startMs.
  const shift = startMs - workload.horizonMs
  const burn = workload.scripts.filter((s) => s.arriveAtMs >= workload.horizonMs - span).map((s) => ({ ...s, id: `warm.${s.id}`, arriveAtMs: s.arriveAtMs + shift }))
  const trace = workload.scripts.map((s) => ({ ...s, arriveAtMs: s.arriveAtMs + startMs }))
  return { scripts: [...burn, ...trace], startMs, burnIn: burn.length }
}

/** Plays `workload` against a fresh in-memory store under `options.policy`. */
export const run = (workload: Workload, options: RunOptions): Result => {
  const given: FleetConfig = { ...defaultFleet, ...options.fleet }
  // The policy's descent rate is the one this run charges (a reserve's lead per class reads it).
  const fleet: FleetConfig = { ...given, policyOptions: { ...given.policyOptions, descentMibPerSec: given.descentMibPerSec } }
  const heartbeats = fleet.heartbeatIntervalMs > 0
  // Agents that never fail keep every reservation fresh: nothing goes stale.
  const limits: Limits.Limits = heartbeats ? fleet.limits : { ...fleet.limits, heartbeatStaleWindowMs: Number.MAX_SAFE_INTEGER }
  const policy = options.policy
  const clock = SimClock.make(0)
  const { store } = StoreSim.make({ limits, park: { name: policy, options: fleet.policyOptions }, noFitDetails: false })
  const played = withBurnIn(workload, fleet.warmStartMs, limits.reaperIntervalMs)
  const scripts = played.scripts
  // Figures count from the trace's start: `startMs` on the run's clock (0 without a burn-in).
  const startMs = played.startMs
  const horizon = workload.horizonMs + startMs
  const n = scripts.length
  // What each VM reserves on its host: its session's budget and the VM's own overhead.
  const footprint = scripts.map((s) => (fleet.vmOverheadMib > 0 ? { ...s.budget, memMib: s.budget.memMib + fleet.vmOverheadMib } : s.budget))

  let storeErrors = 0
  let firstStoreError: string | null = null
  const storeError = (message: string): void => {
    storeErrors++
    if (firstStoreError === null) firstStoreError = message
  }
  /** Runs a store operation; a failure is counted (the checks require none) and answers undefined. */
  const exec = <A, E>(effect: Effect.Effect<A, E>): A | undefined => {
    const exit = clock.run(effect)
    if (Exit.isSuccess(exit)) return exit.value
    storeError(String(exit.cause))
    return undefined
  }
  /**
   * Runs a step the session's state may refuse (the user acts whatever the session is doing):
   * the answer, or the state it refused from (the step is not taken); any other failure is
   * counted as a store error and answers undefined.
   */
  const attempt = <A, E extends { readonly _tag: string }>(effect: Effect.Effect<A, E>): { readonly ok: A } | { readonly refusedFrom: SessionState } | undefined => {
    const exit = clock.run(effect)
    if (Exit.isSuccess(exit)) return { ok: exit.value }
    const refused = exit.cause.reasons.find((r) => r._tag === "Fail" && r.error._tag === "IllegalTransition")
    if (refused !== undefined && refused._tag === "Fail") return { refusedFrom: (refused.error as unknown as IllegalTransition).from as SessionState }
    storeError(String(exit.cause))
    return undefined
  }

  // ---- the fleet ------------------------------------------------------------------------------
  const shapes = shapesOf(fleet)
  const hostTotal = shapes.reduce((a, s) => a + s.count, 0)
  const width = String(hostTotal).length
  const hostIds: string[] = []
  const hostIndex = new Map<string, number>()
  /** Each host's report, by host index: its agent sends it again at every heartbeat. */
  const reports: { totalMib: number; allocatableMib: number; totalVcpus: number; peerUrl: string }[] = []
  // The simulator's own ledger, from session states alone, to check the store against.
  const capacityMib = new Float64Array(hostTotal)
  const cpuBudget = new Float64Array(hostTotal)
  for (const shape of shapes) {
    const headroom = Headroom.fromReport({ allocatableMib: shape.memMib, totalVcpus: shape.vcpus }, Headroom.zero, limits)
    for (let c = 0; c < shape.count; c++) {
      const i = hostIds.length
      const id = `h${String(i).padStart(width, "0")}`
      hostIds.push(id)
      hostIndex.set(id, i)
      capacityMib[i] = headroom.allocatableMib ?? Number.POSITIVE_INFINITY
      cpuBudget[i] = headroom.cpuBudget ?? Number.POSITIVE_INFINITY
      exec(store.registerHost({ id }))
      // Its agent advertises a peer URL, as every agent of a fleet that moves does: the host takes moves (`Candidate.takesMoves`).
      const report = { totalMib: shape.memMib, allocatableMib: shape.memMib, totalVcpus: shape.vcpus, peerUrl: `http://${id}.sim:7100` }
      reports.push(report)
      exec(store.reportHost(id, report))
    }
  }
  const shadowMib = new Float64Array(hostTotal)
  const shadowVcpus = new Float64Array(hostTotal)
  const dirty: number[] = []
  const isDirty = new Uint8Array(hostTotal)
  const touch = (h: number): void => {
    if (isDirty[h] === 0) {
      isDirty[h] = 1
      dirty.push(h)
    }
  }
  // Which budgets no host could take even empty (the hosts never change here): core's rule.
  const emptyFleet = exec(store.fleetView())
  const tooBig = Placement.tooBigFor(emptyFleet?.hosts ?? [], limits)

  // ---- sessions -------------------------------------------------------------------------------
  const phase = new Int32Array(n) // index of the current (or next) active period
  const host = new Int32Array(n).fill(-1)
  const requestAt = new Float64Array(n) // when the open request (create or resume) began
  const requestIsResume = new Uint8Array(n)
  const resumeAfterDescent = new Uint8Array(n)
  const unplaceable = new Uint8Array(n)
  const longest = new Float64Array(n)
  const longestAt = new Float64Array(n)
  const longestIsResume = new Uint8Array(n)
  const sessionIndex = new Map<string, number>()
  // Moves: which sessions run (not parked, starting or moving), each host's sessions, open moves.
  const isRunning = new Uint8Array(n)
  const onHost: Set<number>[] = Array.from({ length: hostTotal }, () => new Set<number>())
  const moveTarget = new Int32Array(n).fill(-1)
  const moveIdOf: (string | undefined)[] = new Array(n)
  const moveEstimate: (MakeRoom.Estimate | undefined)[] = new Array(n)
  const idleAfterMove = new Uint8Array(n)
  const movesFrom = new Int32Array(hostTotal)
  let unplaceableCount = 0
  scripts.forEach((s, i) => {
    sessionIndex.set(s.id, i)
    if (tooBig(footprint[i] as Budget)) {
      unplaceable[i] = 1
      if (i >= played.burnIn) unplaceableCount++
    }
  })

  const heap = new EventHeap()
  let now = 0
  let events = 0
  /** Sessions queued now that some host could take (unplaceable ones wait apart). */
  const waiting = new Set<number>()
  // Users' patience: a stream of its own, so the workload and the rest of the run do not change with it.
  const patience = fleet.patienceMedianS > 0 ? new Rng(0x9a7e_4ce5) : null
  const giveUpAt = new Float64Array(n)
  let gaveUp = 0
  let roomAppeared = false
  /** Whether what happens now counts (the burn-in's figures do not; the invariants always do). */
  const counting = (): boolean => now >= startMs
  /** Whether request `i`'s figures count: it began at or after the trace's start. */
  const countedRequest = (i: number): boolean => (requestAt[i] as number) >= startMs

  // Measurements.
  const waits = new Samples()
  const sizeClassOf = Uint8Array.from(scripts, (sc) => ParkPolicy.sizeClass(sc.budget.memMib))
  const bySize: ({ memMib: number; requests: number; queued: number; waits: Samples } | undefined)[] = []
  const resumeWaits = new Samples()
  const windows = new Windows(fleet.windowMs, workload.horizonMs)
  const countNow = (what: "requests" | "warm" | "cold" | "descents"): void => {
    if (counting()) windows.count(now - startMs, what)
  }
  let requests = 0
  let queuedRequests = 0
  let warm = 0
  let cold = 0
  let parks = 0
  let descents = 0
  let idleDescents = 0
  const yields = Object.fromEntries(ParkPolicy.reasons.map((r) => [r, 0])) as Record<ParkPolicy.Reason, number>
  let wasted = 0
  let overCommits = 0
  let ledgerDrift = 0
  let lost = 0
  let passes = 0
  let reactions = 0
  let peakQueue = 0
  let reservedPctSum = 0
  let movesStarted = 0
  let movesCommitted = 0
  let movedMib = 0
  const moveDowntimes = new Samples()
  const series: Series = { tMs: [], queue: [], parks: [], reservedPct: [] }
  // Descents finished since the last pass, per host, not yet followed by a queued placement there.
  const judging = new Map<number, number>()

  const place = (i: number, hostId: string): void => {
    const h = hostIndex.get(hostId) as number
    const b = footprint[i] as Budget
    host[i] = h
    ;(onHost[h] as Set<number>).add(i)
    shadowMib[h] = (shadowMib[h] as number) + b.memMib
    shadowVcpus[h] = (shadowVcpus[h] as number) + b.vcpus
    touch(h)
  }
  const unplace = (i: number): void => {
    const h = host[i] as number
    if (h < 0) return
    const b = footprint[i] as Budget
    shadowMib[h] = (shadowMib[h] as number) - b.memMib
    shadowVcpus[h] = (shadowVcpus[h] as number) - b.vcpus
    ;(onHost[h] as Set<number>).delete(i)
    host[i] = -1
    touch(h)
    roomAppeared = true
  }
  const residentOf = (i: number): number => {
    const s = scripts[i] as Script
    return s.residentMib ?? s.budget.memMib
  }
  /** When the link of host `h` is free again (shared transfers). */
  const linkFreeAt = new Float64Array(hostTotal)
  /**
   * When a transfer of `mib` at `rate` MiB/s that starts now on host `h` ends: at its own rate,
   * and with a shared link no sooner than the link has moved it after the transfers before it.
   */
  const transferEnd = (h: number, mib: number, rate: number): number => {
    const alone = now + (mib / rate) * 1000
    const link = fleet.hostTransferMibPerSec
    if (!(link > 0) || h < 0) return alone
    const through = Math.max(now, linkFreeAt[h] as number) + (mib / link) * 1000
    linkFreeAt[h] = through
    return Math.max(alone, through)
  }
  const restoreMs = (i: number): number => fleet.restoreBaseMs + transferEnd(host[i] as number, residentOf(i), fleet.restoreMibPerSec) - now
  const descentMs = (i: number): number => transferEnd(host[i] as number, residentOf(i), fleet.descentMibPerSec) - now

  /** Records how long request `i` waited (the figures leave unplaceable sessions out). */
  const recordWait = (i: number, wait: number): void => {
    if (unplaceable[i] === 1 || !countedRequest(i)) return
    waits.push(wait)
    const k = sizeClassOf[i] as number
    let c = bySize[k]
    if (c === undefined) {
      c = { memMib: 0, requests: 0, queued: 0, waits: new Samples() }
      bySize[k] = c
    }
    c.memMib = Math.max(c.memMib, (scripts[i] as Script).budget.memMib)
    c.requests++
    if (wait > 0) c.queued++
    c.waits.push(wait)
    windows.wait((requestAt[i] as number) - startMs, wait)
    if (wait > (longest[i] as number)) {
      longest[i] = wait
      longestAt[i] = requestAt[i] as number
      longestIsResume[i] = requestIsResume[i] as number
    }
  }

  /** A request has been answered with room: record its wait and start its VM. */
  const placed = (i: number, hostId: string, fromQueue: boolean): void => {
    place(i, hostId)
    const wait = now - (requestAt[i] as number)
    recordWait(i, fromQueue ? wait : 0)
    const resuming = requestIsResume[i] === 1
    const bootMs = resuming ? restoreMs(i) : fleet.startMs
    if (resuming && countedRequest(i)) resumeWaits.push(wait + bootMs)
    heap.push(now + bootMs, START, i)
  }

  // ---- the reaper: @engram/reaper's pass and reaction, on this store ----------------------------
  const reaperState = ReaperState.make(fleet.meter)
  // The pass's moves step: what a move copies is the guest's resident RAM (the trace's, else its budget).
  const moveOptions: Reaper.MoveOptions | undefined = fleet.moves
    ? { costs: fleet.moveCosts, maxPerPass: fleet.movesPerPass, residentMib: (s) => residentOf(sessionIndex.get(s.id) as number) }
    : undefined
  const reaperOptions: Reaper.Options = { policy, policyOptions: fleet.policyOptions, state: reaperState, moves: moveOptions }
  const reactWindow = new CoalescingWindow()

  const startDescent = (i: number): void => {
    if (counting()) descents++
    countNow("descents")
    heap.push(now + descentMs(i), DESCENT_DONE, i)
  }

  const drained = (result: { readonly placed: readonly { readonly sessionId: string; readonly hostId: string }[] }): void => {
    for (const p of result.placed) {
      const i = sessionIndex.get(p.sessionId) as number
      waiting.delete(i)
      placed(i, p.hostId, true)
      const h = hostIndex.get(p.hostId) as number
      if (judging.has(h)) judging.delete(h)
    }
  }

  /** The store's sums against the simulator's own, and the samples for the plot, from one pass's read. */
  const checkRead = (view: FleetView): void => {
    const viewHosts = view.hosts
    const sampling = counting()
    let reserved = 0
    let capacity = 0
    let parksNow = 0
    for (let j = 0; j < viewHosts.length; j++) {
      const h = viewHosts[j] as (typeof viewHosts)[number]
      // The read is sorted by id, as the simulator numbered its hosts.
      const k = h.id === hostIds[j] ? j : (hostIndex.get(h.id) as number)
      if (h.headroom.reserved.memMib !== shadowMib[k] || h.headroom.reserved.vcpus !== shadowVcpus[k]) ledgerDrift++
      if (!sampling) continue
      reserved += h.headroom.reserved.memMib
      capacity += h.headroom.allocatableMib ?? 0
      parksNow += h.parks.length
    }
    if (!sampling) return
    const pct = capacity > 0 ? (reserved / capacity) * 100 : 0
    reservedPctSum += pct
    peakQueue = Math.max(peakQueue, view.queue.length)
    series.tMs.push(now - startMs)
    series.queue.push(view.queue.length)
    series.parks.push(parksNow)
    series.reservedPct.push(pct)
  }

  const onEvent = (e: Event): void => {
    switch (e._tag) {
      case "FleetRead":
        if (e.source === "pass") checkRead(e.fleet)
        return
      case "Reclaimed":
        for (const id of e.result.lostSessions) {
          const i = sessionIndex.get(id)
          if (i === undefined) continue
          unplace(i)
          waiting.delete(i)
          lost++
        }
        return
      case "DescentStarted": {
        const i = sessionIndex.get(e.yield.sessionId) as number
        if (counting()) yields[e.yield.reason]++
        startDescent(i)
        return
      }
      case "Drained":
        drained(e.result)
        return
      case "MoveBegun":
        moveBegun(sessionIndex.get(e.move.sessionId) as number, e.move.id, e.planned)
        return
      case "MoveNotBegun":
        storeError(`MoveNotBegun ${e.planned.sessionId}: ${e.reason}`)
        return
      case "MovesFailed":
        storeError(`MovesFailed: ${e.reason}`)
        return
      case "MoveTimedOut":
        // The simulator sets no timeout: its moves always end.
        storeError(`MoveTimedOut ${e.move.sessionId}`)
        return
      case "FleetReadFailed":
      case "ReclaimFailed":
      case "DrainFailed":
        storeError(`${e._tag}: ${e.reason}`)
        return
      case "DescentFailed":
        storeError(`DescentFailed ${e.yield.sessionId}: ${e.reason}`)
        return
      default:
        return
    }
  }
  const listener = ReaperEvents.of({ emit: (e) => Effect.sync(() => onEvent(e)) })
  const runReaper = <A>(effect: Effect.Effect<A, never, Store>): void => {
    const exit = clock.run(effect.pipe(Effect.provideService(Store, store), Effect.provideService(ReaperEvents, listener)))
    if (Exit.isFailure(exit)) storeError(String(exit.cause))
  }

  const drain = (): void => {
    const result = exec(store.drainQueue())
    if (result !== undefined) drained(result)
  }
  /** Room that appeared in this batch goes to the queue before the reaper reads the fleet (as a release drains at once in production). */
  const drainPending = (): void => {
    if (roomAppeared && waiting.size > 0 && fleet.drainOnRelease) drain()
    roomAppeared = false
  }

  const outcome = (i: number, o: PlaceOutcome | undefined): void => {
    if (o === undefined) return
    if (o._tag === "Placed") placed(i, o.session.hostId as string, false)
    else {
      if (countedRequest(i)) {
        queuedRequests++
        windows.count((requestAt[i] as number) - startMs, "queued")
      }
      if (unplaceable[i] === 1) return
      waiting.add(i)
      if (patience !== null) {
        giveUpAt[i] = now + Math.max(1, Math.round(patience.lognormal(fleet.patienceMedianS * 1000, fleet.patienceSigma)))
        heap.push(giveUpAt[i] as number, GIVE_UP, i)
      }
      // React at once (the coordinator's handlers poke the Trigger on every Queued answer).
      if (fleet.reactWindowMs > 0) {
        const due = reactWindow.request(now, fleet.reactWindowMs)
        if (due !== null) heap.push(due, REACT, 0)
      }
    }
  }
  const request = (i: number, resume: boolean): void => {
    if (counting()) requests++
    requestAt[i] = now
    requestIsResume[i] = resume ? 1 : 0
    countNow("requests")
  }

  /** The next user action after the active period that starts now. */
  const scheduleActiveEnd = (i: number, startsAt: number): void => {
    const s = scripts[i] as Script
    const k = phase[i] as number
    const t = startsAt + (s.activeMs[k] as number)
    heap.push(t, k < s.idleMs.length ? IDLE : END, i)
  }

  const pass = (): void => {
    if (counting()) passes++
    drainPending()
    // SPEC §4.3: one fleet read, reclaim, the gate, a descent per yield, then the drain.
    // Its moves for starving sessions (when on) are begun by the pass itself, told as `MoveBegun`.
    runReaper(Reaper.pass(reaperOptions))
    // The judgement of descents that finished before this pass closes with its drain.
    if (counting()) for (const count of judging.values()) wasted += count
    judging.clear()
  }

  /** The target's share of an open move (its reservation), in the simulator's own sums. */
  const shadowTarget = (i: number, sign: 1 | -1): void => {
    const t = moveTarget[i] as number
    const b = footprint[i] as Budget
    shadowMib[t] = (shadowMib[t] as number) + sign * b.memMib
    shadowVcpus[t] = (shadowVcpus[t] as number) + sign * b.vcpus
    touch(t)
  }

  /** The pass began a move of session `i` to make room (`MoveBegun`): its copy and pause, on the simulated links. */
  const moveBegun = (i: number, moveId: string, m: MakeRoom.Planned): void => {
    const src = host[i] as number
    const t = hostIndex.get(m.toHostId) as number
    moveTarget[i] = t
    moveIdOf[i] = moveId
    moveEstimate[i] = m.estimate
    shadowTarget(i, 1)
    movesFrom[src] = (movesFrom[src] as number) + 1
    if (counting()) movesStarted++
    // The copy takes both hosts' links; the pause follows it.
    const rate = fleet.moveCosts.copyMibPerSec
    const copied = (m.estimate.copyMs / 1000) * rate
    const copyEnd = Math.max(transferEnd(src, copied, rate), transferEnd(t, copied, rate))
    heap.push(copyEnd + m.estimate.downtimeMs, MOVE_DONE, i)
  }

  /** The move of session `i` commits: it runs on the target, its source room is free. */
  const finishMove = (i: number): void => {
    const t = moveTarget[i] as number
    if (t < 0) return
    const e = moveEstimate[i] as MakeRoom.Estimate
    const id = moveIdOf[i] as string
    const MiB = 1024 * 1024
    const sendMs = Math.max(1, e.downtimeMs - fleet.moveCosts.commitAllowanceMs)
    const commitMs = Math.max(1, fleet.moveCosts.commitAllowanceMs)
    exec(store.recordRound(id, { kind: "final", wireBytes: e.finalMib * MiB, apparentBytes: e.finalMib * MiB, sendMs, captureMs: 1 }))
    const done = exec(store.commitMove(id, { downtimeMs: 1 + sendMs + commitMs, captureMs: 1, sendMs, commitMs }))
    const src = host[i] as number
    movesFrom[src] = (movesFrom[src] as number) - 1
    moveTarget[i] = -1
    if (done === undefined) {
      shadowTarget(i, -1)
      return
    }
    // The session's footprint leaves the source (room for the queue) and is the target's own now.
    const b = footprint[i] as Budget
    shadowTargetTo(i, t, b)
    if (counting()) {
      movesCommitted++
      movedMib += (scripts[i] as Script).budget.memMib
      moveDowntimes.push(1 + sendMs + commitMs)
    }
    if (idleAfterMove[i] === 1) {
      idleAfterMove[i] = 0
      handle(IDLE, i)
    }
  }
  /** Session `i` now lives on `t` (its target reservation already counted there). */
  const shadowTargetTo = (i: number, t: number, b: Budget): void => {
    const src = host[i] as number
    shadowMib[src] = (shadowMib[src] as number) - b.memMib
    shadowVcpus[src] = (shadowVcpus[src] as number) - b.vcpus
    ;(onHost[src] as Set<number>).delete(i)
    ;(onHost[t] as Set<number>).add(i)
    host[i] = t
    touch(src)
    roomAppeared = true
  }

  /**
   * The user asks for the session back: a park resumes warm in place, a descended session
   * cold (placed, or queued); one still descending resumes cold once its capture is stored
   * (it cannot be undone). The store's answer says which.
   */
  const resume = (i: number): void => {
    const answer = attempt(store.resume((scripts[i] as Script).id))
    if (answer === undefined) return
    if ("refusedFrom" in answer) {
      if (answer.refusedFrom === "descending") resumeAfterDescent[i] = 1
      return
    }
    request(i, true)
    const o = answer.ok
    if (o._tag === "Placed" && o.session.state === "running") {
      if (counting()) warm++
      countNow("warm")
      recordWait(i, 0)
      if (counting()) resumeWaits.push(fleet.warmResumeMs)
      isRunning[i] = 1
      scheduleActiveEnd(i, now + fleet.warmResumeMs)
      return
    }
    if (counting()) cold++
    countNow("cold")
    outcome(i, o)
  }

  const handle = (kind: number, i: number): void => {
    const s = scripts[i] as Script
    switch (kind) {
      case ARRIVE: {
        request(i, false)
        outcome(i, exec(store.createSession({ id: s.id, budget: footprint[i] as Budget })))
        return
      }
      case START: {
        if (!("ok" in (attempt(store.markRunning(s.id)) ?? {}))) return
        isRunning[i] = 1
        scheduleActiveEnd(i, now)
        return
      }
      case IDLE: {
        const answer = attempt(store.idle(s.id))
        if (answer === undefined) return
        if (!("ok" in answer)) {
          // A session being moved goes idle once its move is done.
          if (answer.refusedFrom === "moving") idleAfterMove[i] = 1
          return
        }
        isRunning[i] = 0
        // The store's step decided with the run's park policy: parked, or descending at once.
        if (answer.ok.state === "parked") {
          if (counting()) parks++
        } else {
          if (counting()) idleDescents++
          startDescent(i)
        }
        const k = phase[i] as number
        phase[i] = k + 1
        heap.push(now + (s.idleMs[k] as number), k + 1 < s.activeMs.length ? RESUME : END, i)
        return
      }
      case RESUME:
        resume(i)
        return
      case DESCENT_DONE: {
        const h = host[i] as number
        if (!("ok" in (attempt(store.finishDescent(s.id)) ?? {}))) return
        unplace(i)
        judging.set(h, (judging.get(h) ?? 0) + 1)
        if (resumeAfterDescent[i] === 1) {
          resumeAfterDescent[i] = 0
          resume(i)
        }
        return
      }
      case END: {
        if (!("ok" in (attempt(store.endSession(s.id)) ?? {}))) return
        waiting.delete(i)
        isRunning[i] = 0
        // Its open move ended with it: the target's reservation is gone too.
        if ((moveTarget[i] as number) >= 0) {
          shadowTarget(i, -1)
          const src = host[i] as number
          movesFrom[src] = (movesFrom[src] as number) - 1
          moveTarget[i] = -1
        }
        unplace(i)
        return
      }
      case PASS: {
        pass()
        const next = now + limits.reaperIntervalMs
        if (next <= horizon) heap.push(next, PASS, 0)
        return
      }
      case MOVE_DONE:
        finishMove(i)
        return
      case GIVE_UP: {
        // Only the request that set this time, and only while it still waits.
        if (!waiting.has(i) || giveUpAt[i] !== now) return
        if (!("ok" in (attempt(store.endSession(s.id)) ?? {}))) return
        waiting.delete(i)
        if (countedRequest(i)) gaveUp++
        recordWait(i, now - (requestAt[i] as number))
        return
      }
      case REACT: {
        reactWindow.close()
        drainPending()
        if (waiting.size === 0) return
        if (counting()) reactions++
        runReaper(Reaper.react(reaperOptions))
        return
      }
      case HEARTBEAT: {
        hostIds.forEach((id, i) => {
          exec(store.heartbeatHost(id))
          // Its agent reports too: a host that stopped reporting for a stale window is silent.
          exec(store.reportHost(id, reports[i] as (typeof reports)[number]))
        })
        const next = now + fleet.heartbeatIntervalMs
        if (next <= horizon) heap.push(next, HEARTBEAT, 0)
        return
      }
    }
  }

  // Host agents heartbeat first at t=0, the reaper's first pass follows at once.
  if (heartbeats) heap.push(0, HEARTBEAT, 0)
  heap.push(0, PASS, 0)
  let nextArrival = 0
  const progressEvery = horizon / 200
  let nextProgress = progressEvery

  const afterBatch = (): void => {
    drainPending()
    // No over-commit, ever: check every host the batch touched.
    for (const h of dirty) {
      if ((shadowMib[h] as number) > (capacityMib[h] as number) || (shadowVcpus[h] as number) > (cpuBudget[h] as number)) overCommits++
      isDirty[h] = 0
    }
    dirty.length = 0
  }

  for (;;) {
    const top = heap.peek()
    const arrival = scripts[nextArrival]
    const tArrival = arrival === undefined ? Number.POSITIVE_INFINITY : arrival.arriveAtMs
    const tHeap = top === undefined ? Number.POSITIVE_INFINITY : top.t
    const t = Math.min(tArrival, tHeap)
    if (!(t <= horizon)) break
    if (t !== now) {
      afterBatch()
      now = t
      clock.now = t
      if (options.onProgress !== undefined && now >= nextProgress) {
        options.onProgress(now / horizon)
        nextProgress = now + progressEvery
      }
    }
    events++
    // Arrivals at a time run before the heap's events at that time.
    if (tArrival <= tHeap) {
      handle(ARRIVE, nextArrival)
      nextArrival++
    } else {
      const e = heap.pop() as NonNullable<ReturnType<EventHeap["pop"]>>
      handle(e.kind, e.subject)
    }
  }
  afterBatch()
  now = horizon

  // Requests still waiting count what they have waited so far.
  const queuedAtEnd = new Set((exec(store.fleetView())?.queue ?? []).map((q) => sessionIndex.get(q.sessionId) as number))
  let stillQueued = 0
  for (const i of queuedAtEnd) if (countedRequest(i)) stillQueued++
  for (let i = 0; i < n; i++) if (queuedAtEnd.has(i)) recordWait(i, horizon - (requestAt[i] as number))
  options.onProgress?.(1)

  const longestWaits: LongWait[] = []
  if (fleet.worstSessions > 0) {
    const order = [...longest.keys()].filter((i) => (longest[i] as number) > 0)
    order.sort((a, b) => (longest[b] as number) - (longest[a] as number) || a - b)
    for (const i of order.slice(0, fleet.worstSessions)) {
      const s = scripts[i] as Script
      longestWaits.push({
        sessionId: s.id,
        memMib: s.budget.memMib,
        vcpus: s.budget.vcpus,
        waitMs: longest[i] as number,
        requestAtMs: (longestAt[i] as number) - startMs,
        request: longestIsResume[i] === 1 ? "resume" : "create",
        stillQueued: queuedAtEnd.has(i),
      })
    }
  }

  return {
    policy,
    hosts: hostTotal,
    sessions: n - played.burnIn,
    horizonMs: workload.horizonMs,
    requests,
    queueWait: quantiles(waits.values()),
    queued: queuedRequests,
    stillQueued,
    unplaceable: unplaceableCount,
    resumeToRun: quantiles(resumeWaits.values()),
    warmResumes: warm,
    coldResumes: cold,
    parks,
    descents,
    idleDescents,
    yields,
    wastedDescents: wasted,
    reactions,
    meanReservedPct: passes > 0 ? reservedPctSum / passes : 0,
    peakQueue,
    overCommits,
    ledgerDrift,
    storeErrors,
    firstStoreError,
    lostSessions: lost,
    passes,
    events,
    series,
    windows: windows.figures(),
    longestWaits,
    waitsBySize: bySize.flatMap((c) => {
      if (c === undefined) return []
      const q = quantiles(c.waits.values())
      return [{ memMib: c.memMib, requests: c.requests, queued: c.queued, p99Ms: q.p99, maxMs: q.max }]
    }),
    // With a burn-in, its sessions' resumes may fall in the counted part: the bound counts them too.
    warmBoundTtl: ttlWarmBound(played.burnIn > 0 ? { scripts, horizonMs: horizon } : workload, fleet.limits),
    gaveUp,
    moves: movesStarted,
    movesCommitted,
    movedMib,
    moveDowntime: quantiles(moveDowntimes.values()),
  }
}
