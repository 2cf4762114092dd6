/**
 * The command line: options, their defaults and their validation (pure), and the program that
 * runs a comparison (Effect: files, the terminal). `pnpm sim -- --help` prints the options.
 */
import { readFileSync, writeFileSync } from "node:fs"
import { resolve } from "node:path"
import { parseArgs } from "node:util"
import { Limits, ParkPolicy } from "@engram/core"
import { Data, Effect } from "effect"
import * as Plot from "./Plot.js"
import * as Report from "./Report.js"
import * as Simulation from "./Simulation.js"
import type { FleetConfig, Result } from "./Simulation.js"
import * as Workload from "./Workload.js"
import type { GeneratorConfig } from "./Workload.js"

/** A run as the command line asked for it. */
export interface Options {
  readonly policies: readonly ParkPolicy.Name[]
  readonly generator: GeneratorConfig
  readonly fleet: FleetConfig
  readonly trace: string | null
  readonly record: string | null
  readonly svg: string | null
  readonly json: boolean
  readonly progress: boolean
}

/** Bad command-line input: the option and the rule it broke. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly option: string; readonly message: string }> {}

/** A file that could not be read or written, or a trace that could not be parsed. */
export class FileError extends Data.TaggedError("FileError")<{ readonly path: string; readonly message: string }> {}

/** The options, with their defaults, for `--help`. */
export const usage = `engram fleet simulator: compare park policies on one workload.

usage: pnpm sim -- [options]

  --policy a,b,…          policies to compare (default demand); one of:
${ParkPolicy.names.map((n) => `                            ${n.padEnd(18)} ${ParkPolicy.summaries[n]}`).join("\n")}
                          or "all"
  --hosts N               hosts in the fleet (1000)
  --host-mib N            allocatable RAM each host reports, MiB (65536)
  --host-vcpus N          cores per host (16; × cpuOvercommit 4 = vCPU budget)
  --hours H               simulated hours (24)
  --seed N                workload seed (1)
  --sessions N            sessions arriving over the run (50 per host)
  --resume-prob P         chance a session comes back after an idle period (0.8)
  --active-median-min M   median active period, lognormal (15)
  --idle-min-min M        shortest idle period, Pareto scale (3)
  --idle-alpha A          Pareto shape of idle periods, < 2 = heavy tail (1.2)
  --daily-amplitude A     arrival-rate swing over the day, 0..1 (0.6)
  --descent-mib-per-s R   capture rate of a descent (1024)
  --restore-mib-per-s R   restore rate of a cold resume (2048), after --restore-base-ms (1000)
  --warm-resume-ms MS     unpausing a park (50)
  --start-ms MS           booting a new session (2000)
  --reaper-s S            reaper interval (5)
  --hard-ttl-h H          park hard TTL (8)
  --floor-pct P           the floor of floor30 (30)
  --min-park-age-s S      the minimum park age of demand-minage (300)
  --drain release|pass    drain the queue whenever room appears (release, SPEC §2) or only at passes
  --heartbeat-s S         model host agents' heartbeats every S s (0 = agents never fail)
  --trace FILE            replay a trace (JSON Lines) instead of generating
  --record FILE           write the generated workload as a trace
  --svg FILE              write the plot (default sim.svg; "" for none)
  --json                  print the results as JSON instead of a table
  --no-progress           no progress bar (it shows only when stderr is a terminal)
  --help
`

const numberOption = (values: Record<string, unknown>, name: string, fallback: number, rule: (n: number) => boolean, what: string): number | UsageError => {
  const raw = values[name]
  if (raw === undefined) return fallback
  const n = Number(raw)
  return Number.isFinite(n) && rule(n) ? n : new UsageError({ option: `--${name}`, message: `must be ${what} (got ${String(raw)})` })
}

