/**
 * The coordinator's configuration, read through effect `Config` from the environment and,
 * optionally, a JSON file under it (`ENGRAM_CONFIG_FILE`, keys are the variable names; the
 * environment wins). Every bad value is reported at start, all at once, with its variable and
 * the rule it broke (`@engram/process`'s `Env` format); secrets are `Redacted` and never echoed;
 * the limits are checked by core `Limits.make`, so the words match the agent's and the
 * simulator's. An `ENGRAM_*` variable that no engram component reads is warned about by name.
 */
import { Env } from "@engram/process"
import { Downtime, Limits, MakeRoom, Reclaim } from "@engram/core"
import { checkLeaseTimes, defaultLeaseTimes, Validate } from "@engram/store"
import { Config, ConfigProvider, Effect, Option, Redacted, Schema } from "effect"
import { readFileSync } from "node:fs"
import { isAbsolute, resolve } from "node:path"

/** The validated configuration. */
export interface CoordinatorConfig {
  /** TCP port; 0 = any free port. */
  readonly port: number
  readonly host: string
  /** Where PGlite keeps its files and where a generated admin token is written. */
  readonly dataDir: string
  /** PostgreSQL URL (it may hold a password); null = embedded PGlite under `dataDir`. */
  readonly databaseUrl: Redacted.Redacted<string> | null
  /** The admin token; null = read or generate `<dataDir>/admin-token`. */
  readonly adminToken: Redacted.Redacted<string> | null
  /** A token that may read `/metrics` only; null = none (the admin and host tokens still may). */
  readonly metricsToken: Redacted.Redacted<string> | null
  /** The largest request body accepted; a larger one is refused with 413 while it streams in. */
  readonly maxBodyBytes: number
  readonly limits: Limits.Limits
  /**
   * How old a commit may be and still count in the move guard's commit allowance (ms; SPEC §13):
   * a pair refused before any pause makes no commit, so without an end its old slow commits
   * would refuse its tight-budget moves for ever.
   */
  readonly allowanceHorizonMs: number
  /**
   * How long a move waits for its source agent to take it past its point of no return before it
   * is aborted: `POST /v1/sessions/{id}/move`'s wait, and the reaper's moves for starving
   * sessions (`makeRoomMoves`, which never begins one whose estimated pre-copy runs past half of
   * this). The leader's reaper also aborts any pending move twice this old, whoever began it
   * (a replica that died with its timeouts), with `makeRoomMoves` on or off.
   */
  readonly moveTimeoutMs: number
  /**
   * On PostgreSQL, how often each replica checks its change listener (a statement on the
   * listening connection) and which replicas listen: a replica gone without a clean leave may
   * have died between a write and its notice, so every waiter re-reads once.
   */
  readonly changesCheckMs: number
  /** The most long-polls (assignments, session waits) one host token may hold open at once. */
  readonly maxWaitsPerHostToken: number
  /** The most long-polls the admin token may hold open at once (every tool using it shares them). */
  readonly maxWaitsPerAdminToken: number
  /** The most long-polls this replica holds open at once. */
  readonly maxWaits: number
  /**
   * On PostgreSQL, how old a fleet read a placement may reuse (ms; 0 = a fresh read each time).
   * Safe at any age: core decides on the read and the write applies only if the chosen host is
   * unchanged since; "no room" is only concluded on a fresh read.
   */
  readonly placementReadMaxAgeMs: number
  /**
   * The bound on every store call (ms): a call the database has not answered by then (it is
   * away, or a link to it hangs) answers 503 with `Retry-After`. On PostgreSQL it is also the
   * connect timeout and the server's `statement_timeout` and `idle_in_transaction_session_timeout`.
   */
  readonly storeTimeoutMs: number
  /** Group placement: at most this many concurrent creates placed by one statement (1 = one by one). */
  readonly placementBatchSize: number
  /**
   * On PostgreSQL, 1: replicas spread their creates, each ranking its own share of the hosts
   * first among those that fit (they stop choosing the same host at once); 0: every replica
   * ranks every host alike.
   */
  readonly placementSpread: number
  /** On the embedded store, 1: PGlite's engine runs in a worker thread (beside the HTTP server's event loop); 0: in the main thread. */
  readonly pgliteWorker: number
  /** Group placement: how long (µs of real time) a batch of creates gathers after its first create. */
  readonly placementBatchWindowUs: number
  /** On PostgreSQL with the spread, 1: the window grows with the square of the replicas placing (R² × the window). */
  readonly placementWindowByReplicas: number
  /**
   * On PostgreSQL, 1: a replica that does not hold the reaper's lease forwards its creates, in
   * batches, to the replica that does (the placer), so one replica's groups place them all;
   * 0: every replica places its own creates.
   */
  readonly placementForward: number
  /** How long (ms) a forwarded batch may go unanswered before its creates are placed here instead. */
  readonly placementForwardTimeoutMs: number
  /**
   * The address other replicas reach this one at for forwarded creates (`http://host:port`);
   * null: this replica's listen address (the host name when it listens on every interface).
   */
  readonly peerUrl: string | null
  /**
   * Heartbeats and host reports from many agents are written in groups: how long (ms of real
   * time) a group gathers after its first one (0 = only what arrives together).
   */
  readonly beatWindowMs: number
  /** On PostgreSQL, the reaper's lease: taken over by another replica once unrenewed this long (ms). */
  readonly leaseDurationMs: number
  /** How long the leader goes on acting after its last renewal (ms; less than the lease). */
  readonly leaseRenewDeadlineMs: number
  /**
   * 1: the reaper moves running sessions off a starving session's held host when its parks
   * cannot make the room and the room exists elsewhere (core's `MakeRoom`, the simulator's
   * `--moves`); 0: it waits for them to leave.
   */
  readonly makeRoomMoves: number
  /** At most this many moves begun by one reaper pass for starving sessions (`makeRoomMoves`). */
  readonly makeRoomMovesPerPass: number
  /**
   * How long a move that ended aborted (refused by its source's guard, timed out) keeps the
   * reaper from moving its session again, to any target (ms; core's `MakeRoom.cooling`).
   */
  readonly makeRoomCooldownMs: number
  /**
   * How long history is kept after it ended (ms; 0 keeps it for ever): the reaper's leader
   * deletes ended sessions with their events, ended moves and host pairs with no commit for this
   * long (`Store.pruneHistory`), a bounded chunk a pass. At least the allowance horizon and the
   * make-room cooldown, whose reads need the history within them.
   */
  readonly retentionMs: number
  /** At most this many rows of each kind one reaper pass deletes (`retentionMs`). */
  readonly retentionPruneLimit: number
  /**
   * The failover grace (ms; Nomad's `failover_heartbeat_ttl`): the reaper reclaims no stale
   * reservation until it has reached the store as leader this long without a gap (from a
   * leadership's first pass, and after a gap in its contacts with the store), and the start-up
   * reconcile reclaims only expired ones; so hosts that could not heartbeat while the coordinator
   * side was down renew before anything stale is reclaimed. Default the heartbeat stale window;
   * 0: no grace; else at least a third of the window (`reclaimGraceIssue`).
   */
  readonly reclaimGraceMs: number
  /** An OpenTelemetry collector's OTLP/HTTP base URL (`http://collector:4318`): traces go to `…/v1/traces`; null = no traces. */
  readonly otlpUrl: string | null
  /** Headers the collector needs (`key=value,key2=value2`, e.g. an API key); a secret. */
  readonly otlpHeaders: Redacted.Redacted<string> | null
}

