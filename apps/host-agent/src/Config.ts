/**
 * The agent's configuration, read through effect `Config` from the environment (every variable
 * in README.md). Every bad value is reported at start, all at once, in `@engram/process`'s `Env`
 * format (`VARIABLE="value": rule`); the host token and the peer secret are `Redacted` and never
 * echoed; nothing falls back silently. An `ENGRAM_*` variable that no engram component reads is
 * warned about by name, and so is an agent that advertises no peer URL (a wildcard listen host
 * without `ENGRAM_AGENT_PEER_URL`, its own `ENGRAM_PEERS` entry or `ENGRAM_AGENT_ADVERTISE_HOST`:
 * the coordinator cannot tell a move's source where to reach it, so it takes no make-room move).
 */
import { tmpdir } from "node:os"
import { Payloads, StrictJson } from "@engram/api"
import { Env, Fatal, Main } from "@engram/process"
import { Limits, Names } from "@engram/core"
import type { SimRuntime } from "@engram/runtime"
import { Config, ConfigProvider, Effect, Option, Redacted, Schema } from "effect"
import { type AgentConfig, defaultAgentConfig } from "./Agent.js"
import type { HostAgentOptions } from "./Host.js"
import * as Failover from "./Failover.js"
import { defaultImageFetchMinMibPerSec } from "./ImageFetch.js"
import { HostMeter, layerFixed, measureHost } from "./Measure.js"
import { advertiseHostProblem, listenHostProblem, noPeerUrlWarning, parsePeers, peerHostOf, peersProblem, peerUrlProblem } from "./PeerLink.js"
import { defaultQemuStateDir, type QemuSettings } from "./RuntimeChoice.js"
import * as Templates from "./Templates.js"

/** The configuration is invalid; `issues` names every bad variable. */
export const ConfigInvalid = Env.ConfigInvalid
export type ConfigInvalid = Env.ConfigInvalid

/**
 * A refused configuration as the agent's process ends on it (`main.ts`): the issues in one
 * message (`invalid host agent configuration:` and a line each) and exit code 2, whether the
 * environment's checks refused it (`fromEnvironment`) or `startHostAgent`'s own (`checkedConfig`).
 * Every other failure of `eff` is left as it is.
 */
export const exitOnConfigInvalid = <A, E, R>(eff: Effect.Effect<A, E | ConfigInvalid, R>): Effect.Effect<A, Exclude<E, ConfigInvalid> | Fatal, R> =>
  Effect.mapError(eff, (e) =>
    // Not a ConfigInvalid, `e` is one of the others (TypeScript does not narrow a generic by `instanceof`).
    e instanceof Env.ConfigInvalid ? new Fatal({ message: e.message, exitCode: Main.exitCodes.configuration }) : (e as Exclude<E, ConfigInvalid>),
  )

/** Every variable the agent reads. */
export const variables: readonly string[] = Env.agentVariables

/** Variables whose values are secrets: never echoed. */
export const secretVariables: ReadonlySet<string> = new Set(["ENGRAM_HOST_TOKEN", "ENGRAM_PEER_SECRET"])

type Env_ = Readonly<Record<string, string | undefined>>

const int = (variable: string, min: number) => {
  const rule = `must be an integer >= ${min}`
  return Config.schema(Env.decimalInt(rule).check(Schema.isGreaterThanOrEqualTo(min, { message: rule })), variable)
}
const intUpTo = (variable: string, min: number, max: number, why: string) => {
  // Core's words for a bounded limit (`Limits.boundRule`), so the agent and the coordinator refuse alike.
  const rule = Limits.boundRule("an integer", min, { max, why })
  return Config.schema(Env.decimalInt(rule).check(Schema.isBetween({ minimum: min, maximum: max }, { message: rule })), variable)
}

const dayMs = 24 * 3_600_000

/**
 * The largest value of each of the agent's timing and count settings, with why. Each is many
 * times its default, so only a slip is refused (seconds given as ms twice, digits pasted twice),
 * never a deliberate slow setting; without a bound such a slip was taken and stopped the agent
 * quietly: a retry delay of 10^15 ms, after one failed assignments poll, stopped every command to
 * this host for good while its heartbeats kept it live.
 */
export const settingBounds = {
  // Core's, the coordinator's: the agent must take its coordinator's window.
  heartbeatStaleWindowMs: Limits.bounds.heartbeatStaleWindowMs,
  retryDelayMs: { max: 60_000, why: "a minute: failures in a row back off to 30 times it, and a failed assignments poll takes no command until then" },
  stagingGraceMs: { max: 3_600_000, why: "an hour: a target keeps an unclaimed incoming VM, and its memory, that long" },
  reportRunningAfterMs: { max: 3_600_000, why: "an hour: an in-doubt move's guest runs here uncommitted that long" },
  imageGraceMs: { max: 365 * dayMs, why: "a year" },
  imageFetchDeadlineMs: { max: 7 * dayMs, why: "a week: a resumed session waits pending that long for its image before it boots fresh" },
  maxPreCopyRounds: { max: 100, why: "a move that has not converged in 100 rounds will not" },
  mibPerSec: { max: 102_400, why: "100 GiB/s" },
  simMib: { max: 16 * 1024 * 1024, why: "16 TiB: more than one host holds" },
  simVcpus: { max: 4096, why: "more than one host has" },
} as const

/** An integer setting from `min` to its bound in `settingBounds`. */
const bounded = (variable: string, min: number, bound: { readonly max: number; readonly why: string }) => intUpTo(variable, min, bound.max, bound.why)
const optionalText = (variable: string) => Config.String(variable).pipe(Config.option)

