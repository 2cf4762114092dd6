/**
 * The VM runtime interface: everything the host agent asks of a hypervisor. The agent, the move
 * protocol and the coordinator see only this interface, so the simulated runtime, QEMU
 * (`@engram/runtime-qemu`), Firecracker or Cloud Hypervisor are each one implementation of it.
 *
 * What it decides: the shape of the contract. Captures are files (a descent writes its image
 * to a path of the image store; a restore reads it back), never bytes held in memory. A VM is
 * running when its guest says it is ready (SPEC §13), so `start` and `restore` answer at that
 * point and say how the VM came to run (`Launch`). A template is a booted, paused guest kept by
 * the runtime under a name; a VM may start from it instead of booting. A live
 * move's data plane belongs to the runtime: the target's runtime prepares an incoming VM and
 * answers an endpoint; the source's runtime streams the VM to that endpoint, reports each
 * pre-copy round, applies the downtime guard (`MoveGuard`, over `@engram/core`'s `Downtime`;
 * it knows whether the guest was paused before the move, and then refuses nothing on an
 * estimate) and stops with the guest paused at the post-capture check point, so the agent
 * records the final round with the coordinator before anything is switched over.
 */
import { Clock, Context, Effect, Schema } from "effect"

/**
 * The runtimes' time: Effect's Clock in ms with sub-ms precision (a QEMU pause lasts a few ms).
 * Every time a runtime reports (`pausedAtMs`, `sentAtMs`) is read with it; so must the caller's.
 */
export const nowMs: Effect.Effect<number> = Effect.map(Clock.currentTimeNanos, (n) => Number(n) / 1e6)

/** What a VM is started or restored with. The VM id is the session id. */
export interface VmSpec {
  readonly vmId: string
  readonly memMib: number
  readonly vcpus: number
}

/** Whether the guest runs or is paused in place (a park, or a move's pause). */
export type VmStatus = "running" | "paused"

/** A resident VM. */
export interface VmInfo extends VmSpec {
  readonly status: VmStatus
}

/**
 * How a capture holds the guest's RAM: `mapped`, the guest's RAM file itself, mapped back (lazily)
 * on restore; `stream`, the RAM inside one migration stream, read back in full.
 */
export type SnapshotMethod = "mapped" | "stream"

/**
 * How a VM came to run, as its runtime reports it (the agent logs it). A VM runs when its guest
 * says so (SPEC §13): `readyMs` runs from the start of the operation to that signal.
 */
export interface Launch {
  /** Booted, started from a template, or restored from a descent's image. */
  readonly from: "boot" | "template" | "image"
  /** How the template's or image's RAM came back; null for a boot. */
  readonly method: SnapshotMethod | null
  readonly template: string | null
  readonly readyMs: number
  /**
   * `guest`: the guest said it is ready (a console line, for QEMU); `process`: the hypervisor
   * runs it and no guest signal was configured or came (see `detail`).
   */
  readonly readiness: "guest" | "process"
  /** Why this path, and where the time went, in the runtime's words. */
  readonly detail: string
}

/** A VM that runs, and how it came to. */
export interface VmStarted extends VmInfo {
  readonly launch: Launch
}

/** What a VM is started from: a template the runtime holds (its RAM and devices), instead of a boot. */
export interface StartOptions {
  readonly template?: string
}

/** A template to build: a guest of this size booted until ready, then kept paused under `name`. */
export interface TemplateSpec {
  readonly name: string
  readonly memMib: number
  readonly vcpus: number
}

/** A template a runtime holds. */
export interface TemplateInfo extends TemplateSpec {
  /** Its files' allocated size (the RAM file is sparse: what the booted guest touched). */
  readonly bytes: number
  readonly method: SnapshotMethod
}

