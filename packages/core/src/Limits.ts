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

const finiteAtLeast =
  (min: number, exclusive = false): Rule =>
  (v) =>
    typeof v !== "number" || !Number.isFinite(v)
      ? "must be a finite number"
      : exclusive
        ? v > min
          ? null
          : `must be > ${min}`
        : v >= min
          ? null
          : `must be >= ${min}`

const integerAtLeast =
  (min: number): Rule =>
  (v) =>
    typeof v !== "number" || !Number.isInteger(v) ? "must be an integer" : v >= min ? null : `must be >= ${min}`

const rules: { readonly [K in keyof Limits]: Rule } = {
  cpuOvercommit: finiteAtLeast(0, true),
  memOvercommitRatio: finiteAtLeast(0),
  systemReserveMib: integerAtLeast(0),
  maxEntriesPerNode: integerAtLeast(1),
  requireMeasured: (v) => (typeof v === "boolean" ? null : "must be a boolean"),
  heartbeatStaleWindowMs: integerAtLeast(1),
  parkHardTtlMs: integerAtLeast(1),
  commitAllowanceMs: finiteAtLeast(0),
  reaperIntervalMs: integerAtLeast(1),
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