/** A text variable that `problemOf` accepts (undefined) or refuses with its rule. */
const checkedText = (variable: string, problemOf: (s: string) => string | undefined) =>
  Config.schema(Schema.String.check(Schema.makeFilter((s: string) => problemOf(s) ?? true)), variable)

/** The variable of each of the agent's timing settings (`AgentConfig`'s key): a program's `config.<key>`. */
export const timingVariables = {
  heartbeatIntervalMs: "ENGRAM_AGENT_HEARTBEAT_MS",
  reportIntervalMs: "ENGRAM_AGENT_REPORT_MS",
  pollWaitMs: "ENGRAM_AGENT_POLL_WAIT_MS",
  retryDelayMs: "ENGRAM_AGENT_RETRY_MS",
  maxPreCopyRounds: "ENGRAM_AGENT_MAX_PRECOPY_ROUNDS",
  stagingGraceMs: "ENGRAM_AGENT_STAGING_GRACE_MS",
  reportRunningAfterMs: "ENGRAM_AGENT_REPORT_RUNNING_AFTER_MS",
  imageGraceMs: "ENGRAM_AGENT_IMAGE_GRACE_MS",
  imageFetchDeadlineMs: "ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS",
} as const satisfies { readonly [K in keyof AgentConfig]?: string }

/** Each timing setting's own rule: the environment's and a program's (`checkedConfig`). */
const timingSettings = {
  heartbeatIntervalMs: int(timingVariables.heartbeatIntervalMs, 1).pipe(Config.option),
  reportIntervalMs: int(timingVariables.reportIntervalMs, 1).pipe(Config.option),
  pollWaitMs: intUpTo(timingVariables.pollWaitMs, 0, Payloads.maxAssignmentsWaitMs, "the longest the coordinator holds an assignments poll").pipe(Config.option),
  retryDelayMs: bounded(timingVariables.retryDelayMs, 1, settingBounds.retryDelayMs).pipe(Config.option),
  maxPreCopyRounds: bounded(timingVariables.maxPreCopyRounds, 2, settingBounds.maxPreCopyRounds).pipe(Config.option),
  stagingGraceMs: bounded(timingVariables.stagingGraceMs, 1, settingBounds.stagingGraceMs).pipe(Config.option),
  reportRunningAfterMs: bounded(timingVariables.reportRunningAfterMs, 1, settingBounds.reportRunningAfterMs).pipe(Config.option),
  imageGraceMs: bounded(timingVariables.imageGraceMs, 0, settingBounds.imageGraceMs).pipe(Config.option),
  imageFetchDeadlineMs: bounded(timingVariables.imageFetchDeadlineMs, 0, settingBounds.imageFetchDeadlineMs).pipe(Config.option),
}

const staleWindowVariable = "ENGRAM_HEARTBEAT_STALE_WINDOW_MS"
const staleWindow = bounded(staleWindowVariable, 1, settingBounds.heartbeatStaleWindowMs).pipe(Config.withDefault(Limits.defaults.heartbeatStaleWindowMs))

/**
 * Why `ENGRAM_PEER_SECRET` is refused, or undefined (its value is never echoed: `secretVariables`):
 * the rule of every secret setting (`@engram/process`'s `Env.secretProblem`). The secret is the
 * HMAC key of every move token, proof and image token between the fleet's agents, taken byte for
 * byte: whitespace around it makes it another secret than the other agents'.
 */
const peerSecretProblem = (s: string): string | undefined =>
  Env.secretProblem(s, "the other agents' secret differs and every move between them fails with 401")

/**
 * Why `ENGRAM_HOST_TOKEN` is refused, or undefined (its value is never echoed): the rule of every
 * secret setting (`Env.secretProblem`). The coordinator issues a host 43 characters
 * (`engram hosts add`); whitespace around one makes it another token, which the coordinator
 * refuses: the agent would exit blaming a wrong or rotated token.
 */
const hostTokenProblem = (s: string): string | undefined =>
  Env.secretProblem(s, "it is not the token the coordinator issued, which refuses it, and the agent exits blaming a wrong or rotated token")

/**
 * How an issue shows the value of a peer URL setting (`ENGRAM_AGENT_PEER_URL`, `ENGRAM_PEERS`, a
 * program's `peerUrl`): `<hidden>` when it holds an `@` (it may be `user:password@`), as the
 * coordinator's URL settings (`Env.shownUrl`); else with any query or fragment masked
 * (`Failover.redactUrl`, `ENGRAM_COORDINATOR_URL`'s: a token may ride there too).
 */
const shownPeerUrl = (value: unknown): unknown => Env.shownUrl(value, Failover.redactUrl)

/** How an issue shows a variable's value: the URL settings' masked (`shownPeerUrl`, `Failover.redactUrl`), any other as given. */
const shownValue = (variable: string, value: string | undefined): unknown =>
  value === undefined
    ? undefined
    : variable === "ENGRAM_COORDINATOR_URL"
      ? Failover.redactUrl(value)
      : variable === "ENGRAM_PEERS" || variable === "ENGRAM_AGENT_PEER_URL"
        ? shownPeerUrl(value)
        : value

/**
 * Why an `ENGRAM_PEERS` text is refused, or undefined: `PeerLink.peersProblem` (the entries'
 * form, ids and schemes), and no entry's URL with `user:password@`, a query or a fragment. Node's
 * fetch refuses a URL with credentials, so every move to that host would fail at run time, and
 * the URLs are logged (a token in a query would be too). Each named by its host and the rule,
 * its URL masked (`Failover.redactUrl`).
 */
