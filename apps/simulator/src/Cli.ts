/**
 * The command line, through `effect/cli`: the flags (each with its default and its rule), the
 * options they make (validated across flags), and the programs: `sim` runs a comparison,
 * `sim convert-azure` turns the Azure public VM trace into a trace. `pnpm sim -- --help`
 * prints every flag.
 */
import { createReadStream, readFileSync, writeFileSync } from "node:fs"
import { resolve } from "node:path"
import { createInterface } from "node:readline"
import { NodeServices } from "@effect/platform-node"
import { Limits, ParkPolicy } from "@engram/core"
import type { ParkGate } from "@engram/core"
import { defaultTriggerWindowMs, ReaperState } from "@engram/reaper"
import { Data, Effect, Option } from "effect"
import { CliOutput, Command, Flag } from "effect/cli"
import * as Azure from "./Azure.js"
import * as Bound from "./Bound.js"
import * as Hosts from "./Hosts.js"
import * as Load from "./Load.js"
import * as Parallel from "./Parallel.js"
import * as Plot from "./Plot.js"
import * as Report from "./Report.js"
import * as Simulation from "./Simulation.js"
import type { FleetConfig, Result } from "./Simulation.js"
import * as Stress from "./Stress.js"
import * as Workload from "./Workload.js"
import type { GeneratorConfig } from "./Workload.js"

/** A run as the command line asked for it. */
export interface Options {
  readonly policies: readonly ParkPolicy.Name[]
  readonly generator: GeneratorConfig
  /** The stress workload the generator follows (`--workload`), or null for the default generator. */
  readonly scenario: Stress.Name | null
  readonly fleet: FleetConfig
  readonly trace: string | null
  readonly record: string | null
  readonly svg: string | null
  readonly json: boolean
  readonly progress: boolean
  /** Worker threads for the policies (1: all in the main thread). */
  readonly threads: number
  /** Print the figures per time window too. */
  readonly windows: boolean
  /** Compute the pooled-RAM LP bound on warm resumes and print warm ÷ bound. */
  readonly lpBound: boolean
}

/** Bad command-line input: the option and the rule it broke. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly option: string; readonly message: string }> {}

/** A file that could not be read or written, or a trace that could not be parsed. */
export class FileError extends Data.TaggedError("FileError")<{ readonly path: string; readonly message: string }> {}

// ---- flags ---------------------------------------------------------------------------------------

const fleet0 = Simulation.defaultFleet
const gen0 = Workload.defaultGenerator
const policy0 = ParkPolicy.defaultOptions

const positiveInt = (name: string, fallback: number, what: string) =>
  Flag.Int(name).pipe(
    Flag.filter((n) => n > 0, (n) => `must be a positive integer (got ${n})`),
    Flag.withDefault(fallback),
    Flag.withDescription(`${what} (${fallback})`),
  )
const atLeast0Int = (name: string, fallback: number, what: string) =>
  Flag.Int(name).pipe(Flag.filter((n) => n >= 0, (n) => `must be ≥ 0 (got ${n})`), Flag.withDefault(fallback), Flag.withDescription(`${what} (${fallback})`))
const positive = (name: string, fallback: number, what: string) =>
  Flag.Finite(name).pipe(Flag.filter((n) => n > 0, (n) => `must be a positive number (got ${n})`), Flag.withDefault(fallback), Flag.withDescription(`${what} (${fallback})`))
const atLeast0 = (name: string, fallback: number, what: string) =>
  Flag.Finite(name).pipe(Flag.filter((n) => n >= 0, (n) => `must be ≥ 0 (got ${n})`), Flag.withDefault(fallback), Flag.withDescription(`${what} (${fallback})`))
const between = (name: string, lo: number, hi: number, fallback: number, what: string) =>
  Flag.Finite(name).pipe(
    Flag.filter((n) => n >= lo && n <= hi, (n) => `must be between ${lo} and ${hi} (got ${n})`),
    Flag.withDefault(fallback),
    Flag.withDescription(`${what} (${fallback})`),
  )
const optionalString = (name: string, what: string) => Flag.String(name).pipe(Flag.optional, Flag.withDescription(what))
const boolean = (name: string, what: string, fallback = false) => Flag.Boolean(name).pipe(Flag.withDefault(fallback), Flag.withDescription(what))

const policyHelp = `policies to compare, comma separated, or "all": ${ParkPolicy.names.join(", ")} (${ParkPolicy.defaultName}, the coordinator's default; the README says what each does)`

