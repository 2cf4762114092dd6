/**
 * The coordinator's configuration, read through effect `Config` from the environment and,
 * optionally, a JSON file under it (`ENGRAM_CONFIG_FILE`, keys are the variable names; the
 * environment wins). Every bad value is reported at start, all at once, with its variable and
 * the rule it broke (`@engram/process`'s `Env` format); secrets are `Redacted` and never echoed;
 * the limits are checked by core `Limits.make`, so the words match the agent's and the
 * simulator's. An `ENGRAM_*` variable that no engram component reads is warned about by name.
 * A program's settings (`fromInput`, `startCoordinator({ config })`) go through the same checks,
 * each named by its key (`limits.<field>` for a limit); the rules between settings are
 * `crossFieldIssues`, the one place every path checks them.
 */
import { Urls } from "@engram/api"
import { Env } from "@engram/process"
import { Downtime, Limits, MakeRoom, Move, Names, ParkPolicy, Reclaim } from "@engram/core"
import { checkLeaseTimes, defaultLeaseTimes, Validate } from "@engram/store"
import { StorePg } from "@engram/store-pg"
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
   * The bound on each store call (ms; a request of several calls can take longer): a call the
   * database has not answered by then (it is away, or a link to it hangs) answers 503 with
   * `Retry-After`. On PostgreSQL it is also the
   * connect timeout and the server's `statement_timeout` and `idle_in_transaction_session_timeout`.
   */
  readonly storeTimeoutMs: number
  /**
   * On PostgreSQL, the connections of this replica's store pool (opened as the load needs them).
   * The replica holds two more: the lease's and the change listener's (`connectionsPerReplica`).
   */
  readonly storePoolSize: number
  /**
   * The bound on the probes' store reads (ms): `/readyz` answers 503 when the store did not
   * answer its readiness check by then, and `/metrics` serves without the store's figures
   * (`engram_store_up` 0) past it. Short, as probes and scrapes time out long before a store call.
   */
  readonly probeTimeoutMs: number
  /**
   * How long an idle kept-alive HTTP connection stays open (ms): above the idle timeout of every
   * client and proxy in front of the coordinator, so they close an idle connection first (a
   * request sent as the server closes it fails). 95 s covers nginx, AWS and Go; Google Cloud's
   * load balancer keeps backend connections 600 s (set 620000), Envoy and Istio an hour.
   */
  readonly httpKeepAliveMs: number
  /**
   * The most connections the HTTP server holds open at once (Node's `server.maxConnections`;
   * 0: no cap, the default). Past it a new connection is closed as soon as it is accepted,
   * counted and warned about (`Connections`). A host agent holds 2 or 3 (its report, heartbeat
   * and poll loops run at once), so 10,000 agents need 20,000 to 30,000: no fixed default fits
   * every fleet, and agents refused retry for ever. Set it below the process's file-descriptor
   * limit (`ulimit -n`) less what the store needs: then connections past it are refused with a
   * warning, rather than closed unseen at the limit, and the store can still open files.
   */
  readonly maxConnections: number
  /**
   * How long a stopping coordinator keeps serving with `/readyz` answering 503 before it stops
   * (ms; 0: it stops at once): the time a load balancer or Kubernetes takes to stop sending it
   * new connections after SIGTERM (its endpoints are removed while the pod is told to stop).
   */
  readonly shutdownDelayMs: number
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
   * On PostgreSQL, the reaper's leader gives its lease up after this many passes in a row whose
   * store calls failed (its store's pool wedged while its lease's own connection works), so a
   * replica that reaches the store leads; it stands again once a store read of its own succeeds.
   * 0: never.
   */
  readonly leaderStepDownPasses: number
  /**
   * 1: the reaper moves running sessions off a starving session's held host when its parks
   * cannot make the room and the room exists elsewhere (core's `MakeRoom`, the simulator's
   * moves, on by default there too); 0: it waits for them to leave. On by default: with the
   * starvation limit they bound the longest wait of a session the fleet's free RAM could take (the
   * simulator README's "The default over every workload").
   */
  readonly makeRoomMoves: number
  /** At most this many moves begun by one reaper pass for starving sessions (`makeRoomMoves`). */
  readonly makeRoomMovesPerPass: number
  /**
   * 1 (the default since issue 22): the park policy's reserve counts arrivals in groups when the
   * MiB reserved disperse like groups (core's `ParkPolicy.Options.reserveGroups`); 0: single
   * arrivals, the default before. The reaper measures the dispersion only with a reaper interval
   * of about 27 s or less (12 intervals in its 5 min window): above that it changes nothing.
   */
  readonly reserveGroups: number
  /**
   * 1 (the default since issue 22): each size class of the reserve counts its arrivals over the
   * 20 s lead plus a descent of its size (core's `reserveLeadPerClass`); 0: one lead for every
   * class, the default before.
   */
  readonly reserveLeadPerClass: number
  /**
   * 1 (the default since 2026-12-07): a slow size class of the reserve (its descent outlasts the
   * lead) keeps the places its own arrivals reach at 99 % (core's `reserveSlowClassQuantile`); 0:
   * the 90 % every class keeps, the default before.
   */
  readonly reserveSlowClass: number
  /**
   * With `reserveSlowClass` 1: the probability a slow class's places reach its own arrivals with
   * (core's `reserveSlowClassQuantile`, default 0.99), above the 0.9 every class keeps (core's
   * `reserveQuantile`: at or below it a slow class would gain nothing) and below 1. Ignored with
   * `reserveSlowClass` 0.
   */
  readonly reserveSlowClassQuantile: number
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

