/**
 * The fleet simulator's engine: a discrete-event loop that plays a workload against the real
 * decisions. Every placement, state change, descent, drain and ledger operation runs in
 * `@engram/store-sim` (which decides through `@engram/core`), on a simulated Effect Clock; the
 * park policy is a pure function of `@engram/core`'s `ParkPolicy`. The loop only models what
 * happens outside the store: users, VM start and restore times, descents that take time,
 * host agents' heartbeats and the coordinator's reaper pass (SPEC §4.3).
 */
import { Headroom, Limits, ParkPolicy } from "@engram/core"
import type { FleetView } from "@engram/core"
import type { PlaceOutcome } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Exit } from "effect"
import type { Effect } from "effect"
import { EventHeap } from "./EventHeap.js"
import * as SimClock from "./SimClock.js"
import type { Script, Workload } from "./Workload.js"

/** The fleet and the timings of everything the store does not model. */
export interface FleetConfig {
  readonly hosts: number
  /** What each host reports as allocatable RAM (MiB); capacity is this less the system reserve. */
  readonly hostMib: number
  readonly hostVcpus: number
  /** A descent captures RAM at this rate (MiB/s): a 8 GiB park takes 8 s at 1024. */
  readonly descentMibPerSec: number
  /** A cold resume restores at this rate (MiB/s), after `restoreBaseMs`. */
  readonly restoreMibPerSec: number
  readonly restoreBaseMs: number
  /** A warm resume (unpausing a park). */
  readonly warmResumeMs: number
  /** A new session's VM boot. */
  readonly startMs: number
  /**
   * Host agents heartbeat their reservations this often (must stay under the stale window).
   * `0` models agents that never fail: no heartbeat traffic, and no reservation ever goes
   * stale (the reaper still runs its reclaim every pass). Heartbeats cost a store call per
   * host per interval, which dominates a 1,000-host day, so they are off by default.
   */
  readonly heartbeatIntervalMs: number
  /**
   * Drain the queue whenever room appears (SPEC §2), not only at reaper passes. Off, queued
   * sessions wait for the next pass even when room is free (a coordinator that drains only
   * from its reaper), which is where judging the queue cumulatively matters.
   */
  readonly drainOnRelease: boolean
  readonly limits: Limits.Limits
  readonly policyOptions: ParkPolicy.Options
}

/** Defaults: 1,000 hosts of 64 GiB and 16 cores, SPEC §9 limits. */
export const defaultFleet: FleetConfig = Object.freeze({
  hosts: 1000,
  hostMib: 65_536,
  hostVcpus: 16,
  descentMibPerSec: 1024,
  restoreMibPerSec: 2048,
  restoreBaseMs: 1000,
  warmResumeMs: 50,
  startMs: 2000,
  heartbeatIntervalMs: 0,
  drainOnRelease: true,
  limits: Limits.defaults,
  policyOptions: ParkPolicy.defaultOptions,
})

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

