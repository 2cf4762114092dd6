/**
 * The coordinator as one Layer: the store (PGlite under the data dir by default, PostgreSQL
 * with `databaseUrl`, or any store layer a test passes), the admin token, the HTTP server
 * with every handler, the start-up reconcile, and the reaper loop with its leader election.
 * `startCoordinator` runs it in-process and answers its URL, admin token and a `stop`.
 */
import { NodeHttpServer } from "@effect/platform-node"
import { EngramApi } from "@engram/api"
import { Changes, Store } from "@engram/store"
import { Blockers, ChangesPg, StorePg } from "@engram/store-pg"
import { Trigger } from "@engram/reaper"
import { Log } from "@engram/process"
import { ByteSize, Context, Deferred, Effect, Exit, Layer, Option, Redacted, References, Scope } from "effect"
import type { LogLevel } from "effect"
import { HttpIncomingMessage, HttpRouter, HttpServer } from "effect/http"
import { HttpApiBuilder } from "effect/http-api"
import { mkdirSync, readFileSync } from "node:fs"
import { randomUUID } from "node:crypto"
import { hostname } from "node:os"
import { createServer } from "node:http"
import type { Server } from "node:http"
import { createRequire } from "node:module"
import { join, resolve } from "node:path"
import { Assignments } from "./Assignments.js"
import { AdminOnlyLive, AdminToken, adminTokenFingerprint, BearerAuthLive, Credentials, hashToken, resolveAdminToken, ScrapeAuthLive } from "./Auth.js"
import type { CoordinatorConfig, CoordinatorConfigInput } from "./Config.js"
import * as Config from "./Config.js"
import * as DataDirLock from "./DataDirLock.js"
import { FleetHistory } from "./FleetHistory.js"
import { Forwarder, PeerLive } from "./Forward.js"
import type { Options as FleetHistoryOptions } from "./FleetHistory.js"
import { HandlersLive } from "./Handlers.js"
import { defectReporter, edge, onClientError, onExpectation, pathParamMaxLength, routeLabeler } from "./HttpEdge.js"
import * as SocketGuard from "./SocketGuard.js"
import * as Connections from "./Connections.js"
import * as EncodedOnce from "./EncodedOnce.js"
import { InputErrorsLive } from "./HttpErrors.js"
import { always as leaderAlways, Leader, postgres as leaderPostgres } from "./Leader.js"
import { LongPolls } from "./LongPolls.js"
import { Metrics } from "./Metrics.js"
import { MoveWaiter } from "./MoveWaiter.js"
import { Notifier } from "./Notifier.js"
import { parkRule, ReactAtOnce, reaperPass, ReaperLoop, ReconcileAtStart } from "./Reaper.js"
import type { PassReport } from "./Reaper.js"
import { Drainer } from "./Drainer.js"
import { SessionWaiter } from "./SessionWaiter.js"
import { StrictInputLive } from "./StrictInput.js"
import * as Stalls from "./Stalls.js"
import { boundStore, StoreHealth } from "./StoreBound.js"
import { Settings } from "./Settings.js"
import type { Backend } from "./Settings.js"
import * as Tracing from "./Tracing.js"
import { UiLive } from "./Ui.js"

/** How to run a coordinator. */
export interface CoordinatorOptions {
  /** Settings over the defaults of `Config.parse({})`; secrets as text or `Redacted`. */
  readonly config?: CoordinatorConfigInput | undefined
  /**
   * A store to use instead of the configured one (tests: `StoreSim.layer()`, or a wrapper
   * that fails). Such a store is treated as single-process: this replica always leads.
   */
  readonly store?: Layer.Layer<Store, unknown> | undefined
  /**
   * The change notices to use (default: `ChangesPg` on PostgreSQL, else `Changes.local`). A test
   * that passes its own `store` on a shared PostgreSQL passes `ChangesPg.layer` here.
   */
  readonly changes?: Layer.Layer<Changes> | undefined
  /** Run the reaper loop (default true). Tests that drive `reaperPass` themselves turn it off. */
  readonly reaper?: boolean | undefined
  /** Minimum log level (default `ENGRAM_LOG_LEVEL`, else Info). */
  readonly logLevel?: LogLevel.LogLevel | undefined
  /** How often the dashboard's charts sample the fleet, and how many samples they keep (default every 10 s, an hour). */
  readonly uiHistory?: FleetHistoryOptions | undefined
  /** With `otlpUrl` configured: how often spans are sent (default 1 s; they are sent at stop too). */
  readonly otlpExportIntervalMs?: number | undefined
}