/** What a program may pass for a secret: the text, or it already redacted. */
export type SecretInput = string | Redacted.Redacted<string> | null

/** Settings a program passes (`startCoordinator({config})`): secrets as text or redacted. */
export type CoordinatorConfigInput = Partial<Omit<CoordinatorConfig, "databaseUrl" | "adminToken" | "metricsToken" | "otlpHeaders">> & {
  readonly databaseUrl?: SecretInput
  readonly adminToken?: SecretInput
  readonly metricsToken?: SecretInput
  readonly otlpHeaders?: SecretInput
}

/** One refused setting. */
export type ConfigIssue = Env.Issue

/** The configuration is invalid; `issues` names every bad variable. */
export const ConfigInvalid = Env.ConfigInvalid
export type ConfigInvalid = Env.ConfigInvalid

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

/** Every variable the coordinator reads (`ENGRAM_CONFIG_FILE` included). */
export const variables: readonly string[] = Env.coordinatorVariables

/** Variables whose values are secrets (a database URL may hold a password): never echoed. */
export const secretVariables: ReadonlySet<string> = new Set(["ENGRAM_ADMIN_TOKEN", "ENGRAM_METRICS_TOKEN", "ENGRAM_DATABASE_URL", "ENGRAM_OTLP_HEADERS"])