/** The connections of a replica's store pool by default (`ENGRAM_STORE_POOL_SIZE`): the store's own default. */
export const defaultStorePoolSize = StorePg.defaultPoolSize

/**
 * The PostgreSQL connections one coordinator replica holds at most: its store pool
 * (`engram-placer <id>`), its lease (`engram-lease <holder>`) and its change listener
 * (`engram-wakeups`). A database serving R replicas needs `max_connections` of at least R × this
 * plus its other clients and the superuser-reserved slots.
 */
export const connectionsPerReplica = (storePoolSize: number): number => storePoolSize + 2

/**
 * How long an idle kept-alive connection stays open by default (`ENGRAM_HTTP_KEEP_ALIVE_MS`):
 * longer than the idle timeouts of the usual clients and proxies (nginx 75 s, AWS load balancers
 * 60 s, Go's `http.Transport` 90 s; undici, Node's `fetch`, follows the server's `Keep-Alive:
 * timeout` hint minus a second), so the client closes an idle connection first. With Node's 5 s
 * a loaded client reused a socket the server was closing at that moment ("fetch failed: other
 * side closed").
 */
export const defaultHttpKeepAliveMs = 95_000

/**
 * The cap on the HTTP server's open connections by default (`ENGRAM_MAX_CONNECTIONS`): 0, none.
 * A cap low enough to keep a small machine's descriptors would refuse part of a large fleet (a
 * host agent holds 2 or 3 connections; 10,000 agents 20,000 to 30,000), and what runs out is
 * the file-descriptor limit, which differs by deployment (1,024 to over a million).
 */
export const defaultMaxConnections = 0

/**
 * The default of `ENGRAM_LEADER_STEP_DOWN_PASSES`: 3 failed passes in a row, about 15 s at the
 * default 5 s interval when the calls fail at once (a dead socket), about a minute when each
 * waits out `ENGRAM_STORE_TIMEOUT_MS` (a saturated pool). One or two failed passes (a slow
 * pass, a blip) keep the leader. Stepping down in an outage of the whole database costs little:
 * the replica stands again at its first store read that succeeds, and takes the lease back at
 * once if nobody took it meanwhile.
 */
export const defaultLeaderStepDownPasses = 3

/** The default bound on a probe's store read (`ENGRAM_PROBE_TIMEOUT_MS`): 1 s (a readiness probe's usual timeout). */
export const defaultProbeTimeoutMs = 1000

/** The default retention of history (`ENGRAM_RETENTION_MS`): 7 days. */
export const defaultRetentionMs = 7 * 24 * 3_600_000

/** The longest retention: 10 years (0 keeps history for ever). */
const maxRetentionMs = 3650 * 24 * 3_600_000

/**
 * How a path names a setting in an issue and in the rules that mention it: by its variable for
 * the environment and a file (the identity), by its key for a program's settings.
 */
export type Naming = (variable: string) => string

const byVariable: Naming = (variable) => variable

/**
 * The retention's rule beside the windows that read history: 0 (off), or at least the allowance
 * horizon and the make-room cooldown (a shorter one would delete the commits and aborts they
 * count). Null when it holds.
 */
export const retentionIssue = (c: Pick<CoordinatorConfig, "retentionMs" | "allowanceHorizonMs" | "makeRoomCooldownMs">, name: Naming = byVariable): string | null =>
  c.retentionMs === 0 || (c.retentionMs >= c.allowanceHorizonMs && c.retentionMs >= c.makeRoomCooldownMs)
    ? null
    : `must be 0 (keep history for ever) or at least ${name("ENGRAM_ALLOWANCE_HORIZON_MS")} (${c.allowanceHorizonMs}) and ${name("ENGRAM_MAKE_ROOM_COOLDOWN_MS")} (${c.makeRoomCooldownMs})`

/** The longest failover grace below a stale window of a day: a day. */
export const dayMs = 24 * 3_600_000

/**
 * The longest failover grace: a day, or the heartbeat stale window when that is longer. The
 * default grace is the window, so a window past 3 days (whose third, the shortest grace, is
 * past a day) still has a range of explicit graces, its default among them.
 */
export const maxReclaimGraceMs = (heartbeatStaleWindowMs: number): number => Math.max(dayMs, heartbeatStaleWindowMs)

/**
 * Why the failover grace is refused: one shorter than the agents' heartbeat interval (core's
 * `Reclaim.minGraceMs`, a third of `ENGRAM_HEARTBEAT_STALE_WINDOW_MS`) ends before a live host's
 * next heartbeat lands, so it protects nothing; 0 (no grace) says so. One longer than
 * `maxReclaimGraceMs` is refused too. Null when it holds.
 */
export const reclaimGraceIssue = (reclaimGraceMs: number, heartbeatStaleWindowMs: number, name: Naming = byVariable): string | null => {
  const window = name("ENGRAM_HEARTBEAT_STALE_WINDOW_MS")
  return reclaimGraceMs === 0
    ? null
    : reclaimGraceMs < Reclaim.minGraceMs(heartbeatStaleWindowMs)
      ? `must be 0 (no grace) or at least a third of ${window} (${Reclaim.minGraceMs(heartbeatStaleWindowMs)}, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat`
      : reclaimGraceMs > maxReclaimGraceMs(heartbeatStaleWindowMs)
        ? `must be at most the longer of a day (${dayMs}) and ${window} (${heartbeatStaleWindowMs})`
        : null
}