/** What a running coordinator tells its starter. */
export interface CoordinatorInfoShape {
  readonly url: string
  readonly port: number
  readonly adminToken: string
  /** Where the admin token was read from or written to; null when configured. */
  readonly adminTokenFile: string | null
  readonly backend: Backend
  readonly config: CoordinatorConfig
  /**
   * Succeeds, with the reason, if the embedded store's engine ends while the coordinator runs
   * (PGlite's worker thread died: every store call answers 503 from then on), or its data
   * directory's lock was taken over by another coordinator (this one was frozen or cut off: its
   * engine is dropped at once); never otherwise. `main` exits 1 on it: after an engine's end a
   * supervisor restarts the coordinator on its data directory; after a takeover the restart
   * finds the other's lock and exits 1 again, naming it.
   */
  readonly storeLost: Effect.Effect<string>
}

/** The running coordinator's address and admin credential. */
export class CoordinatorInfo extends Context.Service<CoordinatorInfo, CoordinatorInfoShape>()("@engram/coordinator/CoordinatorInfo") {}


/**
 * The logger of this process (`@engram/process`'s `Log`: pretty on a terminal, JSON lines
 * otherwise or with `ENGRAM_LOG_FORMAT=json`), at `level` (default `ENGRAM_LOG_LEVEL`, else Info).
 */
export const loggerLayer = (level?: LogLevel.LogLevel) => {
  const { settings } = Log.settingsOfProcess()
  return Log.layer(level === undefined ? settings : { ...settings, level })
}

/**
 * How long an idle kept-alive connection stays open by default (`Config.defaultHttpKeepAliveMs`,
 * `ENGRAM_HTTP_KEEP_ALIVE_MS`). The socket itself lives `keepAliveTimeoutBufferMs` past the
 * advertised timeout, a margin for a loaded machine's late timers; the headers of a request may
 * take as long as an idle connection (Node requires `headersTimeout` above the keep-alive timeout).
 */
export const keepAliveTimeoutMs = Config.defaultHttpKeepAliveMs
/**
 * The listening socket's queue of connections not yet accepted (Node's default is 511; the
 * kernel caps it at `net.core.somaxconn`). A fleet's agents reconnect together (a restart, a
 * network blip): with 10,000 of them on a busy coordinator a queue of 511 overflowed, and the
 * kernel reset the connections it dropped (`ECONNRESET` at the agents, which then retried).
 */
export const listenBacklog = 8192

/**
 * The kernel's cap on a listening socket's queue (`net.core.somaxconn`, read from `path`), or
 * undefined where it cannot be read (not Linux).
 */
export const readSomaxconn = (path = "/proc/sys/net/core/somaxconn"): number | undefined => {
  try {
    const n = Number(readFileSync(path, "utf8").trim())
    return Number.isInteger(n) && n > 0 ? n : undefined
  } catch {
    return undefined
  }
}

/**
 * The warning a coordinator logs at start when the kernel caps its listen queue below
 * `listenBacklog` (it does so silently). Measured (fleet bench, 2 December, `net.core.somaxconn`
 * 4,096): 5,000 agents connecting within 2 s filled the queue for 5 s (the coordinator accepted
 * about 300 connections a second while it answered their first polls), the kernel dropped 5,800
 * connection attempts (62,000 at 10,000 agents), and the worst heartbeat sent on such a
 * connection was answered after 2.7 to 18 s (by run), nearly all of it TCP's retransmit waits
 * (1, 3, 7, 15 s…) before the coordinator saw it; on connections already open the same
 * heartbeats took at most 0.75 s.
 * A larger queue does not make the coordinator accept faster: connections then wait their turn
 * in it rather than in doubling retransmits. Undefined when the cap is unknown or high enough.
 */
