/**
 * Composition of one host agent: its VM runtime (simulated by default, QEMU on request), local
 * state (loaded, quarantined if corrupt, reconciled with what the runtime recovers: VMs
 * outlive the agent), the coordinator client, the move target and its peer server, and the
 * agent loops. `startHostAgent` is what the CLI, the demo and the tests run.
 */
import { tmpdir } from "node:os"
import { ImageStore, type RuntimeInfo, type SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import type { Redacted, Scope } from "effect"
import { Effect, Ref } from "effect"
import { FetchHttpClient } from "effect/http"
import type { Env } from "@engram/process"
import { type Agent, type AgentConfig, defaultAgentConfig, makeAgent } from "./Agent.js"
import { checkedConfig } from "./Config.js"
import { type CoordinatorShape, makeHttp } from "./Coordinator.js"
import * as Failover from "./Failover.js"
import * as ImageDir from "./ImageDir.js"
import * as ImageFetch from "./ImageFetch.js"
import * as ImageNonceFile from "./ImageNonceFile.js"
import * as LocalState from "./LocalState.js"
import type { HostReport } from "./Measure.js"
import { makeMoveTarget, type MoveTarget } from "./MoveTarget.js"
import * as PeerLink from "./PeerLink.js"
import * as PeerServer from "./PeerServer.js"
import { makeResidents, type Residents } from "./Residents.js"
import * as RuntimeChoice from "./RuntimeChoice.js"
import * as Supervision from "./Supervision.js"

export { defaultAgentConfig } from "./Agent.js"

export interface HostAgentOptions {
  readonly hostId: string
  /**
   * The coordinator, by URL (with the host token) or as a ready client (tests). Several URLs:
   * replicas of one coordinator, tried in this order (`Failover`).
   */
  readonly coordinator: { readonly url: string | readonly string[]; readonly hostToken: string | Redacted.Redacted<string> } | CoordinatorShape
  /** Shared by the fleet's agents: move tokens derive from it. */
  readonly peerSecret: string
  /**
   * Peer agent URLs by host id: the operator's override (`ENGRAM_PEERS`). A target it does not
   * name is reached at the URL the coordinator gives with the move (the target's `peerUrl`).
   * This host's own entry is the URL it advertises when told none (`peerUrl`) and it has a peer
   * server (`listen`).
   */
  readonly peers: (hostId: string) => string | undefined
  /**
   * Where the peer server listens; omitted = no server (in-memory links only). `advertiseHost`
   * (`ENGRAM_AGENT_ADVERTISE_HOST`): the host peers reach this one at, the derived peer URL's when
   * `host` is a wildcard (`PeerLink.peerHostOf`).
   */
  readonly listen?: { readonly port: number; readonly host: string; readonly advertiseHost?: string }
  /**
   * The peer server's URL this agent advertises with its reports (`ENGRAM_AGENT_PEER_URL`; the
   * coordinator gives it to the sources of moves to this host, and plans make-room moves, and
   * picks the target of a move asked for without one, only among hosts that advertise one).
   * Null: none. Omitted, with a peer server (`listen`): this host's own entry in `peers`
   * (`ENGRAM_PEERS`, `PeerLink.ownPeerUrl`) when it passes the rule, else derived
   * (`PeerLink.derivedPeerUrl`) from `listen` and the bound port; none without a server or
   * when the host is a wildcard. Checked by `startHostAgent` (`PeerLink.peerUrlRule`).
   */
  readonly peerUrl?: string | null
  /**
   * Where moves' data planes listen on this host and the address sources are told (the
   * simulated wire, QEMU's incoming migrations). `listenHost` by default: the peer server's
   * host. `advertiseHost` by default: `listenHost`, or, when that is a wildcard, the host of the
   * peer URL this agent advertises (`PeerLink.migrationAdvertiseHostOf`).
   */
  readonly migration?: Partial<RuntimeChoice.MigrationAddress>
  /** A custom peer link (in-memory tests); default HTTP to `peers`. */
  readonly link?: PeerLink.PeerLink
  /** The state file; omitted = state kept in memory only. */
  readonly stateFile?: string
  /**
   * Where descents write their image files; omitted = `engram-images-<host>` beside the state
   * file (the same directory on every start), or a new temporary one per start without a state
   * file (`ImageDir`).
   */
  readonly imageDir?: string
  /**
   * The floor rate of a descent image's fetch from another host (MiB/s; default
   * `ImageFetch.defaultImageFetchMinMibPerSec`, `ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS`): its listing
   * may take 10 minutes, or the session's memory at this rate when that is longer
   * (`ImageFetch.listingBoundMs`), its files 10 minutes or their listed bytes at this rate
   * (`ImageFetch.fetchBoundMs`).
   */
  readonly imageFetchMinMibPerSec?: number
  /** A ready runtime (tests); else QEMU with `qemu`, else the simulated one with `sim`. */
  readonly runtime?: VmRuntimeShape
  readonly qemu?: RuntimeChoice.QemuSettings
  /** The simulated runtime's settings, by `ENGRAM_SIM`'s rule (`Config.simSettingsProblem`: refused naming `sim`). */
  readonly sim?: Partial<SimRuntime.SimConfig>
  readonly measure: (residentMib: number) => Effect.Effect<HostReport>
  /**
   * The agent's timing and move policy over the defaults, checked as the environment's
   * (`Config.checkedConfig`): a bad value fails the start with `ConfigInvalid`, named by key.
   */
  readonly config?: Partial<AgentConfig>
  /**
   * The coordinator's heartbeat stale window (ms; default SPEC §9's): the heartbeat interval's
   * default is a third of it, and a `config.heartbeatIntervalMs` not below it is refused.
   */
  readonly heartbeatStaleWindowMs?: number
}

export interface HostAgent {
  readonly hostId: string
  readonly agent: Agent
  readonly runtime: VmRuntimeShape
  readonly runtimeInfo: RuntimeInfo
  readonly residents: Residents
  readonly target: MoveTarget
  /** The bound port of the peer server, when it listens. */
  readonly port: number | null
}

/** The agent's heartbeat interval: the default (a third of the stale window), or `o.config`'s (checked by `startHostAgent`). */
const heartbeatIntervalOf = (o: HostAgentOptions): number => o.config?.heartbeatIntervalMs ?? defaultAgentConfig(o.hostId, o.heartbeatStaleWindowMs).heartbeatIntervalMs

/**
 * The HTTP client of the coordinator at `url` (one URL or several replicas'), its calls bounded
 * by the agent's heartbeat interval with several URLs, 30 s with one (`Failover.callTimeoutFor`);
 * an interval the agent learns later shortens it by the same rule (`followHeartbeat`).
 */
export const httpCoordinator = (o: HostAgentOptions, url: string | readonly string[], hostToken: string | Redacted.Redacted<string>): Effect.Effect<CoordinatorShape> => {
  // Parsed once here; a list that does not parse is `makeHttp`'s to name (a defect).
  const parsed = Failover.parseUrls(typeof url === "string" ? url : url.join(","))
  const urls = "urls" in parsed ? parsed.urls : url
  const count = "urls" in parsed ? parsed.urls.length : 1
  return makeHttp({
    url: urls,
    hostId: o.hostId,
    hostToken,
    callTimeoutMs: Failover.callTimeoutFor(count, heartbeatIntervalOf(o)),
    startIndex: Failover.startIndex(o.hostId, count),
  }).pipe(Effect.provide(FetchHttpClient.layer))
}

/**
 * The peer URL an agent told none advertises: its server's (`PeerLink.derivedPeerUrl`), none
 * without a server, for a wildcard host, or (said once) for a host no URL can hold.
 */
const derivedPeerUrlOf = (o: HostAgentOptions, port: number | null): Effect.Effect<string | null> => {
  if (o.listen === undefined || port === null) return Effect.succeed(null)
  const url = PeerLink.derivedPeerUrl(PeerLink.peerHostOf(o.listen.host, o.listen.advertiseHost), port)
  if (url === null || PeerLink.peerUrlProblem(url) === undefined) return Effect.succeed(url)
  return Effect.logWarning("no peer URL advertised: the listen host (or, listening on a wildcard, the advertise host) makes none; set ENGRAM_AGENT_PEER_URL", { hostId: o.hostId, derived: url }).pipe(Effect.as(null))
}

/**
 * The peer URL an agent advertises: the one it is told (`peerUrl`; null: none), else its own
 * entry in the operator's peer list (where the fleet's agents reach it already), else derived
 * (`derivedPeerUrlOf`). An own entry that breaks the rule is not advertised (said once).
 */
const advertisedPeerUrlOf = (o: HostAgentOptions, port: number | null): Effect.Effect<string | null> => {
  if (o.peerUrl !== undefined) return Effect.succeed(o.peerUrl)
  // No peer server: nothing listens at its entry either.
  if (o.listen === undefined) return Effect.succeed(null)
  const own = PeerLink.ownPeerUrl(o.peers, o.hostId)
  if (own !== undefined) return Effect.succeed(own)
  const entry = o.peers(o.hostId)
  if (entry === undefined || entry === "") return derivedPeerUrlOf(o, port)
  return derivedPeerUrlOf(o, port).pipe(
    Effect.tap((derived) =>
      Effect.logWarning(
        `this host's ENGRAM_PEERS entry is not advertised as its peer URL: it ${PeerLink.peerUrlRule}; ` +
          (derived === null
            ? "this agent advertises no peer URL, so the coordinator's reaper moves no session here to make room. Mend the entry or set ENGRAM_AGENT_PEER_URL"
            : `this agent advertises ${derived} instead`),
        { hostId: o.hostId, entry, advertised: derived },
      ),
    ),
  )
}

/**
 * Builds one agent and starts its loops in the current scope. Its options are checked first
 * (`Config.checkedConfig`): bad ones fail it with `ConfigInvalid` before anything starts. A
 * runtime that cannot run here fails it (logged).
 */
export const startHostAgent = (o: HostAgentOptions): Effect.Effect<HostAgent, RuntimeChoice.RuntimeUnavailable | Env.ConfigInvalid, Scope.Scope> =>
  Effect.gen(function* () {
    const config = yield* checkedConfig(o)
    // Before anything starts: a default directory that is not this agent's own refuses the start.
    const imageDir = yield* ImageDir.resolve(o.hostId, o.imageDir, o.stateFile, tmpdir())
    const listenHost = o.migration?.listenHost ?? o.listen?.host ?? "127.0.0.1"
    // The peer URL as far as it is known before the server binds (its host is what counts here).
    const knownPeerUrl =
      o.peerUrl !== undefined
        ? o.peerUrl
        : o.listen === undefined
          ? null
          : (PeerLink.ownPeerUrl(o.peers, o.hostId) ?? PeerLink.derivedPeerUrl(PeerLink.peerHostOf(o.listen.host, o.listen.advertiseHost), o.listen.port))
    const address: RuntimeChoice.MigrationAddress = { listenHost, advertiseHost: PeerLink.migrationAdvertiseHostOf(listenHost, o.migration?.advertiseHost, knownPeerUrl) }
    const runtime: VmRuntimeShape =
      o.runtime ??
      (o.qemu !== undefined
        ? yield* RuntimeChoice.makeQemu(o.qemu, address).pipe(Effect.tapError((e) => Effect.logError(`host agent cannot start: ${e.message}`, { hostId: o.hostId })))
        : yield* RuntimeChoice.makeSim(o.sim ?? {}, o.listen === undefined ? null : address))
    const runtimeInfo = yield* runtime.info
    yield* Effect.logInfo(`runtime: ${runtimeInfo.kind}, guests run under ${runtimeInfo.accelerator}: ${runtimeInfo.detail}`, { hostId: o.hostId })
    // Real guests: said at once where stopping the agent would end them too.
    if (runtimeInfo.kind === "qemu") for (const w of (yield* Supervision.check()).warnings) yield* Effect.logWarning(w.message, { hostId: o.hostId, ...w.fields })

    const loaded = o.stateFile === undefined ? ({ _tag: "Missing" } as const) : yield* LocalState.load(o.stateFile, o.hostId)
    const initial = loaded._tag === "Loaded" ? loaded.state : null
    // Trust the runtime about what is alive (a real one probes its VMs, which outlive the
    // agent); keep the file's reservations and moves for what is.
    const alive = yield* runtime.recover(initial?.vms ?? [])
    const known = new Map((initial?.vms ?? []).map((v) => [v.vmId, v]))
    const lost = (initial?.vms ?? []).filter((v) => !alive.some((a) => a.vmId === v.vmId)).map((v) => v.vmId)
    if (lost.length > 0)
      yield* Effect.logError("VMs this agent ran did not survive its absence (a reboot, or their processes ended with the agent): their guests' memory is lost; a session the coordinator still has here boots fresh", {
        hostId: o.hostId,
        lost,
      })
    const state: LocalState.StateFile = {
      ...(initial ?? LocalState.empty(o.hostId)),
      vms: alive.map((v) => ({
        vmId: v.vmId,
        memMib: v.memMib,
        vcpus: v.vcpus,
        status: v.status,
        reservationId: known.get(v.vmId)?.reservationId ?? null,
        moveId: known.get(v.vmId)?.moveId ?? null,
      })),
    }
    const stateFile = o.stateFile
    const residents = yield* makeResidents(o.hostId, state, stateFile === undefined ? () => Effect.void : (s) => LocalState.write(stateFile, s))
    if (stateFile !== undefined) yield* LocalState.save(stateFile, state)
    const coordinator = "url" in o.coordinator ? yield* httpCoordinator(o, o.coordinator.url, o.coordinator.hostToken) : o.coordinator
    const target = yield* makeMoveTarget(o.hostId, runtime, residents, coordinator)
    const images = ImageStore.directory(imageDir)
    // Nothing fetches yet: a fetch's staging left here by an agent killed mid-fetch is a partial image no one will finish.
    const stale = yield* ImageFetch.sweepStaging(imageDir)
    if (stale.length > 0) yield* Effect.logInfo("stale fetch staging removed", { hostId: o.hostId, removed: stale.map((r) => r.name), bytes: stale.reduce((n, r) => n + r.bytes, 0) })
    // An image removal cut short (the agent stopped between moving the image aside and deleting it).
    const cutRemovals = yield* ImageStore.sweepRemoved(imageDir)
    if (cutRemovals.length > 0) yield* Effect.logInfo("removed descent images' leftovers deleted", { hostId: o.hostId, removed: cutRemovals })
    const link = o.link ?? PeerLink.http(o.peers, o.peerSecret, { oldMoveTokens: config.oldMoveTokens })
    // Known once the server listens (its port may be chosen then); the loops start after.
    const advertised = yield* Ref.make<string | null>(null)
    // The operator's ENGRAM_PEERS entry wins over the coordinator's URL, as for moves; the files
    // come from it, or (the coordinator's URL) from the one the image host proves in its listing.
    const fetchImage = (sessionId: string, imageHostId: string, peerUrl: string | null, memMib: number) => {
      const entry = o.peers(imageHostId)
      const url = entry ?? peerUrl
      return url === null
        ? Effect.fail(new ImageFetch.ImageFetchError({ sessionId, imageHostId, message: "no peer URL is known for the image host" }))
        : ImageFetch.fetchImage({ images, sessionId, imageHostId, peerUrl: url, peerUrlTrusted: entry !== undefined, me: o.hostId, secret: o.peerSecret, minMibPerSec: o.imageFetchMinMibPerSec ?? ImageFetch.defaultImageFetchMinMibPerSec, memMib })
    }
    // Descent images are hashed for their listing only where the peer server serves them.
    const warmImage = o.listen === undefined ? {} : { warmImage: (sessionId: string, goOn: Effect.Effect<boolean>) => ImageFetch.warmHashes(images, sessionId, goOn) }
    const agent = yield* makeAgent(config, { coordinator, runtime, measure: o.measure, residents, images, link, target, peerUrl: Ref.get(advertised), fetchImage, ...warmImage })
    const port =
      o.listen === undefined
        ? null
        : yield* PeerServer.serve({ hostId: o.hostId, secret: o.peerSecret, target, status: agent.status, images, peerUrl: Ref.get(advertised), nonceFile: ImageNonceFile.pathIn(imageDir, o.hostId), oldMoveTokens: config.oldMoveTokens }, { port: o.listen.port, host: o.listen.host }).pipe(Effect.orDie)
    const peerUrl = yield* advertisedPeerUrlOf(o, port)
    yield* Ref.set(advertised, peerUrl)
    yield* Effect.forkScoped(agent.run)
    yield* Effect.logInfo("host agent started", {
      hostId: o.hostId,
      port,
      peerUrl,
      runtime: runtimeInfo.kind,
      accelerator: runtimeInfo.accelerator,
      recoveredVms: state.vms.length,
      // Where this agent keeps what must outlive it: a restart with the same settings finds both.
      stateFile: o.stateFile ?? null,
      stateFileLoaded: loaded._tag === "Loaded",
      imageDir,
    })
    return { hostId: o.hostId, agent, runtime, runtimeInfo, residents, target, port }
  })
