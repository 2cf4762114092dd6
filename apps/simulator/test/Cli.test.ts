// The command line: every flag through effect/cli, and `pnpm sim` as a real process (help,
// worker threads, the Azure converter).
import { execFile } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { Limits, ParkPolicy } from "@engram/core"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Cli, Simulation, Workload } from "../src/index.js"

const parse = (argv: string[]) => Effect.runPromise(Cli.parse(argv, { quiet: true }))
const failure = (argv: string[]) => Effect.runPromise(Effect.flip(Cli.parse(argv, { quiet: true })))

const pkg = join(import.meta.dirname, "..")
const sim = (args: string[]) =>
  promisify(execFile)(join(pkg, "node_modules", ".bin", "tsx"), ["--conditions=@engram/source", join(pkg, "src", "main.ts"), ...args], {
    cwd: pkg,
    env: { ...process.env, INIT_CWD: pkg },
    timeout: 280_000,
    maxBuffer: 64 << 20,
  })

describe("flags", () => {
  it("parses the issue's example, with the defaults elsewhere", async () => {
    const o = (await parse(["--", "--policy", "demand,floor30", "--hosts", "1000", "--hours", "24", "--seed", "7"])) as Cli.Options
    expect(o.policies).toEqual(["demand", "floor30"])
    expect(o.fleet.hosts).toBe(1000)
    expect(o.generator.sessions).toBe(50_000)
    expect(o.generator.seed).toBe(7)
    expect(o.fleet.limits).toEqual(Limits.defaults)
    expect(o.fleet.shapes).toBeNull()
    expect(o.svg).toBe("sim.svg")
    expect((await parse([])) as Cli.Options).toMatchObject({ policies: [ParkPolicy.defaultName] })
    expect(((await parse(["--policy", "all"])) as Cli.Options).policies).toEqual(ParkPolicy.names)
  })

  it("every flag of the first release still works", async () => {
    const o = (await parse([
      ...["--policy", "demand-minage", "--hosts", "12", "--host-mib", "32768", "--host-vcpus", "8", "--hours", "3", "--seed", "4"],
      ...["--sessions", "99", "--resume-prob", "0.5", "--active-median-min", "7", "--idle-min-min", "2", "--idle-alpha", "1.5"],
      ...["--daily-amplitude", "0.2", "--descent-mib-per-s", "512", "--restore-mib-per-s", "1024", "--restore-base-ms", "300"],
      ...["--warm-resume-ms", "20", "--start-ms", "900", "--reaper-s", "2", "--hard-ttl-h", "4", "--floor-pct", "25"],
      ...["--min-park-age-s", "60", "--drain", "pass", "--heartbeat-s", "30", "--trace", "t.jsonl", "--record", "r.jsonl"],
      ...["--svg", "", "--json", "--no-progress"],
    ])) as Cli.Options
    expect(o.policies).toEqual(["demand-minage"])
    expect(o.fleet).toMatchObject({
      hosts: 12,
      hostMib: 32768,
      hostVcpus: 8,
      descentMibPerSec: 512,
      restoreMibPerSec: 1024,
      restoreBaseMs: 300,
      warmResumeMs: 20,
      startMs: 900,
      drainOnRelease: false,
      heartbeatIntervalMs: 30_000,
    })
    expect(o.fleet.limits).toMatchObject({ reaperIntervalMs: 2000, parkHardTtlMs: 4 * 3_600_000 })
    expect(o.fleet.policyOptions).toMatchObject({ floorPct: 25, minParkAgeMs: 60_000 })
    expect(o.generator).toMatchObject({ seed: 4, sessions: 99, hours: 3, resumeProb: 0.5, activeMedianMin: 7, idleMinMin: 2, idleAlpha: 1.5, dailyAmplitude: 0.2 })
    expect([o.trace, o.record, o.svg, o.json, o.progress]).toEqual(["t.jsonl", "r.jsonl", null, true, false])
  })

  it("host shapes, every limit and the gate's knobs are flags", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sim-hosts-"))
    const file = join(dir, "hosts.csv")
    writeFileSync(file, "count,memMib,vcpus\n# big ones\n2,262144,64\n\n")
    const o = (await parse([
      ...["--host", "10x64gx16", "--host", "3x98304x24", "--hosts-file", file],
      ...["--cpu-overcommit", "2", "--mem-overcommit-ratio", "1.5", "--system-reserve-mib", "2048", "--max-entries-per-node", "64"],
      ...["--stale-window-s", "300", "--starvation-limit-s", "90", "--reserve-lead-s", "45", "--reserve-min-age-s", "120"],
      ...["--reserve-quantile", "0.8", "--reserve-old-only", "--reserve-young-min-age-s", "30", "--demand-window-s", "120", "--react-ms", "0"],
      ...["--reserve-lead-per-class", "--reserve-lead-covers-descent", "--reserve-groups", "--descent-mib-per-s", "1024"],
      ...["--window-h", "0.5", "--worst", "3", "--threads", "1", "--windows"],
    ])) as Cli.Options
    expect(o.fleet.shapes).toEqual([
      { count: 10, memMib: 65_536, vcpus: 16 },
      { count: 3, memMib: 98_304, vcpus: 24 },
      { count: 2, memMib: 262_144, vcpus: 64 },
    ])
    // 50 sessions per host of the mixed fleet.
    expect(o.generator.sessions).toBe(50 * 15)
    expect(o.fleet.limits).toMatchObject({ cpuOvercommit: 2, memOvercommitRatio: 1.5, systemReserveMib: 2048, maxEntriesPerNode: 64, heartbeatStaleWindowMs: 300_000 })
    expect(o.fleet.policyOptions).toMatchObject({ starvationLimitMs: 90_000, reserveLeadMs: 45_000, reserveMinParkAgeMs: 120_000, reserveQuantile: 0.8, reserveYoungToo: false, reserveYoungMinAgeMs: 30_000, reserveLeadPerClass: true, reserveLeadCoversDescent: true, reserveGroups: true, descentMibPerSec: 1024 })
    expect(o.fleet).toMatchObject({ reactWindowMs: 0, windowMs: 1_800_000, worstSessions: 3, meter: { windowMs: 120_000 } })
    expect([o.threads, o.windows]).toEqual([1, true])
  })

  it("the default number of sessions scales with the run: 50 per host per 24 h", async () => {
    expect(((await parse(["--hosts", "20", "--hours", "2"])) as Cli.Options).generator.sessions).toBe(83)
    expect(((await parse(["--hosts", "20", "--hours", "48"])) as Cli.Options).generator.sessions).toBe(2000)
  })

  it("a VM's overhead and a warm start are options of the fleet, off by default", async () => {
    expect(((await parse([])) as Cli.Options).fleet).toMatchObject({ vmOverheadMib: 0, warmStartMs: 0 })
    expect(((await parse(["--vm-overhead-mib", "300", "--warm-start"])) as Cli.Options).fleet).toMatchObject({ vmOverheadMib: 300, warmStartMs: 24 * 3_600_000 })
    expect(((await parse(["--warm-start", "--warm-start-h", "6"])) as Cli.Options).fleet.warmStartMs).toBe(6 * 3_600_000)
    // The burn-in's length alone does not start warm.
    expect(((await parse(["--warm-start-h", "6"])) as Cli.Options).fleet.warmStartMs).toBe(0)
    expect(await failure(["--vm-overhead-mib", "-1"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--vm-overhead-mib") })
    expect(await failure(["--warm-start", "--lp-bound"])).toMatchObject({ _tag: "UsageError", option: "--lp-bound" })
  })

  it("groups and a lead per class are on by default, as in the coordinator (--no-reserve-groups, --no-reserve-lead-per-class: off)", async () => {
    expect(((await parse([])) as Cli.Options).fleet.policyOptions).toMatchObject({ reserveGroups: true, reserveLeadPerClass: true })
    expect(((await parse(["--no-reserve-groups"])) as Cli.Options).fleet.policyOptions).toMatchObject({ reserveGroups: false, reserveLeadPerClass: true })
    expect(((await parse(["--no-reserve-lead-per-class"])) as Cli.Options).fleet.policyOptions).toMatchObject({ reserveGroups: true, reserveLeadPerClass: false })
    expect(((await parse(["--reserve-groups=false", "--reserve-lead-per-class=false"])) as Cli.Options).fleet.policyOptions).toMatchObject({ reserveGroups: false, reserveLeadPerClass: false })
    expect(((await parse(["--reserve-groups", "--reserve-lead-per-class"])) as Cli.Options).fleet.policyOptions).toMatchObject({ reserveGroups: true, reserveLeadPerClass: true })
  })

  it("moves are an option of the fleet, on by default (--no-moves: off), with their costs", async () => {
    expect(((await parse([])) as Cli.Options).fleet).toMatchObject({ moves: true, moveCosts: Simulation.defaultFleet.moveCosts })
    expect(((await parse(["--no-moves"])) as Cli.Options).fleet.moves).toBe(false)
    const on = ((await parse(["--moves", "--move-mib-per-s", "512", "--move-dirty-mib-per-s", "0", "--move-max-downtime-ms", "300"])) as Cli.Options).fleet
    expect(on).toMatchObject({ moves: true, moveCosts: { copyMibPerSec: 512, dirtyMibPerSec: 0, maxDowntimeMs: 300 } })
    expect(await failure(["--move-mib-per-s", "0"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--move-mib-per-s") })
    expect(await failure(["--move-dirty-mib-per-s", "-1"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--move-dirty-mib-per-s") })
  })

  it("a positive duration too short to count once rounded to ms is refused, naming the flag (it would turn its feature off, or never end the run)", async () => {
    // A 0 ms window of the figures divided by zero: the run never ended.
    expect(await failure(["--window-h", "0.0000001"])).toMatchObject({ _tag: "UsageError", option: "--window-h", message: "must be at least one second, 1/3600 h (got 1e-7)" })
    expect(await failure(["--demand-window-s", "0.0001"])).toMatchObject({ _tag: "UsageError", option: "--demand-window-s", message: "must be at least 1 ms (got 0.0001 s)" })
    expect(await failure(["--starvation-limit-s", "0.0001"])).toMatchObject({ _tag: "UsageError", option: "--starvation-limit-s", message: "must be at least 1 ms (got 0.0001 s)" })
    // 0 turns the agents' model off; a positive interval is one.
    expect(await failure(["--heartbeat-s", "0.0001"])).toMatchObject({ _tag: "UsageError", option: "--heartbeat-s", message: "must be 0 (agents never fail) or at least 1 ms (got 0.0001 s)" })
    const edge = (await parse(["--window-h", String(1 / 3600), "--demand-window-s", "0.001", "--starvation-limit-s", "0.001", "--heartbeat-s", "0.001"])) as Cli.Options
    expect([edge.fleet.windowMs, edge.fleet.meter.windowMs, edge.fleet.policyOptions.starvationLimitMs, edge.fleet.heartbeatIntervalMs]).toEqual([1000, 1, 1, 1])
  })

  it("bad input names the flag and the rule", async () => {
    expect(await failure(["--policy", "always-park"])).toMatchObject({ _tag: "UsageError", option: "--policy", message: expect.stringContaining("unknown policy always-park") })
    expect(await failure(["--host", "10x64q"])).toMatchObject({ _tag: "UsageError", option: "--host" })
    expect(await failure(["--heartbeat-s", "200"])).toMatchObject({ _tag: "UsageError", option: "--heartbeat-s" })
    expect(await failure(["--max-entries-per-node", "0"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--max-entries-per-node") })
    expect(await failure(["--hosts", "0"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("must be a positive integer (got 0)") })
    expect(await failure(["--drain", "sometimes"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--drain") })
    expect(await failure(["--bogus", "1"])).toMatchObject({ _tag: "UsageError", message: expect.stringContaining("--bogus") })
    expect(await parse(["--help"])).toBeNull()
    expect(await failure(["--hosts-file", "/nonexistent/hosts"])).toMatchObject({ _tag: "FileError" })
  })
})

describe("pnpm sim (a real process)", () => {
  it("--help lists every flag and the converter", async () => {
    const { stdout } = await sim(["--help"])
    for (const flag of ["--policy", "--host", "--hosts-file", "--cpu-overcommit", "--max-entries-per-node", "--system-reserve-mib", "--mem-overcommit-ratio", "--starvation-limit-s", "--reserve-lead-s", "--react-ms", "--threads", "--window-h", "--worst", "--trace", "--record", "--no-progress"])
      expect(stdout).toContain(flag)
    expect(stdout).toContain("convert-azure")
  }, 600_000)

  it("--policy … --threads 2 runs the policies in worker threads, with the figures of a run in this thread", async () => {
    const args = ["--policy", "demand,floor30", "--hosts", "4", "--sessions", "80", "--hours", "3", "--seed", "5", "--threads", "2", "--json", "--svg", ""]
    const { stdout } = await sim(args)
    const results = JSON.parse(stdout) as Omit<Simulation.Result, "series">[]
    const w = Workload.generate({ ...Workload.defaultGenerator, seed: 5, sessions: 80, hours: 3 })
    for (const [k, policy] of (["demand", "floor30"] as const).entries()) {
      const { series: _series, ...local } = Simulation.run(w, { policy, fleet: { hosts: 4 } })
      expect(results[k]).toEqual(JSON.parse(JSON.stringify(local)))
    }
  }, 600_000)

  it("an overloaded run says so on stderr, before and after its table; a run within the fleet does not", async () => {
    const over = await sim(["--policy", "demand", "--hosts", "2", "--hours", "2", "--sessions", "100", "--seed", "3", "--svg", "", "--no-progress"])
    const warnings = over.stderr.split("\n").filter((l) => l.startsWith("WARNING: overloaded: the active sessions alone ask for "))
    expect(warnings, over.stderr).toHaveLength(2)
    expect(warnings[0]).toContain("Fewer --sessions, more --hours or more --hosts")
    expect(over.stdout).toMatch(/^offered load \d+(\.\d)?× the fleet's RAM \(peak \d+(\.\d)?×\), .+ its vCPUs \(active sessions; 25\.0 sessions per host per hour\)$/m)
    const within = await sim(["--policy", "demand", "--hosts", "2", "--hours", "2", "--seed", "3", "--svg", "", "--no-progress"])
    expect(within.stderr).not.toContain("WARNING")
    expect(within.stdout).toMatch(/^2 hosts × 65536 MiB\/16 cores, 8 sessions, 2 h/m)
  }, 600_000)

  it("convert-azure turns a VM table and CPU readings into a trace the simulator replays", async () => {
    const dir = mkdtempSync(join(tmpdir(), "sim-azure-"))
    writeFileSync(
      join(dir, "vmtable.csv"),
      ["vmA,sub1,dep1,0,7000,90.1,20.2,80.3,Interactive,2,4", "vmB,sub1,dep2,600,100000,50,10,40,Delay-insensitive,>24,>64", "vmC,sub2,dep3,9000,9900,10,5,8,Unknown,4,8", "garbage"].join("\n"),
    )
    // vmA idles (max CPU < 5 %) for 30 minutes from 1800 s; vmB from 6000 s to past the horizon.
    const readings = [
      ...[0, 300, 600, 900, 1200, 1500].map((t) => `${t},vmA,10,40,20`),
      ...[1800, 2100, 2400, 2700, 3000, 3300].map((t) => `${t},vmA,0.1,1.5,0.5`),
      ...[3600, 3900, 4200].map((t) => `${t},vmA,10,40,20`),
      "4500,vmA,0.1,2,0.5",
      ...[6000, 6300, 6600, 6900].map((t) => `${t},vmB,0.1,2.5,1`),
    ]
    writeFileSync(join(dir, "cpu.csv"), readings.join("\n"))
    const out = join(dir, "trace.jsonl")
    const { stderr } = await sim(["convert-azure", "--vmtable", join(dir, "vmtable.csv"), "--cpu", join(dir, "cpu.csv"), "--out", out, "--hours", "2"])
    expect(stderr).toContain("wrote 2 sessions (2 idle periods)")
    const parsed = Workload.parseTrace(readFileSync(out, "utf8"))
    if (parsed._tag !== "Parsed") throw new Error(`line ${parsed.issue.line}: ${parsed.issue.message}`)
    expect(parsed.workload).toEqual({
      horizonMs: 2 * 3_600_000,
      scripts: [
        // Active 30 min, idle 30 min, active to its deletion at 7000 s.
        { id: "vmA", arriveAtMs: 0, budget: { memMib: 4096, vcpus: 2 }, activeMs: [1_800_000, 3_400_000], idleMs: [1_800_000], endAfterIdle: false },
        // Open buckets count twice their bound; idle from 6000 s to past the horizon.
        { id: "vmB", arriveAtMs: 600_000, budget: { memMib: 131_072, vcpus: 48 }, activeMs: [5_400_000], idleMs: [Workload.OPEN], endAfterIdle: true },
      ],
    })
    const r = Simulation.run(parsed.workload, { policy: ParkPolicy.defaultName, fleet: { hosts: 2, hostMib: 262_144, hostVcpus: 64 } })
    expect(r.parks).toBe(2)
    expect(r.warmResumes).toBe(1)
  }, 600_000)
})