export const peersRuleProblem = (text: string): string | undefined => {
  const form = peersProblem(text)
  if (form !== undefined) return form
  for (const [id, url] of parsePeers(text)) {
    if (url === "") continue
    const parsed = new URL(url)
    if (parsed.username !== "" || parsed.password !== "")
      return `host ${id}'s URL must be without user:password@ (the agents' requests refuse a URL with credentials, and peer URLs are logged); ${JSON.stringify(Failover.redactUrl(url))} has it`
    if (parsed.search !== "" || parsed.hash !== "" || url.includes("?") || url.includes("#"))
      return `host ${id}'s URL must be without a query or fragment (peer URLs are logged); ${JSON.stringify(Failover.redactUrl(url))} has one`
  }
  return undefined
}

/**
 * Each of the simulated runtime's settings (`SimRuntime.SimConfig`, every key: the type makes a
 * new one be listed here), its least value (a speed the runtime divides by (capture, link) at
 * least 0.001 byte per ms, a byte a second: a denormal such as 5e-324 divided to Infinity; every
 * other figure at least 0) and its largest, with why. Each largest is far past any host,
 * so only a slip is refused: without one, any finite figure was taken (a working set of 1e300
 * bytes, a commit of 1e300 ms), and the simulated guest's arithmetic ran to Infinity.
 */
const simTiB = 1024 ** 4
const simRate = { max: 1024 ** 3, why: "1 GiB per ms, about a TiB/s: far past any memory bus or link" }
const simDuration = { max: 3_600_000, why: "an hour" }
const simSettings: { readonly [K in keyof SimRuntime.SimConfig]: { readonly least: ">= 0.001" | ">= 0"; readonly max: number; readonly why: string } } = {
  dirtyBytesPerMs: { least: ">= 0", ...simRate },
  workingSetBytes: { least: ">= 0", max: 16 * simTiB, why: "16 TiB: more RAM than one host holds" },
  captureBytesPerMs: { least: ">= 0.001", ...simRate },
  captureFixedMs: { least: ">= 0", ...simDuration },
  finalCaptureExtraMs: { least: ">= 0", ...simDuration },
  pauseDelayMs: { least: ">= 0", ...simDuration },
  linkBytesPerMs: { least: ">= 0.001", ...simRate },
  fullWireRatio: { least: ">= 0", max: 10, why: "ten wire bytes per byte: a capture sends about its bytes or fewer" },
  roundOverheadBytes: { least: ">= 0", max: 1024 ** 3, why: "1 GiB a round" },
  commitMs: { least: ">= 0", ...simDuration },
  startMs: { least: ">= 0", ...simDuration },
  templateStartMs: { least: ">= 0", ...simDuration },
  guestBusyMs: { least: ">= 0", max: 365 * 24 * 3_600_000, why: "a year" },
}

/**
 * Why `ENGRAM_SIM` is refused, or undefined: a JSON object of the simulated runtime's settings
 * (`simSettings`), each a finite number from its least value to its largest. An unknown key (a typo) would
 * be ignored, and a wrong type would break the runtime's arithmetic, silently: each is named. A
 * key given twice (`{"startMs":-1,"startMs":1}`: `JSON.parse` keeps the last, so which was meant
 * is not known) is refused by the API's rule (`@engram/api`'s `StrictJson.repeatedKey`).
 */
