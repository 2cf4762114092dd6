/**
 * Host headroom: the one definition of "room" (SPEC §1). Placement, the park gate, the
 * ledger, the host view and the fleet snapshot all read these functions; no other module,
 * store or app does this arithmetic.
 */
import { defaults, type Limits } from "./Limits.js"

/** A session's resource budget. */
export interface Budget {
  readonly memMib: number
  readonly vcpus: number
}

/**
 * A host's capacity after policy and what the ledger holds on it. `allocatableMib` and
 * `cpuBudget` are `null` when the host has not reported them: that dimension is not gated.
 */
export interface HostHeadroom {
  readonly allocatableMib: number | null
  readonly cpuBudget: number | null
  readonly reserved: Budget
}

/** What a host agent reports (SPEC §1): MemAvailable plus the RAM of its resident VMs. */
export interface HostReport {
  readonly allocatableMib: number | null
  readonly totalVcpus: number | null
}

/** The zero budget. */
export const zero: Budget = Object.freeze({ memMib: 0, vcpus: 0 })

/** Sum of two budgets. */
export const add = (a: Budget, b: Budget): Budget => ({ memMib: a.memMib + b.memMib, vcpus: a.vcpus + b.vcpus })

/** `a` less `b`, per dimension. */
export const subtract = (a: Budget, b: Budget): Budget => ({ memMib: a.memMib - b.memMib, vcpus: a.vcpus - b.vcpus })

/** RAM not reserved: negative when the host is reserved beyond its capacity; null when unmeasured. */
export const freeMib = (h: HostHeadroom): number | null =>
  h.allocatableMib === null ? null : h.allocatableMib - h.reserved.memMib

/** vCPUs not reserved; null when the host reported no cores. */
export const freeVcpus = (h: HostHeadroom): number | null =>
  h.cpuBudget === null ? null : h.cpuBudget - h.reserved.vcpus

/**
 * A capacity or a budget as it is shown (the API's host view, no-fit details, the fleet's sums): a
 * full host's smallest positive figure (`ramCapacityOf`, `cpuBudgetOf`: it keeps the host gated)
 * reads 0, never `5e-324`; null stays null (not measured). Placement reads the figures themselves.
 */
export const shown = (figure: number | null): number | null => (figure === null ? null : Math.floor(figure))

/** {@link freeMib} as it is shown ({@link shown}): a full host with nothing reserved has 0 free, not `5e-324`. */
export const shownFreeMib = (h: HostHeadroom): number | null => (h.allocatableMib === null ? null : Math.floor(h.allocatableMib) - h.reserved.memMib)

/** {@link freeVcpus} as it is shown ({@link shown}). */
export const shownFreeVcpus = (h: HostHeadroom): number | null => (h.cpuBudget === null ? null : Math.floor(h.cpuBudget) - h.reserved.vcpus)

/** Whether RAM gates placement on this host: its capacity is known and positive. */
export const gatesRam = (h: HostHeadroom): boolean => h.allocatableMib !== null && h.allocatableMib > 0

/** Whether CPU gates placement on this host: its budget is known and positive. */
export const gatesCpu = (h: HostHeadroom): boolean => h.cpuBudget !== null && h.cpuBudget > 0

/**
 * The largest budget that fits, per dimension; `Infinity` where the dimension is not gated.
 * `fits` and every index built for fast "does anything fit" queries read this.
 */
export const fitLimit = (h: HostHeadroom): Budget => ({ memMib: fitLimitMib(h), vcpus: fitLimitVcpus(h) })

/** The RAM part of {@link fitLimit}. */
export const fitLimitMib = (h: HostHeadroom): number => (gatesRam(h) ? (h.allocatableMib as number) - h.reserved.memMib : Number.POSITIVE_INFINITY)

/** The CPU part of {@link fitLimit}. */
export const fitLimitVcpus = (h: HostHeadroom): number => (gatesCpu(h) ? (h.cpuBudget as number) - h.reserved.vcpus : Number.POSITIVE_INFINITY)

/** Whether `b` fits on the host now (SPEC §1). */
export const fits = (h: HostHeadroom, b: Budget): boolean => b.memMib <= fitLimitMib(h) && b.vcpus <= fitLimitVcpus(h)

/** Which dimension refuses `b`, if any: RAM is named first. */
export const shortfall = (h: HostHeadroom, b: Budget): "ram" | "cpu" | null =>
  b.memMib > fitLimitMib(h) ? "ram" : b.vcpus > fitLimitVcpus(h) ? "cpu" : null

/** Whether a measured host is reserved beyond its RAM capacity. */
export const isOverReserved = (h: HostHeadroom): boolean => gatesRam(h) && h.reserved.memMib > (h.allocatableMib as number)

/**
 * `floor(totalVcpus × cpuOvercommit)`; null when the host reported no cores. A host that
 * reported cores whose budget floors to 0 (one vCPU at a `cpuOvercommit` under 1) has the
 * smallest positive budget instead: full, never ungated (a budget of 0 would read as "CPU does
 * not gate", and such a host took any number of vCPUs), as `ramCapacityOf` keeps a RAM capacity
 * of 0 full.
 */
export const cpuBudgetOf = (totalVcpus: number | null, limits: Limits = defaults): number | null => {
  if (totalVcpus === null || !(totalVcpus > 0)) return null
  const budget = Math.floor(totalVcpus * limits.cpuOvercommit)
  return budget > 0 ? budget : Number.MIN_VALUE
}

/**
 * RAM capacity after policy: `(allocatable − systemReserveMib) × memOvercommitRatio`, the
 * reserve subtracted before the ratio (as OpenStack Placement does). Null when the host has
 * not reported RAM, or when the ratio is 0 (no RAM cap). A host whose report does not
 * exceed the reserve — an explicit `allocatableMib: 0` included — has capacity 0: it is
 * measured and full, never ungated (SPEC §1, §12).
 */
export const ramCapacityOf = (allocatableMib: number | null, limits: Limits = defaults): number | null => {
  if (allocatableMib === null || Number.isNaN(allocatableMib) || limits.memOvercommitRatio === 0) return null
  const capacity = Math.floor((allocatableMib - limits.systemReserveMib) * limits.memOvercommitRatio)
  // A capacity of 0 would read as "not gated"; the smallest positive figure keeps it full.
  return capacity > 0 ? capacity : Number.MIN_VALUE
}

/**
 * Whether a host report counts as measured (SPEC §0): it reported its allocatable RAM, 0
 * included (a full host). An absent or null figure is unmeasured.
 */
export const isMeasuredReport = (report: HostReport): boolean =>
  report.allocatableMib !== null && !Number.isNaN(report.allocatableMib)

/** The headroom of a host from its report and the budgets reserved on it (SPEC §1 policy). */
export const fromReport = (report: HostReport, reserved: Budget, limits: Limits = defaults): HostHeadroom => ({
  allocatableMib: ramCapacityOf(report.allocatableMib, limits),
  cpuBudget: cpuBudgetOf(report.totalVcpus, limits),
  reserved,
})
