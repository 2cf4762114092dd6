/**
 * The `ENGRAM_*` settings of every engram process, read through effect `Config`: each
 * component lists its variables here (so one process can tell a misspelt variable from
 * another component's), `read` evaluates a component's configs and reports every refusal at
 * once in one format (`VARIABLE="value": rule`, secrets shown as `<hidden>`), and `unknown`
 * names the `ENGRAM_*` variables that no component reads.
 */
import { Names } from "@engram/core"
import { Data, Effect, Schema, SchemaIssue } from "effect"
import type { Config, ConfigProvider } from "effect"

/** The coordinator's variables (apps/coordinator, README "Configuration"). */
export const coordinatorVariables = [
  "ENGRAM_CONFIG_FILE",
  "ENGRAM_PORT",
  "ENGRAM_HOST",
  "ENGRAM_DATA_DIR",
  "ENGRAM_DATABASE_URL",
  "ENGRAM_ADMIN_TOKEN",
  "ENGRAM_METRICS_TOKEN",
  "ENGRAM_MAX_BODY_BYTES",
  "ENGRAM_MOVE_TIMEOUT_MS",
  "ENGRAM_CHANGES_CHECK_MS",
  "ENGRAM_MAX_WAITS_PER_HOST_TOKEN",
  "ENGRAM_MAX_WAITS_PER_ADMIN_TOKEN",
  "ENGRAM_MAX_WAITS",
  "ENGRAM_PLACEMENT_READ_MAX_AGE_MS",
  "ENGRAM_STORE_TIMEOUT_MS",
  "ENGRAM_STORE_POOL_SIZE",
  "ENGRAM_PROBE_TIMEOUT_MS",
  "ENGRAM_HTTP_KEEP_ALIVE_MS",
  "ENGRAM_MAX_CONNECTIONS",
  "ENGRAM_SHUTDOWN_DELAY_MS",
  "ENGRAM_PLACEMENT_BATCH_SIZE",
  "ENGRAM_PLACEMENT_BATCH_WINDOW_US",
  "ENGRAM_PLACEMENT_SPREAD",
  "ENGRAM_PGLITE_WORKER",
  "ENGRAM_PLACEMENT_FORWARD",
  "ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS",
  "ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS",
  "ENGRAM_PEER_URL",
  "ENGRAM_BEAT_WINDOW_MS",
  "ENGRAM_LEASE_DURATION_MS",
  "ENGRAM_LEASE_RENEW_DEADLINE_MS",
  "ENGRAM_LEADER_STEP_DOWN_PASSES",
  "ENGRAM_MAKE_ROOM_MOVES",
  "ENGRAM_MAKE_ROOM_MOVES_PER_PASS",
  "ENGRAM_RESERVE_GROUPS",
  "ENGRAM_RESERVE_LEAD_PER_CLASS",
  "ENGRAM_RESERVE_SLOW_CLASS",
  "ENGRAM_RESERVE_SLOW_CLASS_QUANTILE",
  "ENGRAM_MAKE_ROOM_COOLDOWN_MS",
  "ENGRAM_RETENTION_MS",
  "ENGRAM_RETENTION_PRUNE_LIMIT",
  "ENGRAM_RECLAIM_GRACE_MS",
  "ENGRAM_CPU_OVERCOMMIT",
  "ENGRAM_MEM_OVERCOMMIT_RATIO",
  "ENGRAM_SYSTEM_RESERVE_MIB",
  "ENGRAM_MAX_ENTRIES_PER_NODE",
  "ENGRAM_REQUIRE_MEASURED",
  "ENGRAM_HEARTBEAT_STALE_WINDOW_MS",
  "ENGRAM_PARK_HARD_TTL_MS",
  "ENGRAM_COMMIT_ALLOWANCE_MS",
  "ENGRAM_ALLOWANCE_HORIZON_MS",
  "ENGRAM_REAPER_INTERVAL_MS",
  "ENGRAM_OTLP_URL",
  "ENGRAM_OTLP_HEADERS",
] as const