/** What one run measured. */
export interface Result {
  readonly policy: ParkPolicy.Name
  readonly hosts: number
  readonly sessions: number
  readonly horizonMs: number
  /** Creates and resumes: every time a user asked for a running VM. */
  readonly requests: number
  /** Time each request spent queued for room (0 when it placed or unparked at once); still-queued requests count their wait so far. */
  readonly queueWait: Quantiles
  /** Requests that queued at all. */
  readonly queued: number
  /** Requests still queued when the run ended. */
  readonly stillQueued: number
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
  /** Events processed (arrivals, user actions, VM starts, descents, passes, heartbeats). */
  readonly events: number
  readonly series: Series
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

// What the simulator believes each session is doing (mirrors the store's state).
const S_NEW = 0
const S_QUEUED = 1
const S_PENDING = 2
const S_RUNNING = 3
const S_PARKED = 4
const S_DESCENDING = 5
const S_DESCENDED = 6
const S_ENDED = 7
const S_LOST = 8

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

/** Plays `workload` against a fresh in-memory store under `options.policy`. */
export const run = (workload: Workload, options: RunOptions): Result => {
  const fleet: FleetConfig = { ...defaultFleet, ...options.fleet }
  const heartbeats = fleet.heartbeatIntervalMs > 0
  // Agents that never fail keep every reservation fresh: nothing goes stale.
  const limits: Limits.Limits = heartbeats ? fleet.limits : { ...fleet.limits, heartbeatStaleWindowMs: Number.MAX_SAFE_INTEGER }
  const policy = options.policy
  const clock = SimClock.make(0)
  const { store } = StoreSim.make({ limits, noFitDetails: false })
  const scripts = workload.scripts
  const horizon = workload.horizonMs
  const n = scripts.length

  let storeErrors = 0
  let firstStoreError: string | null = null
  /** Runs a store operation; a failure is counted (the checks require none) and answers undefined. */
  const exec = <A, E>(effect: Effect.Effect<A, E>): A | undefined => {
    const exit = clock.run(effect)
    if (Exit.isSuccess(exit)) return exit.value
    storeErrors++
    if (firstStoreError === null) firstStoreError = String(exit.cause)
    return undefined
  }

  // ---- the fleet ------------------------------------------------------------------------------
  const width = String(fleet.hosts).length
  const hostIds: string[] = []
  const hostIndex = new Map<string, number>()
  for (let i = 0; i < fleet.hosts; i++) {
    const id = `h${String(i).padStart(width, "0")}`
    hostIds.push(id)
    hostIndex.set(id, i)
    exec(store.registerHost({ id }))
    exec(store.reportHost(id, { totalMib: fleet.hostMib, allocatableMib: fleet.hostMib, totalVcpus: fleet.hostVcpus }))
  }
  // The simulator's own ledger, from session states alone, to check the store against.
  const headroom = Headroom.fromReport({ allocatableMib: fleet.hostMib, totalVcpus: fleet.hostVcpus }, Headroom.zero, limits)
  const capacityMib = headroom.allocatableMib ?? Number.POSITIVE_INFINITY
  const cpuBudget = headroom.cpuBudget ?? Number.POSITIVE_INFINITY
  const shadowMib = new Float64Array(fleet.hosts)
  const shadowVcpus = new Float64Array(fleet.hosts)
  const dirty: number[] = []
  const isDirty = new Uint8Array(fleet.hosts)
  const touch = (h: number): void => {
    if (isDirty[h] === 0) {
      isDirty[h] = 1
      dirty.push(h)
    }
  }

  // ---- sessions -------------------------------------------------------------------------------
  const state = new Uint8Array(n)
  const phase = new Int32Array(n) // index of the current (or next) active period
  const host = new Int32Array(n).fill(-1)
  const requestAt = new Float64Array(n) // when the open request (create or resume) began
  const requestIsResume = new Uint8Array(n)
  const resumeAfterDescent = new Uint8Array(n)
  const sessionIndex = new Map<string, number>()
  scripts.forEach((s, i) => sessionIndex.set(s.id, i))

  const heap = new EventHeap()
  let now = 0
  let events = 0
  /** Sessions queued now, in the order they queued. */
  const waiting = new Set<number>()
  let roomAppeared = false

  // Measurements.
  const waits = new Samples()
  const resumeWaits = new Samples()
  let requests = 0
  let queuedRequests = 0
  let warm = 0
  let cold = 0
  let parks = 0
  let descents = 0
  let idleDescents = 0
  const yields: Record<ParkPolicy.Reason, number> = { demand: 0, over_reserved: 0, hard_ttl: 0, floor: 0 }
  let wasted = 0
  let overCommits = 0
  let ledgerDrift = 0
  let lost = 0
  let passes = 0
  let peakQueue = 0
  let reservedPctSum = 0
  const series: Series = { tMs: [], queue: [], parks: [], reservedPct: [] }
  // Descents finished since the last pass, per host, not yet followed by a queued placement there.
  const judging = new Map<number, number>()

  const place = (i: number, hostId: string): void => {
    const h = hostIndex.get(hostId) as number
    const b = (scripts[i] as Script).budget
    host[i] = h
    shadowMib[h] = (shadowMib[h] as number) + b.memMib
    shadowVcpus[h] = (shadowVcpus[h] as number) + b.vcpus
    touch(h)
  }
  const unplace = (i: number): void => {
    const h = host[i] as number
    if (h < 0) return
    const b = (scripts[i] as Script).budget
    shadowMib[h] = (shadowMib[h] as number) - b.memMib
    shadowVcpus[h] = (shadowVcpus[h] as number) - b.vcpus
    host[i] = -1
    touch(h)
    roomAppeared = true
  }
  const restoreMs = (i: number): number =>
    fleet.restoreBaseMs + ((scripts[i] as Script).budget.memMib / fleet.restoreMibPerSec) * 1000
  const descentMs = (i: number): number => ((scripts[i] as Script).budget.memMib / fleet.descentMibPerSec) * 1000

  /** A request has been answered with room: record its wait and start its VM. */
  const placed = (i: number, hostId: string, fromQueue: boolean): void => {
    place(i, hostId)
    state[i] = S_PENDING
    const wait = now - (requestAt[i] as number)
    waits.push(fromQueue ? wait : 0)
    const resuming = requestIsResume[i] === 1
    const bootMs = resuming ? restoreMs(i) : fleet.startMs
    if (resuming) resumeWaits.push(wait + bootMs)
    heap.push(now + bootMs, START, i)
  }
  const outcome = (i: number, o: PlaceOutcome | undefined): void => {
    if (o === undefined) {
      state[i] = S_LOST
      return
    }
    if (o._tag === "Placed") placed(i, o.session.hostId as string, false)
    else {
      state[i] = S_QUEUED
      waiting.add(i)
      queuedRequests++
    }
  }
  const request = (i: number, resume: boolean): void => {
    requests++
    requestAt[i] = now
    requestIsResume[i] = resume ? 1 : 0
  }

  /** The next user action after the active period that starts now. */
  const scheduleActiveEnd = (i: number, startsAt: number): void => {
    const s = scripts[i] as Script
    const k = phase[i] as number
    const t = startsAt + (s.activeMs[k] as number)
    heap.push(t, k < s.idleMs.length ? IDLE : END, i)
  }

  const drain = (): void => {
    const result = exec(store.drainQueue())
    if (result === undefined) return
    for (const p of result.placed) {
      const i = sessionIndex.get(p.sessionId) as number
      waiting.delete(i)
      placed(i, p.hostId, true)
      const h = hostIndex.get(p.hostId) as number
      if (judging.has(h)) judging.delete(h)
    }
  }

  /**
   * The policy's answer for an idle session, fresh at the moment it goes idle: the policy runs
   * over the session's host and the queue. Every policy's `mayPark` depends on nothing else,
   * and (with drains on release) no queued session fits on any host between drains, so this
   * view answers "is a queued session without room" as a full fleet read would, at a fraction
   * of the cost.
   */
  const mayParkNow = (hostId: string): boolean => {
    if (!fleet.drainOnRelease && waiting.size > 0) {
      // Queued sessions may fit somewhere: only a full read answers exactly.
      const full = exec(store.fleetView())
      return full !== undefined && ParkPolicy.evaluate(policy, full, now, limits, fleet.policyOptions).mayPark(hostId)
    }
    const view = exec(store.getHost(hostId))
    if (view === undefined) return false
    // Any one queued session stands for the queue: none of them fits anywhere (see above).
    const head = waiting.values().next()
    const queue = head.done === true ? [] : [{ sessionId: (scripts[head.value] as Script).id, budget: (scripts[head.value] as Script).budget, queuedAt: requestAt[head.value] as number }]
    const local: FleetView = {
      hosts: [{ id: view.id, headroom: view.headroom, state: view.state, entries: view.entries, measured: view.measured, descentsRunning: view.descentsRunning, parks: [] }],
      queue,
    }
    return ParkPolicy.evaluate(policy, local, now, limits, fleet.policyOptions).mayPark(hostId)
  }

  const pass = (): void => {
    passes++
    // SPEC §4.3: one fleet read, reclaim, the gate, a descent per yield, then the drain.
    const view = exec(store.fleetView())
    if (view === undefined) return // a failed read holds every park
    // The store's sums against the simulator's own, from the same read.
    const viewHosts = view.hosts
    for (let j = 0; j < viewHosts.length; j++) {
      const h = viewHosts[j] as (typeof viewHosts)[number]
      // The read is sorted by id, as the simulator numbered its hosts.
      const k = h.id === hostIds[j] ? j : (hostIndex.get(h.id) as number)
      if (h.headroom.reserved.memMib !== shadowMib[k] || h.headroom.reserved.vcpus !== shadowVcpus[k]) ledgerDrift++
    }
    const reclaimed = exec(store.reclaim())
    if (reclaimed !== undefined) {
      for (const id of reclaimed.lostSessions) {
        const i = sessionIndex.get(id)
        if (i === undefined) continue
        unplace(i)
        state[i] = S_LOST
        lost++
      }
    }
    const fleetView: FleetView = reclaimed !== undefined && reclaimed.reclaimed.length > 0 ? (exec(store.fleetView()) ?? view) : view
    const decision = ParkPolicy.evaluate(policy, fleetView, now, limits, fleet.policyOptions)
    for (const y of decision.yields) {
      const i = sessionIndex.get(y.sessionId)
      if (i === undefined || state[i] !== S_PARKED) continue
      // A lost race (the user resumed it first) fails the CAS and skips the yield.
      if (exec(store.beginDescent(y.sessionId)) === undefined) continue
      yields[y.reason]++
      startDescent(i)
    }
    drain()
    // The judgement of descents that finished before this pass closes with its drain.
    for (const count of judging.values()) wasted += count
    judging.clear()

    // Samples of the pass's read.
    let reserved = 0
    let capacity = 0
    let parksNow = 0
    for (const h of fleetView.hosts) {
      reserved += h.headroom.reserved.memMib
      capacity += h.headroom.allocatableMib ?? 0
      parksNow += h.parks.length
    }
    const pct = capacity > 0 ? (reserved / capacity) * 100 : 0
    reservedPctSum += pct
    peakQueue = Math.max(peakQueue, fleetView.queue.length)
    series.tMs.push(now)
    series.queue.push(fleetView.queue.length)
    series.parks.push(parksNow)
    series.reservedPct.push(pct)
  }

  const startDescent = (i: number): void => {
    state[i] = S_DESCENDING
    descents++
    heap.push(now + descentMs(i), DESCENT_DONE, i)
  }

  const resume = (i: number): void => {
    request(i, true)
    cold++
    const o = exec(store.resume((scripts[i] as Script).id))
    outcome(i, o)
  }

  const handle = (kind: number, i: number): void => {
    const s = scripts[i] as Script
    switch (kind) {
      case ARRIVE: {
        request(i, false)
        outcome(i, exec(store.createSession({ id: s.id, budget: s.budget })))
        return
      }
      case START: {
        if (state[i] !== S_PENDING) return
        if (exec(store.markRunning(s.id)) === undefined) return
        state[i] = S_RUNNING
        scheduleActiveEnd(i, now)
        return
      }
      case IDLE: {
        if (state[i] !== S_RUNNING) return
        const mayPark = mayParkNow(hostIds[host[i] as number] as string)
        if (exec(store.idle(s.id, mayPark)) === undefined) return
        if (mayPark) {
          state[i] = S_PARKED
          parks++
        } else {
          idleDescents++
          startDescent(i)
        }
        const k = phase[i] as number
        phase[i] = k + 1
        heap.push(now + (s.idleMs[k] as number), k + 1 < s.activeMs.length ? RESUME : END, i)
        return
      }
      case RESUME: {
        const st = state[i]
        if (st === S_PARKED) {
          request(i, true)
          if (exec(store.unpark(s.id)) === undefined) return
          warm++
          waits.push(0)
          resumeWaits.push(fleet.warmResumeMs)
          state[i] = S_RUNNING
          scheduleActiveEnd(i, now + fleet.warmResumeMs)
        } else if (st === S_DESCENDING) {
          // The capture cannot be undone: the session resumes cold once it is stored.
          resumeAfterDescent[i] = 1
        } else if (st === S_DESCENDED) {
          resume(i)
        }
        return
      }
      case DESCENT_DONE: {
        if (state[i] !== S_DESCENDING) return
        const h = host[i] as number
        if (exec(store.finishDescent(s.id)) === undefined) return
        unplace(i)
        state[i] = S_DESCENDED
        judging.set(h, (judging.get(h) ?? 0) + 1)
        if (resumeAfterDescent[i] === 1) {
          resumeAfterDescent[i] = 0
          resume(i)
        }
        return
      }
      case END: {
        const st = state[i]
        if (st === S_ENDED || st === S_LOST || st === S_NEW) return
        if (st === S_QUEUED) waiting.delete(i)
        if (exec(store.endSession(s.id)) === undefined) return
        unplace(i)
        state[i] = S_ENDED
        return
      }
      case PASS: {
        pass()
        const next = now + limits.reaperIntervalMs
        if (next <= horizon) heap.push(next, PASS, 0)
        return
      }
      case HEARTBEAT: {
        for (const id of hostIds) exec(store.heartbeatHost(id))
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
    if (roomAppeared && waiting.size > 0 && fleet.drainOnRelease) drain()
    roomAppeared = false
    // No over-commit, ever: check every host the batch touched.
    for (const h of dirty) {
      if ((shadowMib[h] as number) > capacityMib || (shadowVcpus[h] as number) > cpuBudget) overCommits++
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
  let stillQueued = 0
  for (let i = 0; i < n; i++) {
    if (state[i] === S_QUEUED) {
      stillQueued++
      waits.push(horizon - (requestAt[i] as number))
    }
  }
  options.onProgress?.(1)

  return {
    policy,
    hosts: fleet.hosts,
    sessions: n,
    horizonMs: horizon,
    requests,
    queueWait: quantiles(waits.values()),
    queued: queuedRequests,
    stillQueued,
    resumeToRun: quantiles(resumeWaits.values()),
    warmResumes: warm,
    coldResumes: cold,
    parks,
    descents,
    idleDescents,
    yields,
    wastedDescents: wasted,
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
  }
}