/** Every flag of `sim`, with its default and its rule. */
export const flags = {
  policy: Flag.String("policy").pipe(Flag.withDefault(ParkPolicy.defaultName as string), Flag.withDescription(policyHelp)),
  // The fleet.
  hosts: positiveInt("hosts", fleet0.hosts, "hosts in the fleet, all of one shape"),
  hostMib: positiveInt("host-mib", fleet0.hostMib, "allocatable RAM each host reports, MiB"),
  hostVcpus: positiveInt("host-vcpus", fleet0.hostVcpus, "cores per host (× --cpu-overcommit = its vCPU budget)"),
  host: Flag.String("host").pipe(
    Flag.atLeast(0),
    Flag.withDescription("a host shape COUNTxMEMxVCPUS, MEM in MiB or with g/t (200x64gx16); repeat for a mixed fleet (replaces --hosts/--host-mib/--host-vcpus)"),
  ),
  hostsFile: optionalString("hosts-file", "a file of host shapes, one per line (COUNTxMEMxVCPUS or count,memMib,vcpus); added to --host"),
  // Limits (SPEC §9).
  cpuOvercommit: positive("cpu-overcommit", Limits.defaults.cpuOvercommit, "vCPUs offered per core"),
  memOvercommitRatio: atLeast0("mem-overcommit-ratio", Limits.defaults.memOvercommitRatio, "RAM capacity = (allocatable − reserve) × ratio; 0 = no RAM cap"),
  systemReserveMib: atLeast0Int("system-reserve-mib", Limits.defaults.systemReserveMib, "RAM held back on every host, MiB"),
  maxEntries: positiveInt("max-entries-per-node", Limits.defaults.maxEntriesPerNode, "reservations a host may hold"),
  reaperS: positive("reaper-s", Limits.defaults.reaperIntervalMs / 1000, "reaper interval, s"),
  hardTtlH: positive("hard-ttl-h", Limits.defaults.parkHardTtlMs / 3_600_000, "park hard TTL, h"),
  staleWindowS: positive("stale-window-s", Limits.defaults.heartbeatStaleWindowMs / 1000, "heartbeat stale window, s (with --heartbeat-s)"),
  // The gate and the policies.
  floorPct: between("floor-pct", 0, 100, policy0.floorPct, "the floor of floor30, %"),
  minParkAgeS: atLeast0("min-park-age-s", policy0.minParkAgeMs / 1000, "the minimum park age of demand-minage, s"),
  starvationLimitS: positive("starvation-limit-s", policy0.starvationLimitMs / 1000, "a session without room this long is starving: a host is held for it, s"),
  reserveLeadS: atLeast0("reserve-lead-s", policy0.reserveLeadMs / 1000, "demand-reserve keeps free room for the demand of this many recent seconds"),
  reserveMinAgeS: atLeast0("reserve-min-age-s", policy0.reserveMinParkAgeMs / 1000, "demand-reserve: parks younger than this never yield for the reserve, s"),
  reserveQuantile: Flag.Finite("reserve-quantile").pipe(
    Flag.filter((n) => n > 0 && n < 1, (n) => `must be between 0 and 1, both excluded (got ${n})`),
    Flag.withDefault(policy0.reserveQuantile),
    Flag.withDescription(`demand-reserve: each session size gets as many places as its expected arrivals reach with this probability (${policy0.reserveQuantile})`),
  ),
  reserveYoungMinAgeS: atLeast0("reserve-young-min-age-s", policy0.reserveYoungMinAgeMs / 1000, "demand-reserve: parks younger than this never yield for the reserve, s"),
  reserveLeadPerClass: boolean(
    "reserve-lead-per-class",
    "demand-reserve: each size class counts its arrivals over --reserve-lead-s plus a descent of its size at --descent-mib-per-s (on by default, as in the coordinator; --no-reserve-lead-per-class: one lead for every class)",
    policy0.reserveLeadPerClass,
  ),
  reserveLeadCoversDescent: boolean(
    "reserve-lead-covers-descent",
    "demand-reserve: a size class whose descent at --descent-mib-per-s outlasts --reserve-lead-s counts its arrivals over that descent (the README's \"Why the big classes wait\"; acts only with --no-reserve-lead-per-class)",
  ),
  reserveGroups: boolean(
    "reserve-groups",
    "demand-reserve: count arrivals in groups when the MiB reserved per interval disperse like groups (the README's \"Groups by the meter's variance\"; on by default, as in the coordinator; --no-reserve-groups: single arrivals)",
    policy0.reserveGroups,
  ),
  reserveOldOnly: boolean("reserve-old-only", "demand-reserve: only parks past --reserve-min-age-s yield for the reserve (by default younger ones do too when the old cannot make it)"),
  demandWindowS: positive("demand-window-s", ReaperState.defaultMeterOptions.windowMs / 1000, "the reaper measures the recent demand for room over this window, s"),
  reactMs: atLeast0("react-ms", defaultTriggerWindowMs, "the gate runs this long after a request queues (coalescing window), ms; 0 = only at passes"),
  // Timings outside the store.
  descentMibPerS: positive("descent-mib-per-s", fleet0.descentMibPerSec, "capture rate of a descent, resident MiB/s"),
  restoreMibPerS: positive("restore-mib-per-s", fleet0.restoreMibPerSec, "restore rate of a cold resume, resident MiB/s, after --restore-base-ms"),
  restoreBaseMs: atLeast0("restore-base-ms", fleet0.restoreBaseMs, "fixed cost of a restore, ms"),
  warmResumeMs: atLeast0("warm-resume-ms", fleet0.warmResumeMs, "unpausing a park, ms"),
  startMs: atLeast0("start-ms", fleet0.startMs, "booting a new session, ms"),
  hostTransferMibPerS: atLeast0(
    "host-transfer-mib-per-s",
    fleet0.hostTransferMibPerSec,
    "each host's disk/network, shared by its descents and restores, MiB/s (each also at most its own rate); 0 = no shared limit",
  ),
  patienceMedianS: atLeast0("patience-median-s", fleet0.patienceMedianS, "a queued request gives up after a lognormal patience with this median, s (the session ends: lost demand); 0 = users wait for ever"),
  patienceSigma: positive("patience-sigma", fleet0.patienceSigma, "shape of the lognormal patience"),
  vmOverheadMib: atLeast0Int("vm-overhead-mib", fleet0.vmOverheadMib, "RAM every running or parked VM costs its host beyond its session's budget (QEMU, page tables), MiB"),
  warmStart: boolean("warm-start", "begin in steady state: the trace's last --warm-start-h hours play first as a burn-in whose figures are not counted"),
  warmStartH: positive("warm-start-h", 24, "length of the --warm-start burn-in, h (at most the whole trace)"),
  moves: boolean("moves", "moves as a policy action (on by default, as in the coordinator; --no-moves: off): running sessions move off a starving session's held host when its parks cannot make the room (core's MakeRoom)", fleet0.moves),
  movesPerPass: positiveInt("moves-per-pass", fleet0.movesPerPass, "with moves on, at most this many moves begun by one reaper pass (the coordinator's ENGRAM_MAKE_ROOM_MOVES_PER_PASS)"),
  moveMibPerS: positive("move-mib-per-s", fleet0.moveCosts.copyMibPerSec, "copy rate of a move, MiB/s (over both hosts' links with --host-transfer-mib-per-s)"),
  moveDirtyMibPerS: atLeast0("move-dirty-mib-per-s", fleet0.moveCosts.dirtyMibPerSec, "how fast a moving guest dirties its RAM, MiB/s (each pre-copy round sends what the last let it dirty)"),
  moveMaxDowntimeMs: positive("move-max-downtime-ms", fleet0.moveCosts.maxDowntimeMs, "a move's downtime budget: the guard refuses a session whose estimate passes it, ms"),
  drain: Flag.Literals("drain", ["release", "pass"]).pipe(
    Flag.withDefault("release" as const),
    Flag.withDescription("drain the queue whenever room appears (release, SPEC §2) or only at passes (release)"),
  ),
  heartbeatS: atLeast0("heartbeat-s", 0, "model host agents' heartbeats every S s; 0 = agents never fail"),
  // The generated workload.
  workload: Flag.String("workload").pipe(
    Flag.optional,
    Flag.withDescription(
      `a stress workload with the fleet it is sized for (--host replaces the fleet, --sessions the count; the other workload flags but --seed, --hours and --size-jitter-pct are its own): ${Stress.names.join(", ")}`,
    ),
  ),
  sizeJitterPct: between("size-jitter-pct", 0, 50, 0, "size noise: every generated session's RAM × (1 − U × pct / 100), U uniform in [0, 1)"),
  hours: positive("hours", gen0.hours, "simulated hours"),
  seed: Flag.Int("seed").pipe(Flag.withDefault(gen0.seed), Flag.withDescription(`workload seed (${gen0.seed})`)),
  sessions: Flag.Int("sessions").pipe(
    Flag.filter((n) => n > 0, (n) => `must be a positive integer (got ${n})`),
    Flag.optional,
    Flag.withDescription("sessions arriving over the run (50 per host per 24 h)"),
  ),
  resumeProb: between("resume-prob", 0, 1, gen0.resumeProb, "chance a session comes back after an idle period"),
  activeMedianMin: positive("active-median-min", gen0.activeMedianMin, "median active period, lognormal, min"),
  idleMinMin: positive("idle-min-min", gen0.idleMinMin, "shortest idle period, Pareto scale, min"),
  idleAlpha: positive("idle-alpha", gen0.idleAlpha, "Pareto shape of idle periods, < 2 = heavy tail"),
  dailyAmplitude: between("daily-amplitude", 0, 1, gen0.dailyAmplitude, "arrival-rate swing over the day"),
  // Input and output.
  trace: optionalString("trace", "replay a trace (JSON Lines) instead of generating"),
  record: optionalString("record", "write the generated workload as a trace"),
  svg: optionalString("svg", 'write the plot (sim.svg; "" for none)'),
  json: boolean("json", "print the results as JSON instead of a table"),
  windows: boolean("windows", "print the figures per time window too"),
  lpBound: boolean("lp-bound", "compute the pooled-RAM LP bound on warm resumes (HiGHS) and print warm ÷ bound per policy"),
  windowH: positive("window-h", fleet0.windowMs / 3_600_000, "length of a time window of the figures, h"),
  worst: atLeast0Int("worst", fleet0.worstSessions, "name this many of the longest-waiting sessions"),
  threads: Flag.Int("threads").pipe(
    Flag.filter((n) => n > 0, (n) => `must be a positive integer (got ${n})`),
    Flag.optional,
    Flag.withDescription("worker threads for the policies (one per policy, at most one per core)"),
  ),
  noProgress: boolean("no-progress", "no progress bar (it shows only when stderr is a terminal)"),
}