/** The host agent's variables (apps/host-agent, README "Configuration"). */
export const agentVariables = [
  "ENGRAM_HOST_ID",
  "ENGRAM_COORDINATOR_URL",
  "ENGRAM_HOST_TOKEN",
  "ENGRAM_PEER_SECRET",
  "ENGRAM_PEERS",
  "ENGRAM_HEARTBEAT_STALE_WINDOW_MS",
  "ENGRAM_AGENT_HEARTBEAT_MS",
  "ENGRAM_AGENT_REPORT_MS",
  "ENGRAM_AGENT_POLL_WAIT_MS",
  "ENGRAM_AGENT_RETRY_MS",
  "ENGRAM_AGENT_MAX_PRECOPY_ROUNDS",
  "ENGRAM_AGENT_STAGING_GRACE_MS",
  "ENGRAM_AGENT_REPORT_RUNNING_AFTER_MS",
  "ENGRAM_AGENT_MOVE_INTENT",
  "ENGRAM_AGENT_OLD_MOVE_TOKENS",
  "ENGRAM_AGENT_PORT",
  "ENGRAM_AGENT_HOST",
  "ENGRAM_AGENT_STATE_FILE",
  "ENGRAM_AGENT_IMAGE_DIR",
  "ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS",
  "ENGRAM_AGENT_IMAGE_GRACE_MS",
  "ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS",
  "ENGRAM_AGENT_MEASURE",
  "ENGRAM_AGENT_PROC_ROOT",
  "ENGRAM_AGENT_SYS_ROOT",
  "ENGRAM_AGENT_TEMPLATES",
  "ENGRAM_SIM",
  "ENGRAM_SIM_TOTAL_MIB",
  "ENGRAM_SIM_OS_MIB",
  "ENGRAM_SIM_VCPUS",
  "ENGRAM_AGENT_MIGRATION_HOST",
  "ENGRAM_AGENT_ADVERTISE_HOST",
  "ENGRAM_AGENT_PEER_URL",
  "ENGRAM_RUNTIME",
  "ENGRAM_QEMU_STATE_DIR",
  "ENGRAM_QEMU_KERNEL",
  "ENGRAM_QEMU_INITRD",
  "ENGRAM_QEMU_APPEND",
  "ENGRAM_QEMU_DISK",
  "ENGRAM_QEMU_DISK_FORMAT",
  "ENGRAM_QEMU_BINARY",
  "ENGRAM_QEMU_ACCEL",
  "ENGRAM_QEMU_MOVE_MIB_S",
  "ENGRAM_QEMU_MEMORY",
  "ENGRAM_QEMU_RAM_DIR",
  "ENGRAM_QEMU_READY_LINE",
] as const

/** The demo fleet's variables (`pnpm start`). */
export const demoVariables = [
  "ENGRAM_COORDINATOR_URL",
  "ENGRAM_PORT",
  "ENGRAM_DATA_DIR",
  "ENGRAM_ADMIN_TOKEN",
  "ENGRAM_ADMIN_TOKEN_FILE",
  "ENGRAM_DEMO_STATE_DIR",
  "ENGRAM_DEMO_TOUR",
  "ENGRAM_TOUR_VERBOSE",
  // The test guest's (tooling/guest), which the demo's QEMU hosts boot unless told otherwise.
  "ENGRAM_GUEST_CACHE",
  "ENGRAM_GUEST_KERNEL",
  "ENGRAM_GUEST_BUSYBOX",
] as const

/** Variables of the clients and of logging (read by every process that has them). */
export const sharedVariables = ["ENGRAM_URL", "ENGRAM_TOKEN", "ENGRAM_TIMEOUT_MS", "ENGRAM_LOG_FORMAT", "ENGRAM_LOG_LEVEL"] as const

/** Variables of the repository's tests and benchmarks. */
export const developmentVariables = [
  "ENGRAM_TEST_DATABASE_URL",
  "ENGRAM_TEST_PG_URL",
  "ENGRAM_TEST_PG_DEBUG",
  "ENGRAM_TEST_PG_TMPDIR",
  "ENGRAM_PG_BIN_DIR",
  "ENGRAM_BENCH_DATABASE_URL",
] as const