/** The default bound on a store call: 15 s (well above a store call under load; a database that is away answers 503 past it). */
export const defaultStoreTimeoutMs = 15_000

/** The default retention of history (`ENGRAM_RETENTION_MS`): 7 days. */
export const defaultRetentionMs = 7 * 24 * 3_600_000

/** The longest retention: 10 years (0 keeps history for ever). */
const maxRetentionMs = 3650 * 24 * 3_600_000

/**
 * The retention's rule beside the windows that read history: 0 (off), or at least the allowance
 * horizon and the make-room cooldown (a shorter one would delete the commits and aborts they
 * count). Null when it holds.
 */
export const retentionIssue = (c: Pick<CoordinatorConfig, "retentionMs" | "allowanceHorizonMs" | "makeRoomCooldownMs">): string | null =>
  c.retentionMs === 0 || (c.retentionMs >= c.allowanceHorizonMs && c.retentionMs >= c.makeRoomCooldownMs)
    ? null
    : `must be 0 (keep history for ever) or at least ENGRAM_ALLOWANCE_HORIZON_MS (${c.allowanceHorizonMs}) and ENGRAM_MAKE_ROOM_COOLDOWN_MS (${c.makeRoomCooldownMs})`

/**
 * Why the failover grace is refused: one shorter than the agents' heartbeat interval (core's
 * `Reclaim.minGraceMs`, a third of `ENGRAM_HEARTBEAT_STALE_WINDOW_MS`) ends before a live host's
 * next heartbeat lands, so it protects nothing; 0 (no grace) says so. Null when it holds.
 */
export const reclaimGraceIssue = (reclaimGraceMs: number, heartbeatStaleWindowMs: number): string | null =>
  reclaimGraceMs === 0 || reclaimGraceMs >= Reclaim.minGraceMs(heartbeatStaleWindowMs)
    ? null
    : `must be 0 (no grace) or at least a third of ENGRAM_HEARTBEAT_STALE_WINDOW_MS (${Reclaim.minGraceMs(heartbeatStaleWindowMs)}, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat`

/** The longest failover grace (`ENGRAM_RECLAIM_GRACE_MS`): a day. */
export const maxReclaimGraceMs = 24 * 3_600_000

// `ENGRAM_RECLAIM_GRACE_MS` unset: the heartbeat stale window, known once the limits are read.
const graceFromStaleWindow = -1

/** The default request body limit: 1 MiB. */
export const defaultMaxBodyBytes = 1024 * 1024

// ---------------------------------------------------------------------------------------------
// The settings, one Config each
// ---------------------------------------------------------------------------------------------

const int = (variable: string, fallback: number, min: number, max: number) => {
  const rule = `must be an integer from ${min} to ${max}`
  return Config.schema(
    Schema.NumberFromString.annotate({ message: rule }).check(Schema.isInt({ message: rule }), Schema.isBetween({ minimum: min, maximum: max }, { message: rule })),
    variable,
  ).pipe(Config.withDefault(fallback))
}

const text = (variable: string, fallback: string) => Config.String(variable).pipe(Config.withDefault(fallback))

const secret = (variable: string, check: Schema.Codec<string, string>) =>
  Config.schema(check, variable).pipe(
    Config.map((s): Redacted.Redacted<string> | null => Redacted.make(s, { label: variable })),
    Config.withDefault(null),
  )

