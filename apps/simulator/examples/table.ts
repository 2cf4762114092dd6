/**
 * The policy table the default is chosen from: every workload of the README (the generator at
 * four loads, the reference day, the Azure-like traces when their files are given) and every
 * stress workload, under the policies the goal compares, in one run. Each row is checked
 * against the goal (SPEC §4.2, the simulator README): the 30 % floor's p99 + 1 s, its maximum
 * wait + 600 s, 0.9 × the better warm resumes of `demand` and `demand-fitting`, no broken
 * invariant, and with unplaceable sessions more warm resumes than the floor.
 *
 *   pnpm exec tsx --conditions=@engram/source examples/table.ts [--traces DIR] [--json FILE] [--only NAME|…] [--policies P,…]
 *
 * `--traces DIR` adds the Azure-like traces `DIR/ta1.jsonl` and `DIR/ta2.jsonl` (see the README
 * for how to make them). Prints Markdown; `--json FILE` also writes every figure. `--baseline
 * FILE` (an earlier `--json`) takes the rows of every policy not in `--policies` from it, so one
 * changed policy is measured again against the same baselines. `--baseline-md FILE` takes them
 * from the Markdown rows of a README's goal table instead (its p99, maximum, warm and unplaceable
 * columns: what the goal reads): the first goal table in the file, or the N-th with
 * `--baseline-table N` (a goal table: a header starting with this table's columns, workload,
 * policy, …, `goal-table.ts`; a table N that does not exist or has no usable rows stops the run,
 * naming the flag). `--policy-option NAME=VALUE` (repeatable) sets one knob of
 * `ParkPolicy.Options` over the defaults. Moves as a policy action (`FleetConfig.moves`) are on as in
 * the simulator's defaults; `--no-moves` runs without them (`--moves` with them whatever the default);
 * `--timings stream` with the costs the README's table was first measured with (descents 1,024
 * MiB/s, restores 1 s + 2,048 MiB/s, warm resumes 50 ms). `--no-lp` leaves the LP bound out.
 * `--lead-per-class` runs demand-reserve with a lead per size class (`reserveLeadPerClass`, the
 * default since 2026-12-04: `--policy-option reserveLeadPerClass=false` turns it off).
 * `--seed N` generates every generated workload with seed N (the traces are files: unchanged).
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { availableParallelism, loadavg } from "node:os"
import type { ParkPolicy } from "@engram/core"
import * as Bound from "../src/Bound.js"
import * as Parallel from "../src/Parallel.js"
import * as Simulation from "../src/Simulation.js"
import type { FleetConfig, HostShape, Result } from "../src/Simulation.js"
import * as Stress from "../src/Stress.js"
import * as Workload from "../src/Workload.js"
import * as GoalTable from "./goal-table.js"

const GIB = 1024
const arg = (name: string): string | undefined => {
  const k = process.argv.indexOf(name)
  return k < 0 ? undefined : process.argv[k + 1]
}

interface Case {
  readonly name: string
  readonly shapes: readonly HostShape[]
  readonly workload: () => Workload.Workload
  readonly limits?: Partial<FleetConfig["limits"]>
}

const hosts100: readonly HostShape[] = [{ count: 100, memMib: 64 * GIB, vcpus: 16 }]
// `--seed N`: every generated workload (the loads and the stress workloads) with seed N instead of its own, to see how
// much a row owes to its one seed.
const seedArg = arg("--seed")
const seedOver = seedArg === undefined ? undefined : Number(seedArg)
if (seedOver !== undefined && !Number.isSafeInteger(seedOver)) throw new Error(`--seed ${seedArg}: not an integer`)
const generated = (seed: number, sessions: number) => () => Workload.generate({ ...Workload.defaultGenerator, seed: seedOver ?? seed, sessions })
const trace = (path: string) => () => {
  const parsed = Workload.parseTrace(readFileSync(path, "utf8"))
  if (parsed._tag === "Invalid") throw new Error(`${path}: line ${parsed.issue.line}: ${parsed.issue.message}`)
  return parsed.workload
}

const cases: Case[] = [
  { name: "50 per host", shapes: hosts100, workload: generated(7, 5000) },
  { name: "60 per host", shapes: hosts100, workload: generated(7, 6000) },
  { name: "70 per host", shapes: hosts100, workload: generated(7, 7000) },
  { name: "80 per host", shapes: hosts100, workload: generated(7, 8000) },
  { name: "reference day (1,000 hosts)", shapes: [{ count: 1000, memMib: 64 * GIB, vcpus: 16 }], workload: generated(7, 50_000) },
  { name: "60 per host, seed 1", shapes: hosts100, workload: generated(1, 6000) },
  ...Stress.scenarios.map((s) => ({ name: s.name, shapes: s.shapes, workload: () => Workload.generate(s.generator(seedOver ?? 1, s.sessions)) })),
]
const traces = arg("--traces")
if (traces !== undefined) {
  const ta1 = join(traces, "ta1.jsonl")
  const ta2 = join(traces, "ta2.jsonl")
  const entries = { limits: { maxEntriesPerNode: 64 } }
  if (existsSync(ta1)) {
    cases.push({
      name: "Azure-like 1, mixed hosts",
      shapes: [
        { count: 100, memMib: 128 * GIB, vcpus: 32 },
        { count: 50, memMib: 256 * GIB, vcpus: 64 },
        { count: 8, memMib: 512 * GIB, vcpus: 128 },
      ],
      workload: trace(ta1),
      ...entries,
    })
    cases.push({ name: "Azure-like 1, unplaceable VMs", shapes: [{ count: 240, memMib: 128 * GIB, vcpus: 32 }], workload: trace(ta1), ...entries })
  }
  if (existsSync(ta2))
    cases.push({
      name: "Azure-like 2, mixed hosts",
      shapes: [
        { count: 150, memMib: 128 * GIB, vcpus: 32 },
        { count: 60, memMib: 256 * GIB, vcpus: 64 },
        { count: 10, memMib: 512 * GIB, vcpus: 128 },
      ],
      workload: trace(ta2),
      ...entries,
    })
}

const only = arg("--only")?.split("|")
const policies = (arg("--policies")?.split(",") ?? ["demand", "demand-fitting", "floor30", "demand-reserve"]) as ParkPolicy.Name[]
const threads = Math.min(2, availableParallelism())
/** `--baseline-table`'s value as a number: one that is not a whole number from 1 stops the run, quoting it as given. */
const tableNumber = (given: string): number => {
  if (!/^[1-9][0-9]*$/.test(given.trim())) throw new Error(`--baseline-table ${JSON.stringify(given)}: must be a whole number from 1 (the first goal table)`)
  return Number(given)
}
const baselineFile = arg("--baseline")
const baselineMd = arg("--baseline-md")
const baseline: GoalTable.Stored[] | undefined =
  baselineMd !== undefined
    ? GoalTable.fromMarkdown(readFileSync(baselineMd, "utf8"), tableNumber(arg("--baseline-table") ?? "1"), baselineMd)
    : baselineFile === undefined
      ? undefined
      : (JSON.parse(readFileSync(baselineFile, "utf8")) as GoalTable.Stored[])