/** A resident VM as measured on the host. */
export interface VmUsage extends VmInfo {
  /** Resident set size of the VM's process (or its model), bytes; null when it cannot be read. */
  readonly rssBytes: number | null
  /**
   * The RAM the VM holds that the host's MemAvailable does not count as available: its
   * anonymous and shared-memory pages. A guest RAM file on disk lives in the page cache, which
   * MemAvailable already counts, so it is not here. Null when it cannot be read.
   */
  readonly ramBytes: number | null
  /** The hypervisor process, when there is one. */
  readonly pid: number | null
  /**
   * CPU time the guest has used so far (ms; for QEMU the process's user + system time), the
   * agent's measure of guest activity. Null or absent when the runtime cannot measure it.
   */
  readonly cpuMs?: number | null | undefined
}

/** What a runtime says about itself at start (logged and shown on the agent's status). */
export interface RuntimeInfo {
  /** `sim`, `qemu`, … */
  readonly kind: string
  /** How guests execute: `kvm`, `tcg`, `sim`. */
  readonly accelerator: string
  /** Why: e.g. "/dev/kvm absent" or "KVM probe failed: …". */
  readonly detail: string
}

/** A descent's image: one file in the image store (and the runtime's files beside it). */
export interface DescentImage {
  readonly vmId: string
  readonly path: string
  /** Size of the image: the file, and for a mapped image its RAM file's allocated size. */
  readonly bytes: number
  /** How it holds the guest's RAM, when the runtime that wrote it says (an image found in the store does not). */
  readonly method?: SnapshotMethod
  /** Why this method and where the time went, in the runtime's words. */
  readonly detail?: string
}

/**
 * Where a move's target waits for the VM: produced by the target's runtime, carried by the agent
 * (in the peer protocol) to the source's runtime, which alone interprets `uri`.
 */
export interface IncomingEndpoint {
  /** The runtime kind that made it; a source of another kind refuses it. */
  readonly runtime: string
  /** e.g. `tcp:10.0.0.2:41234` (QEMU), `sim-mem:7` or `tcp:…` (the simulated wire). */
  readonly uri: string
}

/** The kind of a round: the full (bulk) round, a delta of the pages dirtied since, or the final round sent paused. */
export type RoundKind = "full" | "delta" | "final"

/**
 * One round of a move as the source measured it: the coordinator's round record (SPEC §5).
 * `wireBytes` is what crossed (or will cross) the wire, `apparentBytes` the size of the memory
 * it covers, `sendMs` how long sending took (0 for a final round not yet sent), `captureMs` how
 * long taking it took (the pause's capture for a final round; 0 where capture and send are one
 * stream, as in QEMU's pre-copy).
 */
export interface MoveRound {
  readonly kind: RoundKind
  readonly wireBytes: number
  readonly apparentBytes: number
  readonly sendMs: number
  readonly captureMs: number
}

/** The budget and policy of one move. */
export interface MoveBudget {
  /** The pause the caller accepts. */
  readonly maxDowntimeMs: number
  /** The coordinator's allowance for the commit on the target (SPEC §9 default 400). */
  readonly commitAllowanceMs: number
  /** Pre-copy rounds at most, the full round included. */
  readonly maxPreCopyRounds: number
}

/** What the source's runtime needs for a move. */
export interface MigrateRequest<E> {
  readonly moveId: string
  readonly endpoint: IncomingEndpoint
  readonly budget: MoveBudget
  /**
   * Called with every pre-copy round measured while the guest runs (the agent records it with
   * the coordinator); rounds measured once it paused come back in `AtSwitchover.unreported`. A
   * failure ends the move: the guest keeps (or resumes) running here and `migrate` fails with
   * that error.
   */
  readonly onRound: (round: MoveRound) => Effect.Effect<void, E>
  /**
   * Called at most once, with the guest still running, before the runtime may let it pause (the
   * agent records its intent with the coordinator here: the point of no return is held before
   * the pause, SPEC §5). The simulated runtime calls it when its guard decides to pause; a
   * hypervisor that may stop the guest on its own at any pass with no point to hold before that
   * stop (QEMU 7.2) calls it before the first round. A failure ends the move: the guest keeps
   * running here and `migrate` fails with that error. A runtime that paused before calling it
   * never calls it (the agent then records the intent in the pause, beside the send).
   */
  readonly beforePause?: Effect.Effect<void, E> | undefined
  /**
   * Asked when the downtime guard refuses the move (`pre-pause`, the guest running) or would
   * abort it (`post-capture`, the guest paused); true: the move goes on over budget (the guest
   * pauses, or stays paused, and the final round goes at `switchover`). The agent answers true
   * only for a move its coordinator holds committed (an operator's word while the source was not
   * heard): the session is placed on the target, which needs the final round or the guest is
   * lost. Missing, or false: the guard's refusal stands. Never fails; called at most once per stage.
   */
  readonly overBudget?: ((refusal: { readonly stage: RefusalStage; readonly estimateMs: number; readonly reason: string }) => Effect.Effect<boolean>) | undefined
}

