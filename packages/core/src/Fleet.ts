/**
 * The fleet snapshot: the autoscaling signal an operator reads (SPEC §1, §7, §12). It sums the
 * same headroom placement reserves against, so "free" means the same thing everywhere, and
 * it names the queued sessions no host of the fleet can take (`unplaceable`: the cue for a
 * bigger host, where `queue.withoutRoom` is the cue for more hosts).
 */
import * as Headroom from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as ParkGate from "./ParkGate.js"
import { compareIds } from "./Order.js"
import * as Placement from "./Placement.js"

/** The fleet at a glance. */
export interface Snapshot {
  readonly hosts: {
    readonly total: number
    readonly ready: number
    readonly measured: number
    readonly cordoned: number
    readonly draining: number
    /**
     * Hosts (any state) whose agent is silent at the read's time: no report within the stale
     * window (`Placement.isSilent`). They take no placements until their agent reports again.
     * 0 without a `now`.
     */
    readonly silent: number
    /** The silent hosts among `ready` (counted there too): `ready − readySilent` hosts take placements. */
    readonly readySilent: number
  }
  /**
   * Sums over measured, ready hosts with a RAM cap (silent ones included: see `silentFreeMib`).
   * Free may be negative when over-reserved.
   */
  readonly capacityMib: number
  readonly reservedMib: number
  readonly freeMib: number
  /** Sums over ready hosts that reported cores. */
  readonly cpuBudget: number
  readonly reservedVcpus: number
  readonly freeVcpus: number
  /** The part of `freeMib` on ready silent hosts: room no placement can use until their agents report (0 without a `now`). */
  readonly silentFreeMib: number
  /** The part of `freeVcpus` on ready silent hosts. */
  readonly silentFreeVcpus: number
  readonly queue: {
    readonly sessions: number
    readonly memMib: number
    readonly vcpus: number
    /**
     * Queued sessions that fit on no candidate host now (too-big ones excluded); with the read's
     * time, a host claimed for a starving session is no candidate for the others (as for the gate).
     */
    readonly withoutRoom: number
  }
  /**
   * Queued sessions too big for every ready measured host even when empty (SPEC §12 `too_big`),
   * and the largest of their budgets per dimension (0 when none): the host size the fleet lacks.
   */
  readonly unplaceable: {
    readonly count: number
    readonly largestMemMib: number
    readonly largestVcpus: number
  }
  readonly parks: number
  readonly descentsRunning: number
  /** Each template (name and size) the hosts hold, with how many hold it (any state), by name then size. */
  readonly templates: readonly TemplateCount[]
}

/** A template and how many hosts hold it. */
export interface TemplateCount extends Placement.HeldTemplate {
  readonly hosts: number
}

/** The templates the hosts hold, each with its number of holders, by name then size. */
export const templateCounts = (hosts: Iterable<Placement.Candidate>): TemplateCount[] => {
  const counts = new Map<string, TemplateCount>()
  for (const h of hosts)
    for (const t of h.templates ?? []) {
      const key = `${t.name}/${t.memMib}/${t.vcpus}`
      const c = counts.get(key)
      counts.set(key, { name: t.name, memMib: t.memMib, vcpus: t.vcpus, hosts: (c?.hosts ?? 0) + 1 })
    }
  return [...counts.values()].sort((a, b) => compareIds(a.name, b.name) || a.memMib - b.memMib || a.vcpus - b.vcpus)
}

/**
 * Computes the snapshot from one fleet read. With `now` (the read's time), the queue's
 * `withoutRoom` counts no room on a silent host (`Placement.isSilent`): a dead agent's empty host
 * does not hide the cue for more hosts; the silent hosts are counted (`hosts.silent`,
 * `hosts.readySilent`) and their room named (`silentFreeMib`, `silentFreeVcpus`), while `ready`,
 * `freeMib` and `freeVcpus` keep their meaning (every ready host). With `now`, a host placement
 * claims for a starving session (the gate's `options.starvationLimitMs`) is no room for the other
 * queued sessions either, as the park gate counts them (`ParkGate.countWithoutRoom`): a session
 * that fits only there waits as surely as one that fits nowhere.
 */
export const snapshot = (fleet: ParkGate.FleetView, limits: Limits = defaults, now?: number, options: ParkGate.Options = ParkGate.defaultOptions): Snapshot => {
  let ready = 0
  let measured = 0
  let cordoned = 0
  let draining = 0
  let silent = 0
  let readySilent = 0
  let silentFreeMib = 0
  let silentFreeVcpus = 0
  let capacityMib = 0
  let reservedMib = 0
  let cpuBudget = 0
  let reservedVcpus = 0
  let parks = 0
  let descentsRunning = 0
  for (const h of fleet.hosts) {
    const state = h.state ?? "ready"
    if (state === "ready") ready++
    else if (state === "cordoned") cordoned++
    else draining++
    if (Placement.isMeasured(h)) measured++
    parks += h.parks.length
    descentsRunning += h.descentsRunning
    const isSilent = now !== undefined && Placement.isSilent(h, now, limits)
    if (isSilent) silent++
    if (state !== "ready") continue
    if (isSilent) readySilent++
    if (Headroom.gatesRam(h.headroom)) {
      capacityMib += Math.floor(h.headroom.allocatableMib as number)
      reservedMib += h.headroom.reserved.memMib
      if (isSilent) silentFreeMib += Math.floor(h.headroom.allocatableMib as number) - h.headroom.reserved.memMib
    }
    if (Headroom.gatesCpu(h.headroom)) {
      cpuBudget += Math.floor(h.headroom.cpuBudget as number)
      reservedVcpus += h.headroom.reserved.vcpus
      if (isSilent) silentFreeVcpus += Math.floor(h.headroom.cpuBudget as number) - h.headroom.reserved.vcpus
    }
  }
  let qMem = 0
  let qCpu = 0
  for (const q of fleet.queue) {
    qMem += q.budget.memMib
    qCpu += q.budget.vcpus
  }
  const tooBig = ParkGate.unplaceable(fleet, limits)
  const largest = ParkGate.largestOf(tooBig)
  return {
    hosts: { total: fleet.hosts.length, ready, measured, cordoned, draining, silent, readySilent },
    capacityMib,
    reservedMib,
    freeMib: capacityMib - reservedMib,
    cpuBudget,
    reservedVcpus,
    freeVcpus: cpuBudget - reservedVcpus,
    silentFreeMib,
    silentFreeVcpus,
    queue: {
      sessions: fleet.queue.length,
      memMib: qMem,
      vcpus: qCpu,
      withoutRoom: ParkGate.countWithoutRoom(fleet, limits, now, options),
    },
    unplaceable: { count: tooBig.length, largestMemMib: largest.memMib, largestVcpus: largest.vcpus },
    parks,
    descentsRunning,
    templates: templateCounts(fleet.hosts),
  }
}