/** Why the reaper's lease times are refused (`@engram/store`'s `checkLeaseTimes`): the leader must stop acting before its lease can pass on. Null when they hold. */
export const leaseIssue = (c: Pick<CoordinatorConfig, "leaseDurationMs" | "leaseRenewDeadlineMs">, name: Naming = byVariable): string | null =>
  checkLeaseTimes({ leaseDurationMs: c.leaseDurationMs, renewDeadlineMs: c.leaseRenewDeadlineMs }) === null
    ? null
    : `must be less than ${name("ENGRAM_LEASE_DURATION_MS")} (${c.leaseDurationMs})`

/**
 * The longest the heartbeats' group window may be beside the stale window: less than the window
 * less the agents' heartbeat interval (core's `Reclaim.minGraceMs`, a third of it). A host whose
 * heartbeats arrive an interval apart is still seen live only if each is written within the rest
 * of the window; one held longer lands after its host may have gone stale.
 */
export const maxBeatWindowMs = (heartbeatStaleWindowMs: number): number => heartbeatStaleWindowMs - Reclaim.minGraceMs(heartbeatStaleWindowMs) - 1

/** Why the heartbeats' group window is refused beside the stale window (`maxBeatWindowMs`). Null when it holds. */
export const beatWindowIssue = (beatWindowMs: number, heartbeatStaleWindowMs: number, name: Naming = byVariable): string | null =>
  beatWindowMs <= maxBeatWindowMs(heartbeatStaleWindowMs)
    ? null
    : `must be less than ${name("ENGRAM_HEARTBEAT_STALE_WINDOW_MS")} less a third of it, the agents' heartbeat interval (${heartbeatStaleWindowMs - Reclaim.minGraceMs(heartbeatStaleWindowMs)}): a heartbeat held longer is written after its host may have gone stale`

/** The settings the rules between settings read (the grace resolved: its default is the stale window). */
const crossKeys = ["leaseDurationMs", "leaseRenewDeadlineMs", "retentionMs", "allowanceHorizonMs", "makeRoomCooldownMs", "reclaimGraceMs", "beatWindowMs"] as const

/** The values the rules between settings read, each null when its own rule refused it (no rule is judged on a guess). */
export type CrossFields = { readonly [K in (typeof crossKeys)[number] | "heartbeatStaleWindowMs"]: number | null }

/** `c` when none of `keys` is null. */
const known = <K extends keyof CrossFields>(c: CrossFields, ...keys: K[]): { readonly [P in K]: number } | null =>
  keys.every((k) => c[k] !== null) ? (c as { readonly [P in K]: number }) : null

/**
 * Every rule between settings, checked at once: the lease's renew deadline below its duration,
 * the retention beside the windows that read history, the failover grace and the heartbeats'
 * group window beside the stale window. Every path that builds a configuration (the environment, a file, a program's settings)
 * comes through here; `name` names the settings as that path does, `value` gives what it held.
 * A rule one of whose settings broke its own rule is not judged.
 */
export const crossFieldIssues = (c: CrossFields, name: Naming = byVariable, value: (variable: string) => unknown = () => undefined): Env.Issue[] => {
  const issues: Env.Issue[] = []
  const refuse = (variable: string, rule: string | null) => {
    if (rule === null) return
    const v = value(variable)
    issues.push(v === undefined ? { variable: name(variable), rule } : { variable: name(variable), rule, value: v })
  }
  const lease = known(c, "leaseDurationMs", "leaseRenewDeadlineMs")
  if (lease !== null) refuse("ENGRAM_LEASE_RENEW_DEADLINE_MS", leaseIssue(lease, name))
  const retention = known(c, "retentionMs", "allowanceHorizonMs", "makeRoomCooldownMs")
  if (retention !== null) refuse("ENGRAM_RETENTION_MS", retentionIssue(retention, name))
  const grace = known(c, "reclaimGraceMs", "heartbeatStaleWindowMs")
  if (grace !== null) refuse("ENGRAM_RECLAIM_GRACE_MS", reclaimGraceIssue(grace.reclaimGraceMs, grace.heartbeatStaleWindowMs, name))
  const beats = known(c, "beatWindowMs", "heartbeatStaleWindowMs")
  if (beats !== null) refuse("ENGRAM_BEAT_WINDOW_MS", beatWindowIssue(beats.beatWindowMs, beats.heartbeatStaleWindowMs, name))
  return issues
}

// `ENGRAM_RECLAIM_GRACE_MS` unset: the heartbeat stale window, known once the limits are read.
const graceFromStaleWindow = -1

/** The default request body limit: 1 MiB. */
export const defaultMaxBodyBytes = 1024 * 1024

// ---------------------------------------------------------------------------------------------
// The settings, one Config each
// ---------------------------------------------------------------------------------------------

/** Each setting's own rule by variable, as its Config words it (a program's null is refused with it). */
const ruleOfVariable: Record<string, string> = {}

const int = (variable: string, fallback: number, min: number, max: number) => {
  const rule = `must be an integer from ${min} to ${max}`
  ruleOfVariable[variable] = rule
  return Config.schema(
    Env.decimalInt(rule).check(Schema.isBetween({ minimum: min, maximum: max }, { message: rule })),
    variable,
  ).pipe(Config.withDefault(fallback))
}

const intAtLeast = (variable: string, fallback: number, min: number) => {
  const rule = `must be an integer >= ${min}`
  ruleOfVariable[variable] = rule
  return Config.schema(Env.decimalInt(rule).check(Schema.isGreaterThanOrEqualTo(min, { message: rule })), variable).pipe(Config.withDefault(fallback))
}

/**
 * A probability in decimal notation, as written: digits with at most one point, no sign, no
 * exponent; up to 17 digits after the point (a program's number in its shortest form, as
 * `String(0.9 + 0.09)` gives "0.9900000000000001").
 */
const decimalFraction = /^([0-9]{1,15}(\.[0-9]{1,17})?|\.[0-9]{1,17})$/

