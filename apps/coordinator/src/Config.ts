/**
 * The coordinator's configuration: environment variables, optionally under a JSON file
 * (`ENGRAM_CONFIG_FILE`, keys are the variable names; the environment wins), validated at
 * start. Every bad value is reported with its variable and the rule it broke; the limits
 * are checked by core `Limits.make`, so the words match the agent's and the simulator's.
 */
import { Limits } from "@engram/core"
import { Data, Effect } from "effect"
import { readFileSync } from "node:fs"
import { isAbsolute, resolve } from "node:path"

/** The validated configuration. */
export interface CoordinatorConfig {
  /** TCP port; 0 = any free port. */
  readonly port: number
  readonly host: string
  /** Where PGlite keeps its files and where a generated admin token is written. */
  readonly dataDir: string
  /** PostgreSQL URL; null = embedded PGlite under `dataDir`. */
  readonly databaseUrl: string | null
  /** The admin token; null = read or generate `<dataDir>/admin-token`. */
  readonly adminToken: string | null
  readonly limits: Limits.Limits
  /** How long `POST /v1/sessions/{id}/move` waits for the source agent before aborting the move. */
  readonly moveTimeoutMs: number
  /** How often a long-poll re-reads the store when other replicas may change it (PostgreSQL). */
  readonly storePollMs: number
  /**
   * On PostgreSQL, how old a fleet read a placement may reuse (ms; 0 = a fresh read each time).
   * Safe at any age: core decides on the read and the write applies only if the chosen host is
   * unchanged since; "no room" is only concluded on a fresh read.
   */
  readonly placementReadMaxAgeMs: number
}

/** One refused setting. */
export interface ConfigIssue {
  readonly variable: string
  readonly rule: string
  readonly value: unknown
}

/** The configuration is invalid; `issues` names every bad variable. */
export class ConfigInvalid extends Data.TaggedError("ConfigInvalid")<{ readonly issues: readonly ConfigIssue[] }> {
  override get message(): string {
    return `invalid configuration:\n${this.issues.map((i) => `  ${i.variable}=${JSON.stringify(i.value)}: ${i.rule}`).join("\n")}`
  }
}

/** The limit each variable sets. */
export const limitVariables: { readonly [V: string]: keyof Limits.Limits } = {
  ENGRAM_CPU_OVERCOMMIT: "cpuOvercommit",
  ENGRAM_MEM_OVERCOMMIT_RATIO: "memOvercommitRatio",
  ENGRAM_SYSTEM_RESERVE_MIB: "systemReserveMib",
  ENGRAM_MAX_ENTRIES_PER_NODE: "maxEntriesPerNode",
  ENGRAM_REQUIRE_MEASURED: "requireMeasured",
  ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "heartbeatStaleWindowMs",
  ENGRAM_PARK_HARD_TTL_MS: "parkHardTtlMs",
  ENGRAM_COMMIT_ALLOWANCE_MS: "commitAllowanceMs",
  ENGRAM_REAPER_INTERVAL_MS: "reaperIntervalMs",
}

const otherVariables = [
  "ENGRAM_PORT",
  "ENGRAM_HOST",
  "ENGRAM_DATA_DIR",
  "ENGRAM_DATABASE_URL",
  "ENGRAM_ADMIN_TOKEN",
  "ENGRAM_MOVE_TIMEOUT_MS",
  "ENGRAM_STORE_POLL_MS",
  "ENGRAM_PLACEMENT_READ_MAX_AGE_MS",
] as const

/** Every variable the coordinator reads (besides `ENGRAM_CONFIG_FILE`). */
export const variables: readonly string[] = [...otherVariables, ...Object.keys(limitVariables)]

type Raw = Readonly<Record<string, unknown>>

/** Variables whose values are secrets (a database URL may hold a password): never echoed. */
const secretVariables: ReadonlySet<string> = new Set(["ENGRAM_ADMIN_TOKEN", "ENGRAM_DATABASE_URL"])
const hidden = "<hidden>"

/**
 * Where a relative `dataDir` lives. pnpm sets `INIT_CWD` to the directory it was run from, and
 * runs a package's script in the package's directory; so under `pnpm start` at the repository
 * root a relative data dir (the default `./.engram`) is the root's, not `apps/coordinator`'s.
 * Without `INIT_CWD` (plain `node`/`tsx`) it stays relative to the working directory.
 */
export const resolveDataDir = (dataDir: string, env: Readonly<Record<string, string | undefined>>): string => {
  const base = env["INIT_CWD"]
  return isAbsolute(dataDir) || base === undefined || base === "" ? dataDir : resolve(base, dataDir)
}

const present = (v: unknown): boolean => v !== undefined && v !== null && v !== ""

// Environment values are strings; a JSON file may hold numbers and booleans already.
const toNumber = (v: unknown): unknown => {
  if (typeof v !== "string") return v
  const t = v.trim()
  return t !== "" && Number.isFinite(Number(t)) ? Number(t) : v
}
const toBoolean = (v: unknown): unknown => {
  if (typeof v !== "string") return v
  const t = v.trim().toLowerCase()
  return t === "true" || t === "1" ? true : t === "false" || t === "0" ? false : v
}