const moves = process.argv.includes("--no-moves") ? false : process.argv.includes("--moves") || Simulation.defaultFleet.moves
const noLp = process.argv.includes("--no-lp")
/**
 * `--policy-option NAME=VALUE` (repeatable): one knob of `ParkPolicy.Options`, a number or
 * `true`/`false`, over the defaults (`--policy-option reserveLeadMs=20000`). An unknown name or a
 * value of the wrong type stops the run. `--lead-per-class` is `--policy-option reserveLeadPerClass=true`.
 */
const knobs: Record<string, number | boolean> = {}
process.argv.forEach((a, k) => {
  if (a !== "--policy-option") return
  const [name, value] = (process.argv[k + 1] ?? "").split("=") as [string, string | undefined]
  const current = (Simulation.defaultFleet.policyOptions as unknown as Record<string, unknown>)[name]
  if (typeof current === "number" && value !== undefined && value !== "" && Number.isFinite(Number(value))) knobs[name] = Number(value)
  else if (typeof current === "boolean" && (value === "true" || value === "false")) knobs[name] = value === "true"
  else throw new Error(`--policy-option ${name}=${value ?? ""}: not a knob of ParkPolicy.Options with a ${typeof current === "undefined" ? "known name" : `${typeof current} value`}`)
})
if (process.argv.includes("--lead-per-class")) knobs.reserveLeadPerClass = true
const policyOptions = Object.keys(knobs).length > 0 ? { policyOptions: { ...Simulation.defaultFleet.policyOptions, ...knobs } } : {}
if (Object.keys(knobs).length > 0) process.stderr.write(`policy options: ${JSON.stringify(knobs)}\n`)
const streamTimings = arg("--timings") === "stream" ? { descentMibPerSec: 1024, restoreMibPerSec: 2048, restoreBaseMs: 1000, warmResumeMs: 50 } : {}

