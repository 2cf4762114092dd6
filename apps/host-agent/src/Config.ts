/**
 * The agent's configuration from the environment (every variable in README.md). Invalid
 * values are refused by name; nothing falls back silently.
 */
import { Limits } from "@engram/core"
import { Data, Effect } from "effect"
import type { AgentConfig } from "./Agent.js"
import { defaultAgentConfig, type HostAgentOptions } from "./Host.js"
import { layerFixed, measureHost } from "./Measure.js"
import { parsePeers } from "./PeerLink.js"
import { HostMeter } from "./Measure.js"
import type { SimConfig } from "./SimRuntime.js"

export class ConfigInvalid extends Data.TaggedError("ConfigInvalid")<{ readonly issues: readonly string[] }> {
  override get message() {
    return `invalid host agent configuration:\n  ${this.issues.join("\n  ")}`
  }
}

type Env = Readonly<Record<string, string | undefined>>

/** Reads `HostAgentOptions` from `env`. */
export const fromEnvironment = (env: Env = process.env): Effect.Effect<HostAgentOptions, ConfigInvalid> =>
  Effect.gen(function* () {
    const issues: string[] = []
    const str = (name: string, required = false): string | undefined => {
      const v = env[name]
      if ((v === undefined || v === "") && required) issues.push(`${name}: required`)
      return v === "" ? undefined : v
    }
    const int = (name: string, fallback: number, min = 0): number => {
      const v = env[name]
      if (v === undefined || v === "") return fallback
      const n = Number(v)
      if (!Number.isInteger(n) || n < min) {
        issues.push(`${name}=${JSON.stringify(v)}: must be an integer >= ${min}`)
        return fallback
      }
      return n
    }
    const hostId = str("ENGRAM_HOST_ID", true) ?? ""
    const url = str("ENGRAM_COORDINATOR_URL", true) ?? ""
    const hostToken = str("ENGRAM_HOST_TOKEN", true) ?? ""
    const peerSecret = str("ENGRAM_PEER_SECRET", true) ?? ""
    if (peerSecret !== "" && peerSecret.length < 16) issues.push("ENGRAM_PEER_SECRET: must be at least 16 characters")
    const staleMs = int("ENGRAM_HEARTBEAT_STALE_WINDOW_MS", Limits.defaults.heartbeatStaleWindowMs, 1)
    const base = defaultAgentConfig(hostId, staleMs)
    const config: AgentConfig = {
      ...base,
      heartbeatIntervalMs: int("ENGRAM_AGENT_HEARTBEAT_MS", base.heartbeatIntervalMs, 1),
      reportIntervalMs: int("ENGRAM_AGENT_REPORT_MS", base.reportIntervalMs, 1),
      pollWaitMs: int("ENGRAM_AGENT_POLL_WAIT_MS", base.pollWaitMs, 0),
      retryDelayMs: int("ENGRAM_AGENT_RETRY_MS", base.retryDelayMs, 1),
      maxPreCopyRounds: int("ENGRAM_AGENT_MAX_PRECOPY_ROUNDS", base.maxPreCopyRounds, 2),
      stagingGraceMs: int("ENGRAM_AGENT_STAGING_GRACE_MS", base.stagingGraceMs, 1),
    }
    const peers = parsePeers(str("ENGRAM_PEERS") ?? "")
    const port = int("ENGRAM_AGENT_PORT", 7100, 0)
    const listenHost = str("ENGRAM_AGENT_HOST") ?? "127.0.0.1"
    let sim: Partial<SimConfig> = {}
    const simText = str("ENGRAM_SIM")
    if (simText !== undefined) {
      try {
        sim = JSON.parse(simText) as Partial<SimConfig>
      } catch {
        issues.push("ENGRAM_SIM: must be a JSON object of simulated runtime settings")
      }
    }
    const measureKind = str("ENGRAM_AGENT_MEASURE") ?? "proc"
    let measure: HostAgentOptions["measure"]
    if (measureKind === "fixed") {
      const fixed = { totalMib: int("ENGRAM_SIM_TOTAL_MIB", 16384, 1), osMib: int("ENGRAM_SIM_OS_MIB", 1024, 0), vcpus: int("ENGRAM_SIM_VCPUS", 8, 1) }
      measure = (mib) => HostMeter.use((m) => m.measure(mib)).pipe(Effect.provide(layerFixed(fixed)))
    } else if (measureKind === "proc") {
      const roots = { proc: str("ENGRAM_AGENT_PROC_ROOT") ?? "/proc", sys: str("ENGRAM_AGENT_SYS_ROOT") ?? "/sys" }
      measure = (mib) => measureHost(roots, mib)
    } else {
      issues.push(`ENGRAM_AGENT_MEASURE=${JSON.stringify(measureKind)}: must be proc or fixed`)
      measure = () => Effect.succeed({ totalMib: null, allocatableMib: null, totalVcpus: null })
    }
    if (issues.length > 0) return yield* new ConfigInvalid({ issues })
    const stateFile = str("ENGRAM_AGENT_STATE_FILE")
    const imageDir = str("ENGRAM_AGENT_IMAGE_DIR")
    return {
      hostId,
      coordinator: { url, hostToken },
      peerSecret,
      peers: (id: string) => peers.get(id),
      listen: { port, host: listenHost },
      sim,
      measure,
      config,
      ...(stateFile === undefined ? {} : { stateFile }),
      ...(imageDir === undefined ? {} : { imageDir }),
    } satisfies HostAgentOptions
  })