/**
 * A probability above `above` and below 1, in decimal notation (`0.995`): `Number` alone would
 * read "1e-1" or "0x1"; a value outside is refused with the rule, which says why `above`.
 */
const probabilityAbove = (variable: string, fallback: number, above: number, why: string) => {
  const rule = `must be a decimal number above ${above} (${why}) and below 1`
  ruleOfVariable[variable] = rule
  return Config.schema(
    Schema.String.check(Schema.isPattern(decimalFraction, { message: rule })).pipe(
      Schema.decodeTo(Schema.NumberFromString.annotate({ message: rule })),
      Schema.check(Schema.isGreaterThan(above, { message: rule }), Schema.isLessThan(1, { message: rule })),
    ),
    variable,
  ).pipe(Config.withDefault(fallback))
}

/**
 * A text setting that `problemOf` accepts (undefined) or refuses with `rule`. An empty value is
 * unset, its default, as every setting's is (effect's `ConfigProvider` reads `""` as absent).
 */
const text = (variable: string, fallback: string, rule: string, problemOf: (s: string) => boolean) => {
  ruleOfVariable[variable] = rule
  return Config.schema(Schema.String.check(Schema.makeFilter((s: string) => (problemOf(s) ? rule : true))), variable).pipe(Config.withDefault(fallback))
}

/**
 * The rule of `ENGRAM_DATA_DIR`: a path without whitespace around it. A blank one names no
 * directory, and a space or newline copied with it names another than the one meant (the
 * embedded database and the admin token would start afresh there).
 */
export const dataDirRule = "must be a directory path, not blank and without whitespace before or after it (empty is unset: the default ./.engram)"

/**
 * Why `ENGRAM_OTLP_URL` is refused, or undefined: an http:// or https:// URL without
 * `user:password@`. The URL is logged and kept in plain text (it is no secret), so credentials
 * go in `ENGRAM_OTLP_HEADERS`; a value that does not parse but holds an `@` counts as holding them.
 */
const otlpUrlProblem = (u: string): string | undefined => {
  if (!/^https?:\/\/[^\s]+$/.test(u)) return "must be an http:// or https:// URL (the collector's OTLP/HTTP address, e.g. http://localhost:4318)"
  const parsed = URL.canParse(u) ? new URL(u) : null
  const userinfo = parsed === null ? u.includes("@") : parsed.username !== "" || parsed.password !== ""
  return userinfo ? "must be an http:// or https:// URL without user:password@ (the URL is logged; give the collector's credentials in ENGRAM_OTLP_HEADERS, a secret)" : undefined
}

/**
 * The URL settings: a refused value holding an `@` (it may be `user:password@`) is shown as
 * `<hidden>`, never echoed; any other with its query or fragment masked (`Urls.redact`).
 */
const urlVariables: ReadonlySet<string> = new Set(["ENGRAM_OTLP_URL", "ENGRAM_PEER_URL"])

/** The rule of `ENGRAM_PEER_URL`: core's peer URL rule (`Move.peerUrlRule`, the agents'), and no path. */
export const replicaUrlRule = `must be ${Move.peerUrlRule}, and without a path: where the other replicas reach this one (http://10.0.0.5:7070)`

/**
 * Whether `url` may be this replica's `ENGRAM_PEER_URL`: a peer URL by core's one rule
 * (`Move.isPeerUrl`: no wildcard host such as 0.0.0.0, no `user:password@`, …), as the agents'
 * `ENGRAM_AGENT_PEER_URL` is, without a path (at most a trailing `/`, dropped).
 */
const isReplicaUrl = (url: string): boolean => /^https?:\/\/[^\s/]+\/?$/.test(url) && Move.isPeerUrl(url)

/** A token by the rule of every secret setting (`Env.secretProblem`); `whatFails` with whitespace kept around it. */
const secretText = (whatFails: string) => Schema.String.check(Schema.makeFilter((s: string) => Env.secretProblem(s, whatFails) ?? true))

const secret = (variable: string, check: Schema.Codec<string, string>) =>
  Config.schema(check, variable).pipe(
    Config.map((s): Redacted.Redacted<string> | null => Redacted.make(s, { label: variable })),
    Config.withDefault(null),
  )

/**
 * The variable of each setting (a file's key; a program's settings use the setting's key). The
 * limits' are `limitVariables`.
 */
