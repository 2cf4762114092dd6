/**
 * The load a workload offers a fleet, before any policy runs: the RAM and vCPUs its sessions
 * ask for while active, averaged over the run, against the fleet's capacity (core's
 * `Headroom.ramCapacityOf` and `cpuBudgetOf`, as placement sees it). Active demand is a floor:
 * parks hold room too, until the gate makes them yield. Past 1× no policy can keep the queue
 * short, and a comparison of policies shows only the overload; the command line warns.
 */
import { Headroom } from "@engram/core"
import type { Limits } from "@engram/core"
import * as Simulation from "./Simulation.js"
import type { FleetConfig } from "./Simulation.js"
import type { Workload } from "./Workload.js"

/** The offered load of a workload on a fleet. */
export interface OfferedLoad {
  /** Mean RAM asked for by active sessions ÷ the fleet's RAM capacity (0 when RAM is not capped). */
  readonly ramRatio: number
  /** Mean vCPUs asked for by active sessions ÷ the fleet's vCPU budget. */
  readonly cpuRatio: number
  /** The most RAM active sessions ask for at one time ÷ the fleet's RAM capacity. */
  readonly peakRamRatio: number
  /** Sessions per host per hour of the run. */
  readonly sessionsPerHostHour: number
}

/** At or past this mean ratio in either dimension, a run is overloaded: the queue can only grow. */
export const overloadRatio = 1
/**
 * At or past this peak ratio, a run is overloaded too: at the busiest moment the active sessions
 * alone ask for twice the fleet, so every policy queues there whatever it descends. (Between 1×
 * and 2× at the peak, queues at the peak are expected and the policies still differ.)
 */
export const overloadPeakRatio = 2

/** The fleet's RAM capacity and vCPU budget, summed over its hosts. */
const capacityOf = (fleet: FleetConfig, limits: Limits.Limits) => {
  let ramMib = 0
  let vcpus = 0
  for (const s of Simulation.shapesOf(fleet)) {
    ramMib += s.count * (Headroom.ramCapacityOf(s.memMib, limits) ?? 0)
    vcpus += s.count * (Headroom.cpuBudgetOf(s.vcpus, limits) ?? 0)
  }
  return { ramMib, vcpus }
}

/** The mean active demand of the workload against the fleet's capacity. */
export const offered = (workload: Workload, fleet: FleetConfig): OfferedLoad => {
  const horizon = Math.max(1, workload.horizonMs)
  let memMs = 0
  let vcpuMs = 0
  // RAM steps (+ at an active period's start, − at its end) for the peak.
  const steps: [number, number][] = []
  for (const s of workload.scripts) {
    // Active periods inside the run, on the timeline of a fleet that makes nobody wait.
    let t = s.arriveAtMs
    let active = 0
    for (let k = 0; k < s.activeMs.length && t < horizon; k++) {
      const a = Math.min(s.activeMs[k] as number, horizon - t)
      active += a
      steps.push([t, s.budget.memMib], [t + a, -s.budget.memMib])
      t += (s.activeMs[k] as number) + (s.idleMs[k] ?? 0)
    }
    memMs += s.budget.memMib * active
    vcpuMs += s.budget.vcpus * active
  }
  steps.sort((a, b) => a[0] - b[0] || a[1] - b[1])
  let now = 0
  let peakMib = 0
  for (const [, d] of steps) {
    now += d
    if (now > peakMib) peakMib = now
  }
  const cap = capacityOf(fleet, { ...fleet.limits })
  const hosts = Simulation.hostCount(fleet)
  return {
    ramRatio: cap.ramMib > 0 ? memMs / horizon / cap.ramMib : 0,
    cpuRatio: cap.vcpus > 0 ? vcpuMs / horizon / cap.vcpus : 0,
    peakRamRatio: cap.ramMib > 0 ? peakMib / cap.ramMib : 0,
    sessionsPerHostHour: hosts > 0 ? workload.scripts.length / hosts / (horizon / 3_600_000) : 0,
  }
}

/** Whether the load is past what any policy can serve. */
export const isOverloaded = (load: OfferedLoad): boolean =>
  load.ramRatio >= overloadRatio || load.cpuRatio >= overloadRatio || load.peakRamRatio >= overloadPeakRatio

const times = (x: number) => `${x >= 10 ? x.toFixed(0) : x.toFixed(1)}×`

/** One line for the header of a report: the offered load. */
export const describe = (load: OfferedLoad): string =>
  `offered load ${times(load.ramRatio)} the fleet's RAM (peak ${times(load.peakRamRatio)}), ${times(load.cpuRatio)} its vCPUs (active sessions; ${load.sessionsPerHostHour.toFixed(1)} sessions per host per hour)`

/** The warning for an overloaded run: what it means and what to change; null when the load is below capacity. */
export const warning = (load: OfferedLoad): string | null => {
  if (!isOverloaded(load)) return null
  const which =
    load.ramRatio >= overloadRatio || load.cpuRatio >= overloadRatio
      ? `${load.ramRatio >= load.cpuRatio ? `${times(load.ramRatio)} the fleet's RAM` : `${times(load.cpuRatio)} its vCPUs`} on average`
      : `${times(load.peakRamRatio)} the fleet's RAM at the peak`
  return (
    `WARNING: overloaded: the active sessions alone ask for ${which}, so every policy queues most requests ` +
    `and the comparison shows the overload, not the policies. Fewer --sessions, more --hours or more --hosts give a run that informs ` +
    `(a mean below 1× and a peak below ${overloadPeakRatio}×; a peak near 1× keeps parks under pressure).`
  )
}