/** Parses the command line; `null` means `--help`. */
export const parse = (argv: readonly string[]): Options | UsageError | null => {
  const spec = {
    policy: { type: "string" },
    hosts: { type: "string" },
    "host-mib": { type: "string" },
    "host-vcpus": { type: "string" },
    hours: { type: "string" },
    seed: { type: "string" },
    sessions: { type: "string" },
    "resume-prob": { type: "string" },
    "active-median-min": { type: "string" },
    "idle-min-min": { type: "string" },
    "idle-alpha": { type: "string" },
    "daily-amplitude": { type: "string" },
    "descent-mib-per-s": { type: "string" },
    "restore-mib-per-s": { type: "string" },
    "restore-base-ms": { type: "string" },
    "warm-resume-ms": { type: "string" },
    "start-ms": { type: "string" },
    "reaper-s": { type: "string" },
    "hard-ttl-h": { type: "string" },
    "floor-pct": { type: "string" },
    "min-park-age-s": { type: "string" },
    drain: { type: "string" },
    "heartbeat-s": { type: "string" },
    trace: { type: "string" },
    record: { type: "string" },
    svg: { type: "string" },
    json: { type: "boolean" },
    "no-progress": { type: "boolean" },
    help: { type: "boolean" },
  } as const
  let values: Record<string, unknown>
  try {
    // pnpm passes a lone "--" through; it is not an option.
    values = parseArgs({ args: argv.filter((a) => a !== "--"), options: spec, strict: true, allowPositionals: false }).values
  } catch (e) {
    return new UsageError({ option: "", message: e instanceof Error ? e.message : String(e) })
  }
  if (values["help"] === true) return null

  const rawPolicies = String(values["policy"] ?? "demand")
  const names = rawPolicies === "all" ? [...ParkPolicy.names] : rawPolicies.split(",").map((s) => s.trim()).filter((s) => s !== "")
  const policies: ParkPolicy.Name[] = []
  for (const n of names) {
    if (!ParkPolicy.isName(n)) return new UsageError({ option: "--policy", message: `unknown policy ${n}; one of ${ParkPolicy.names.join(", ")}` })
    if (!policies.includes(n)) policies.push(n)
  }
  if (policies.length === 0) return new UsageError({ option: "--policy", message: "name at least one policy" })

  const positiveInt = (n: number) => Number.isInteger(n) && n > 0
  const positive = (n: number) => n > 0
  const atLeast0 = (n: number) => n >= 0
  const unit = (n: number) => n >= 0 && n <= 1
  const num = {
    hosts: numberOption(values, "hosts", 1000, positiveInt, "a positive integer"),
    hostMib: numberOption(values, "host-mib", Simulation.defaultFleet.hostMib, positiveInt, "a positive integer"),
    hostVcpus: numberOption(values, "host-vcpus", Simulation.defaultFleet.hostVcpus, positiveInt, "a positive integer"),
    hours: numberOption(values, "hours", 24, positive, "a positive number"),
    seed: numberOption(values, "seed", 1, Number.isInteger, "an integer"),
    resumeProb: numberOption(values, "resume-prob", Workload.defaultGenerator.resumeProb, unit, "between 0 and 1"),
    activeMedianMin: numberOption(values, "active-median-min", Workload.defaultGenerator.activeMedianMin, positive, "a positive number"),
    idleMinMin: numberOption(values, "idle-min-min", Workload.defaultGenerator.idleMinMin, positive, "a positive number"),
    idleAlpha: numberOption(values, "idle-alpha", Workload.defaultGenerator.idleAlpha, positive, "a positive number"),
    dailyAmplitude: numberOption(values, "daily-amplitude", Workload.defaultGenerator.dailyAmplitude, unit, "between 0 and 1"),
    descent: numberOption(values, "descent-mib-per-s", Simulation.defaultFleet.descentMibPerSec, positive, "a positive number"),
    restore: numberOption(values, "restore-mib-per-s", Simulation.defaultFleet.restoreMibPerSec, positive, "a positive number"),
    restoreBase: numberOption(values, "restore-base-ms", Simulation.defaultFleet.restoreBaseMs, atLeast0, "≥ 0"),
    warm: numberOption(values, "warm-resume-ms", Simulation.defaultFleet.warmResumeMs, atLeast0, "≥ 0"),
    start: numberOption(values, "start-ms", Simulation.defaultFleet.startMs, atLeast0, "≥ 0"),
    reaper: numberOption(values, "reaper-s", Limits.defaults.reaperIntervalMs / 1000, positive, "a positive number"),
    ttl: numberOption(values, "hard-ttl-h", Limits.defaults.parkHardTtlMs / 3_600_000, positive, "a positive number"),
    floorPct: numberOption(values, "floor-pct", ParkPolicy.defaultOptions.floorPct, unit100, "between 0 and 100"),
    minAge: numberOption(values, "min-park-age-s", ParkPolicy.defaultOptions.minParkAgeMs / 1000, atLeast0, "≥ 0"),
    heartbeat: numberOption(values, "heartbeat-s", 0, atLeast0, "≥ 0"),
  }
  for (const v of Object.values(num)) if (v instanceof UsageError) return v
  const n = num as { readonly [K in keyof typeof num]: number }
  const sessions = numberOption(values, "sessions", 50 * n.hosts, positiveInt, "a positive integer")
  if (sessions instanceof UsageError) return sessions
  const drain = String(values["drain"] ?? "release")
  if (drain !== "release" && drain !== "pass") return new UsageError({ option: "--drain", message: `must be release or pass (got ${drain})` })

  const limits = Limits.make({ reaperIntervalMs: Math.round(n.reaper * 1000), parkHardTtlMs: Math.round(n.ttl * 3_600_000) })
  if (limits._tag === "Invalid") return new UsageError({ option: "--reaper-s/--hard-ttl-h", message: limits.issues.map((i) => `${i.field} ${i.rule}`).join("; ") })
  if (n.heartbeat > 0 && n.heartbeat * 1000 >= limits.limits.heartbeatStaleWindowMs)
    return new UsageError({ option: "--heartbeat-s", message: `must stay under the stale window (${limits.limits.heartbeatStaleWindowMs / 1000} s)` })

  return {
    policies,
    generator: {
      ...Workload.defaultGenerator,
      seed: n.seed,
      sessions,
      hours: n.hours,
      resumeProb: n.resumeProb,
      activeMedianMin: n.activeMedianMin,
      idleMinMin: n.idleMinMin,
      idleAlpha: n.idleAlpha,
      dailyAmplitude: n.dailyAmplitude,
    },
    fleet: {
      ...Simulation.defaultFleet,
      hosts: n.hosts,
      hostMib: n.hostMib,
      hostVcpus: n.hostVcpus,
      descentMibPerSec: n.descent,
      restoreMibPerSec: n.restore,
      restoreBaseMs: n.restoreBase,
      warmResumeMs: n.warm,
      startMs: n.start,
      heartbeatIntervalMs: Math.round(n.heartbeat * 1000),
      drainOnRelease: drain === "release",
      limits: limits.limits,
      policyOptions: { floorPct: n.floorPct, minParkAgeMs: Math.round(n.minAge * 1000) },
    },
    trace: values["trace"] === undefined ? null : String(values["trace"]),
    record: values["record"] === undefined ? null : String(values["record"]),
    svg: values["svg"] === undefined ? "sim.svg" : String(values["svg"]) === "" ? null : String(values["svg"]),
    json: values["json"] === true,
    progress: values["no-progress"] !== true,
  }
}