export const listenQueueWarning = (somaxconn: number | undefined): string | undefined =>
  somaxconn === undefined || somaxconn >= listenBacklog
    ? undefined
    : `the kernel caps this coordinator's listen queue at ${somaxconn} connections (net.core.somaxconn), below the ${listenBacklog} it asks for: ` +
      `when more agents than that connect at once (a restart, a network blip), the kernel drops the rest and their first requests (heartbeats among them) wait for TCP's retransmits (1, 3, 7, 15 s…); ` +
      `raise it (sysctl -w net.core.somaxconn=${listenBacklog})`
const keepAliveTimeoutBufferMs = 5_000

/** How long a request may take to arrive whole (headers and body), ms; at least the headers' bound. */
const requestTimeoutMs = 120_000

const keepingAlive = (server: Server, keepAliveMs: number): Server => {
  server.keepAliveTimeout = keepAliveMs
  ;(server as Server & { keepAliveTimeoutBuffer?: number }).keepAliveTimeoutBuffer = keepAliveTimeoutBufferMs
  server.headersTimeout = keepAliveMs + keepAliveTimeoutBufferMs + 1000
  // A whole request (headers and body) within 2 minutes (Node's default is 5): receiving only,
  // so answers held for long (waits, moves) are not cut.
  server.requestTimeout = Math.max(requestTimeoutMs, server.headersTimeout)
  return server
}

/** This coordinator's version (its package's), for the traces' resource. */
const coordinatorVersion = (): string => {
  try {
    return String((createRequire(import.meta.url)("../package.json") as { version?: unknown }).version ?? "unknown")
  } catch {
    return "unknown"
  }
}

type Provided = CoordinatorInfo | Store | Changes | Metrics | Notifier | LongPolls | Credentials | Leader | Settings | Drainer

/**
 * The coordinator as a Layer: serves until the layer's scope closes. Its settings are checked
 * first (`Config.fromInput`): bad ones fail it with `ConfigInvalid` before anything is opened.
 */
export const layer = (options: CoordinatorOptions = {}): Layer.Layer<Provided, unknown> =>
  Layer.unwrap(Effect.map(Config.fromInput(options.config), (config) => configured(config, options)))