/** Every `ENGRAM_*` variable some engram component reads. */
export const knownVariables: ReadonlySet<string> = new Set<string>([
  ...coordinatorVariables,
  ...agentVariables,
  ...demoVariables,
  ...sharedVariables,
  ...developmentVariables,
])

/** One refused setting: the variable, the rule it broke and what it held (`<hidden>` for a secret). */
export interface Issue {
  readonly variable: string
  readonly rule: string
  readonly value?: unknown
}

/**
 * A variable's integer, by core's one rule for integers read from text (`Names.decimalInt`), read
 * as a number whose `rule` every refusal words.
 */
export const decimalInt = (rule: string) =>
  Schema.String.check(Schema.isPattern(Names.decimalInt, { message: rule })).pipe(
    Schema.decodeTo(Schema.NumberFromString.annotate({ message: rule })),
    Schema.check(Schema.isInt({ message: rule })),
  )

/**
 * The entries of a variable holding a comma-separated `key=value` list, as written
 * (`ENGRAM_PEERS`, OpenTelemetry's headers): each part trimmed, blank ones left out, split at its
 * first `=` into `key` and `value` (each trimmed); `eq` below 1: no key before an `=`.
 */
export const keyValues = (text: string): { readonly part: string; readonly eq: number; readonly key: string; readonly value: string }[] =>
  text
    .split(",")
    .map((raw) => raw.trim())
    .filter((part) => part !== "")
    .map((part) => {
      const eq = part.indexOf("=")
      return { part, eq, key: part.slice(0, eq).trim(), value: part.slice(eq + 1).trim() }
    })

/** How one issue reads: `ENGRAM_PORT="70000": must be an integer from 0 to 65535`. */
export const formatIssue = (i: Issue): string => `${i.variable}${i.value === undefined ? "" : `=${JSON.stringify(i.value)}`}: ${i.rule}`

/** The configuration is invalid; `issues` names every bad variable, all at once. */
export class ConfigInvalid extends Data.TaggedError("ConfigInvalid")<{ readonly component: string; readonly issues: readonly Issue[] }> {
  override get message(): string {
    return `invalid ${this.component} configuration:\n${this.issues.map((i) => `  ${formatIssue(i)}`).join("\n")}`
  }
}

/** What a secret's value shows as in an issue. */
export const hidden = "<hidden>"

/**
 * How an issue shows the value of a URL setting: `<hidden>` ({@link hidden}) when it holds an `@`
 * (it may be `user:password@`, a parsed URL's or not), else through `masked` (`@engram/api`'s
 * `Urls.redact` masks a query or fragment, where a token may ride too; as given without it). The
 * coordinator's URL settings and the host agent's (`ENGRAM_AGENT_PEER_URL`, `ENGRAM_PEERS`, a
 * program's `peerUrl`).
 */
export const shownUrl = (value: unknown, masked: (url: string) => string = (url) => url): unknown =>
  typeof value !== "string" ? value : value.includes("@") ? hidden : masked(value)

/** The fewest characters a secret setting may hold (a token, a key). */
export const minSecretLength = 16

/**
 * Why a secret setting (`ENGRAM_ADMIN_TOKEN`, `ENGRAM_METRICS_TOKEN`, `ENGRAM_PEER_SECRET`) is
 * refused, or undefined: at least {@link minSecretLength} characters, not whitespace only, no
 * whitespace before or after it. A secret is taken byte for byte, and whitespace around it (a
 * newline copied from a file, a blank pasted with it) makes it another secret than the one its
 * peers and clients hold, so every call fails at run time with 401 instead of at start. Refused,
 * not trimmed: trimming one process's would part it from those that keep the same whitespace.
 * A secret of whitespace only is none. `whatFails` says what fails with the whitespace kept (it
 * ends the rule's words); the value is never in them.
 */
