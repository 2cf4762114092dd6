/**
 * The engram store on PostgreSQL (postgres.js) and on PGlite, through drizzle-orm: one
 * implementation, one query path, two drivers. This module assembles it: a driver's `Db`
 * (`PostgresJs.ts`, `Pglite.ts`, over the transaction runner of `Transaction.ts`), the host
 * cache (`HostCache.ts`), and one module per concern (`Hosts.ts`, `Sessions.ts`, `Queue.ts`,
 * `Reservations.ts`, `Moves.ts`, `Prune.ts`), each of which reads, asks `@engram/core` for a plan, and hands it
 * to the one apply (`Apply.ts`). Nothing partial is ever written; time comes from the Effect
 * Clock.
 */
import { randomUUID } from "node:crypto"
import { Limits, ParkPolicy } from "@engram/core"
import type { Placement } from "@engram/core"
import { Store, StoreTesting } from "@engram/store"
import type { StoreShape, StoreTestingShape, Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import { Clock, Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import { dieOnUnique } from "./Db.js"
import type { Conflicts, Conn, Db } from "./Db.js"
import type { Deps } from "./Deps.js"
import * as AllowanceCommits from "./AllowanceCommits.js"
import * as Blockers from "./Blockers.js"
import * as DatabaseTime from "./DatabaseTime.js"
import * as Assignments from "./Assignments.js"
import * as HostCache from "./HostCache.js"
import { readSumsDrift } from "./HostRows.js"
import type { SumsDrift } from "./HostRows.js"
import * as Hosts from "./Hosts.js"
import * as Reservations from "./Reservations.js"
import * as Moves from "./Moves.js"
import * as Pglite from "./Pglite.js"
import * as PostgresJs from "./PostgresJs.js"
import * as Prune from "./Prune.js"
import * as Queue from "./Queue.js"
import * as Sessions from "./Sessions.js"

/** The connections of a store's pool on a PostgreSQL URL by default (`PgOptions.poolSize`): 10. */
export const defaultPoolSize = PostgresJs.defaultPoolSize

/** Options of a store on a PostgreSQL URL. */
export interface PgOptions extends PostgresJs.ConnectOptions {
  /** Decision limits (default `Limits.defaults`). */
  readonly limits?: Limits.Limits | undefined
  /** See {@link StoreOptions.park}. */
  readonly park?: ParkPolicy.Rule | undefined
  /** See {@link StoreOptions.placementReadMaxAgeMs}. */
  readonly placementReadMaxAgeMs?: number | undefined
  /** See {@link StoreOptions.optimisticPlacementAttempts}. */
  readonly optimisticPlacementAttempts?: number | undefined
  /** See {@link StoreOptions.placementBatchSize}. */
  readonly placementBatchSize?: number | undefined
  /** See {@link StoreOptions.placementBatchWindowMs}. */
  readonly placementBatchWindowMs?: number | undefined
  /** See {@link StoreOptions.placementWindowByReplicas}. */
  readonly placementWindowByReplicas?: boolean | undefined
  /** See {@link StoreOptions.beatWindowMs}. */
  readonly beatWindowMs?: number | undefined
  /** See {@link StoreOptions.beatBatchSize}. */
  readonly beatBatchSize?: number | undefined
  /**
   * See {@link StoreOptions.groupHoldBoundMs}; on a URL with `statementTimeoutMs` the default is
   * 4× that bound (the server cancels a statement past it, so a group still held at 4× is stuck
   * in the driver, not running).
   */
  readonly groupHoldBoundMs?: number | undefined
  /**
   * Replicas spread their placements (default true): the stores placing on one database find
   * each other (each pool's connections carry the store's name as their `application_name`,
   * `engram-placer <id>`, read back from `pg_stat_activity` with every fleet read) and each ranks
   * its own share of the hosts first (`Placement.Spread`), so they stop choosing the same host
   * at once. It orders the hosts that fit, never whether a session fits; alone on its database a
   * store decides as without it. False: every host ranked alike (the connections are not named).
   */
  readonly spreadPlacements?: boolean | undefined
  /**
   * Stamps and judges every time (heartbeats, reports, reservations' expiry, a session's idle
   * time, events) on the database's clock: the Effect Clock's monotonic time plus its
   * offset from the database's `clock_timestamp()`, measured as the store opens and every
   * `databaseTimeEveryMs` after (`DatabaseTime.ts`). For replicas whose clocks may disagree: on
   * their own clocks, a replica a minute behind stamps live hosts' heartbeats a minute old, and
   * the leader reclaims their sessions. Default false: the Effect Clock alone (a test's
   * `TestClock` moves the store's time). The coordinator sets it.
   */
  readonly databaseTime?: boolean | undefined
  /** How often (ms) `databaseTime` measures the offset again (default 10,000). */
  readonly databaseTimeEveryMs?: number | undefined
}

/** Tuning of the store itself. */
export interface StoreOptions {
  /** The park policy an idle session's step decides with (default `ParkPolicy.defaultRule`). */
  readonly park?: ParkPolicy.Rule | undefined
  /**
   * How old (real ms) the fleet read a placement ranks from may be; 0 (the default) reads
   * the room of every host afresh for every placement (a read that starts after the call;
   * concurrent placements share it). Above 0, placements reuse the last read, kept up to
   * date with this store's own writes (`HostCache.ts`): the choice may then miss another
   * replica's last changes, never the safety, which comes from the version the apply checks.
   * A placement finds no fit, and queues, only on a fresh read.
   */
  readonly placementReadMaxAgeMs?: number | undefined
  /**
   * How many times a new session's optimistic placement may lose its host to a concurrent
   * write (and decide again) before it falls back to the locking path (default 8; 0: always
   * the locking path).
   */
  readonly optimisticPlacementAttempts?: number | undefined
  /**
   * Group placement: concurrent creates are placed together, up to this many per batch
   * (default 64; 1 places every create by itself). A batch is one fleet read, core's walk of
   * the batch in order, and one statement writing every placement with the version check.
   */
  readonly placementBatchSize?: number | undefined
  /**
   * How long (real ms, fractions allowed) a batch of creates keeps gathering after its first
   * create before it is placed (default 0.2). While a batch is being written, the next one
   * gathers anyway.
   */
  readonly placementBatchWindowMs?: number | undefined
  /**
   * With the spread (`spreadPlacements`): the creates' window grows with the square of the
   * stores placing on the database, as the last fleet read found them (R stores: R² ×
   * `placementBatchWindowMs`). Each of R replicas sees a R-th of the creates, so its groups
   * would shrink R-fold; the longer window keeps them near one store's (default false).
   */
  readonly placementWindowByReplicas?: boolean | undefined
  /**
   * Heartbeats (of hosts and of reservations) and host reports from many agents are written
   * together: those that arrive within this many real ms of the first of a group, up to
   * `beatBatchSize`, in one statement (default 0: what arrives together, or while the last
   * group is written). A fleet's coordinator waits a little (its `ENGRAM_BEAT_WINDOW_MS`), so
   * an idle fleet costs the database a few groups a second instead of one transaction per
   * heartbeat. Each caller still gets its own answer: an unknown id fails that caller alone.
   */
  readonly beatWindowMs?: number | undefined
  /** At most this many heartbeats or reports per statement (default 512). */
  readonly beatBatchSize?: number | undefined
  /**
   * How long (real ms) one grouped write (creates, resumes, heartbeats, reports, activity) may
   * hold its slot (default 60,000): past it, its callers are answered `Unavailable` (the outcome
   * unknown until read back), the next group goes, and the statement is interrupted in the
   * background. Without a bound, a statement that never answers would hold every later group.
   */
  readonly groupHoldBoundMs?: number | undefined
}

/** Options of a store on PGlite. */
export interface PgliteOptions extends Pglite.ConnectOptions {
  readonly limits?: Limits.Limits | undefined
  readonly park?: ParkPolicy.Rule | undefined
  readonly placementReadMaxAgeMs?: number | undefined
  readonly optimisticPlacementAttempts?: number | undefined
  readonly placementBatchSize?: number | undefined
  readonly placementBatchWindowMs?: number | undefined
  readonly beatWindowMs?: number | undefined
  readonly beatBatchSize?: number | undefined
  readonly groupHoldBoundMs?: number | undefined
}

/** A store with its test reset. */
export interface StorePair {
  readonly store: StoreShape
  readonly testing: StoreTestingShape
  /** The hosts whose maintained sums differ from the ledger (`host_reserved_sums`): empty when consistent. */
  readonly sumsDrift: Effect.Effect<readonly SumsDrift[], Unavailable>
  /** The transient conflicts (deadlocks, serialization failures) the store met and retried so far. */
  readonly conflicts: () => Conflicts
  /** The version checks of this store's placements so far: written, and lost to another writer. */
  readonly placementChecks: () => HostCache.PlacementChecks
  /** This store's share of the hosts as its last fleet read found the placing stores (none: alone, or not spreading). */
  readonly placementSpread: () => Placement.Spread | undefined
  /** What this store's connections wait on now (on PostgreSQL; none on PGlite). */
  readonly diagnose?: Effect.Effect<Blockers.Diagnosis> | undefined
}

/**
 * This store's placement version checks (`StorePair.placementChecks`), beside the `Store` its
 * layers provide: the coordinator shows them on `/metrics`. Counted per store, so per replica.
 */
export class PlacementStats extends Context.Service<PlacementStats, { readonly checks: () => HostCache.PlacementChecks }>()("@engram/store-pg/PlacementStats") {}

/**
 * Builds the store over an open database. `placer`: the `application_name` every connection of
 * `db` carries (`HostCache.placerPrefix` and an id unique to this store), for a store that
 * spreads its placements among the others placing on the database (`PgOptions.spreadPlacements`).
 */
export const make = (
  db: Db,
  initialLimits: Limits.Limits = Limits.defaults,
  options: StoreOptions = {},
  placer?: string,
  /** The time the store stamps and judges with, when not the Effect Clock's (`PgOptions.databaseTime`). */
  time?: DatabaseTime.DatabaseTime,
): StorePair => {
  let limits = initialLimits
  const cache = HostCache.make({ limits, maxReadAgeMs: options.placementReadMaxAgeMs ?? 0, pool: readsOf(db.pool), placer })
  // postgres.js pipelines concurrent queries of one transaction; PGlite runs them one by one.
  const concurrency = db.driver === "postgres" ? 2 : 1
  const deps: Deps = {
    db,
    limits: () => limits,
    park: options.park ?? ParkPolicy.defaultRule,
    now: time?.now ?? Clock.currentTimeMillis,
    cache,
    both: (a, b) => Effect.all([a, b], { concurrency }),
  }
  const beats = { beatWindowMs: options.beatWindowMs, beatBatchSize: options.beatBatchSize, holdBoundMs: options.groupHoldBoundMs }
  const store: StoreShape = {
    limits: () => limits,
    ...(time === undefined ? {} : { now: time.nowMs }),
    ...Hosts.make(deps, beats),
    ...Sessions.make(deps, {
      maxCasAttempts: options.optimisticPlacementAttempts ?? 8,
      batchSize: Math.max(1, Math.floor(options.placementBatchSize ?? 64)),
      batchWindowMs: Math.max(0, options.placementBatchWindowMs ?? 0.2),
      holdBoundMs: options.groupHoldBoundMs,
      windowByReplicas: options.placementWindowByReplicas === true,
    }, beats),
    ...Queue.make(deps),
    ...Reservations.make(deps, beats),
    ...Moves.make(deps),
    ...Assignments.make(deps),
    ...AllowanceCommits.make(deps),
    ...Prune.make(deps),
  }
  const testing: StoreTestingShape = {
    reset: (next) =>
      readsOf(db.pool)
        .query(sql`truncate table session_events, move_pairs, moves, reservations, sessions, hosts, metrics`)
        .pipe(
          Effect.andThen(
            Effect.sync(() => {
              limits = next ?? Limits.defaults
              cache.reset(limits)
            }),
          ),
        ),
  }
  return { store, testing, sumsDrift: readSumsDrift(readsOf(db.pool)), conflicts: db.conflicts, placementChecks: cache.checks, placementSpread: cache.spread }
}

/** The pool with a unique violation a defect: for reads and statements that insert nothing a client names. */
const readsOf = (pool: Db["pool"]): Conn<Unavailable> => ({
  ...pool,
  use: (f) => dieOnUnique(pool.use(f)),
  query: (s) => dieOnUnique(pool.query(s)),
  pipeline: (s) => dieOnUnique(pool.pipeline(s)),
})

const storeOptions = (o: StoreOptions): StoreOptions => ({
  park: o.park,
  placementReadMaxAgeMs: o.placementReadMaxAgeMs,
  optimisticPlacementAttempts: o.optimisticPlacementAttempts,
  placementBatchSize: o.placementBatchSize,
  placementBatchWindowMs: o.placementBatchWindowMs,
  placementWindowByReplicas: o.placementWindowByReplicas,
  beatWindowMs: o.beatWindowMs,
  beatBatchSize: o.beatBatchSize,
  groupHoldBoundMs: o.groupHoldBoundMs,
})

/** A group's hold bound on a URL: 4× the server's statement bound where one is set. */
export const groupHoldBoundFor = (options: Pick<PgOptions, "groupHoldBoundMs" | "statementTimeoutMs">): number | undefined =>
  options.groupHoldBoundMs ?? (options.statementTimeoutMs !== undefined && options.statementTimeoutMs > 0 ? 4 * options.statementTimeoutMs : undefined)

/** The `application_name` prefix of a store's pool that does not spread its placements (a placer's is `HostCache.placerPrefix`). */
export const storeApplicationPrefix = "engram-store "

/** Opens the store on a PostgreSQL URL: applies the migrations, then a postgres.js pool. Closed with the scope. */
export const openUrl = (options: PgOptions): Effect.Effect<StorePair, Unavailable, Scope.Scope> => {
  const placer = options.spreadPlacements === false ? undefined : `${HostCache.placerPrefix}${randomUUID().slice(0, 13)}`
  // Every pool has a name of its own: the diagnosis of a timed-out call finds its connections by it.
  const applicationName = placer ?? `${storeApplicationPrefix}${randomUUID().slice(0, 13)}`
  return Effect.gen(function* () {
    const db = yield* PostgresJs.open({ ...options, applicationName })
    const time = options.databaseTime === true ? yield* DatabaseTime.start(readsOf(db.pool), options.databaseTimeEveryMs) : undefined
    return {
      ...make(db, options.limits ?? Limits.defaults, storeOptions({ ...options, groupHoldBoundMs: groupHoldBoundFor(options) }), placer, time),
      diagnose: Blockers.make(options.url, applicationName),
    }
  })
}

/**
 * How old a read of the hosts placements on PGlite may reuse by default: an embedded store has
 * one writer (SPEC §12), this store, whose every write of a host's room teaches the host cache
 * the row it wrote. So creates decide on the cache without reading.
 */
export const pgliteReadMaxAgeMs = 3_600_000

/** Opens the store on PGlite (in memory, or in `dataDir`): applies the migrations. Closed with the scope. */
export const openPglite = (options: PgliteOptions = {}): Effect.Effect<StorePair, Unavailable, Scope.Scope> =>
  Effect.map(Pglite.open(options), (db) =>
    make(db, options.limits ?? Limits.defaults, storeOptions({ ...options, placementReadMaxAgeMs: options.placementReadMaxAgeMs ?? pgliteReadMaxAgeMs })),
  )

const testingContext = (pair: StorePair): Context.Context<Store | StoreTesting> =>
  Context.add(Context.make(Store, pair.store), StoreTesting, pair.testing)

const storeContext = (pair: StorePair): Context.Context<Store | PlacementStats> => {
  const context = Context.add(Context.make(Store, pair.store), PlacementStats, { checks: pair.placementChecks })
  // On PostgreSQL, what its connections wait on goes along (the coordinator reads it when a call times out).
  return pair.diagnose === undefined ? context : (Context.add(context, Blockers.Blockers, { diagnose: pair.diagnose }) as Context.Context<Store | PlacementStats>)
}

/** The store on a PostgreSQL URL, with its placement checks. */
export const layer = (options: PgOptions): Layer.Layer<Store | PlacementStats, Unavailable> => Layer.effectContext(Effect.map(openUrl(options), storeContext))

/** The store on PGlite (embedded; in memory unless `dataDir`), with its placement checks. */
export const layerPglite = (options: PgliteOptions = {}): Layer.Layer<Store | PlacementStats, Unavailable> =>
  Layer.effectContext(Effect.map(openPglite(options), storeContext))

/** The store on a PostgreSQL URL with its `StoreTesting` reset (for the conformance suite). */
export const layerTesting = (options: PgOptions): Layer.Layer<Store | StoreTesting, Unavailable> =>
  Layer.effectContext(Effect.map(openUrl(options), testingContext))

/** The store on PGlite with its `StoreTesting` reset (for the conformance suite). */
export const layerPgliteTesting = (options: PgliteOptions = {}): Layer.Layer<Store | StoreTesting, Unavailable> =>
  Layer.effectContext(Effect.map(openPglite(options), testingContext))