/** The coordinator on a checked configuration. */
const configured = (config: CoordinatorConfig, options: CoordinatorOptions): Layer.Layer<Provided, unknown> => {
  const databaseUrl = config.databaseUrl === null ? null : Redacted.value(config.databaseUrl)
  const backend: Backend = options.store !== undefined ? "custom" : databaseUrl !== null ? "postgres" : "pglite"
  // Group placement: concurrent creates placed together (see @engram/store-pg).
  // Heartbeats and reports of many agents written together.
  // The embedded store's engine thread ended on its own, or its data directory's lock was taken over (see CoordinatorInfoShape.storeLost).
  const storeLost = Deferred.makeUnsafe<string>()
  const batching = { placementBatchSize: config.placementBatchSize, placementBatchWindowMs: config.placementBatchWindowUs / 1000, beatWindowMs: config.beatWindowMs }
  const openedStore: Layer.Layer<Store, unknown> =
    options.store ??
    (databaseUrl !== null
      ? StorePg.layer({
          url: databaseUrl,
          limits: config.limits,
          park: parkRule(config),
          placementReadMaxAgeMs: config.placementReadMaxAgeMs,
          connectTimeoutSec: Math.max(1, Math.ceil(config.storeTimeoutMs / 1000)),
          statementTimeoutMs: config.storeTimeoutMs,
          poolSize: config.storePoolSize,
          spreadPlacements: config.placementSpread === 1,
          placementWindowByReplicas: config.placementWindowByReplicas === 1,
          // Replicas stamp and judge heartbeats on one clock, the database's, whatever their own say.
          databaseTime: true,
          ...batching,
        })
      : Layer.unwrap(
          Effect.gen(function* () {
            const dataDir = resolve(config.dataDir)
            mkdirSync(dataDir, { recursive: true })
            // One writer per embedded store: held until the coordinator stops. Lost to another, the
            // engine is dropped at once (nothing more written, not even its close's checkpoint:
            // the directory is the other's now) and the coordinator exits 1.
            const abandon = new AbortController()
            yield* DataDirLock.acquire(dataDir, {
              onLost: (why) => {
                abandon.abort(why)
                Deferred.doneUnsafe(storeLost, Effect.succeed(`${why}: another coordinator writes the embedded database now, and this one wrote nothing more to it`))
              },
            })
            return StorePg.layerPglite({
              dataDir: join(dataDir, "pglite"),
              worker: config.pgliteWorker === 1,
              abandon: abandon.signal,
              onWorkerExit: (why) =>
                Deferred.doneUnsafe(storeLost, Effect.succeed(`${why}: the embedded database is gone; a supervisor's restart of the coordinator recovers it (PGlite recovers its data directory at the next start)`)),
              limits: config.limits,
              park: parkRule(config),
              ...batching,
            })
          }),
        ))
  // Every store call answers within `storeTimeoutMs` (503 with Retry-After past it).
  const storeLayer: Layer.Layer<Store | StoreHealth | Stalls.Stalls, unknown> = Layer.effectContext(
    Effect.gen(function* () {
      const blockers = yield* Effect.serviceOption(Blockers.Blockers)
      const stalls = Option.isSome(blockers) ? Stalls.make(blockers.value.diagnose) : Stalls.none
      const { store, health } = boundStore(yield* Store, config.storeTimeoutMs, Tracing.childSpans(yield* Tracing.spans), stalls)
      const bound = Context.add(Context.add(Context.make(Store, store), StoreHealth, health), Stalls.Stalls, stalls)
      // The placement checks of a store-pg store go along (`/metrics` shows them).
      const stats = yield* Effect.serviceOption(StorePg.PlacementStats)
      return Option.isSome(stats) ? Context.add(bound, StorePg.PlacementStats, stats.value) : bound
    }),
  ).pipe(Layer.provide(openedStore))
  // This replica's internal address (forwarded creates come here while it leads): configured,
  // or its listen address once the server listens.
  let advertised: string | null = config.peerUrl
  // This replica's admin token fingerprint, written with the lease: set once the token is resolved.
  let adminFingerprint: string | null = null
  const leaderLayer =
    backend === "postgres" && databaseUrl !== null
      ? leaderPostgres(
          databaseUrl,
          { leaseDurationMs: config.leaseDurationMs, renewDeadlineMs: config.leaseRenewDeadlineMs },
          `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`,
          () => advertised,
          () => adminFingerprint,
        )
      : leaderAlways
  // Replicas on one PostgreSQL wake each other's waiters through LISTEN/NOTIFY.
  const changesLayer: Layer.Layer<Changes> =
    options.changes ?? (backend === "postgres" && databaseUrl !== null ? ChangesPg.layer({ url: databaseUrl, checkMs: config.changesCheckMs }) : Changes.local)

  const settingsLayer = Layer.succeed(Settings, Settings.of({ config, backend }))
  const adminLayer = Layer.effect(
    AdminToken,
    Effect.gen(function* () {
      const admin = yield* resolveAdminToken(config.adminToken, config.dataDir)
      const fingerprint = adminTokenFingerprint(admin.token)
      adminFingerprint = fingerprint
      if (admin.generated) yield* Effect.logInfo("generated an admin token", { adminTokenFile: admin.file })
      // Replicas on one PostgreSQL each generate their own token otherwise, and refuse each other's:
      // said at every start from a token file, not only the one that generated it.
      if (admin.file !== null && backend === "postgres") yield* Effect.logWarning(Config.generatedTokenOnPostgresWarning(admin.file), { adminTokenFile: admin.file })
      return AdminToken.of({
        tokenHash: hashToken(admin.token),
        token: admin.token,
        file: admin.file,
        fingerprint,
        metricsTokenHash: config.metricsToken === null ? null : hashToken(Redacted.value(config.metricsToken)),
      })
    }),
  )

  // Shared state lives outside HttpRouter.serve (which builds its app in a private MemoMap),
  // with the services the handlers call: "room appeared", the move waiter, the assignments
  // long-poll, and the gate's immediate reaction to a session queued without room (off with
  // the reaper loop: tests that drive passes by hand get a trigger that does nothing).
  const trigger = options.reaper === false ? Layer.succeed(Trigger, Trigger.of({ poke: Effect.void })) : ReactAtOnce
  const shared = Layer.mergeAll(
    Assignments.layer,
    MoveWaiter.layer,
    SessionWaiter.layer,
    LongPolls.layer,
    Forwarder.layer,
    trigger,
    FleetHistory.layer(options.uiHistory),
    Tracing.MoveSpans.layer,
  ).pipe(
    Layer.provideMerge(Layer.mergeAll(Drainer.layer, Credentials.layer)),
    Layer.provideMerge(Layer.mergeAll(Metrics.layer, Notifier.layer, settingsLayer, leaderLayer, adminLayer)),
    Layer.provideMerge(storeLayer),
    Layer.provideMerge(changesLayer),
  )

  const apiLayer = HttpApiBuilder.layer(EngramApi).pipe(
    Layer.provide(HandlersLive),
    Layer.provide([BearerAuthLive, AdminOnlyLive, ScrapeAuthLive, InputErrorsLive, StrictInputLive]),
  )
  // The browsable reference (Scalar, served from this process: no CDN; encoded once), and the dashboard at /ui.
  const docsLayer = EncodedOnce.docsLayer("/docs")
  // Set when the coordinator begins to stop (after its shutdown delay): new requests get 503.
  let closing = false
  // Set while a stopping coordinator waits out its shutdown delay: /readyz answers 503.
  let draining = false
  // The server is built without `shared`'s services (`own`) in its context: every request's
  // context starts as a copy of the server's, and effect copies it again on the way (the API
  // builder's merge, `HandlerGroup`), so each service there costs every request. The routes
  // and the start-up reconcile take what they call from `own` when they are built; requests
  // read only `Metrics` (`HttpErrors.api` counts a 503) and `Stalls` (it tells an agent a stalled
  // database), which the server keeps.
  const served = (own: Context.Context<Layer.Success<typeof shared>>) => {
    const withOwn = Layer.provide(Layer.succeedContext(own))
    const metrics = Context.get(own, Metrics)
    const stalls = Context.get(own, Stalls.Stalls)
    // The edge wraps the router (every route and its 404) as its global middleware rather than
    // as the server's: a server middleware costs every request the server's longer path.
    const edgeLayer = HttpRouter.middleware(edge({ maxBodyBytes: config.maxBodyBytes, closing: () => closing, draining: () => draining, metrics }), { global: true })
    return HttpRouter.serve(withOwn(Layer.mergeAll(apiLayer, docsLayer, UiLive, PeerLive, edgeLayer)), {
      disableLogger: true,
      disableListenLog: true,
      // A path id past the router's default 100 characters reached no route (a 404 "no endpoint"):
      // it reaches its route, whose decoder and store judge it (an id no record can have: 400 or 404).
      routerConfig: { maxParamLength: pathParamMaxLength },
    }).pipe(
      Layer.provideMerge(
        Layer.unwrap(
          Effect.map(Effect.context<never>(), (services) => {
            // The refusals at the connection cap are logged with this coordinator's logger.
            const logWarning = Effect.runForkWith(services)
            return NodeHttpServer.layer(
              // What Node's parser refuses (an oversized URL or header) and an `Expect` it cannot
              // meet are answered in JSON too, and counted; a missing `Host` is the edge's to refuse
              // (Node's own check answers a bare 400 before any listener).
              () =>
                Connections.track(
                  SocketGuard.guard(
                    keepingAlive(createServer({ requireHostHeader: false }), config.httpKeepAliveMs)
                      .on("clientError", onClientError(metrics))
                      .on("checkExpectation", onExpectation(metrics)),
                  ),
                  {
                    maxConnections: config.maxConnections,
                    open: (count) => metrics.connectionsOpen.set(count),
                    refused: () => metrics.connectionsRefused.inc(),
                    warn: (message, fields) => void logWarning(Effect.logWarning(message, fields)),
                  },
                ),
              { port: config.port, host: config.host, backlog: listenBacklog, gracefulShutdownTimeout: "10 seconds" },
            )
          }),
        ),
      ),
      // A request's defect reaches its 500's log line.
      Layer.provide(defectReporter),
      // Set once for every request rather than per request (the hot path): the body limit, and no
      // spans unless they are exported (a span per request cost ~5 % of a request's CPU).
      Layer.provide(
        Layer.mergeAll(
          Layer.succeed(HttpIncomingMessage.MaxBodySize, ByteSize.bytes(config.maxBodyBytes)),
          Layer.succeed(References.TracerEnabled, config.otlpUrl !== null),
          Layer.succeed(Metrics, metrics),
          Layer.succeed(Stalls.Stalls, stalls),
        ),
      ),
      // The start-up reconcile (reclaim, only expired reservations while the failover grace is on, then drain) finishes
      // before the server is built, so the first request already sees its result.
      Layer.provide(withOwn(ReconcileAtStart)),
    )
  }
  // `shared`'s services and the server beside them (`Layer.flatMap` builds the server outside them).
  const server = Layer.flatMap(shared, (own) => Layer.merge(Layer.succeedContext(own), served(own)))
  const reaper = options.reaper === false ? Layer.empty : ReaperLoop

  const info = Layer.effect(
    CoordinatorInfo,
    Effect.gen(function* () {
      const http = yield* HttpServer.HttpServer
      const admin = yield* AdminToken
      const address = http.address
      const port = address._tag === "UnixPathAddress" ? 0 : address.port
      const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`
      // Listening on every interface: other replicas reach this one by its host name.
      advertised ??= config.host === "0.0.0.0" || config.host === "::" ? `http://${hostname()}:${port}` : url
      const infoValue: CoordinatorInfoShape = { url, port, adminToken: admin.token, adminTokenFile: admin.file, backend, config, storeLost: Deferred.await(storeLost) }
      const leader = yield* Leader
      const longPolls = yield* LongPolls
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          closing = true
        }).pipe(
          // The lease first, before the server drains its open requests: another replica leads
          // at its next check. Then the open long-polls answer at once (their agents ask another
          // replica), so the drain does not wait them out (up to its 10 s).
          Effect.andThen(leader.giveUp ?? Effect.void),
          Effect.andThen(longPolls.endAll),
        ),
      )
      // The first finalizer to run (the last added): not ready, still serving, for the delay. The
      // reaper stops at once (its layer closes beside this one), so the lease goes first: another
      // replica leads meanwhile.
      if (config.shutdownDelayMs > 0)
        yield* Effect.addFinalizer(() =>
          Effect.sync(() => {
            draining = true
          }).pipe(
            Effect.andThen(leader.giveUp ?? Effect.void),
            Effect.andThen(Effect.logInfo(`stopping: /readyz answers 503; serving for ${config.shutdownDelayMs} ms more (ENGRAM_SHUTDOWN_DELAY_MS)`)),
            Effect.andThen(Effect.sleep(config.shutdownDelayMs)),
          ),
        )
      const queueWarning = listenQueueWarning(readSomaxconn())
      // Info, not a warning: most kernels cap the queue at 4,096, which only a fleet of thousands
      // of agents connecting at once (a restart, a network blip) outgrows.
      if (queueWarning !== undefined) yield* Effect.logInfo(queueWarning, { somaxconn: readSomaxconn(), listenBacklog })
      // A cap within `fdHeadroom` of the descriptor limit leaves the store too few, and at or above it never acts.
      const fdLimit = Connections.readFdLimit()
      const capWarning = Connections.fdLimitWarning(config.maxConnections, fdLimit)
      if (capWarning !== undefined) yield* Effect.logWarning(capWarning, { maxConnections: config.maxConnections, fdLimit })
      // Set for the other backend than the one running: said once, not refused (one
      // environment may serve both).
      const ignored = backend === "pglite" ? Config.postgresOnlySet(config) : backend === "postgres" ? Config.embeddedOnlySet(config) : []
      if (ignored.length > 0)
        yield* Effect.logWarning(backend === "pglite" ? Config.postgresOnlyWarning(ignored) : Config.embeddedOnlyWarning(ignored), { variables: ignored })
      yield* Effect.logInfo(`engram coordinator listening on ${url}`, {
        url,
        port,
        store: backend,
        dataDir: backend === "pglite" ? resolve(config.dataDir) : null,
        adminTokenFile: admin.file,
        reaperIntervalMs: config.limits.reaperIntervalMs,
      })
      return CoordinatorInfo.of(infoValue)
    }),
  )

  // Traces over OTLP when a collector is configured; nothing otherwise (see Tracing.ts).
  const tracing = Tracing.layer(
    config.otlpUrl === null ? null : { url: config.otlpUrl, headers: config.otlpHeaders, exportIntervalMs: options.otlpExportIntervalMs },
    routeLabeler(),
    coordinatorVersion(),
  )
  return Layer.mergeAll(info, reaper).pipe(Layer.provideMerge(server), Layer.provide(tracing))
}