export const settingVariables = {
  port: "ENGRAM_PORT",
  host: "ENGRAM_HOST",
  dataDir: "ENGRAM_DATA_DIR",
  databaseUrl: "ENGRAM_DATABASE_URL",
  adminToken: "ENGRAM_ADMIN_TOKEN",
  metricsToken: "ENGRAM_METRICS_TOKEN",
  maxBodyBytes: "ENGRAM_MAX_BODY_BYTES",
  moveTimeoutMs: "ENGRAM_MOVE_TIMEOUT_MS",
  allowanceHorizonMs: "ENGRAM_ALLOWANCE_HORIZON_MS",
  changesCheckMs: "ENGRAM_CHANGES_CHECK_MS",
  maxWaitsPerHostToken: "ENGRAM_MAX_WAITS_PER_HOST_TOKEN",
  maxWaitsPerAdminToken: "ENGRAM_MAX_WAITS_PER_ADMIN_TOKEN",
  maxWaits: "ENGRAM_MAX_WAITS",
  placementReadMaxAgeMs: "ENGRAM_PLACEMENT_READ_MAX_AGE_MS",
  storeTimeoutMs: "ENGRAM_STORE_TIMEOUT_MS",
  storePoolSize: "ENGRAM_STORE_POOL_SIZE",
  probeTimeoutMs: "ENGRAM_PROBE_TIMEOUT_MS",
  httpKeepAliveMs: "ENGRAM_HTTP_KEEP_ALIVE_MS",
  maxConnections: "ENGRAM_MAX_CONNECTIONS",
  shutdownDelayMs: "ENGRAM_SHUTDOWN_DELAY_MS",
  placementBatchSize: "ENGRAM_PLACEMENT_BATCH_SIZE",
  placementSpread: "ENGRAM_PLACEMENT_SPREAD",
  pgliteWorker: "ENGRAM_PGLITE_WORKER",
  placementBatchWindowUs: "ENGRAM_PLACEMENT_BATCH_WINDOW_US",
  placementWindowByReplicas: "ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS",
  placementForward: "ENGRAM_PLACEMENT_FORWARD",
  placementForwardTimeoutMs: "ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS",
  peerUrl: "ENGRAM_PEER_URL",
  beatWindowMs: "ENGRAM_BEAT_WINDOW_MS",
  leaseDurationMs: "ENGRAM_LEASE_DURATION_MS",
  leaseRenewDeadlineMs: "ENGRAM_LEASE_RENEW_DEADLINE_MS",
  leaderStepDownPasses: "ENGRAM_LEADER_STEP_DOWN_PASSES",
  makeRoomMoves: "ENGRAM_MAKE_ROOM_MOVES",
  makeRoomMovesPerPass: "ENGRAM_MAKE_ROOM_MOVES_PER_PASS",
  reserveGroups: "ENGRAM_RESERVE_GROUPS",
  reserveLeadPerClass: "ENGRAM_RESERVE_LEAD_PER_CLASS",
  reserveSlowClass: "ENGRAM_RESERVE_SLOW_CLASS",
  reserveSlowClassQuantile: "ENGRAM_RESERVE_SLOW_CLASS_QUANTILE",
  makeRoomCooldownMs: "ENGRAM_MAKE_ROOM_COOLDOWN_MS",
  retentionMs: "ENGRAM_RETENTION_MS",
  retentionPruneLimit: "ENGRAM_RETENTION_PRUNE_LIMIT",
  reclaimGraceMs: "ENGRAM_RECLAIM_GRACE_MS",
  otlpUrl: "ENGRAM_OTLP_URL",
  otlpHeaders: "ENGRAM_OTLP_HEADERS",
} as const satisfies { readonly [K in Exclude<keyof CoordinatorConfig, "limits">]: string }

