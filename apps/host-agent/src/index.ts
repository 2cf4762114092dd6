/**
 * @engram/host-agent: the engram host agent. It measures its host, reports and heartbeats,
 * pulls its assignments from the coordinator and drives its VMs through `@engram/runtime`'s
 * interface (simulated by default, QEMU with `ENGRAM_RUNTIME=qemu`), and moves live VMs agent
 * to agent under the downtime guard.
 */
export * as Agent from "./Agent.js"
export * as Config from "./Config.js"
export * as Coordinator from "./Coordinator.js"
export * as Failover from "./Failover.js"
export * as LocalState from "./LocalState.js"
export * as Measure from "./Measure.js"
export * as MoveSource from "./MoveSource.js"
export * as MoveTarget from "./MoveTarget.js"
export * as MoveToken from "./MoveToken.js"
export * as Pacing from "./Pacing.js"
export * as PeerLink from "./PeerLink.js"
export * as PeerServer from "./PeerServer.js"
export * as Residents from "./Residents.js"
export * as RuntimeChoice from "./RuntimeChoice.js"
export { defaultAgentConfig, httpCoordinator, startHostAgent } from "./Host.js"
export type { HostAgent, HostAgentOptions } from "./Host.js"