function unit100(n: number): boolean {
  return n >= 0 && n <= 100
}

/** Relative paths are read from where the user typed the command (pnpm runs scripts in the package). */
const userPath = (path: string): string => resolve(process.env["INIT_CWD"] ?? process.cwd(), path)

const readText = (path: string) =>
  Effect.try({ try: () => readFileSync(userPath(path), "utf8"), catch: (e) => new FileError({ path, message: e instanceof Error ? e.message : String(e) }) })
const writeText = (path: string, text: string) =>
  Effect.try({ try: () => writeFileSync(userPath(path), text), catch: (e) => new FileError({ path, message: e instanceof Error ? e.message : String(e) }) })

/** A progress bar on stderr, drawn only when stderr is a terminal. */
const progressBar = (label: string, enabled: boolean): { update: (done: number) => void; finish: () => void } => {
  if (!enabled || process.stderr.isTTY !== true) return { update: () => undefined, finish: () => undefined }
  const width = 30
  const t0 = performance.now()
  let drawn = -1
  return {
    update: (done) => {
      const filled = Math.round(done * width)
      if (filled === drawn) return
      drawn = filled
      const secs = ((performance.now() - t0) / 1000).toFixed(0)
      process.stderr.write(`\r${label.padEnd(18)} [${"#".repeat(filled)}${".".repeat(width - filled)}] ${(done * 100).toFixed(0).padStart(3)}% ${secs}s`)
    },
    finish: () => process.stderr.write("\r\x1b[K"),
  }
}

