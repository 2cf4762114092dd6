/**
 * Composition of one host agent: local state (loaded, quarantined if corrupt, recovered into
 * the runtime), the coordinator client, the move target and its peer server, and the agent
 * loops. `startHostAgent` is what the CLI, the demo and the tests run.
 */
import { Limits } from "@engram/core"
import type { Redacted, Scope } from "effect"
import { Effect } from "effect"
import { type Agent, type AgentConfig, makeAgent } from "./Agent.js"
import { type CoordinatorShape, makeHttp } from "./Coordinator.js"
import * as ImageStore from "./ImageStore.js"
import * as LocalState from "./LocalState.js"
import type { HostReport } from "./Measure.js"
import { makeMoveTarget, type MoveTarget } from "./MoveTarget.js"
import * as PeerLink from "./PeerLink.js"
import * as PeerServer from "./PeerServer.js"
import { makeResidents, type Residents } from "./Residents.js"
import type { VmRuntimeShape } from "./Runtime.js"
import { makeSimRuntime, type SimConfig } from "./SimRuntime.js"
import { FetchHttpClient } from "effect/http"

/** The agent defaults (SPEC §9 for the shared ones). */
export const defaultAgentConfig = (hostId: string, heartbeatStaleWindowMs = Limits.defaults.heartbeatStaleWindowMs): AgentConfig => ({
  hostId,
  heartbeatIntervalMs: Math.max(1, Math.floor(heartbeatStaleWindowMs / 3)),
  reportIntervalMs: 30_000,
  pollWaitMs: 20_000,
  retryDelayMs: 1_000,
  maxPreCopyRounds: 6,
  stagingGraceMs: 60_000,
})

export interface HostAgentOptions {
  readonly hostId: string
  /** The coordinator, by URL (with the host token) or as a ready client (tests). */
  readonly coordinator: { readonly url: string; readonly hostToken: string | Redacted.Redacted<string> } | CoordinatorShape
  /** Shared by the fleet's agents: move tokens derive from it. */
  readonly peerSecret: string
  /** Peer agent URLs by host id. */
  readonly peers: (hostId: string) => string | undefined
  /** Where the peer server listens; omitted = no server (in-memory links only). */
  readonly listen?: { readonly port: number; readonly host: string }
  /** A custom peer link (in-memory tests); default HTTP to `peers`. */
  readonly link?: PeerLink.PeerLink
  /** The state file; omitted = state kept in memory only. */
  readonly stateFile?: string
  /** Where descents store images; omitted = memory. */
  readonly imageDir?: string
  /** The runtime; default the simulated one with `sim`. */
  readonly runtime?: VmRuntimeShape
  readonly sim?: Partial<SimConfig>
  readonly measure: (residentMib: number) => Effect.Effect<HostReport>
  readonly config?: Partial<AgentConfig>
}

export interface HostAgent {
  readonly hostId: string
  readonly agent: Agent
  readonly runtime: VmRuntimeShape
  readonly residents: Residents
  readonly target: MoveTarget
  /** The bound port of the peer server, when it listens. */
  readonly port: number | null
}

/** Builds one agent and starts its loops in the current scope. */
export const startHostAgent = (o: HostAgentOptions): Effect.Effect<HostAgent, never, Scope.Scope> =>
  Effect.gen(function* () {
    const config: AgentConfig = { ...defaultAgentConfig(o.hostId), ...o.config, hostId: o.hostId }
    const loaded = o.stateFile === undefined ? ({ _tag: "Missing" } as const) : yield* LocalState.load(o.stateFile, o.hostId)
    const initial = loaded._tag === "Loaded" ? loaded.state : null
    const runtime = o.runtime ?? (yield* makeSimRuntime(o.sim))
    // Trust the runtime about what is alive; keep the file's reservations for what is.
    const alive = yield* runtime.recover(initial?.vms ?? [])
    const known = new Map((initial?.vms ?? []).map((v) => [v.vmId, v]))
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
    const residents = yield* makeResidents(o.hostId, state, stateFile === undefined ? () => Effect.void : (s) => LocalState.save(stateFile, s))
    if (stateFile !== undefined) yield* LocalState.save(stateFile, state)
    const coordinator = "url" in o.coordinator
      ? yield* makeHttp({ url: o.coordinator.url, hostId: o.hostId, hostToken: o.coordinator.hostToken }).pipe(Effect.provide(FetchHttpClient.layer))
      : o.coordinator
    const target = yield* makeMoveTarget(o.hostId, runtime, residents)
    const images = o.imageDir === undefined ? yield* ImageStore.inMemory() : ImageStore.directory(o.imageDir)
    const link = o.link ?? PeerLink.http(o.peers, o.peerSecret)
    const agent = yield* makeAgent(config, { coordinator, runtime, measure: o.measure, residents, images, link, target })
    const port =
      o.listen === undefined
        ? null
        : yield* PeerServer.serve({ hostId: o.hostId, secret: o.peerSecret, target, status: agent.status }, o.listen).pipe(Effect.orDie)
    yield* Effect.forkScoped(agent.run)
    yield* Effect.logInfo("host agent started", { hostId: o.hostId, port, recoveredVms: state.vms.length, stateFile: loaded._tag })
    return { hostId: o.hostId, agent, runtime, residents, target, port }
  })