const simProblem = (text: string): string | undefined => {
  let v: unknown
  try {
    v = JSON.parse(text)
  } catch {
    return "must be a JSON object of simulated runtime settings"
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return "must be a JSON object of simulated runtime settings"
  const repeated = StrictJson.repeatedKey(text)
  if (repeated !== undefined) return `setting ${StrictJson.keyName(repeated)} ${StrictJson.repeatedKeyRule}`
  return simSettingsProblem(v)
}

/**
 * Why an object of simulated runtime settings is refused, or undefined (`ENGRAM_SIM`'s, and a
 * program's `sim` option: one rule): each key one of `simSettings`, each value a finite number
 * from its least value to its largest.
 */
export const simSettingsProblem = (v: unknown): string | undefined => {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return "must be an object of simulated runtime settings"
  for (const [key, value] of Object.entries(v) as [string, unknown][]) {
    if (value === undefined) continue
    if (!Object.hasOwn(simSettings, key)) return `${JSON.stringify(key)} is not a simulated runtime setting (${Object.keys(simSettings).join(", ")})`
    const { least, max, why } = simSettings[key as keyof SimRuntime.SimConfig]
    const holds = typeof value === "number" && Number.isFinite(value) && (least === ">= 0.001" ? value >= 0.001 : value >= 0)
    if (!holds) return `setting ${key} must be a number ${least}; ${typeof value === "number" ? String(value) : JSON.stringify(value)} is not`
    if ((value as number) > max) return `setting ${key} must be a number <= ${max} (${why}); ${String(value)} is not`
  }
  return undefined
}

/** The simulated host's size (`ENGRAM_AGENT_MEASURE=fixed`) when not told another. */
const defaultSimHost = { totalMib: 16384, osMib: 1024, vcpus: 8 }

const settings = {
  hostId: checkedText("ENGRAM_HOST_ID", (s) => (Names.isId(s) ? undefined : Names.idRule)),
  urls: checkedText("ENGRAM_COORDINATOR_URL", (s) => {
    const parsed = Failover.parseUrls(s)
    return "urls" in parsed ? undefined : parsed.problem
  }).pipe(
    Config.map((s) => {
      const parsed = Failover.parseUrls(s)
      return "urls" in parsed ? parsed.urls : [s]
    }),
  ),
  hostToken: checkedText("ENGRAM_HOST_TOKEN", hostTokenProblem).pipe(Config.map((s) => Redacted.make(s, { label: "ENGRAM_HOST_TOKEN" }))),
  peerSecret: checkedText("ENGRAM_PEER_SECRET", peerSecretProblem).pipe(Config.map((s) => Redacted.make(s, { label: "ENGRAM_PEER_SECRET" }))),
  staleMs: staleWindow,
  ...timingSettings,
  moveIntent: Config.schema(Schema.Literals(["0", "1"]).annotate({ message: "must be 0 or 1" }), "ENGRAM_AGENT_MOVE_INTENT").pipe(Config.withDefault("0" as const)),
  oldMoveTokens: Config.schema(Schema.Literals(["0", "1"]).annotate({ message: "must be 0 or 1" }), "ENGRAM_AGENT_OLD_MOVE_TOKENS").pipe(Config.withDefault("1" as const)),
  peers: checkedText("ENGRAM_PEERS", peersRuleProblem).pipe(Config.withDefault("")),
  port: intUpTo("ENGRAM_AGENT_PORT", 0, 65535, "a TCP port; 0 takes any free one").pipe(Config.withDefault(7100)),
  // One host, as the migration host is (core's `Names.isHost`): it is written into the agent's peer URL.
  listenHost: checkedText("ENGRAM_AGENT_HOST", listenHostProblem).pipe(Config.withDefault("127.0.0.1")),
  sim: checkedText("ENGRAM_SIM", simProblem).pipe(Config.option),
  measure: Config.schema(Schema.Literals(["proc", "fixed"]).annotate({ message: "must be proc or fixed" }), "ENGRAM_AGENT_MEASURE").pipe(Config.withDefault("proc" as const)),
  simTotalMib: bounded("ENGRAM_SIM_TOTAL_MIB", 1, settingBounds.simMib).pipe(Config.withDefault(defaultSimHost.totalMib)),
  simOsMib: bounded("ENGRAM_SIM_OS_MIB", 0, settingBounds.simMib).pipe(Config.withDefault(defaultSimHost.osMib)),
  simVcpus: bounded("ENGRAM_SIM_VCPUS", 1, settingBounds.simVcpus).pipe(Config.withDefault(defaultSimHost.vcpus)),
  procRoot: Config.String("ENGRAM_AGENT_PROC_ROOT").pipe(Config.withDefault("/proc")),
  sysRoot: Config.String("ENGRAM_AGENT_SYS_ROOT").pipe(Config.withDefault("/sys")),
  stateFile: optionalText("ENGRAM_AGENT_STATE_FILE"),
  imageDir: optionalText("ENGRAM_AGENT_IMAGE_DIR"),
  imageFetchMinMibPerSec: bounded("ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS", 1, settingBounds.mibPerSec).pipe(Config.withDefault(defaultImageFetchMinMibPerSec)),
  // Empty is unset, for each of the optional addresses.
  migrationHost: checkedText("ENGRAM_AGENT_MIGRATION_HOST", (s) => (s === "" ? undefined : listenHostProblem(s))).pipe(Config.option),
  advertiseHost: checkedText("ENGRAM_AGENT_ADVERTISE_HOST", (s) => (s === "" ? undefined : advertiseHostProblem(s))).pipe(Config.option),
  peerUrl: checkedText("ENGRAM_AGENT_PEER_URL", (s) => (s === "" ? undefined : peerUrlProblem(s))).pipe(Config.option),
  templates: checkedText("ENGRAM_AGENT_TEMPLATES", (s) => {
    const parsed = Templates.parse(s)
    return "specs" in parsed ? undefined : parsed.problem
  }).pipe(Config.withDefault("")),
}

/** The runtime's settings (`ENGRAM_RUNTIME` and, for QEMU, `ENGRAM_QEMU_*`). */
const runtimeSettings = {
  runtime: Config.schema(Schema.Literals(["sim", "qemu"]).annotate({ message: "must be sim or qemu" }), "ENGRAM_RUNTIME").pipe(Config.withDefault("sim" as const)),
  qemuStateDir: optionalText("ENGRAM_QEMU_STATE_DIR"),
  qemuKernel: optionalText("ENGRAM_QEMU_KERNEL"),
  qemuInitrd: optionalText("ENGRAM_QEMU_INITRD"),
  qemuAppend: optionalText("ENGRAM_QEMU_APPEND"),
  qemuDisk: optionalText("ENGRAM_QEMU_DISK"),
  qemuDiskFormat: optionalText("ENGRAM_QEMU_DISK_FORMAT"),
  qemuBinary: optionalText("ENGRAM_QEMU_BINARY"),
  qemuAccel: Config.schema(Schema.Literals(["auto", "kvm", "tcg"]).annotate({ message: "must be auto, kvm or tcg" }), "ENGRAM_QEMU_ACCEL").pipe(Config.withDefault("auto" as const)),
  qemuMoveMibPerSec: bounded("ENGRAM_QEMU_MOVE_MIB_S", 1, settingBounds.mibPerSec).pipe(Config.option),
  qemuMemory: Config.schema(Schema.Literals(["file", "anonymous"]).annotate({ message: "must be file or anonymous" }), "ENGRAM_QEMU_MEMORY").pipe(Config.withDefault("file" as const)),
  qemuRamDir: optionalText("ENGRAM_QEMU_RAM_DIR"),
  qemuReadyLine: Config.schema(
    Schema.String.check(
      Schema.makeFilter((s: string) => {
        try {
          new RegExp(s)
          return true
        } catch (e) {
          return `must be a regular expression (${e instanceof Error ? e.message : String(e)})`
        }
      }),
    ),
    "ENGRAM_QEMU_READY_LINE",
  ).pipe(Config.option),
}

/** The QEMU variables, which apply only with `ENGRAM_RUNTIME=qemu`. */
const qemuVariables = Env.agentVariables.filter((v) => v.startsWith("ENGRAM_QEMU_"))

/** A variable's value as an integer, when it is one (its own rule judges it otherwise). */
const integerOf = (env: Env_, v: string): number | undefined => {
  const raw = env[v]
  const n = raw === undefined || raw.trim() === "" ? Number.NaN : Number(raw)
  return Number.isInteger(n) ? n : undefined
}

/** How a path names a variable in an issue: the environment by the variable, a program by its option key. */
type Naming = (variable: string) => string

/**
 * The one rule between a periodic call's interval and the stale window: below it. What a host
 * calling less often suffers, by call: heartbeats, it goes stale between them; reports, it looks
 * silent between them (`Placement.isSilent`) and takes no placements. Null when it holds.
 */
const intervalIssue =
  (what: string) =>
  (intervalMs: number, heartbeatStaleWindowMs: number, name: Naming = (v) => v): string | null =>
    intervalMs < heartbeatStaleWindowMs ? null : `must be less than ${name(staleWindowVariable)} (${heartbeatStaleWindowMs}): a host that ${what}`

/** The heartbeat interval's rule (`intervalIssue`). */
export const heartbeatIssue = intervalIssue("heartbeats less often goes stale between its heartbeats")

/** The report interval's rule (`intervalIssue`). */
export const reportIssue = intervalIssue("reports less often looks silent between its reports and takes no placements")

/** The intervals bound by the stale window: each one's variable, option key and rule. */
const windowBound = [
  { variable: "ENGRAM_AGENT_HEARTBEAT_MS", key: "heartbeatIntervalMs", issue: heartbeatIssue },
  { variable: "ENGRAM_AGENT_REPORT_MS", key: "reportIntervalMs", issue: reportIssue },
] as const

/**
 * The rule between the simulated host's sizes (`ENGRAM_AGENT_MEASURE=fixed`): the system's share
 * is part of the host, so it cannot be larger than it. Null when it holds.
 */
export const simOsIssue = (osMib: number, totalMib: number): string | null =>
  osMib <= totalMib ? null : `must be at most ENGRAM_SIM_TOTAL_MIB (${totalMib}): the system's share is part of the simulated host`

/** The simulated host's sizes, which apply only with `ENGRAM_AGENT_MEASURE=fixed`. */
const simHostVariables = ["ENGRAM_SIM_TOTAL_MIB", "ENGRAM_SIM_OS_MIB", "ENGRAM_SIM_VCPUS"] as const

/** The rules between the timing and sizing variables, each judged when its variables hold their own rules. */
const timingIssues = (env: Env_): Env.Issue[] => {
  const issues: Env.Issue[] = []
  const orDefault = (v: string, fallback: number) => (env[v] === undefined || env[v] === "" ? fallback : integerOf(env, v))
  const windowMs = orDefault(staleWindowVariable, Limits.defaults.heartbeatStaleWindowMs)
  for (const b of windowBound) {
    const unset = env[b.variable] === undefined || env[b.variable] === ""
    // Unset, the interval is its default (a third of the window, at least 1 ms), judged here too:
    // below a window of 1 ms none is, and it was named by its option key when the start judged it.
    const ms = unset ? (windowMs === undefined || windowMs < 1 ? undefined : defaultAgentConfig("", windowMs)[b.key]) : integerOf(env, b.variable)
    const rule = ms === undefined || windowMs === undefined || windowMs < 1 ? null : b.issue(ms, windowMs)
    if (rule !== null) issues.push(unset ? { variable: b.variable, rule: `${rule} (unset, it is ${ms})` } : { variable: b.variable, rule, value: env[b.variable] })
  }
  const measure = env["ENGRAM_AGENT_MEASURE"] === undefined || env["ENGRAM_AGENT_MEASURE"] === "" ? "proc" : env["ENGRAM_AGENT_MEASURE"]
  // Measured from /proc, the simulated host's sizes are unused: refused, as ENGRAM_SIM is outside
  // ENGRAM_RUNTIME=sim, not ignored (they apply with either runtime).
  if (measure === "proc") {
    for (const v of simHostVariables) if (env[v] !== undefined && env[v] !== "") issues.push({ variable: v, rule: "applies only with ENGRAM_AGENT_MEASURE=fixed", value: env[v] })
  }
  if (measure === "fixed") {
    const osMib = orDefault("ENGRAM_SIM_OS_MIB", defaultSimHost.osMib)
    const totalMib = orDefault("ENGRAM_SIM_TOTAL_MIB", defaultSimHost.totalMib)
    // Judged only when each holds its own range.
    const inRange = (mib: number | undefined, min: number): mib is number => mib !== undefined && mib >= min && mib <= settingBounds.simMib.max
    const sizes = inRange(osMib, 0) && inRange(totalMib, 1) ? simOsIssue(osMib, totalMib) : null
    const given = env["ENGRAM_SIM_OS_MIB"] !== undefined && env["ENGRAM_SIM_OS_MIB"] !== ""
    if (sizes !== null) issues.push(given ? { variable: "ENGRAM_SIM_OS_MIB", rule: sizes, value: env["ENGRAM_SIM_OS_MIB"] } : { variable: "ENGRAM_SIM_OS_MIB", rule: `${sizes} (unset, it is ${osMib})` })
  }
  return issues
}

/** The rules between the runtime's variables. */
const runtimeIssues = (env: Env_): Env.Issue[] => {
  const set = (v: string) => env[v] !== undefined && env[v] !== ""
  const issues: Env.Issue[] = []
  const runtime = set("ENGRAM_RUNTIME") ? env["ENGRAM_RUNTIME"] : "sim"
  if (runtime === "sim") {
    for (const v of qemuVariables) if (set(v)) issues.push({ variable: v, rule: "applies only with ENGRAM_RUNTIME=qemu", value: env[v] })
    return issues
  }
  if (runtime !== "qemu") return issues
  if (set("ENGRAM_SIM")) issues.push({ variable: "ENGRAM_SIM", rule: "applies only with ENGRAM_RUNTIME=sim", value: env["ENGRAM_SIM"] })
  if (set("ENGRAM_QEMU_DISK") && set("ENGRAM_QEMU_KERNEL")) issues.push({ variable: "ENGRAM_QEMU_DISK", rule: "cannot be set with ENGRAM_QEMU_KERNEL (a guest boots one or the other)", value: env["ENGRAM_QEMU_DISK"] })
  if (set("ENGRAM_QEMU_INITRD") && !set("ENGRAM_QEMU_KERNEL")) issues.push({ variable: "ENGRAM_QEMU_INITRD", rule: "needs ENGRAM_QEMU_KERNEL", value: env["ENGRAM_QEMU_INITRD"] })
  if (set("ENGRAM_QEMU_APPEND") && set("ENGRAM_QEMU_DISK")) issues.push({ variable: "ENGRAM_QEMU_APPEND", rule: "applies to a kernel boot, not to ENGRAM_QEMU_DISK", value: env["ENGRAM_QEMU_APPEND"] })
  if (set("ENGRAM_QEMU_DISK_FORMAT") && !set("ENGRAM_QEMU_DISK")) issues.push({ variable: "ENGRAM_QEMU_DISK_FORMAT", rule: "needs ENGRAM_QEMU_DISK", value: env["ENGRAM_QEMU_DISK_FORMAT"] })
  if (set("ENGRAM_QEMU_RAM_DIR") && env["ENGRAM_QEMU_MEMORY"] === "anonymous") issues.push({ variable: "ENGRAM_QEMU_RAM_DIR", rule: "applies to ENGRAM_QEMU_MEMORY=file (RAM files), not anonymous", value: env["ENGRAM_QEMU_RAM_DIR"] })
  if (!set("ENGRAM_QEMU_KERNEL") && !set("ENGRAM_QEMU_DISK")) {
    issues.push({ variable: "ENGRAM_QEMU_KERNEL", rule: "or ENGRAM_QEMU_DISK is required with ENGRAM_RUNTIME=qemu (the guest every VM boots)" })
  }
  return issues
}

const given = <A>(o: Option.Option<A>): { readonly value: A } | undefined => (Option.isSome(o) ? { value: o.value } : undefined)
const text = (o: Option.Option<string>) => (Option.isSome(o) && o.value !== "" ? o.value : undefined)

/** The rules between variables (each variable's own rule is its Config's). */
const crossIssues = (env: Env_): Env.Issue[] => [...timingIssues(env), ...runtimeIssues(env)]

/** Reads `configs` and checks the rules between variables (`cross`); every problem at once. */
const readAll = <A extends Record<string, unknown>>(env: Env_, configs: { readonly [K in keyof A]: Config.Config<A[K]> }, cross: (env: Env_) => Env.Issue[]) =>
  Effect.gen(function* () {
    const envRecord: Record<string, string | undefined> = { ...env }
    const read = yield* Env.read<A>("host agent", configs, { provider: ConfigProvider.fromEnvRecord(envRecord), raw: (v) => shownValue(v, env[v]), secrets: secretVariables }).pipe(Effect.result)
    const crossed = cross(env)
    if (read._tag === "Failure" || crossed.length > 0) {
      return yield* new Env.ConfigInvalid({ component: "host agent", issues: [...(read._tag === "Failure" ? read.failure.issues : []), ...crossed] })
    }
    return read.success
  })

type RuntimeValues = { readonly [K in keyof typeof runtimeSettings]: Config.Success<(typeof runtimeSettings)[K]> }

/** The QEMU settings of the values read; undefined for the simulated runtime. */
const qemuOf = (s: RuntimeValues, hostId: string, stateFile: string | undefined): QemuSettings | undefined => {
  if (s.runtime !== "qemu") return undefined
  const kernel = text(s.qemuKernel)
  const disk = text(s.qemuDisk)
  const append = text(s.qemuAppend)
  const initrd = text(s.qemuInitrd)
  const format = text(s.qemuDiskFormat)
  const binary = text(s.qemuBinary)
  const ramDir = text(s.qemuRamDir)
  const readyLine = text(s.qemuReadyLine)
  return {
    stateDir: text(s.qemuStateDir) ?? defaultQemuStateDir(hostId, stateFile, tmpdir()),
    memory: s.qemuMemory,
    ...(ramDir === undefined ? {} : { ramDir }),
    ...(readyLine === undefined ? {} : { readyLine: new RegExp(readyLine) }),
    // crossIssues guarantees one of the two.
    boot:
      kernel !== undefined
        ? { kind: "kernel", kernel, ...(initrd === undefined ? {} : { initrd }), ...(append === undefined ? {} : { append }) }
        : { kind: "disk", disk: disk ?? "", ...(format === undefined ? {} : { format }) },
    accelerator: s.qemuAccel,
    ...(binary === undefined ? {} : { binary }),
    ...(Option.isSome(s.qemuMoveMibPerSec) ? { moveBandwidthBytesPerSec: s.qemuMoveMibPerSec.value * 1024 * 1024 } : {}),
  }
}

/**
 * The runtime of an agent from `env` (`ENGRAM_RUNTIME`, `ENGRAM_QEMU_*`): `qemu` set for QEMU,
 * absent for the simulated runtime. For the demo, which runs its agents in one process.
 */
export const runtimeFromEnvironment = (env: Env_, hostId: string, stateFile: string | undefined): Effect.Effect<{ readonly qemu?: QemuSettings }, Env.ConfigInvalid> =>
  Effect.map(readAll<RuntimeValues>(env, runtimeSettings, runtimeIssues), (s) => {
    const qemu = qemuOf(s, hostId, stateFile)
    return qemu === undefined ? {} : { qemu }
  })

/** A program's option key for each variable it can set (`config.<key>` for the agent's timing). */
const optionKeyOf: Readonly<Record<string, string>> = {
  [staleWindowVariable]: "heartbeatStaleWindowMs",
  ...Object.fromEntries(Object.entries(timingVariables).map(([k, v]) => [v, `config.${k}`])),
}
const byOptionKey: Naming = (variable) => optionKeyOf[variable] ?? variable

/**
 * The agent's configuration of a program's options (`startHostAgent`): the defaults (the
 * heartbeat interval a third of `heartbeatStaleWindowMs`), then `o.config`, through the same
 * checks as the environment's (each timing setting's range, the heartbeat interval below the
 * stale window, the templates' rules, `peerUrl`'s, and `peerSecret`'s: `ENGRAM_PEER_SECRET`'s
 * rule, its value never echoed), every issue at once, named by option key
 * (`config.heartbeatIntervalMs`); an unknown key or a null is refused, an undefined one keeps its default.
 */
export const checkedConfig = (
  o: Pick<HostAgentOptions, "hostId" | "config" | "heartbeatStaleWindowMs" | "peerUrl" | "sim"> & { readonly peerSecret?: HostAgentOptions["peerSecret"] },
): Effect.Effect<AgentConfig, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    const raw: Record<string, unknown> = {}
    // What each variable was given, for the issues (a null as null).
    const shown: Record<string, unknown> = {}
    const refused: Env.Issue[] = []
    const variableOf: Readonly<Record<string, string>> = timingVariables
    const give = (variable: string, value: unknown) => {
      // A null is never a default here: refused with the setting's own rule (NaN breaks every one).
      raw[variable] = value === null ? Number.NaN : value
      shown[variable] = value
    }
    const window: unknown = o.heartbeatStaleWindowMs
    if (window !== undefined) give(staleWindowVariable, window)
    for (const [key, value] of Object.entries(o.config ?? {}) as [string, unknown][]) {
      const variable = variableOf[key]
      // Null is image removal's own default (off), not a value to refuse.
      if (value === undefined || key === "hostId" || (key === "imageGraceMs" && value === null)) continue
      // A whole `AgentConfig` (the environment's, as `engram agent` passes it) carries the window
      // too: taken unless the option's own `heartbeatStaleWindowMs` is given.
      if (key === "heartbeatStaleWindowMs") {
        if (window === undefined) give(staleWindowVariable, value)
      } else if (variable !== undefined) give(variable, value)
      else if (key === "moveIntent" || key === "oldMoveTokens") {
        if (typeof value !== "boolean") refused.push({ variable: `config.${key}`, rule: "must be true or false", value })
      } else if (key === "templates") {
        const problem = Templates.specsProblem(value)
        if (problem !== undefined) refused.push({ variable: "config.templates", rule: problem })
      } else refused.push({ variable: `config.${key}`, rule: "is not a known setting" })
    }
    const peerUrl: unknown = o.peerUrl
    if (peerUrl !== undefined && peerUrl !== null) {
      const problem = typeof peerUrl === "string" ? peerUrlProblem(peerUrl) : "must be a string or null"
      if (problem !== undefined) refused.push({ variable: "peerUrl", rule: problem, value: shownPeerUrl(peerUrl) })
    }
    // A program's simulated runtime settings by `ENGRAM_SIM`'s rule (a denormal speed divided to Infinity).
    if (o.sim !== undefined) {
      const problem = simSettingsProblem(o.sim)
      if (problem !== undefined) refused.push({ variable: "sim", rule: problem })
    }
    // A program's secret by the environment's rule (`peerSecretProblem`), never echoed.
    const peerSecret: unknown = o.peerSecret
    if (peerSecret !== undefined) {
      const problem = typeof peerSecret === "string" ? peerSecretProblem(peerSecret) : "must be a string"
      if (problem !== undefined) refused.push({ variable: "peerSecret", rule: problem })
    }
    const source = { provider: ConfigProvider.fromUnknown(raw), raw: (v: string) => shown[v], secrets: secretVariables }
    const read = yield* Effect.result(Env.read("host agent", { staleMs: staleWindow, ...timingSettings }, source))
    const issues: Env.Issue[] = [...refused, ...(read._tag === "Failure" ? read.failure.issues.map((i) => ({ ...i, variable: byOptionKey(i.variable) })) : [])]
    // The rule between each interval and the window, judged whenever both held their own rules, whatever the others'.
    const windowMs = yield* Effect.result(staleWindow.parse(source.provider))
    for (const b of windowBound) {
      const ms = yield* Effect.result(timingSettings[b.key].parse(source.provider))
      if (windowMs._tag !== "Success" || ms._tag !== "Success") continue
      // Unset, the interval is its default (a third of the window, at least 1 ms): judged too (below a window of 1 ms none is).
      const value = given(ms.success)
      const ruleMs = value?.value ?? defaultAgentConfig(o.hostId, windowMs.success)[b.key]
      const rule = b.issue(ruleMs, windowMs.success, byOptionKey)
      if (rule !== null) issues.push(value === undefined ? { variable: `config.${b.key}`, rule: `${rule} (unset, it is ${ruleMs})` } : { variable: `config.${b.key}`, rule, value: value.value })
    }
    if (issues.length > 0 || read._tag === "Failure") return yield* new Env.ConfigInvalid({ component: "host agent", issues })
    return { ...defaultAgentConfig(o.hostId, read.success.staleMs), ...o.config, hostId: o.hostId }
  })