const settings = {
  port: int("ENGRAM_PORT", 7070, 0, 65535),
  host: text("ENGRAM_HOST", "127.0.0.1"),
  dataDir: text("ENGRAM_DATA_DIR", "./.engram"),
  databaseUrl: secret("ENGRAM_DATABASE_URL", Schema.String.check(Schema.isPattern(/^postgres(ql)?:\/\//, { message: "must be a postgres:// or postgresql:// URL" }))),
  adminToken: secret("ENGRAM_ADMIN_TOKEN", Schema.String.check(Schema.isMinLength(16, { message: "must be at least 16 characters" }))),
  metricsToken: secret("ENGRAM_METRICS_TOKEN", Schema.String.check(Schema.isMinLength(16, { message: "must be at least 16 characters" }))),
  maxBodyBytes: int("ENGRAM_MAX_BODY_BYTES", defaultMaxBodyBytes, 1024, 1024 * 1024 * 1024),
  moveTimeoutMs: int("ENGRAM_MOVE_TIMEOUT_MS", 120_000, 1, 3_600_000),
  allowanceHorizonMs: int("ENGRAM_ALLOWANCE_HORIZON_MS", Downtime.defaultRecencyPolicy.horizonMs, 1000, 7 * 24 * 3_600_000),
  changesCheckMs: int("ENGRAM_CHANGES_CHECK_MS", 2000, 100, 60_000),
  maxWaitsPerHostToken: int("ENGRAM_MAX_WAITS_PER_HOST_TOKEN", 4, 1, 1000),
  maxWaitsPerAdminToken: int("ENGRAM_MAX_WAITS_PER_ADMIN_TOKEN", 5000, 1, 1_000_000),
  maxWaits: int("ENGRAM_MAX_WAITS", 20_000, 1, 1_000_000),
  placementReadMaxAgeMs: int("ENGRAM_PLACEMENT_READ_MAX_AGE_MS", 100, 0, 60_000),
  storeTimeoutMs: int("ENGRAM_STORE_TIMEOUT_MS", defaultStoreTimeoutMs, 100, 600_000),
  placementBatchSize: int("ENGRAM_PLACEMENT_BATCH_SIZE", 64, 1, 1000),
  placementSpread: int("ENGRAM_PLACEMENT_SPREAD", 1, 0, 1),
  pgliteWorker: int("ENGRAM_PGLITE_WORKER", 1, 0, 1),
  placementBatchWindowUs: int("ENGRAM_PLACEMENT_BATCH_WINDOW_US", 200, 0, 100_000),
  placementWindowByReplicas: int("ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS", 0, 0, 1),
  placementForward: int("ENGRAM_PLACEMENT_FORWARD", 0, 0, 1),
  placementForwardTimeoutMs: int("ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS", 1000, 10, 60_000),
  peerUrl: Config.schema(Schema.String.check(Schema.isPattern(/^https?:\/\/[^\s/]+\/?$/, { message: "must be an http:// or https:// URL of this replica, without a path (http://10.0.0.5:7070)" })), "ENGRAM_PEER_URL").pipe(
    Config.map((u): string | null => u.replace(/\/$/, "")),
    Config.withDefault(null),
  ),
  beatWindowMs: int("ENGRAM_BEAT_WINDOW_MS", 100, 0, 10_000),
  leaseDurationMs: int("ENGRAM_LEASE_DURATION_MS", defaultLeaseTimes.leaseDurationMs, 100, 3_600_000),
  leaseRenewDeadlineMs: int("ENGRAM_LEASE_RENEW_DEADLINE_MS", defaultLeaseTimes.renewDeadlineMs, 50, 3_600_000),
  makeRoomMoves: int("ENGRAM_MAKE_ROOM_MOVES", 0, 0, 1),
  makeRoomMovesPerPass: int("ENGRAM_MAKE_ROOM_MOVES_PER_PASS", 16, 1, 1000),
  makeRoomCooldownMs: int("ENGRAM_MAKE_ROOM_COOLDOWN_MS", MakeRoom.defaultCooldownMs, 0, 7 * 24 * 3_600_000),
  retentionMs: int("ENGRAM_RETENTION_MS", defaultRetentionMs, 0, maxRetentionMs),
  retentionPruneLimit: int("ENGRAM_RETENTION_PRUNE_LIMIT", 1000, 1, Validate.maxPruneLimit),
  reclaimGraceMs: int("ENGRAM_RECLAIM_GRACE_MS", graceFromStaleWindow, 0, maxReclaimGraceMs),
  otlpUrl: Config.schema(Schema.String.check(Schema.isPattern(/^https?:\/\/[^\s]+$/, { message: "must be an http:// or https:// URL (the collector's OTLP/HTTP address, e.g. http://localhost:4318)" })), "ENGRAM_OTLP_URL").pipe(
    Config.map((u): string | null => u),
    Config.withDefault(null),
  ),
  otlpHeaders: secret("ENGRAM_OTLP_HEADERS", Schema.String.check(Schema.isPattern(/^\s*[^=,\s]+\s*=[^,]*(,\s*[^=,\s]+\s*=[^,]*)*\s*$/, { message: "must be key=value pairs separated by commas" }))),
}

// The limits are read as text and judged by core `Limits.make`, whose words every component shares.
const limitTexts = Config.all(Object.fromEntries(Object.keys(limitVariables).map((v) => [v, Config.String(v).pipe(Config.option)])))

const toNumber = (t: string): unknown => (t.trim() !== "" && Number.isFinite(Number(t.trim())) ? Number(t.trim()) : t)
const toBoolean = (t: string): unknown => {
  const v = t.trim().toLowerCase()
  return v === "true" || v === "1" ? true : v === "false" || v === "0" ? false : t
}

/** Reads and checks every setting from `source`: all of them, or every issue at once. */
const load = (source: Env.Source): Effect.Effect<CoordinatorConfig, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    const base = yield* Effect.result(Env.read("coordinator", settings, source))
    const texts = yield* Effect.orDie(limitTexts.parse(source.provider))
    const overrides: Record<string, unknown> = {}
    for (const [variable, field] of Object.entries(limitVariables)) {
      const t = texts[variable]
      if (t !== undefined && Option.isSome(t)) overrides[field] = field === "requireMeasured" ? toBoolean(t.value) : toNumber(t.value)
    }
    const made = Limits.make(overrides)
    const byField = Object.fromEntries(Object.entries(limitVariables).map(([v, f]) => [f, v]))
    const issues: Env.Issue[] = [
      ...(base._tag === "Failure" ? base.failure.issues : []),
      ...(made._tag === "Invalid"
        ? made.issues.map((i) => {
            const variable = byField[i.field] ?? String(i.field)
            return { variable, rule: i.rule, value: source.raw(variable) }
          })
        : []),
    ]
    const lease = base._tag === "Success" ? checkLeaseTimes({ leaseDurationMs: base.success.leaseDurationMs, renewDeadlineMs: base.success.leaseRenewDeadlineMs }) : null
    if (lease !== null)
      issues.push({ variable: "ENGRAM_LEASE_RENEW_DEADLINE_MS", rule: "must be less than ENGRAM_LEASE_DURATION_MS", value: source.raw("ENGRAM_LEASE_RENEW_DEADLINE_MS") })
    const retention = base._tag === "Success" ? retentionIssue(base.success) : null
    if (retention !== null) issues.push({ variable: "ENGRAM_RETENTION_MS", rule: retention, value: source.raw("ENGRAM_RETENTION_MS") })
    const reclaimGraceMs =
      base._tag === "Success" && made._tag === "Valid"
        ? base.success.reclaimGraceMs === graceFromStaleWindow
          ? made.limits.heartbeatStaleWindowMs
          : base.success.reclaimGraceMs
        : null
    const grace = reclaimGraceMs !== null && made._tag === "Valid" ? reclaimGraceIssue(reclaimGraceMs, made.limits.heartbeatStaleWindowMs) : null
    if (grace !== null) issues.push({ variable: "ENGRAM_RECLAIM_GRACE_MS", rule: grace, value: source.raw("ENGRAM_RECLAIM_GRACE_MS") })
    if (base._tag === "Failure" || made._tag === "Invalid" || reclaimGraceMs === null || lease !== null || retention !== null || grace !== null)
      return yield* new Env.ConfigInvalid({ component: "coordinator", issues })
    return { ...base.success, limits: made.limits, reclaimGraceMs }
  })

/** Validates raw settings (variable name → value, as a JSON file holds them). Pure: no environment, no files. */
export const parse = (
  raw: Readonly<Record<string, unknown>>,
): { readonly _tag: "Valid"; readonly config: CoordinatorConfig } | { readonly _tag: "Invalid"; readonly issues: readonly ConfigIssue[] } => {
  const r = Effect.runSync(Effect.result(load({ provider: ConfigProvider.fromUnknown(raw), raw: (v) => raw[v], secrets: secretVariables })))
  return r._tag === "Success" ? { _tag: "Valid", config: r.success } : { _tag: "Invalid", issues: r.failure.issues }
}

/** The defaults: what `parse({})` gives. */
export const defaults = (): CoordinatorConfig => {
  const r = parse({})
  if (r._tag === "Invalid") throw new Error("unreachable: the defaults are valid")
  return r.config
}

/** A program's settings over the defaults, secrets redacted. */
export const fromInput = (input: CoordinatorConfigInput = {}): CoordinatorConfig => {
  const redact = (s: SecretInput | undefined, fallback: Redacted.Redacted<string> | null) =>
    s === undefined ? fallback : s === null ? null : Redacted.isRedacted(s) ? s : Redacted.make(s)
  const d = defaults()
  return {
    ...d,
    ...input,
    // Unset: the stale window of these limits (`ENGRAM_RECLAIM_GRACE_MS`'s default).
    reclaimGraceMs: input.reclaimGraceMs ?? input.limits?.heartbeatStaleWindowMs ?? d.reclaimGraceMs,
    databaseUrl: redact(input.databaseUrl, d.databaseUrl),
    adminToken: redact(input.adminToken, d.adminToken),
    metricsToken: redact(input.metricsToken, d.metricsToken),
    otlpHeaders: redact(input.otlpHeaders, d.otlpHeaders),
  }
}

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

/**
 * Reads the configuration from `env` (default `process.env`) and the JSON file named by
 * `ENGRAM_CONFIG_FILE`, if any. Unknown keys in the file are refused (a typo never keeps a
 * default); an unknown `ENGRAM_*` variable in the environment is logged as a warning. A
 * relative data dir is resolved against `INIT_CWD` when pnpm set it (`resolveDataDir`).
 */
export const fromEnvironment = (env: Readonly<Record<string, string | undefined>> = process.env): Effect.Effect<CoordinatorConfig, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    const invalid = (issues: Env.Issue[]) => new Env.ConfigInvalid({ component: "coordinator", issues })
    let file: Record<string, unknown> = {}
    const fileIssues: Env.Issue[] = []
    const path = env["ENGRAM_CONFIG_FILE"]
    if (path !== undefined && path !== "") {
      const read = yield* Effect.try({
        try: () => JSON.parse(readFileSync(path, "utf8")) as unknown,
        catch: (e) => invalid([{ variable: "ENGRAM_CONFIG_FILE", rule: `must name a readable JSON file (${e instanceof Error ? e.message : String(e)})`, value: path }]),
      })
      if (typeof read !== "object" || read === null || Array.isArray(read)) {
        return yield* invalid([{ variable: "ENGRAM_CONFIG_FILE", rule: "must hold a JSON object of ENGRAM_* settings", value: path }])
      }
      const unknownKeys = Object.keys(read).filter((k) => !variables.includes(k) || k === "ENGRAM_CONFIG_FILE")
      // Not echoed: a misspelt key may hold a secret (ENGRAM_ADMIN_TOKN).
      fileIssues.push(...unknownKeys.map((k) => ({ variable: k, rule: `is not a known setting (in ${path})`, value: Env.hidden })))
      file = Object.fromEntries(Object.entries(read).filter(([k]) => !unknownKeys.includes(k)))
    }
    for (const u of Env.unknown(env)) yield* Effect.logWarning(Env.unknownMessage(u), { variable: u.variable, didYouMean: u.didYouMean })
    const envRecord: Record<string, string | undefined> = { ...env }
    const provider = ConfigProvider.orElse(ConfigProvider.fromEnvRecord(envRecord), ConfigProvider.fromUnknown(file))
    const raw = (v: string) => (env[v] !== undefined && env[v] !== "" ? env[v] : file[v])
    const loaded = yield* Effect.result(load({ provider, raw, secrets: secretVariables }))
    // Every problem at once: the file's unknown keys beside the values' issues.
    const issues = [...fileIssues, ...(loaded._tag === "Failure" ? loaded.failure.issues : [])]
    if (loaded._tag === "Failure" || issues.length > 0) return yield* invalid(issues)
    return { ...loaded.success, dataDir: resolveDataDir(loaded.success.dataDir, env) }
  })
