/**
 * The policy limits of engram (SPEC §9): every default in one place, and the one
 * validation of overrides, so the coordinator, the agent and the simulator refuse a bad
 * value with the same words.
 */

/** Policy limits. Durations are milliseconds; RAM is MiB. */
export interface Limits {
  /** vCPUs offered per physical vCPU: `cpuBudget = floor(totalVcpus × cpuOvercommit)`. */
  readonly cpuOvercommit: number
  /** RAM capacity = `(allocatable − systemReserveMib) × memOvercommitRatio`; `0` = no RAM cap. */
  readonly memOvercommitRatio: number
  /** RAM held back from VMs on every host, subtracted before the ratio. */
  readonly systemReserveMib: number
  /** Reservations a host may hold at once. */
  readonly maxEntriesPerNode: number
  /** Refuse reservations (and so placements) on hosts that have not reported RAM. */
  readonly requireMeasured: boolean
  /** A reservation whose last heartbeat is older than this is stale. */
  readonly heartbeatStaleWindowMs: number
  /** A park older than this yields regardless of demand. */
  readonly parkHardTtlMs: number
  /** Fixed allowance for the target's commit in every downtime estimate. */
  readonly commitAllowanceMs: number
  /** Interval between two reaper passes. */
  readonly reaperIntervalMs: number
}

/** The defaults of SPEC §9. */
export const defaults: Limits = Object.freeze({
  cpuOvercommit: 4.0,
  memOvercommitRatio: 1.0,
  systemReserveMib: 1024,
  maxEntriesPerNode: 32,
  requireMeasured: false,
  heartbeatStaleWindowMs: 2 * 60 * 1000,
  parkHardTtlMs: 8 * 60 * 60 * 1000,
  commitAllowanceMs: 400,
  reaperIntervalMs: 5000,
})

/** One refused field of a limits override. */
export interface LimitsIssue {
  readonly field: keyof Limits
  readonly rule: string
  readonly value: unknown
}

/** The result of {@link make}: the limits, or every field that broke its rule. */
export type MakeResult =
  | { readonly _tag: "Valid"; readonly limits: Limits }
  | { readonly _tag: "Invalid"; readonly issues: readonly LimitsIssue[] }

type Rule = (v: unknown) => string | null

const dayMs = 24 * 3_600_000

/** An upper bound and why it is that. */
export interface Bound {
  readonly max: number
  readonly why: string
}

/**
 * The largest value of each timing, count, size and ratio limit, with why. Each is many times its default,
 * so only a slip is refused (seconds given as ms twice, digits pasted twice), never a deliberate
 * setting; without a bound such a slip was taken silently (a reaper interval of 10^12 ms is a
 * reaper that never runs again). The host agent bounds its own settings the same way, and reads
 * the stale window's bound from here.
 */
export const bounds = {
  heartbeatStaleWindowMs: { max: 365 * dayMs, why: "a year: windows of days are in use, and every agent must take its coordinator's" },
  parkHardTtlMs: { max: 365 * dayMs, why: "a year" },
  commitAllowanceMs: { max: 60_000, why: "a minute: every downtime estimate counts it, so one above a session's budget refuses its every move" },
  reaperIntervalMs: { max: 3_600_000, why: "an hour: stale reservations, parks and starving sessions wait a pass" },
  maxEntriesPerNode: { max: 100_000, why: "far more VMs than one host runs" },
  systemReserveMib: { max: 16 * 1024 * 1024, why: "16 TiB: more RAM than one host holds" },
  cpuOvercommit: { max: 100, why: "a hundred vCPUs offered per core: far past any workload's share" },
  memOvercommitRatio: { max: 100, why: "a hundred times a host's RAM: far past what page sharing and ballooning give back" },
} as const satisfies { readonly [K in keyof Limits]?: Bound }

/** A bounded figure's one rule, in the words of every refusal of it (the host agent's too): `must be an integer from 1 to 3600000 (an hour: …)`. */
export const boundRule = (kind: "an integer" | "a number", min: number, bound: Bound): string => `must be ${kind} from ${min} to ${bound.max} (${bound.why})`

const integerWithin =
  (min: number, bound: Bound): Rule =>
  (v) =>
    typeof v === "number" && Number.isInteger(v) && v >= min && v <= bound.max ? null : boundRule("an integer", min, bound)

const finiteWithin =
  (min: number, bound: Bound): Rule =>
  (v) =>
    typeof v === "number" && Number.isFinite(v) && v >= min && v <= bound.max ? null : boundRule("a number", min, bound)

/**
 * The least `cpuOvercommit`: a thousandth of a vCPU per core. Below it the ratio only says "every
 * host is full" (a budget that floors to 0 is full, `Headroom.cpuBudgetOf`): a host needs over a
 * thousand cores to offer one vCPU. A value such as 5e-324 was taken as a positive ratio.
 */
export const minCpuOvercommit = 0.001

const rules: { readonly [K in keyof Limits]: Rule } = {
  cpuOvercommit: finiteWithin(minCpuOvercommit, bounds.cpuOvercommit),
  memOvercommitRatio: finiteWithin(0, bounds.memOvercommitRatio),
  systemReserveMib: integerWithin(0, bounds.systemReserveMib),
  maxEntriesPerNode: integerWithin(1, bounds.maxEntriesPerNode),
  requireMeasured: (v) => (typeof v === "boolean" ? null : "must be a boolean"),
  heartbeatStaleWindowMs: integerWithin(1, bounds.heartbeatStaleWindowMs),
  parkHardTtlMs: integerWithin(1, bounds.parkHardTtlMs),
  commitAllowanceMs: finiteWithin(0, bounds.commitAllowanceMs),
  reaperIntervalMs: integerWithin(1, bounds.reaperIntervalMs),
}

/**
 * Applies overrides to the defaults (or to `base`) and checks every field; an unknown
 * field is refused too, so a typo never silently keeps a default.
 */
export const make = (overrides: Readonly<Record<string, unknown>>, base: Limits = defaults): MakeResult => {
  const issues: LimitsIssue[] = []
  const out: Record<string, unknown> = { ...base }
  for (const [field, value] of Object.entries(overrides)) {
    if (value === undefined) continue
    if (!Object.hasOwn(rules, field)) {
      issues.push({ field: field as keyof Limits, rule: "is not a known limit", value })
      continue
    }
    const broken = rules[field as keyof Limits](value)
    if (broken !== null) issues.push({ field: field as keyof Limits, rule: broken, value })
    else out[field] = value
  }
  return issues.length > 0 ? { _tag: "Invalid", issues } : { _tag: "Valid", limits: Object.freeze(out as unknown as Limits) }
}