/** Reads `HostAgentOptions` from `env` (default `process.env`); every problem is reported at once. */
export const fromEnvironment = (env: Env_ = process.env): Effect.Effect<HostAgentOptions, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    for (const u of Env.unknown(env)) yield* Effect.logWarning(Env.unknownMessage(u), { variable: u.variable, didYouMean: u.didYouMean })
    const s = yield* readAll(env, { ...settings, ...runtimeSettings }, crossIssues)
    const base = defaultAgentConfig(s.hostId, s.staleMs)
    const config: AgentConfig = {
      ...base,
      heartbeatIntervalMs: given(s.heartbeatIntervalMs)?.value ?? base.heartbeatIntervalMs,
      reportIntervalMs: given(s.reportIntervalMs)?.value ?? base.reportIntervalMs,
      pollWaitMs: given(s.pollWaitMs)?.value ?? base.pollWaitMs,
      retryDelayMs: given(s.retryDelayMs)?.value ?? base.retryDelayMs,
      maxPreCopyRounds: given(s.maxPreCopyRounds)?.value ?? base.maxPreCopyRounds,
      stagingGraceMs: given(s.stagingGraceMs)?.value ?? base.stagingGraceMs,
      reportRunningAfterMs: given(s.reportRunningAfterMs)?.value ?? base.reportRunningAfterMs,
      imageGraceMs: given(s.imageGraceMs)?.value ?? base.imageGraceMs,
      imageFetchDeadlineMs: given(s.imageFetchDeadlineMs)?.value ?? base.imageFetchDeadlineMs,
      moveIntent: s.moveIntent === "1",
      oldMoveTokens: s.oldMoveTokens === "1",
      templates: (() => {
        const parsed = Templates.parse(s.templates)
        return "specs" in parsed ? parsed.specs : []
      })(),
    }
    const peers = parsePeers(s.peers)
    const sim = Option.isSome(s.sim) ? (JSON.parse(s.sim.value) as Partial<SimRuntime.SimConfig>) : {}
    const qemu = qemuOf(s, s.hostId, text(s.stateFile))
    const migrationHost = text(s.migrationHost) ?? s.listenHost
    const advertiseHost = text(s.advertiseHost)
    const peerUrl = text(s.peerUrl)
    // Moves are on by default (the coordinator's ENGRAM_MAKE_ROOM_MOVES): an agent that cannot be found for one says so once, at start.
    // Told none, the agent advertises its own ENGRAM_PEERS entry before deriving one (`Host`); one
    // that breaks the rule is named by the agent itself at start, with what it advertises instead.
    const ownEntry = peers.get(s.hostId)
    const unfound = ownEntry !== undefined && ownEntry !== "" ? null : noPeerUrlWarning(peerUrl, peerHostOf(s.listenHost, advertiseHost))
    if (unfound !== null) yield* Effect.logWarning(unfound, { hostId: s.hostId, variable: "ENGRAM_AGENT_PEER_URL" })
    const fixed = { totalMib: s.simTotalMib, osMib: s.simOsMib, vcpus: s.simVcpus }
    const roots = { proc: s.procRoot, sys: s.sysRoot }
    const measure: HostAgentOptions["measure"] =
      s.measure === "fixed" ? (mib) => HostMeter.use((m) => m.measure(mib)).pipe(Effect.provide(layerFixed(fixed))) : (mib) => measureHost(roots, mib)
    return {
      hostId: s.hostId,
      heartbeatStaleWindowMs: s.staleMs,
      // One URL stays a string (as given); several are replicas (Failover).
      coordinator: { url: s.urls.length === 1 ? s.urls[0]! : s.urls, hostToken: s.hostToken },
      peerSecret: Redacted.value(s.peerSecret),
      peers: (id: string) => peers.get(id),
      listen: { port: s.port, host: s.listenHost, ...(advertiseHost === undefined ? {} : { advertiseHost }) },
      // Unset: derived from the peer server's address once it listens (`Host`).
      ...(peerUrl === undefined ? {} : { peerUrl }),
      // Unset, the advertised one is derived once the peer URL is known (`PeerLink.migrationAdvertiseHostOf`).
      migration: { listenHost: migrationHost, ...(advertiseHost === undefined ? {} : { advertiseHost }) },
      sim,
      ...(qemu === undefined ? {} : { qemu }),
      measure,
      config,
      ...(Option.isSome(s.stateFile) ? { stateFile: s.stateFile.value } : {}),
      ...(Option.isSome(s.imageDir) ? { imageDir: s.imageDir.value } : {}),
      imageFetchMinMibPerSec: s.imageFetchMinMibPerSec,
    } satisfies HostAgentOptions
  })