const s = (ms: number): string => (ms / 1000).toFixed(ms >= 100_000 ? 0 : 1)
const rows: string[] = [
  `| ${[...GoalTable.goalColumns, "warm ÷ TTL bound", "warm ÷ LP bound", "descents", "goal"].join(" | ")} |`,
  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
const all: { workload: string; lp: Bound.LpBound; results: Omit<Result, "series">[] }[] = []
const load0 = loadavg()[0] as number
const t0 = performance.now()
for (const c of cases) {
  if (only !== undefined && !only.includes(c.name)) continue
  const workload = c.workload()
  const fleet: FleetConfig = { ...Simulation.defaultFleet, ...streamTimings, ...policyOptions, moves, shapes: c.shapes, limits: { ...Simulation.defaultFleet.limits, ...c.limits } }
  const stored = baseline?.find((b) => b.workload === c.name)?.results ?? []
  const wanted = [...new Set<ParkPolicy.Name>([...policies, "floor30", "demand", "demand-fitting"])].filter(
    (p) => policies.includes(p) || !stored.some((r) => r.policy === p),
  )
  const fresh = await Parallel.runPolicies(workload, wanted, fleet, threads)
  const results = [...fresh, ...stored.filter((r) => !wanted.includes(r.policy))] as Result[]
  const lp = noLp ? { warm: 0 } : await Bound.pooledRam(workload, fleet.shapes ?? [], fleet.limits)
  const by = new Map(results.map((r) => [r.policy, r]))
  const floor = by.get("floor30") as Result
  const best = Math.max((by.get("demand") as Result).warmResumes, (by.get("demand-fitting") as Result).warmResumes)
  for (const p of policies) {
    const r = by.get(p) as Result
    const misses: string[] = []
    if (r.overCommits + r.ledgerDrift + r.storeErrors > 0) misses.push("invariants")
    if (r.queueWait.p99 > floor.queueWait.p99 + 1000) misses.push("p99")
    if (r.queueWait.max > floor.queueWait.max + 600_000) misses.push("max")
    if (r.warmResumes < 0.9 * best) misses.push("warm")
    if (r.unplaceable > 0 && r.warmResumes <= floor.warmResumes && p !== "floor30") misses.push("warm vs floor")
    rows.push(
      `| ${c.name} | ${p}${moves === Simulation.defaultFleet.moves ? "" : moves ? " + moves" : " without moves"} | ${r.queued} | ${s(r.queueWait.p99)} | ${s(r.queueWait.max)} | ${r.unplaceable} | ${r.warmResumes} | ${best > 0 ? (r.warmResumes / best).toFixed(2) : "-"} | ${r.warmBoundTtl > 0 ? (r.warmResumes / r.warmBoundTtl).toFixed(2) : "-"} | ${lp.warm > 0 ? (r.warmResumes / lp.warm).toFixed(2) : "-"} | ${r.descents} | ${p === "floor30" ? "(baseline)" : misses.length === 0 ? "✓" : `✗ ${misses.join(", ")}`} |`,
    )
  }
  all.push({ workload: c.name, lp: lp as Bound.LpBound, results: results.map((r) => Object.fromEntries(Object.entries(r).filter(([k]) => k !== "series")) as Omit<Result, "series">) })
  const sizes = policies.map((p) => {
    const r = by.get(p) as Result
    const biggest = r.waitsBySize[r.waitsBySize.length - 1]
    return `${p}: moves ${r.moves ?? 0}, largest class ${biggest === undefined ? "-" : `${biggest.memMib / GIB} GiB max ${s(biggest.maxMs)} s`}`
  })
  process.stderr.write(`${c.name}: done at ${((performance.now() - t0) / 1000).toFixed(0)} s; ${sizes.join("; ")}\n`)
}
const load1 = loadavg()[0] as number
process.stdout.write(`${rows.join("\n")}\n\n${threads} threads, ${((performance.now() - t0) / 1000).toFixed(0)} s wall, load average ${load0.toFixed(1)} at the start and ${load1.toFixed(1)} at the end\n`)
const jsonOut = arg("--json")
if (jsonOut !== undefined) writeFileSync(jsonOut, JSON.stringify(all, null, 1))
