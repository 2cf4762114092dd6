/**
 * The VM runtime interface: everything the agent asks of a hypervisor. The agent, the move
 * protocol and the coordinator only see this interface, so a Firecracker or Cloud Hypervisor
 * runtime is one more implementation of it (snapshot files for captures, the dirty-page log
 * for deltas, the restore API for commits) with no change elsewhere.
 */
import type { Effect} from "effect";
import { Context, Schema } from "effect"

/** What a VM is started or restored with. The VM id is the session id. */
export interface VmSpec {
  readonly vmId: string
  readonly memMib: number
  readonly vcpus: number
}

/** Whether the guest runs or is paused in place (a park, or the pause of a move). */
export type VmStatus = "running" | "paused"

/** A resident VM. */
export interface VmInfo extends VmSpec {
  readonly status: VmStatus
}

/** The kind of a capture: the kinds of a move's rounds; a descent is a `full` capture. */
export type CaptureKind = "full" | "delta" | "final"

/**
 * One capture of a VM's memory and device state. `apparentBytes` is the size of the captured
 * ranges (the whole memory for a full capture, the dirty ranges for a delta); `wireBytes` is
 * what sending it costs (zero pages and holes compressed, plus the per-round overhead).
 * `payload` is the opaque image the target's `restore` accepts; a real runtime would hand a
 * snapshot file to stream instead of bytes in memory.
 */
export interface Capture {
  readonly vmId: string
  readonly kind: CaptureKind
  readonly apparentBytes: number
  readonly wireBytes: number
  readonly payload: Uint8Array
}

/** Runtime statistics of a resident VM. */
export interface VmStats extends VmInfo {
  /** Bytes dirtied since the last capture while dirty tracking runs; 0 when it does not. */
  readonly dirtyBytes: number
  readonly tracking: boolean
}

/** A runtime operation failed; `op` names it. */
export class RuntimeError extends Schema.TaggedError<RuntimeError>()("RuntimeError", {
  op: Schema.String,
  vmId: Schema.String,
  message: Schema.String,
}) {}

/** The VM runtime of one host. */
export interface VmRuntimeShape {
  /** Boots a fresh VM, running. */
  readonly start: (spec: VmSpec) => Effect.Effect<VmInfo, RuntimeError>
  readonly pause: (vmId: string) => Effect.Effect<void, RuntimeError>
  readonly resume: (vmId: string) => Effect.Effect<void, RuntimeError>
  /** Captures the whole VM and starts (or restarts) dirty tracking. */
  readonly fullCapture: (vmId: string) => Effect.Effect<Capture, RuntimeError>
  /**
   * Captures the ranges dirtied since the previous capture and restarts tracking. `final` is
   * the capture taken with the guest paused at the end of a move.
   */
  readonly deltaCapture: (vmId: string, kind: "delta" | "final") => Effect.Effect<Capture, RuntimeError>
  /** Stops dirty tracking (a move that ended without a commit). */
  readonly stopTracking: (vmId: string) => Effect.Effect<void, RuntimeError>
  /** Builds a VM from a full capture and the deltas after it, left paused. */
  readonly restore: (spec: VmSpec, images: readonly Capture[]) => Effect.Effect<VmInfo, RuntimeError>
  /** Stops and removes a VM; removing an absent VM succeeds. */
  readonly destroy: (vmId: string) => Effect.Effect<void>
  readonly stats: (vmId: string) => Effect.Effect<VmStats, RuntimeError>
  readonly list: Effect.Effect<readonly VmInfo[]>
  /**
   * After an agent restart: the VMs the agent's state file lists. A real runtime probes its
   * hypervisor sockets and answers what is actually alive; the simulated one re-adopts them
   * (a simulated VM outlives its agent, as a real one does).
   */
  readonly recover: (known: readonly VmInfo[]) => Effect.Effect<readonly VmInfo[]>
  /**
   * The link model of this runtime for `wireBytes` sent to a peer: the simulated runtime waits
   * for its simulated link; a real runtime returns at once (the network is the link).
   */
  readonly paceSend: (wireBytes: number) => Effect.Effect<void>
}

/** The VM runtime service. */
export class VmRuntime extends Context.Service<VmRuntime, VmRuntimeShape>()("@engram/host-agent/VmRuntime") {}