/** Validates raw settings (variable name → value). Pure: no environment, no files. */
export const parse = (raw: Raw): { readonly _tag: "Valid"; readonly config: CoordinatorConfig } | { readonly _tag: "Invalid"; readonly issues: readonly ConfigIssue[] } => {
  const issues: ConfigIssue[] = []
  const int = (variable: string, fallback: number, min: number, max: number): number => {
    const value = raw[variable]
    if (!present(value)) return fallback
    const n = toNumber(value)
    if (typeof n !== "number" || !Number.isInteger(n) || n < min || n > max) {
      issues.push({ variable, rule: `must be an integer from ${min} to ${max}`, value })
      return fallback
    }
    return n
  }
  const str = (variable: string): string | null => {
    const value = raw[variable]
    if (!present(value)) return null
    if (typeof value !== "string") {
      issues.push({ variable, rule: "must be a string", value: secretVariables.has(variable) ? hidden : value })
      return null
    }
    return value
  }

  const port = int("ENGRAM_PORT", 7070, 0, 65535)
  const host = str("ENGRAM_HOST") ?? "127.0.0.1"
  const dataDir = str("ENGRAM_DATA_DIR") ?? "./.engram"
  const databaseUrl = str("ENGRAM_DATABASE_URL")
  if (databaseUrl !== null && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    issues.push({ variable: "ENGRAM_DATABASE_URL", rule: "must be a postgres:// or postgresql:// URL", value: hidden })
  }
  const adminToken = str("ENGRAM_ADMIN_TOKEN")
  if (adminToken !== null && adminToken.length < 16) {
    // Never echo a secret, not even a bad one.
    issues.push({ variable: "ENGRAM_ADMIN_TOKEN", rule: "must be at least 16 characters", value: hidden })
  }
  const moveTimeoutMs = int("ENGRAM_MOVE_TIMEOUT_MS", 120_000, 1, 3_600_000)
  const storePollMs = int("ENGRAM_STORE_POLL_MS", 500, 10, 60_000)
  const placementReadMaxAgeMs = int("ENGRAM_PLACEMENT_READ_MAX_AGE_MS", 100, 0, 60_000)

  const overrides: Record<string, unknown> = {}
  for (const [variable, field] of Object.entries(limitVariables)) {
    const value = raw[variable]
    if (!present(value)) continue
    overrides[field] = field === "requireMeasured" ? toBoolean(value) : toNumber(value)
  }
  const made = Limits.make(overrides)
  let limits = Limits.defaults
  if (made._tag === "Invalid") {
    const byField = Object.fromEntries(Object.entries(limitVariables).map(([v, f]) => [f, v]))
    for (const i of made.issues) issues.push({ variable: byField[i.field] ?? String(i.field), rule: i.rule, value: raw[byField[i.field] ?? ""] })
  } else {
    limits = made.limits
  }

  if (issues.length > 0) return { _tag: "Invalid", issues }
  return { _tag: "Valid", config: { port, host, dataDir, databaseUrl, adminToken, limits, moveTimeoutMs, storePollMs, placementReadMaxAgeMs } }
}

/** The defaults: what `parse({})` gives. */
export const defaults = (): CoordinatorConfig => {
  const r = parse({})
  if (r._tag === "Invalid") throw new Error("unreachable: the defaults are valid")
  return r.config
}

/**
 * Reads the configuration from `env` (default `process.env`) and the JSON file named by
 * `ENGRAM_CONFIG_FILE`, if any. Unknown keys in the file are refused (a typo never keeps a default).
 * A relative data dir is resolved against `INIT_CWD` when pnpm set it (`resolveDataDir`).
 */
export const fromEnvironment = (env: Readonly<Record<string, string | undefined>> = process.env): Effect.Effect<CoordinatorConfig, ConfigInvalid> =>
  Effect.gen(function* () {
    let fileValues: Record<string, unknown> = {}
    const file = env["ENGRAM_CONFIG_FILE"]
    if (file !== undefined && file !== "") {
      const read = yield* Effect.try({
        try: () => JSON.parse(readFileSync(file, "utf8")) as unknown,
        catch: (e) => new ConfigInvalid({ issues: [{ variable: "ENGRAM_CONFIG_FILE", rule: `must name a readable JSON file (${e instanceof Error ? e.message : String(e)})`, value: file }] }),
      })
      if (typeof read !== "object" || read === null || Array.isArray(read)) {
        return yield* new ConfigInvalid({ issues: [{ variable: "ENGRAM_CONFIG_FILE", rule: "must hold a JSON object of ENGRAM_* settings", value: file }] })
      }
      const unknown = Object.keys(read).filter((k) => !variables.includes(k))
      if (unknown.length > 0) {
        // Not echoed: a misspelt key may hold a secret (ENGRAM_ADMIN_TOKN).
        return yield* new ConfigInvalid({ issues: unknown.map((k) => ({ variable: k, rule: `is not a known setting (in ${file})`, value: hidden })) })
      }
      fileValues = read as Record<string, unknown>
    }
    const raw: Record<string, unknown> = { ...fileValues }
    for (const v of variables) if (present(env[v])) raw[v] = env[v]
    const r = parse(raw)
    if (r._tag === "Invalid") return yield* new ConfigInvalid({ issues: r.issues })
    return { ...r.config, dataDir: resolveDataDir(r.config.dataDir, env) }
  })