/** The parsed flags. */
export type Flags = Command.Command.Config.Infer<typeof flags>

/** The default workload: this many sessions per host per 24 simulated hours (the reference day's load). */
export const sessionsPerHostPerDay = 50

/** Relative paths are read from where the user typed the command (pnpm runs scripts in the package). */
const userPath = (path: string): string => resolve(process.env["INIT_CWD"] ?? process.cwd(), path)

const readText = (path: string) =>
  Effect.try({ try: () => readFileSync(userPath(path), "utf8"), catch: (e) => new FileError({ path, message: e instanceof Error ? e.message : String(e) }) })
const writeText = (path: string, text: string) =>
  Effect.try({ try: () => writeFileSync(userPath(path), text), catch: (e) => new FileError({ path, message: e instanceof Error ? e.message : String(e) }) })

/** The host shapes the flags name (`--host`, then `--hosts-file`), or null for one shape from `--hosts`. */
const shapesFrom = (f: Flags) =>
  Effect.gen(function* () {
    const shapes: Simulation.HostShape[] = []
    for (const raw of f.host) {
      const shape = Hosts.parseShape(raw)
      if (typeof shape === "string") return yield* new UsageError({ option: "--host", message: shape })
      shapes.push(shape)
    }
    if (Option.isSome(f.hostsFile)) {
      const path = f.hostsFile.value
      const read = Hosts.parseHostsFile(yield* readText(path))
      if ("message" in read) return yield* new FileError({ path, message: read.line > 0 ? `line ${read.line}: ${read.message}` : read.message })
      shapes.push(...read)
    }
    return shapes.length > 0 ? shapes : null
  })