export const secretProblem = (s: string, whatFails: string): string | undefined =>
  s.length < minSecretLength
    ? `must be at least ${minSecretLength} characters`
    : s.trim() === ""
      ? "must not be whitespace only"
      : s.trim() !== s
        ? `must not begin or end with whitespace (a newline copied from a file: ${whatFails})`
        : undefined

/** Where `read` takes values from, and how it shows them in an issue. */
export interface Source {
  readonly provider: ConfigProvider.ConfigProvider
  /** The raw value of a variable, to echo in an issue (undefined = absent). */
  readonly raw: (variable: string) => unknown
  /** Variables whose values are never echoed. */
  readonly secrets: ReadonlySet<string>
}

const formatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** The issues of one failed config; `fallback` names the variable when the error has no path. */
const issuesOf = (error: Config.ConfigError, fallback: string, source: Source): Issue[] => {
  const show = (variable: string): unknown => {
    const value = source.raw(variable)
    return value === undefined || value === "" ? undefined : source.secrets.has(variable) ? hidden : value
  }
  if (error.cause._tag === "SourceError") return [{ variable: fallback, rule: `cannot be read (${error.cause.message})` }]
  return formatter(error.cause.issue).issues.map((i) => {
    const head = i.path?.[0]
    const variable = typeof head === "string" ? head : fallback
    const value = show(variable)
    // A config without a default that found nothing: the schema saw `undefined`.
    const rule = value === undefined && /^Expected string$|^Missing key$/.test(i.message) ? "is required" : i.message
    return value === undefined ? { variable, rule } : { variable, rule, value }
  })
}

/**
 * Reads every config of `configs` (keyed by the variable it reads, for the issues of a config
 * that names none) from `source`, and answers them all or every issue at once.
 */
export const read = <A extends Record<string, unknown>>(
  component: string,
  configs: { readonly [K in keyof A]: Config.Config<A[K]> },
  source: Source,
): Effect.Effect<A, ConfigInvalid> =>
  Effect.gen(function* () {
    const out: Record<string, unknown> = {}
    const issues: Issue[] = []
    for (const [key, config] of Object.entries(configs) as [string, Config.Config<unknown>][]) {
      const r = yield* Effect.result(config.parse(source.provider))
      if (r._tag === "Success") out[key] = r.success
      else issues.push(...issuesOf(r.failure, key, source))
    }
    if (issues.length > 0) return yield* new ConfigInvalid({ component, issues })
    return out as A
  })

/** The Levenshtein distance of two names, for "did you mean". */
const distance = (a: string, b: string): number => {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const row = [i]
    for (let j = 1; j <= b.length; j++) {
      row[j] = Math.min((prev[j] ?? 0) + 1, (row[j - 1] ?? 0) + 1, (prev[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1))
    }
    prev = row
  }
  return prev[b.length] ?? 0
}

/** An `ENGRAM_*` variable no component reads, and the known one it most likely meant. */
export interface Unknown {
  readonly variable: string
  readonly didYouMean: string | null
}

/**
 * The `ENGRAM_*` variables of `env` that no engram component reads (a misspelling keeps a
 * default silently otherwise), each with the nearest of `candidates` (default every known one).
 */
export const unknown = (env: Readonly<Record<string, string | undefined>>, candidates: Iterable<string> = knownVariables): readonly Unknown[] => {
  const names = [...candidates]
  return Object.keys(env)
    .filter((k) => k.startsWith("ENGRAM_") && env[k] !== undefined && !knownVariables.has(k))
    .sort()
    .map((variable) => {
      let best: string | null = null
      let bestDistance = 4
      for (const n of names) {
        const d = distance(variable, n)
        if (d < bestDistance) [best, bestDistance] = [n, d]
      }
      return { variable, didYouMean: best }
    })
}

/** The warning line for an unknown variable. */
export const unknownMessage = (u: Unknown): string =>
  `${u.variable} is not a setting of any engram component and is ignored${u.didYouMean === null ? "" : ` (did you mean ${u.didYouMean}?)`}`