/** The stage at which the guard refused a move. */
export type RefusalStage = "pre-pause" | "post-capture"

/** The guard refused before the guest paused: it never stopped, it runs here. */
export interface Refused {
  readonly _tag: "Refused"
  readonly stage: "pre-pause"
  readonly estimateMs: number
  /** `ErrMoveDowntime: …`, for the coordinator's abort record. */
  readonly reason: string
  readonly rounds: readonly MoveRound[]
}

/** The post-capture check failed with the guest paused: the pause was given back, the guest runs here. */
export interface Aborted {
  readonly _tag: "Aborted"
  readonly stage: "post-capture"
  readonly estimateMs: number
  readonly reason: string
  readonly rounds: readonly MoveRound[]
  readonly captureMs: number
  /** How long the guest was paused, pause to resume. */
  readonly pausedMs: number
}

/** The source after a switchover: the final round sent, the guest paused here (kept until the commit settles). */
export interface Switched {
  /** Sending the final round: the continue to the runtime's "sent" (QEMU: `completed`). */
  readonly sendMs: number
  /** When the final round was sent, on the runtime's Clock in ms. */
  readonly sentAtMs: number
  /** The final round's bytes on the wire, measured. */
  readonly finalWireBytes: number
  /** The hypervisor's own figure for the pause (QEMU's `downtime`), when it has one. */
  readonly runtimeDowntimeMs: number | null
}

/**
 * The guest is paused, the final round measured and the post-capture check passed: nothing of
 * the final round has left the host yet. The agent records the final round with the
 * coordinator, then calls `switchover` (or `abort` to resume here).
 */
export interface AtSwitchover {
  readonly _tag: "AtSwitchover"
  readonly rounds: readonly MoveRound[]
  /**
   * Pre-copy rounds measured only at the check point (the hypervisor finished them before the
   * pause, unread): in `rounds`, but not passed to `onRound`, so no record of them lengthens
   * the pause. The caller records them before the final round.
   */
  readonly unreported: readonly MoveRound[]
  /** The final round: `captureMs` measured, `sendMs` 0 (not sent yet). */
  readonly final: MoveRound
  /** The post-capture estimate that fit (or that `overBudget` let go over the budget, or that a guest already paused was not held to). */
  readonly estimateMs: number
  /**
   * The guest was paused when `migrate` began (parked in RAM, or a committed move's paused
   * source copy streamed again): its stream paused it no further, so the guard refused nothing
   * on its estimates (`MoveGuard.Guest`, core's `Downtime.check`), and `pausedAtMs` is the final
   * capture's start, not a pause of the guest's.
   */
  readonly alreadyPaused: boolean
  /** When the guest paused, on the runtime's Clock in ms (the downtime runs from here); for a guest already paused, when the final capture began. */
  readonly pausedAtMs: number
  readonly captureMs: number
  /** True when the hypervisor paused on its own before the pre-pause check could run (see the README). */
  readonly selfConverged: boolean
  /** Sends the final round. The target holds the VM paused until its `commitIncoming`. */
  readonly switchover: Effect.Effect<Switched, RuntimeError>
  /**
   * Gives the pause back: the guest resumes here; the target's incoming VM fails and is destroyed
   * there. A guest that was paused when `migrate` began (a committed move's paused source copy
   * streamed again) stays paused: only one that ran is resumed (so does a failed `switchover`).
   */
  readonly abort: Effect.Effect<void>
}