/** The options of a run from the parsed flags: the rules that span several flags are checked here. */
export const toOptions = (f: Flags): Effect.Effect<Options, UsageError | FileError> =>
  Effect.gen(function* () {
    const names = f.policy === "all" ? [...ParkPolicy.names] : f.policy.split(",").map((s) => s.trim()).filter((s) => s !== "")
    const policies: ParkPolicy.Name[] = []
    for (const n of names) {
      if (!ParkPolicy.isName(n)) return yield* new UsageError({ option: "--policy", message: `unknown policy ${n}; one of ${ParkPolicy.names.join(", ")}` })
      if (!policies.includes(n)) policies.push(n)
    }
    if (policies.length === 0) return yield* new UsageError({ option: "--policy", message: "name at least one policy" })

    const limits = Limits.make({
      cpuOvercommit: f.cpuOvercommit,
      memOvercommitRatio: f.memOvercommitRatio,
      systemReserveMib: f.systemReserveMib,
      maxEntriesPerNode: f.maxEntries,
      reaperIntervalMs: Math.round(f.reaperS * 1000),
      parkHardTtlMs: Math.round(f.hardTtlH * 3_600_000),
      heartbeatStaleWindowMs: Math.round(f.staleWindowS * 1000),
    })
    if (limits._tag === "Invalid") return yield* new UsageError({ option: "limits", message: limits.issues.map((i) => `${i.field} ${i.rule}`).join("; ") })
    if (f.heartbeatS > 0 && f.heartbeatS * 1000 >= limits.limits.heartbeatStaleWindowMs)
      return yield* new UsageError({ option: "--heartbeat-s", message: `must stay under the stale window (${limits.limits.heartbeatStaleWindowMs / 1000} s)` })

    // A positive duration that rounds to 0 ms would turn its feature off (0 means off), or, for
    // the figures' window, divide the run by zero and never end it.
    const tooShort: readonly (readonly [string, boolean, string])[] = [
      ["--window-h", Math.round(f.windowH * 3_600_000) < 1000, `must be at least one second, 1/3600 h (got ${f.windowH})`],
      ["--demand-window-s", Math.round(f.demandWindowS * 1000) < 1, `must be at least 1 ms (got ${f.demandWindowS} s)`],
      ["--starvation-limit-s", Math.round(f.starvationLimitS * 1000) < 1, `must be at least 1 ms (got ${f.starvationLimitS} s)`],
      ["--heartbeat-s", f.heartbeatS > 0 && Math.round(f.heartbeatS * 1000) < 1, `must be 0 (agents never fail) or at least 1 ms (got ${f.heartbeatS} s)`],
    ]
    for (const [option, short, message] of tooShort) if (short) return yield* new UsageError({ option, message })

    // The LP bounds a run that starts empty: a burn-in's sessions hold RAM and resume warm outside its model.
    if (f.warmStart && f.lpBound) return yield* new UsageError({ option: "--lp-bound", message: "bounds a run that starts empty; leave out --warm-start" })
    let scenario: Stress.Scenario | null = null
    if (Option.isSome(f.workload)) {
      const name = f.workload.value
      if (!Stress.isName(name)) return yield* new UsageError({ option: "--workload", message: `unknown workload ${name}; one of ${Stress.names.join(", ")}` })
      scenario = Stress.byName(name)
    }
    const shapes = (yield* shapesFrom(f)) ?? scenario?.shapes ?? null
    const hostTotal = shapes === null ? f.hosts : shapes.reduce((a, s) => a + s.count, 0)
    // The reference load scales with the run: 50 sessions per host over a day, not 50 in every run
    // (a stress workload has its own count).
    const sessions = Option.getOrElse(f.sessions, () => scenario?.sessions ?? Math.max(1, Math.round((sessionsPerHostPerDay * hostTotal * f.hours) / 24)))
    const policyOptions: ParkPolicy.Options = {
      ...ParkPolicy.defaultOptions,
      floorPct: f.floorPct,
      minParkAgeMs: Math.round(f.minParkAgeS * 1000),
      starvationLimitMs: Math.round(f.starvationLimitS * 1000),
      reserveLeadMs: Math.round(f.reserveLeadS * 1000),
      reserveMinParkAgeMs: Math.round(f.reserveMinAgeS * 1000),
      reserveQuantile: f.reserveQuantile,
      reserveYoungToo: !f.reserveOldOnly,
      reserveYoungMinAgeMs: Math.round(f.reserveYoungMinAgeS * 1000),
      reserveLeadPerClass: f.reserveLeadPerClass,
      reserveLeadCoversDescent: f.reserveLeadCoversDescent,
      reserveGroups: f.reserveGroups,
      descentMibPerSec: f.descentMibPerS,
    } satisfies ParkGate.Options & ParkPolicy.Options
    const svg = Option.getOrElse(f.svg, () => "sim.svg")
    const generated: GeneratorConfig =
      scenario === null
        ? {
            ...Workload.defaultGenerator,
            seed: f.seed,
            sessions,
            resumeProb: f.resumeProb,
            activeMedianMin: f.activeMedianMin,
            idleMinMin: f.idleMinMin,
            idleAlpha: f.idleAlpha,
            dailyAmplitude: f.dailyAmplitude,
          }
        : scenario.generator(f.seed, sessions)
    return {
      policies,
      generator: { ...generated, hours: f.hours, ...(f.sizeJitterPct > 0 ? { sizeJitterPct: f.sizeJitterPct } : {}) },
      scenario: scenario?.name ?? null,
      fleet: {
        ...Simulation.defaultFleet,
        hosts: f.hosts,
        hostMib: f.hostMib,
        hostVcpus: f.hostVcpus,
        shapes,
        descentMibPerSec: f.descentMibPerS,
        restoreMibPerSec: f.restoreMibPerS,
        restoreBaseMs: f.restoreBaseMs,
        warmResumeMs: f.warmResumeMs,
        startMs: f.startMs,
        hostTransferMibPerSec: f.hostTransferMibPerS,
        patienceMedianS: f.patienceMedianS,
        patienceSigma: f.patienceSigma,
        vmOverheadMib: f.vmOverheadMib,
        warmStartMs: f.warmStart ? Math.round(f.warmStartH * 3_600_000) : 0,
        moves: f.moves,
        movesPerPass: f.movesPerPass,
        moveCosts: {
          ...fleet0.moveCosts,
          copyMibPerSec: f.moveMibPerS,
          dirtyMibPerSec: f.moveDirtyMibPerS,
          maxDowntimeMs: f.moveMaxDowntimeMs,
          commitAllowanceMs: limits.limits.commitAllowanceMs,
        },
        heartbeatIntervalMs: Math.round(f.heartbeatS * 1000),
        drainOnRelease: f.drain === "release",
        reactWindowMs: f.reactMs,
        limits: limits.limits,
        policyOptions,
        meter: { ...ReaperState.defaultMeterOptions, windowMs: Math.round(f.demandWindowS * 1000) },
        windowMs: Math.round(f.windowH * 3_600_000),
        worstSessions: f.worst,
      },
      trace: Option.getOrNull(f.trace),
      record: Option.getOrNull(f.record),
      svg: svg === "" ? null : svg,
      json: f.json,
      progress: !f.noProgress,
      threads: Option.getOrElse(f.threads, () => Parallel.defaultThreads(policies.length)),
      windows: f.windows,
      lpBound: f.lpBound,
    }
  })