/** The workload of a run: the trace when one is given, else the generator's. */
export const loadWorkload = (options: Options) =>
  Effect.gen(function* () {
    if (options.trace === null) return Workload.generate(options.generator)
    const text = yield* readText(options.trace)
    const parsed = Workload.parseTrace(text)
    if (parsed._tag === "Invalid")
      return yield* new FileError({ path: options.trace, message: `line ${parsed.issue.line}: ${parsed.issue.message}` })
    return parsed.workload
  })

/** Runs every policy on the workload and answers the results. */
export const runAll = (options: Options, workload: Workload.Workload) =>
  Effect.sync(() => {
    const results: Result[] = []
    for (const policy of options.policies) {
      const bar = progressBar(policy, options.progress)
      results.push(Simulation.run(workload, { policy, fleet: options.fleet, onProgress: bar.update }))
      bar.finish()
    }
    return results
  })

/** The whole command: parse, run, print, write; answers the process exit code. */
export const main = (argv: readonly string[]) =>
  Effect.gen(function* () {
    const options = parse(argv)
    if (options === null) {
      process.stdout.write(usage)
      return 0
    }
    if (options instanceof UsageError) return yield* options
    const workload = yield* loadWorkload(options)
    if (options.record !== null) {
      yield* writeText(options.record, Workload.toTrace(workload, `seed ${options.generator.seed}`))
      process.stderr.write(`recorded ${workload.scripts.length} sessions to ${options.record}\n`)
    }
    const t0 = performance.now()
    const results = yield* runAll(options, workload)
    const wallS = (performance.now() - t0) / 1000
    if (options.json) {
      process.stdout.write(`${JSON.stringify(results.map(({ series: _series, ...r }) => r), null, 2)}\n`)
    } else {
      const hours = workload.horizonMs / 3_600_000
      process.stdout.write(
        `${options.fleet.hosts} hosts × ${options.fleet.hostMib} MiB, ${workload.scripts.length} sessions, ${hours} h` +
          `${options.trace === null ? `, seed ${options.generator.seed}` : `, trace ${options.trace}`}; ` +
          `${results.reduce((a, r) => a + r.events, 0)} events in ${wallS.toFixed(1)} s\n\n`,
      )
      process.stdout.write(Report.text(results))
    }
    if (options.svg !== null) {
      yield* writeText(options.svg, Plot.svg(results, `engram simulator: ${options.fleet.hosts} hosts, ${workload.scripts.length} sessions`))
      process.stderr.write(`plot written to ${options.svg}\n`)
    }
    const breaks = results.flatMap(Report.invariantBreaks)
    for (const b of breaks) process.stderr.write(`INVARIANT BROKEN: ${b}\n`)
    return breaks.length > 0 ? 1 : 0
  })