/** A coordinator running in this process. */
export interface RunningCoordinator extends CoordinatorInfoShape {
  /** Runs one reaper pass now against this coordinator's store (tests; no leadership check). */
  readonly reaperPass: () => Promise<PassReport>
  /** Runs an effect against this coordinator's services (tests). */
  readonly run: <A, E>(effect: Effect.Effect<A, E, Store | Changes | Metrics | Notifier | LongPolls | Credentials>) => Promise<A>
  /** Stops serving (in-flight requests finish), releases the leader lock, closes the store. */
  readonly stop: () => Promise<void>
}

/** Starts a coordinator in this process. */
export const startCoordinator = async (options: CoordinatorOptions = {}): Promise<RunningCoordinator> => {
  const scope = Effect.runSync(Scope.make())
  const built = layer(options).pipe(Layer.provide(loggerLayer(options.logLevel)))
  const context = await Effect.runPromise(Layer.buildWithScope(built, scope)).catch(async (e: unknown) => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    throw e
  })
  const info = Context.get(context, CoordinatorInfo)
  const provide = <A, E>(effect: Effect.Effect<A, E, Store | Changes | Metrics | Notifier | LongPolls | Credentials>) =>
    effect.pipe(Effect.provideContext(context), Effect.provide(loggerLayer(options.logLevel)))
  let stopping: Promise<void> | undefined
  return {
    ...info,
    // A pass driven by hand first tries the leader lock, as the loop does each interval.
    reaperPass: () => Effect.runPromise(provide(Effect.flatMap(Effect.flatMap(Effect.serviceOption(Leader), (l) => (Option.isSome(l) ? l.value.tick : Effect.void)), () => reaperPass))),
    run: (effect) => Effect.runPromise(provide(effect)),
    stop: () => (stopping ??= Effect.runPromise(Scope.close(scope, Exit.void))),
  }
}