const settings = {
  port: int(settingVariables.port, 7070, 0, 65535),
  // Core's host rule, the agents' listen hosts' (a wildcard such as 0.0.0.0 or :: listens on every interface).
  host: text(settingVariables.host, "127.0.0.1", Names.hostRule, (s) => !Names.isHost(s)),
  dataDir: text(settingVariables.dataDir, "./.engram", dataDirRule, (s) => s.trim() === "" || s.trim() !== s),
  databaseUrl: secret(settingVariables.databaseUrl, Schema.String.check(Schema.isPattern(/^postgres(ql)?:\/\//, { message: "must be a postgres:// or postgresql:// URL" }))),
  adminToken: secret(settingVariables.adminToken, secretText("no request can present it (HTTP drops whitespace around a header's value) and every call fails with 401")),
  metricsToken: secret(settingVariables.metricsToken, secretText("no scrape can present it (HTTP drops whitespace around a header's value) and every scrape fails with 401")),
  maxBodyBytes: int(settingVariables.maxBodyBytes, defaultMaxBodyBytes, 1024, 1024 * 1024 * 1024),
  moveTimeoutMs: int(settingVariables.moveTimeoutMs, 120_000, 1, 3_600_000),
  allowanceHorizonMs: int(settingVariables.allowanceHorizonMs, Downtime.defaultRecencyPolicy.horizonMs, 1000, 7 * 24 * 3_600_000),
  changesCheckMs: int(settingVariables.changesCheckMs, 2000, 100, 60_000),
  maxWaitsPerHostToken: int(settingVariables.maxWaitsPerHostToken, 4, 1, 1000),
  maxWaitsPerAdminToken: int(settingVariables.maxWaitsPerAdminToken, 5000, 1, 1_000_000),
  maxWaits: int(settingVariables.maxWaits, 20_000, 1, 1_000_000),
  placementReadMaxAgeMs: int(settingVariables.placementReadMaxAgeMs, 100, 0, 60_000),
  storeTimeoutMs: int(settingVariables.storeTimeoutMs, defaultStoreTimeoutMs, 100, 600_000),
  storePoolSize: int(settingVariables.storePoolSize, defaultStorePoolSize, 1, 1000),
  probeTimeoutMs: int(settingVariables.probeTimeoutMs, defaultProbeTimeoutMs, 10, 60_000),
  httpKeepAliveMs: int(settingVariables.httpKeepAliveMs, defaultHttpKeepAliveMs, 1000, 3_600_000),
  maxConnections: int(settingVariables.maxConnections, defaultMaxConnections, 0, 1_000_000),
  shutdownDelayMs: int(settingVariables.shutdownDelayMs, 0, 0, 600_000),
  placementBatchSize: int(settingVariables.placementBatchSize, 64, 1, 1000),
  placementSpread: int(settingVariables.placementSpread, 1, 0, 1),
  pgliteWorker: int(settingVariables.pgliteWorker, 1, 0, 1),
  placementBatchWindowUs: int(settingVariables.placementBatchWindowUs, 200, 0, 100_000),
  placementWindowByReplicas: int(settingVariables.placementWindowByReplicas, 0, 0, 1),
  placementForward: int(settingVariables.placementForward, 0, 0, 1),
  placementForwardTimeoutMs: int(settingVariables.placementForwardTimeoutMs, 1000, 10, 60_000),
  peerUrl: Config.schema(Schema.String.check(Schema.makeFilter((s: string) => (isReplicaUrl(s) ? true : replicaUrlRule))), settingVariables.peerUrl).pipe(
    Config.map((u): string | null => u.replace(/\/$/, "")),
    Config.withDefault(null),
  ),
  beatWindowMs: int(settingVariables.beatWindowMs, 100, 0, 10_000),
  leaseDurationMs: int(settingVariables.leaseDurationMs, defaultLeaseTimes.leaseDurationMs, 100, 3_600_000),
  leaseRenewDeadlineMs: int(settingVariables.leaseRenewDeadlineMs, defaultLeaseTimes.renewDeadlineMs, 50, 3_600_000),
  leaderStepDownPasses: int(settingVariables.leaderStepDownPasses, defaultLeaderStepDownPasses, 0, 1000),
  makeRoomMoves: int(settingVariables.makeRoomMoves, 1, 0, 1),
  makeRoomMovesPerPass: int(settingVariables.makeRoomMovesPerPass, 16, 1, 1000),
  reserveGroups: int(settingVariables.reserveGroups, 1, 0, 1),
  reserveLeadPerClass: int(settingVariables.reserveLeadPerClass, 1, 0, 1),
  reserveSlowClass: int(settingVariables.reserveSlowClass, 1, 0, 1),
  reserveSlowClassQuantile: probabilityAbove(settingVariables.reserveSlowClassQuantile, ParkPolicy.defaultOptions.reserveSlowClassQuantile, ParkPolicy.defaultOptions.reserveQuantile, "every class's reserveQuantile: at or below it a slow class gains no place"),
  makeRoomCooldownMs: int(settingVariables.makeRoomCooldownMs, MakeRoom.defaultCooldownMs, 0, 7 * 24 * 3_600_000),
  retentionMs: int(settingVariables.retentionMs, defaultRetentionMs, 0, maxRetentionMs),
  retentionPruneLimit: int(settingVariables.retentionPruneLimit, 1000, 1, Validate.maxPruneLimit),
  // Its longest follows the stale window (`maxReclaimGraceMs`): a rule between settings.
  reclaimGraceMs: intAtLeast(settingVariables.reclaimGraceMs, graceFromStaleWindow, 0),
  otlpUrl: Config.schema(Schema.String.check(Schema.makeFilter((u: string) => otlpUrlProblem(u) ?? true)), settingVariables.otlpUrl).pipe(
    Config.map((u): string | null => u),
    Config.withDefault(null),
  ),
  otlpHeaders: secret(settingVariables.otlpHeaders, Schema.String.check(Schema.isPattern(/^\s*[^=,\s]+\s*=[^,]*(,\s*[^=,\s]+\s*=[^,]*)*\s*$/, { message: "must be key=value pairs separated by commas" }))),
}

/** The variables whose setting may be null (null is their default: no database URL, no token…). */
const nullableVariables: ReadonlySet<string> = new Set(
  (
    ["databaseUrl", "adminToken", "metricsToken", "peerUrl", "otlpUrl", "otlpHeaders"] satisfies readonly {
      readonly [K in keyof CoordinatorConfig]: null extends CoordinatorConfig[K] ? K : never
    }[keyof CoordinatorConfig][]
  ).map((k) => settingVariables[k]),
)

/**
 * A null (a file's, a program's) for a setting that cannot be null: refused with the setting's
 * own rule (core's words for a limit), never taken for its default.
 */
const nullIssues = (raw: (variable: string) => unknown): Env.Issue[] => [
  ...Object.values(settingVariables)
    .filter((v) => raw(v) === null && !nullableVariables.has(v))
    .map((v) => ({ variable: v, rule: ruleOfVariable[v] ?? "must not be null", value: null })),
  ...Object.entries(limitVariables)
    .filter(([v]) => raw(v) === null)
    .map(([v, field]) => {
      const made = Limits.make({ [field]: null })
      return { variable: v, rule: made._tag === "Invalid" ? (made.issues[0]?.rule ?? "must not be null") : "must not be null", value: null }
    }),
]

// The limits are read as text and judged by core `Limits.make`, whose words every component shares.
const limitTexts = Config.all(Object.fromEntries(Object.keys(limitVariables).map((v) => [v, Config.String(v).pipe(Config.option)])))

// Decimal notation only, as every other number setting (`Env.decimalInt`): `Number` alone reads
// "0x3a98" as 15000 and "1e4" as 10000. Anything else stays text, which `Limits.make` refuses by name.
const toNumber = (t: string): unknown => (/^[+-]?([0-9]{1,15}(\.[0-9]*)?|\.[0-9]+)$/.test(t) ? Number(t) : t)
// A boolean limit's text, taken as written as every on/off setting is (`0`/`1` exactly, no blanks
// nor case folding): `true`/`1` or `false`/`0`. Anything else stays text, refused by name below.
const booleanWords: Readonly<Record<string, boolean>> = { true: true, "1": true, false: false, "0": false }
const toBoolean = (t: string): unknown => (Object.hasOwn(booleanWords, t) ? booleanWords[t] : t)

/** The rule of a boolean limit read from text (`ENGRAM_REQUIRE_MEASURED`), as its refusal words it. */
export const booleanRule = "must be true, false, 1 or 0, exactly (no blanks around it, lower case)"

/**
 * Reads and checks every setting from `source`: all of them, or every issue at once, each named
 * by `name` (a program's settings name them by key), the rules between settings by
 * `crossFieldIssues`.
 */
const load = (given: Env.Source, name: Naming = byVariable): Effect.Effect<CoordinatorConfig, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    // A URL setting's value that may hold `user:password@` is never echoed in an issue, nor its
    // query or fragment (a token may ride there): the agents' peer URL settings' rule.
    const source: Env.Source = {
      ...given,
      raw: (v) => {
        const value = given.raw(v)
        return urlVariables.has(v) ? Env.shownUrl(value, Urls.redact) : value
      },
    }
    // A null reads as unset (its default) below: refused here, and no rule between settings is judged on it.
    const nulls = nullIssues(source.raw)
    const refused = new Set(nulls.map((i) => i.variable))
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
            // A boolean's text that is none of the words: core's "must be a boolean" would not say which text is one.
            const rule = i.field === "requireMeasured" && typeof overrides[i.field] === "string" ? booleanRule : i.rule
            return { variable, rule, value: source.raw(variable) }
          })
        : []),
      ...nulls,
    ].map((i) => ({ ...i, variable: name(i.variable) }))
    // The rules between settings, on every setting whose own value held, whatever the others'.
    const held: Record<string, number | null> = {}
    for (const key of crossKeys) {
      const r = yield* Effect.result(settings[key].parse(source.provider))
      held[key] = r._tag === "Success" && !refused.has(settingVariables[key]) ? r.success : null
    }
    // The stale window alone: another limit's refusal leaves it known.
    const staleWindow = Limits.make(overrides["heartbeatStaleWindowMs"] === undefined ? {} : { heartbeatStaleWindowMs: overrides["heartbeatStaleWindowMs"] })
    const staleWindowMs = staleWindow._tag === "Valid" && !refused.has("ENGRAM_HEARTBEAT_STALE_WINDOW_MS") ? staleWindow.limits.heartbeatStaleWindowMs : null
    // Unset, the grace is the stale window.
    const reclaimGraceMs = held["reclaimGraceMs"] === graceFromStaleWindow ? staleWindowMs : (held["reclaimGraceMs"] ?? null)
    const cross = { ...held, reclaimGraceMs, heartbeatStaleWindowMs: staleWindowMs } as CrossFields
    issues.push(...crossFieldIssues(cross, name, source.raw))
    if (issues.length > 0 || base._tag === "Failure" || made._tag === "Invalid" || reclaimGraceMs === null)
      return yield* new Env.ConfigInvalid({ component: "coordinator", issues })
    return { ...base.success, limits: made.limits, reclaimGraceMs }
  })

