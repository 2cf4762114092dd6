/**
 * An upper bound on warm resumes for any workload: the pooled-RAM linear program. On the
 * workload's own timeline (the one of a fleet that makes nobody wait), every active period holds
 * its session's budget; an idle period that ends in a resume may be kept parked (a fraction
 * x ∈ [0, 1] of it, to relax the choice), holding its budget while it lasts, and only if a park
 * could last it under the hard TTL. At every sample time the running budgets and the parks kept
 * must fit in the fleet's whole RAM capacity pooled into one host. The most parks kept is a bound
 * no policy beats while making nobody wait: pooling ignores how sessions pack onto hosts, the
 * fractions ignore that a park is kept whole, and checking the capacity only at sample times
 * drops constraints; each only loosens it.
 *
 * Solved with HiGHS (the `highs` package: the University of Edinburgh's solver compiled to
 * WebAssembly, a sparse simplex and interior-point code that takes models of this size, ~10⁵
 * columns, in seconds, where the pure-JavaScript solvers work on dense tableaux).
 */
import type { Limits } from "@engram/core"
import * as HighsModule from "highs"
import type { Highs, InitOptions } from "highs"
import type { HostShape } from "./Simulation.js"
import { OPEN } from "./Workload.js"
import type { Workload } from "./Workload.js"

/** The bound and what it was computed over. */
export interface LpBound {
  /** No policy keeps more resumes warm without making anyone wait (rounded down). */
  readonly warm: number
  /** Resumes a park could last under the hard TTL (the TTL bound): the LP's candidates. */
  readonly ttl: number
  /** Candidates no sample time falls in: always counted warm. */
  readonly unconstrained: number
  /** Sample times with a capacity row. */
  readonly rows: number
  /** HiGHS's model status. */
  readonly status: string
}

/** The fleet's pooled RAM capacity (MiB): every host's (allocatable − system reserve) × ratio. */
export const pooledCapacityMib = (shapes: readonly HostShape[], limits: Limits.Limits): number =>
  limits.memOvercommitRatio === 0
    ? Number.POSITIVE_INFINITY
    : shapes.reduce((a, s) => a + s.count * Math.max(0, s.memMib - limits.systemReserveMib) * limits.memOvercommitRatio, 0)

// The package's declarations read as CommonJS here; its ES build's default export is the loader.
const loadHighs = (HighsModule as unknown as { readonly default: (options?: InitOptions) => Promise<Highs> }).default
let solver: Highs | undefined

/** The pooled-RAM LP bound on warm resumes, the capacity checked every `sampleMs` (5 minutes by default). */
export const pooledRam = async (workload: Workload, shapes: readonly HostShape[], limits: Limits.Limits, sampleMs = 300_000): Promise<LpBound> => {
  const capacity = pooledCapacityMib(shapes, limits)
  const longest = limits.parkHardTtlMs + limits.reaperIntervalMs
  const samples = Math.max(1, Math.ceil(workload.horizonMs / sampleMs))
  const first = (t: number): number => Math.min(samples, Math.ceil(t / sampleMs))
  // Running RAM per sample (GiB), from a difference array; each candidate park's sample range.
  const running = new Float64Array(samples + 1)
  const cols: { gib: number; from: number; to: number }[] = []
  let ttl = 0
  let unconstrained = 0
  for (const s of workload.scripts) {
    const gib = s.budget.memMib / 1024
    let t = s.arriveAtMs
    for (let k = 0; k < s.activeMs.length; k++) {
      const active = s.activeMs[k] as number
      const end = active >= OPEN ? workload.horizonMs : Math.min(workload.horizonMs, t + active)
      running[first(t)] = (running[first(t)] as number) + gib
      running[first(end)] = (running[first(end)] as number) - gib
      if (active >= OPEN) break
      t += active
      const idle = s.idleMs[k]
      if (idle === undefined || idle >= OPEN) break
      // Idle period k ends in a resume when another active period follows, within the run.
      if (k + 1 < s.activeMs.length && idle <= longest && t + idle < workload.horizonMs) {
        ttl++
        const from = first(t)
        const to = first(t + idle)
        if (to > from) cols.push({ gib, from, to })
        else unconstrained++
      }
      t += idle
    }
  }
  if (!Number.isFinite(capacity) || cols.length === 0) return { warm: ttl, ttl, unconstrained, rows: 0, status: "no capacity rows" }
  for (let i = 1; i <= samples; i++) running[i] = (running[i] as number) + (running[i - 1] as number)
  // Rows: the candidates covering each sample.
  const terms: string[][] = Array.from({ length: samples }, () => [])
  cols.forEach((c, j) => {
    for (let i = c.from; i < c.to; i++) (terms[i] as string[]).push(`${+c.gib.toFixed(4)} x${j}`)
  })
  const capGib = capacity / 1024
  const lines = ["Maximize", " obj:"]
  for (let j = 0; j < cols.length; j++) lines.push(` + x${j}`)
  lines.push("Subject To")
  let rows = 0
  terms.forEach((row, i) => {
    if (row.length === 0) return
    rows++
    lines.push(` c${i}:`)
    for (let k = 0; k < row.length; k += 50) lines.push(` + ${row.slice(k, k + 50).join(" + ")}`)
    lines.push(` <= ${Math.max(0, capGib - (running[i] as number)).toFixed(4)}`)
  })
  lines.push("Bounds")
  for (let j = 0; j < cols.length; j++) lines.push(` 0 <= x${j} <= 1`)
  lines.push("End")
  solver ??= await loadHighs()
  const solution = solver.solve(lines.join("\n"), { log_to_console: false, output_flag: false })
  const objective = solution.Status === "Optimal" ? solution.ObjectiveValue : cols.length
  // A rounding margin: the LP's optimum is a real number.
  return { warm: Math.min(ttl, Math.floor(objective + 1e-6) + unconstrained), ttl, unconstrained, rows, status: solution.Status }
}
