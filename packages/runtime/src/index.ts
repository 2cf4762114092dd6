/**
 * @engram/runtime: the VM runtime interface of the engram host agent and the simulated runtime.
 *
 *   Runtime     the interface (`VmRuntimeShape`, the `VmRuntime` service) and its types
 *   MoveGuard   the downtime guard every runtime applies to a move, over core's `Downtime`
 *   Move        a whole move between two runtimes of one process, and the phase arithmetic
 *   ImageStore  where descents put their image files
 *   Durable     files kept across restarts and crashes: written whole and synced
 *   pathSegment an id as a file name that stays inside its directory
 *   SimRuntime  the simulated runtime (seed 004's figures by default)
 *   SimWire     the simulated runtime's move data plane: in-process or TCP
 */
export * as Durable from "./Durable.js"
export * as ImageStore from "./ImageStore.js"
export * as Move from "./Move.js"
export { pathSegment } from "./Paths.js"
export * as MoveGuard from "./MoveGuard.js"
export * as Runtime from "./Runtime.js"
export * as SimRuntime from "./SimRuntime.js"
export * as SimWire from "./SimWire.js"
export {
  nowMs,
  RuntimeError,
  VmRuntime,
  type Aborted,
  type AtSwitchover,
  type DescentImage,
  type IncomingEndpoint,
  type Launch,
  type MigrateRequest,
  type MigrateResult,
  type MoveBudget,
  type MoveRound,
  type Refused,
  type RoundKind,
  type RuntimeInfo,
  type SnapshotMethod,
  type StartOptions,
  type Switched,
  type TemplateInfo,
  type TemplateSpec,
  type VmInfo,
  type VmRuntimeShape,
  type VmSpec,
  type VmStarted,
  type VmStatus,
  type VmUsage,
} from "./Runtime.js"