/** What `parse` and `parseInput` answer: the configuration, or every issue. */
export type ParseResult = { readonly _tag: "Valid"; readonly config: CoordinatorConfig } | { readonly _tag: "Invalid"; readonly issues: readonly ConfigIssue[] }

const run = (loaded: Effect.Effect<CoordinatorConfig, Env.ConfigInvalid>): ParseResult => {
  const r = Effect.runSync(Effect.result(loaded))
  return r._tag === "Success" ? { _tag: "Valid", config: r.success } : { _tag: "Invalid", issues: r.failure.issues }
}

/** Validates raw settings (variable name → value, as a JSON file holds them). Pure: no environment, no files. */
export const parse = (raw: Readonly<Record<string, unknown>>): ParseResult =>
  run(load({ provider: ConfigProvider.fromUnknown(raw), raw: (v) => raw[v], secrets: secretVariables }))

/** The defaults: what `parse({})` gives. */
export const defaults = (): CoordinatorConfig => {
  const r = parse({})
  if (r._tag === "Invalid") throw new Error("unreachable: the defaults are valid")
  return r.config
}

const keyOfVariable: Readonly<Record<string, string>> = {
  ...Object.fromEntries(Object.entries(settingVariables).map(([k, v]) => [v, k])),
  ...Object.fromEntries(Object.entries(limitVariables).map(([v, f]) => [v, `limits.${f}`])),
}

/** A program's settings name each setting by its key, a limit as `limits.<field>`. */
export const byKey: Naming = (variable) => keyOfVariable[variable] ?? variable

/**
 * Validates a program's settings over the defaults (`startCoordinator({ config })`): the same
 * checks as the environment's (each setting's rule, core's `Limits.make`, `crossFieldIssues`),
 * every issue named by key; an unknown key is refused, an undefined one keeps its default, a
 * null unsets a setting that may be null and is refused for any other. Pure. Unset, the grace is the stale window of the limits passed.
 */
export const parseInput = (input: CoordinatorConfigInput = {}): ParseResult => {
  const raw: Record<string, unknown> = {}
  const refused: Env.Issue[] = []
  const settingOf: Readonly<Record<string, string>> = settingVariables
  for (const [key, value] of Object.entries(input)) {
    if (value === undefined || key === "limits") continue
    const variable = settingOf[key]
    if (variable === undefined) refused.push({ variable: key, rule: "is not a known setting" })
    // A null goes on: unset for a setting that may be null, refused by `load` for any other.
    else raw[variable] = Redacted.isRedacted(value) ? Redacted.value(value) : value
  }
  const limitOf = Object.fromEntries(Object.entries(limitVariables).map(([v, f]) => [f, v]))
  if (input.limits === null) refused.push({ variable: "limits", rule: "must be an object of limits (leave it out for the defaults)", value: null })
  for (const [field, value] of Object.entries(input.limits ?? {})) {
    const variable = limitOf[field]
    if (variable === undefined) refused.push({ variable: `limits.${field}`, rule: "is not a known limit" })
    else if (value !== undefined) raw[variable] = value
  }
  const r = run(load({ provider: ConfigProvider.fromUnknown(raw), raw: (v) => raw[v], secrets: secretVariables }, byKey))
  return refused.length === 0 ? r : { _tag: "Invalid", issues: [...refused, ...(r._tag === "Invalid" ? r.issues : [])] }
}