// ---- the run ---------------------------------------------------------------------------------------

/** A progress line on stderr, drawn only when stderr is a terminal: one gauge per policy. */
const progressBar = (policies: readonly ParkPolicy.Name[], enabled: boolean) => {
  if (!enabled || process.stderr.isTTY !== true) return { update: () => undefined, finish: () => undefined }
  const done = new Map<ParkPolicy.Name, number>(policies.map((p) => [p, 0]))
  const t0 = performance.now()
  let drawnAt = 0
  return {
    update: (policy: ParkPolicy.Name, d: number) => {
      done.set(policy, d)
      const t = performance.now()
      if (t - drawnAt < 200 && d < 1) return
      drawnAt = t
      const gauges = [...done].map(([p, x]) => `${p} ${(x * 100).toFixed(0).padStart(3)}%`).join("  ")
      process.stderr.write(`\r\x1b[K${gauges}  ${((t - t0) / 1000).toFixed(0)}s`)
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

/** Runs every policy on the workload (in worker threads when `threads` > 1) and answers the results. */
export const runAll = (options: Options, workload: Workload.Workload) =>
  Effect.promise(async () => {
    const bar = progressBar(options.policies, options.progress)
    const results = await Parallel.runPolicies(workload, options.policies, options.fleet, options.threads, bar.update)
    bar.finish()
    return results
  })

const describeFleet = (fleet: FleetConfig): string =>
  Simulation.shapesOf(fleet)
    .map((s) => `${s.count} hosts × ${s.memMib} MiB/${s.vcpus} cores`)
    .join(" + ")

/** The comparison: load, run, print, write; answers the process exit code (1 when an invariant broke). */
export const runComparison = (options: Options) =>
  Effect.gen(function* () {
    const workload = yield* loadWorkload(options)
    const load = Load.offered(workload, options.fleet)
    // Said before the run (which may take minutes) and on stderr, so --json output stays the results.
    const overloaded = Load.warning(load)
    if (overloaded !== null) process.stderr.write(`${overloaded}\n`)
    if (options.record !== null) {
      yield* writeText(options.record, Workload.toTrace(workload, `${options.scenario ?? "generator"} seed ${options.generator.seed}`))
      process.stderr.write(`recorded ${workload.scripts.length} sessions to ${options.record}\n`)
    }
    const t0 = performance.now()
    const results: Result[] = yield* runAll(options, workload)
    const wallS = (performance.now() - t0) / 1000
    if (options.json) {
      process.stdout.write(`${JSON.stringify(results.map(({ series: _series, ...r }) => r), null, 2)}\n`)
    } else {
      const hours = workload.horizonMs / 3_600_000
      process.stdout.write(
        `${describeFleet(options.fleet)}, ${workload.scripts.length} sessions, ${hours} h` +
          `${options.trace === null ? `, ${options.scenario === null ? "" : `${options.scenario}, `}seed ${options.generator.seed}` : `, trace ${options.trace}`}; ` +
          `${results.reduce((a, r) => a + r.events, 0)} events in ${wallS.toFixed(1)} s\n${Load.describe(load)}\n\n`,
      )
      process.stdout.write(Report.text(results))
      process.stdout.write(Report.longestWaitsText(results))
      process.stdout.write(Report.waitsBySizeText(results))
      if (options.fleet.patienceMedianS > 0) process.stdout.write(`\ngave up waiting (lost demand): ${results.map((r) => `${r.policy} ${r.gaveUp}`).join(", ")}\n`)
      if (options.windows) process.stdout.write(Report.windowsText(results))
      if (options.lpBound) {
        const bound = yield* Effect.promise(() => Bound.pooledRam(workload, Simulation.shapesOf(options.fleet), options.fleet.limits))
        process.stdout.write(
          `\npooled-RAM LP bound: ${bound.warm} warm resumes (TTL bound ${bound.ttl}); warm ÷ LP bound: ${results.map((r) => `${r.policy} ${bound.warm > 0 ? (r.warmResumes / bound.warm).toFixed(2) : "-"}`).join(", ")}\n`,
        )
      }
    }
    if (options.svg !== null) {
      yield* writeText(options.svg, Plot.svg(results, `engram simulator: ${describeFleet(options.fleet)}, ${workload.scripts.length} sessions`))
      process.stderr.write(`plot written to ${options.svg}\n`)
    }
    // Again after the table, where the reader's eyes are.
    if (overloaded !== null && !options.json) process.stderr.write(`${overloaded}\n`)
    const breaks = results.flatMap(Report.invariantBreaks)
    for (const b of breaks) process.stderr.write(`INVARIANT BROKEN: ${b}\n`)
    return breaks.length > 0 ? 1 : 0
  })

// ---- convert-azure --------------------------------------------------------------------------------

const convertFlags = {
  vmtable: Flag.String("vmtable").pipe(Flag.withDescription("the Azure VM table (vmtable.csv, no header)")),
  cpu: Flag.String("cpu").pipe(Flag.atLeast(0), Flag.withDescription("a file of 5-minute CPU readings (vm_cpu_readings-file-N-of-M.csv), in time order; repeat for several")),
  out: Flag.String("out").pipe(Flag.withDescription("the trace to write (JSON Lines)")),
  fromS: atLeast0("from-s", Azure.defaultAzureOptions.fromS, "keep VMs alive from this trace second on"),
  hours: positive("hours", Azure.defaultAzureOptions.hours, "for this many hours"),
  idleCpuPct: between("idle-cpu-pct", 0, 100, Azure.defaultAzureOptions.idleCpuPct, "a reading whose max CPU is under this is idle, %"),
  minIdleMin: positive("min-idle-min", Azure.defaultAzureOptions.minIdleMin, "shorter idle runs count as active, min"),
  maxVms: Flag.Int("max-vms").pipe(Flag.filter((n) => n > 0, (n) => `must be a positive integer (got ${n})`), Flag.optional, Flag.withDescription("keep at most this many VMs")),
}

/** Streams a file's lines into `each`. */
const eachLine = (path: string, each: (line: string) => void) =>
  Effect.tryPromise({
    try: async () => {
      const lines = createInterface({ input: createReadStream(userPath(path), "utf8"), crlfDelay: Number.POSITIVE_INFINITY })
      for await (const line of lines) each(line)
    },
    catch: (e) => new FileError({ path, message: e instanceof Error ? e.message : String(e) }),
  })

/** Converts the Azure public VM trace to a trace file. */
export const convertAzure = (f: Command.Command.Config.Infer<typeof convertFlags>) =>
  Effect.gen(function* () {
    const builder = new Azure.AzureBuilder({
      fromS: f.fromS,
      hours: f.hours,
      idleCpuPct: f.idleCpuPct,
      minIdleMin: f.minIdleMin,
      maxVms: Option.getOrNull(f.maxVms),
    })
    yield* eachLine(f.vmtable, (line) => builder.addVm(line))
    for (const path of f.cpu) yield* eachLine(path, (line) => builder.addReading(line))
    const workload = builder.workload()
    yield* writeText(f.out, Workload.toTrace(workload, `azure ${f.vmtable} from ${f.fromS} s, ${f.hours} h`))
    const idle = workload.scripts.reduce((a, s) => a + s.idleMs.length, 0)
    process.stderr.write(
      `wrote ${workload.scripts.length} sessions (${idle} idle periods) to ${f.out}` +
        `${builder.skipped.vms + builder.skipped.readings > 0 ? `; skipped ${builder.skipped.vms} VM lines and ${builder.skipped.readings} readings` : ""}\n`,
    )
  })

// ---- the commands ----------------------------------------------------------------------------------

/** Exit code of the last run, for `main`. */
const exit = { code: 0 }

const simCommand = (handler: (f: Flags) => Effect.Effect<void, UsageError | FileError>) =>
  Command.make("sim", flags, handler).pipe(
    Command.withDescription("engram fleet simulator: compare park policies on one workload (generated, or a trace), running the reaper's own pass on the in-memory store"),
    Command.withExamples([
      { command: "pnpm sim -- --policy demand,floor30 --hosts 1000 --hours 24 --seed 7", description: "the reference day" },
      { command: "pnpm sim -- --policy all --host 80x64gx16 --host 20x256gx64 --sessions 6000", description: "a mixed fleet, every policy in worker threads" },
      { command: "pnpm sim -- --policy demand,floor30,demand-reserve --workload flash-crowd", description: "a stress workload on the fleet it is sized for" },
      { command: "pnpm sim -- convert-azure --vmtable vmtable.csv --cpu vm_cpu_readings-file-1-of-195.csv --out azure.jsonl --max-vms 5000", description: "an Azure trace" },
    ]),
    Command.withSubcommands([
      Command.make("convert-azure", convertFlags, convertAzure).pipe(
        Command.withDescription("convert the Azure public VM trace (AzurePublicDataset V1/V2) to a simulator trace: VM lifetimes, sizes from the buckets, idle periods from low-CPU readings"),
      ),
    ]),
  )

/** The `sim` command with its `convert-azure` subcommand. */
export const command = simCommand((f) =>
  Effect.gen(function* () {
    exit.code = yield* runComparison(yield* toOptions(f))
  }),
)

// pnpm passes a lone "--" through; it is not an option.
const args = (argv: readonly string[]): string[] => argv.filter((a) => a !== "--")

/**
 * Parses a command line into the options of a run, without running it: `null` for `--help`
 * (printed, unless `quiet`) and for a subcommand. A flag that breaks its rule fails with a
 * `UsageError` in the library's words.
 */
export const parse = (argv: readonly string[], options: { readonly quiet?: boolean } = {}) =>
  Effect.gen(function* () {
    let parsed: Options | null = null
    const capture = simCommand((f) =>
      Effect.map(toOptions(f), (o) => {
        parsed = o
      }),
    )
    yield* Command.runWith(capture, { version: "0.1.0", renderErrors: false })(args(argv))
    return parsed as Options | null
  }).pipe(
    // A flag that broke its rule: the library's words, as a usage error.
    Effect.catchTag("ShowHelp", (help) =>
      help.errors.length === 0 ? Effect.succeed(null) : Effect.fail(new UsageError({ option: "", message: help.errors.map((e) => e.message).join("; ") })),
    ),
    options.quiet === true ? Effect.provide(CliOutput.layerPresenter({ present: () => Effect.void })) : (e) => e,
    Effect.provide(NodeServices.layer),
  )

/** The whole command line: answers the process exit code. */
export const main = (argv: readonly string[]) =>
  Effect.gen(function* () {
    exit.code = 0
    yield* Command.runWith(command, { version: "0.1.0" })(args(argv))
    return exit.code
  }).pipe(Effect.provide(NodeServices.layer))