/** How `migrate` stopped. */
export type MigrateResult = Refused | Aborted | AtSwitchover

/** A runtime operation failed; `op` names it. */
export class RuntimeError extends Schema.TaggedError<RuntimeError>()("RuntimeError", {
  op: Schema.String,
  vmId: Schema.String,
  message: Schema.String,
}) {}

/** The VM runtime of one host. */
export interface VmRuntimeShape {
  readonly info: Effect.Effect<RuntimeInfo>
  /**
   * A fresh VM, running once its guest is ready: booted, or started from the template named in
   * `options` (its size must be the spec's). A template the runtime does not hold fails.
   */
  readonly start: (spec: VmSpec, options?: StartOptions) => Effect.Effect<VmStarted, RuntimeError>
  /** Pauses the guest in place; its RAM stays resident. Parking a paused VM succeeds. */
  readonly park: (vmId: string) => Effect.Effect<void, RuntimeError>
  /**
   * Resumes a paused guest (also a source's paused copy after a switchover), and waits for the
   * guest's next readiness signal where the runtime has one. Unparking a running VM succeeds.
   */
  readonly unpark: (vmId: string) => Effect.Effect<void, RuntimeError>
  /**
   * Captures the whole VM into the file `path` (the image store's), then removes the VM: its RAM
   * is free when this answers. The file is complete when it exists (written aside, then renamed).
   */
  readonly descend: (vmId: string, path: string) => Effect.Effect<DescentImage, RuntimeError>
  /** Builds a VM from a descent's image and resumes it: the guest continues where it was, running once it says so. */
  readonly restore: (spec: VmSpec, image: DescentImage) => Effect.Effect<VmStarted, RuntimeError>
  /** The templates this runtime holds. */
  readonly templates: Effect.Effect<readonly TemplateInfo[]>
  /** Boots a guest of the template's size, waits until it is ready and keeps it as the template `name` (replacing one of that name). */
  readonly buildTemplate: (template: TemplateSpec) => Effect.Effect<TemplateInfo, RuntimeError>
  /** Removes a template; removing an absent one succeeds. */
  readonly removeTemplate: (name: string) => Effect.Effect<void>
  /** Stops and removes a VM; removing an absent VM succeeds. */
  readonly destroy: (vmId: string) => Effect.Effect<void>
  /**
   * The resident VMs, answered from the runtime's memory (no hypervisor call): the agent reads it
   * on every reconcile pass to notice a VM that ended by itself, so a VM the runtime knows ended leaves it.
   */
  readonly list: Effect.Effect<readonly VmInfo[]>
  /** The resident VMs with their measured RSS. */
  readonly usage: Effect.Effect<readonly VmUsage[]>
  /**
   * After an agent restart: what is actually alive. A real runtime probes its hypervisor sockets
   * (its VMs outlive the agent) and ignores `known`; the simulated one re-adopts `known` (the
   * agent's state file), since its VMs lived in the dead process.
   */
  readonly recover: (known: readonly VmInfo[]) => Effect.Effect<readonly VmInfo[]>

  /** Target side of a move: an incoming VM for `spec`, waiting (paused) for the stream. */
  readonly prepareIncoming: (spec: VmSpec, moveId: string) => Effect.Effect<IncomingEndpoint, RuntimeError>
  /**
   * Target side: the stream is complete (waits for it); resume the VM here. Fails when the
   * stream failed or was never finished (the incoming VM is then destroyed).
   */
  readonly commitIncoming: (vmId: string) => Effect.Effect<VmInfo, RuntimeError>
  /** Source side of a move: see {@link MigrateRequest} and {@link MigrateResult}. */
  readonly migrate: <E>(vmId: string, request: MigrateRequest<E>) => Effect.Effect<MigrateResult, RuntimeError | E>
}

/** The VM runtime service. */
export class VmRuntime extends Context.Service<VmRuntime, VmRuntimeShape>()("@engram/runtime/VmRuntime") {}