/** A program's settings over the defaults, checked as `parseInput` does; secrets redacted. */
export const fromInput = (input: CoordinatorConfigInput = {}): Effect.Effect<CoordinatorConfig, Env.ConfigInvalid> => {
  const r = parseInput(input)
  return r._tag === "Valid" ? Effect.succeed(r.config) : Effect.fail(new Env.ConfigInvalid({ component: "coordinator", issues: r.issues }))
}

/**
 * The settings that act on PostgreSQL only (`ENGRAM_DATABASE_URL`): the embedded store (PGlite)
 * has one replica, so no change listener, no reaper's lease, no spread nor forwarding of
 * placements among replicas, and reads the fleet fresh.
 */
export const postgresOnlyKeys = [
  "changesCheckMs",
  "storePoolSize",
  "placementReadMaxAgeMs",
  "placementSpread",
  "placementWindowByReplicas",
  "placementForward",
  "placementForwardTimeoutMs",
  "peerUrl",
  "leaseDurationMs",
  "leaseRenewDeadlineMs",
  "leaderStepDownPasses",
] as const satisfies readonly (keyof typeof settingVariables)[]

/**
 * The variables of `config`'s PostgreSQL-only settings that are set away from their defaults
 * (whichever path set them: a value equal to the default changes nothing either way).
 */
export const postgresOnlySet = (config: CoordinatorConfig): readonly string[] => {
  const byDefault = defaults()
  return postgresOnlyKeys.filter((k) => config[k] !== byDefault[k]).map((k) => settingVariables[k])
}

/** The start-up warning for PostgreSQL-only settings given to a coordinator on the embedded database. */
export const postgresOnlyWarning = (variables: readonly string[]): string =>
  `${variables.join(", ")} ${variables.length === 1 ? "has" : "have"} no effect on the embedded database (PGlite): ${variables.length === 1 ? "it applies" : "they apply"} on PostgreSQL only (ENGRAM_DATABASE_URL)`

/** The settings that act on the embedded database (PGlite) only: a coordinator on PostgreSQL ignores them. */
export const embeddedOnlyKeys = ["pgliteWorker"] as const satisfies readonly (keyof typeof settingVariables)[]

/** The variables of `config`'s embedded-only settings set away from their defaults (as `postgresOnlySet`). */
export const embeddedOnlySet = (config: CoordinatorConfig): readonly string[] => {
  const byDefault = defaults()
  return embeddedOnlyKeys.filter((k) => config[k] !== byDefault[k]).map((k) => settingVariables[k])
}

/**
 * The start-up warning of a coordinator on PostgreSQL whose admin token was generated: every
 * replica must share one `ENGRAM_ADMIN_TOKEN`, or each refuses the others' tokens (and forwarded
 * creates, whose peer token derives from it). Names the file, never the token.
 */
export const generatedTokenOnPostgresWarning = (file: string | null): string =>
  `ENGRAM_ADMIN_TOKEN is not set: this replica uses an admin token it generated${file === null ? "" : ` (in ${file})`}. ` +
  "Every coordinator replica on this database must be started with the same ENGRAM_ADMIN_TOKEN, or each refuses the others' admin tokens " +
  "and forwarded creates (ENGRAM_PLACEMENT_FORWARD) fail with 'invalid bearer token'. With one replica, set it anyway to keep it across data directories"

/** The start-up warning for embedded-only settings given to a coordinator on PostgreSQL. */
export const embeddedOnlyWarning = (variables: readonly string[]): string =>
  `${variables.join(", ")} ${variables.length === 1 ? "has" : "have"} no effect on PostgreSQL (ENGRAM_DATABASE_URL is set): ${variables.length === 1 ? "it applies" : "they apply"} to the embedded database (PGlite) only`

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
 * The `ENGRAM_*` variable a config file's unknown key most likely meant: the variable of a
 * `startCoordinator` key (`port` → `ENGRAM_PORT`, `limits` fields too), else the coordinator's
 * variable nearest in spelling to the key as a variable (`prot` → `ENGRAM_PORT`), else null.
 */
export const fileKeyHint = (key: string): string | null => {
  const byProgramKey = Object.entries(keyOfVariable).find(([, k]) => k === key || k === `limits.${key}`)?.[0]
  if (byProgramKey !== undefined) return byProgramKey
  const asVariable = key.startsWith("ENGRAM_") ? key : `ENGRAM_${key.replace(/([a-z0-9])([A-Z])/g, "$1_$2").toUpperCase()}`
  return Env.unknown({ [asVariable]: "" }, variables.filter((v) => v !== "ENGRAM_CONFIG_FILE"))[0]?.didYouMean ?? null
}

/**
 * A config file's unknown key as an issue, with the variable it likely meant. Its value is shown
 * only when it is a number or a boolean: an unknown key's string may be a secret whatever the
 * nearest variable (`pgUrl` holding a password reads as `ENGRAM_PEER_URL`).
 */
const unknownFileKey = (key: string, value: unknown, path: string): Env.Issue => {
  const hint = fileKeyHint(key)
  const rule = `is not a known setting (in ${path}; the file's keys are the ENGRAM_* variable names${hint === null ? "" : `: did you mean ${hint}?`})`
  return { variable: key, rule, value: typeof value === "number" || typeof value === "boolean" ? value : Env.hidden }
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
      fileIssues.push(...unknownKeys.map((k) => unknownFileKey(k, (read as Record<string, unknown>)[k], path)))
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
