/**
 * The agent's configuration, read through effect `Config` from the environment (every variable
 * in README.md). Every bad value is reported at start, all at once, in `@engram/api`'s `Env`
 * format (`VARIABLE="value": rule`); the host token and the peer secret are `Redacted` and never
 * echoed; nothing falls back silently. An `ENGRAM_*` variable that no engram component reads is
 * warned about by name.
 */
import { Env } from "@engram/api"
import { Limits } from "@engram/core"
import { Config, ConfigProvider, Effect, Option, Redacted, Schema } from "effect"
import type { AgentConfig } from "./Agent.js"
import { defaultAgentConfig, type HostAgentOptions } from "./Host.js"
import { HostMeter, layerFixed, measureHost } from "./Measure.js"
import { parsePeers } from "./PeerLink.js"
import type { SimConfig } from "./SimRuntime.js"

/** The configuration is invalid; `issues` names every bad variable. */
export const ConfigInvalid = Env.ConfigInvalid
export type ConfigInvalid = Env.ConfigInvalid

/** Every variable the agent reads. */
export const variables: readonly string[] = Env.agentVariables

/** Variables whose values are secrets: never echoed. */
export const secretVariables: ReadonlySet<string> = new Set(["ENGRAM_HOST_TOKEN", "ENGRAM_PEER_SECRET"])

type Env_ = Readonly<Record<string, string | undefined>>

const int = (variable: string, min: number) => {
  const rule = `must be an integer >= ${min}`
  return Config.schema(Schema.NumberFromString.annotate({ message: rule }).check(Schema.isInt({ message: rule }), Schema.isGreaterThanOrEqualTo(min, { message: rule })), variable)
}
const intOr = (variable: string, fallback: number, min: number) => int(variable, min).pipe(Config.withDefault(fallback))
const optionalText = (variable: string) => Config.String(variable).pipe(Config.option)

const settings = {
  hostId: Config.String("ENGRAM_HOST_ID"),
  url: Config.String("ENGRAM_COORDINATOR_URL"),
  hostToken: Config.Redacted("ENGRAM_HOST_TOKEN"),
  peerSecret: Config.schema(Schema.String.check(Schema.isMinLength(16, { message: "must be at least 16 characters" })), "ENGRAM_PEER_SECRET").pipe(
    Config.map((s) => Redacted.make(s, { label: "ENGRAM_PEER_SECRET" })),
  ),
  staleMs: intOr("ENGRAM_HEARTBEAT_STALE_WINDOW_MS", Limits.defaults.heartbeatStaleWindowMs, 1),
  heartbeatIntervalMs: int("ENGRAM_AGENT_HEARTBEAT_MS", 1).pipe(Config.option),
  reportIntervalMs: int("ENGRAM_AGENT_REPORT_MS", 1).pipe(Config.option),
  pollWaitMs: int("ENGRAM_AGENT_POLL_WAIT_MS", 0).pipe(Config.option),
  retryDelayMs: int("ENGRAM_AGENT_RETRY_MS", 1).pipe(Config.option),
  maxPreCopyRounds: int("ENGRAM_AGENT_MAX_PRECOPY_ROUNDS", 2).pipe(Config.option),
  stagingGraceMs: int("ENGRAM_AGENT_STAGING_GRACE_MS", 1).pipe(Config.option),
  peers: Config.String("ENGRAM_PEERS").pipe(Config.withDefault("")),
  port: intOr("ENGRAM_AGENT_PORT", 7100, 0),
  listenHost: Config.String("ENGRAM_AGENT_HOST").pipe(Config.withDefault("127.0.0.1")),
  sim: Config.schema(
    Schema.String.check(
      Schema.makeFilter(
        (s: string) => {
          try {
            const v: unknown = JSON.parse(s)
            return typeof v === "object" && v !== null && !Array.isArray(v)
          } catch {
            return false
          }
        },
        { message: "must be a JSON object of simulated runtime settings" },
      ),
    ),
    "ENGRAM_SIM",
  ).pipe(Config.option),
  measure: Config.schema(Schema.Literals(["proc", "fixed"]).annotate({ message: "must be proc or fixed" }), "ENGRAM_AGENT_MEASURE").pipe(Config.withDefault("proc" as const)),
  simTotalMib: intOr("ENGRAM_SIM_TOTAL_MIB", 16384, 1),
  simOsMib: intOr("ENGRAM_SIM_OS_MIB", 1024, 0),
  simVcpus: intOr("ENGRAM_SIM_VCPUS", 8, 1),
  procRoot: Config.String("ENGRAM_AGENT_PROC_ROOT").pipe(Config.withDefault("/proc")),
  sysRoot: Config.String("ENGRAM_AGENT_SYS_ROOT").pipe(Config.withDefault("/sys")),
  stateFile: optionalText("ENGRAM_AGENT_STATE_FILE"),
  imageDir: optionalText("ENGRAM_AGENT_IMAGE_DIR"),
}

const given = <A>(o: Option.Option<A>): { readonly value: A } | undefined => (Option.isSome(o) ? { value: o.value } : undefined)

/** Reads `HostAgentOptions` from `env` (default `process.env`); every problem is reported at once. */
export const fromEnvironment = (env: Env_ = process.env): Effect.Effect<HostAgentOptions, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    for (const u of Env.unknown(env)) yield* Effect.logWarning(Env.unknownMessage(u), { variable: u.variable, didYouMean: u.didYouMean })
    const envRecord: Record<string, string | undefined> = { ...env }
    const s = yield* Env.read("host agent", settings, { provider: ConfigProvider.fromEnvRecord(envRecord), raw: (v) => env[v], secrets: secretVariables })
    const base = defaultAgentConfig(s.hostId, s.staleMs)
    const config: AgentConfig = {
      ...base,
      heartbeatIntervalMs: given(s.heartbeatIntervalMs)?.value ?? base.heartbeatIntervalMs,
      reportIntervalMs: given(s.reportIntervalMs)?.value ?? base.reportIntervalMs,
      pollWaitMs: given(s.pollWaitMs)?.value ?? base.pollWaitMs,
      retryDelayMs: given(s.retryDelayMs)?.value ?? base.retryDelayMs,
      maxPreCopyRounds: given(s.maxPreCopyRounds)?.value ?? base.maxPreCopyRounds,
      stagingGraceMs: given(s.stagingGraceMs)?.value ?? base.stagingGraceMs,
    }
    const peers = parsePeers(s.peers)
    const sim = Option.isSome(s.sim) ? (JSON.parse(s.sim.value) as Partial<SimConfig>) : {}
    const fixed = { totalMib: s.simTotalMib, osMib: s.simOsMib, vcpus: s.simVcpus }
    const roots = { proc: s.procRoot, sys: s.sysRoot }
    const measure: HostAgentOptions["measure"] =
      s.measure === "fixed" ? (mib) => HostMeter.use((m) => m.measure(mib)).pipe(Effect.provide(layerFixed(fixed))) : (mib) => measureHost(roots, mib)
    return {
      hostId: s.hostId,
      coordinator: { url: s.url, hostToken: s.hostToken },
      peerSecret: Redacted.value(s.peerSecret),
      peers: (id: string) => peers.get(id),
      listen: { port: s.port, host: s.listenHost },
      sim,
      measure,
      config,
      ...(Option.isSome(s.stateFile) ? { stateFile: s.stateFile.value } : {}),
      ...(Option.isSome(s.imageDir) ? { imageDir: s.imageDir.value } : {}),
    } satisfies HostAgentOptions
  })
