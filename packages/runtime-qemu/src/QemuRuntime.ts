/**
 * The QEMU runtime: one `qemu-system-x86_64` per session, driven over QMP.
 *
 * - start: a QEMU booting the configured kernel (+ initramfs) or disk, KVM when the probe says
 *   it works, TCG otherwise; serial console to `console.log` in the VM's directory; running
 *   once the guest says so on its console (`readyLine`). Or started from a template.
 * - guest RAM: a RAM file per VM (`memory-backend-file`, `share=on`) by default, so descents,
 *   restores and templates map it instead of streaming it (Snapshots.ts); anonymous RAM with
 *   `memory: "anonymous"` (every capture streams).
 * - park / unpark: QMP `stop` / `cont` (RAM stays resident).
 * - descend / restore: Snapshots.ts (mapped or stream); the guest continues, it does not reboot.
 * - live move: the target starts QEMU with `-incoming` on a port QEMU picks; the source runs
 *   QEMU's migration to it under engram's guard (QemuMigration.ts) and stops at
 *   `pre-switchover`; the target's commit is `cont` once its incoming migration completed.
 * - usage: VmRSS and RssAnon + RssShmem from `/proc/<pid>/status`. recover: VMs outlive the
 *   agent; a new runtime adopts every live VM of its state directory: attached when its QMP
 *   socket answers, else listed as attaching and attached in the background (never replaced).
 *   destroy: `quit`, then kill. A VM whose QEMU ends by itself (crashed, killed) is logged and
 *   leaves the list, its files removed (VmHost.ts, `watchEnd`): the agent notices the guest gone.
 *   A monitor connection that closes while QEMU lives is connected again (Monitor.ts).
 */
import { readdir } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Fiber, Layer, type Scope } from "effect"
import {
  type AtSwitchover,
  type IncomingEndpoint,
  type MigrateRequest,
  type MigrateResult,
  MoveGuard,
  nowMs,
  type RuntimeError,
  type RuntimeInfo,
  type Switched,
  type VmInfo,
  VmRuntime,
  type VmRuntimeShape,
  type VmSpec,
  type VmStarted,
  type VmStatus,
  type VmUsage,
} from "@engram/runtime"
import * as Accel from "./Accel.js"
import * as Qmp from "./Qmp.js"
import * as RamFile from "./RamFile.js"
import * as M from "./QemuMigration.js"
import * as P from "./QemuProcess.js"
import * as Snap from "./Snapshots.js"
import * as Host from "./VmHost.js"

/** The runtime's settings. */
export interface QemuConfig {
  /** Where VM directories and QMP sockets live. Keep it short: socket paths hold 107 bytes. */
  readonly stateDir: string
  /**
   * How guests boot, or how a given VM boots. Every host of a fleet must answer the same for a
   * VM: a move's target and a restore rebuild the machine the source ran.
   */
  readonly boot: P.Boot | ((spec: VmSpec) => P.Boot)
  /** Default `qemu-system-x86_64`. */
  readonly binary?: string
  /** `auto` (default) probes KVM and falls back to TCG. */
  readonly accelerator?: "auto" | "kvm" | "tcg"
  /** Default `q35`. */
  readonly machineType?: string
  /**
   * Guest RAM: `file` (default), a RAM file per VM that descents, restores and templates map
   * (`mapped`); `anonymous`, QEMU's own memory, captured in migration streams (`stream`).
   */
  readonly memory?: "file" | "anonymous"
  /**
   * Where RAM files live. Default: each VM's directory, on the state directory's filesystem:
   * keep the image store there, so a descent renames the file instead of copying it. A tmpfs
   * (`/dev/shm/…`) keeps running guests' RAM out of the page cache and off the disk, and a
   * descent then copies the RAM to the image store (see the README, "Where RAM files live").
   */
  readonly ramDir?: string
  /**
   * The guest's readiness signal (SPEC §13): a console line matching it says the guest is ready
   * (booted; or, after a resume, continuing). Default none: a VM is ready when QEMU runs it.
   */
  readonly readyLine?: RegExp
  /** From spawn to the ready line of a boot (else the start fails). Default 300 s. */
  readonly bootReadyTimeoutMs?: number
  /** From `cont` to the ready line of a resume (else it counts as running by QEMU's word, and says so). Default 10 s. */
  readonly resumeReadyTimeoutMs?: number
  /** Where incoming moves listen (default 127.0.0.1) and the address sources are told (default the same). */
  readonly migrationListenHost?: string
  readonly migrationAdvertiseHost?: string
  /** QEMU's `max-bandwidth` for live moves, bytes/s. Default 1 GiB/s. */
  readonly moveBandwidthBytesPerSec?: number
  /** QEMU's `max-bandwidth` for descents and templates (to a local file), bytes/s. Default 16 GiB/s. */
  readonly descentBandwidthBytesPerSec?: number
  /** TCG translation cache, MiB (QEMU's default is 1 GiB of address space per VM). Default 64. */
  readonly tcgTbSizeMib?: number
  /** Per QMP command. Default 10 s. */
  readonly qmpTimeoutMs?: number
  /** From spawn to a QMP connection. Default 30 s. */
  readonly startTimeoutMs?: number
  /**
   * A move's longest wait for its next migration event (a bulk round included), and how long a
   * capture or a load may go without progress (bytes sent; a load: RAM filled) before it fails
   * (a capture is cancelled). Default 120 s.
   */
  readonly migrationTimeoutMs?: number
  /**
   * How long `recover` waits for a live QEMU's monitor before it lists the VM as the agent knew
   * it and keeps trying in the background (see the README, "After a restart"). Default 3 s.
   */
  readonly recoverAttachTimeoutMs?: number
  /**
   * The least a move's final round (the guest paused) is waited for, when less of its downtime
   * budget is left: past `max(this, what is left)` it is cancelled and the guest resumes here.
   * Default 5 s (the host agent's floor for a record in the pause).
   */
  readonly switchoverFloorMs?: number
  /** The longest pause between the background tries to attach such a VM (they start at 100 ms and double). Default 10 s. */
  readonly attachRetryMaxMs?: number
  /** Appended to every QEMU command line. */
  readonly extraArgs?: readonly string[]
  /** For tests only: where a test cuts a restore short as a crash would (see `TestHooks`). */
  readonly testHooks?: Host.TestHooks
}

/** The QEMU runtime: the interface plus what tests and operators inspect. */
export interface QemuRuntimeShape extends VmRuntimeShape {
  readonly config: QemuConfig
  readonly accel: Accel.Accel
  readonly qemuVersion: Accel.QemuVersion | null
  /** Whether guests get the TCG dirty-sync workaround (8 KiB more RAM; see Accel.ts). */
  readonly tcgSyncWorkaround: boolean
  /** How this runtime captures guests (mapped RAM files or streams), and why. */
  readonly snapshots: Host.Snapshots
  /** Where the RAM file of a VM lives (when its RAM is a file). */
  readonly ramPathOf: (vmId: string) => string
  /** The serial console file of a VM (a restore or an incoming move starts a new one). */
  readonly consolePath: (vmId: string) => string
  /** The QEMU process of a resident VM. */
  readonly pidOf: (vmId: string) => number | undefined
  /** Runs a QMP command on a resident VM (diagnostics, tests). */
  readonly qmp: <A = unknown>(vmId: string, command: string, args?: Readonly<Record<string, unknown>>) => Effect.Effect<A, RuntimeError>
}

type Vm = Host.Vm
const err = Host.err

/** How a runtime on this QEMU captures guests, and why. */
export const snapshotsOf = (memory: "file" | "anonymous", v: Accel.QemuVersion | null): Host.Snapshots => {
  const ignoreShared = v !== null && v.major >= 4
  if (!ignoreShared) return { method: "stream", ignoreShared, reason: `QEMU ${v === null ? "of unknown version" : `${v.major}.${v.minor}`} has no x-ignore-shared (4.0+): captures stream guest RAM` }
  if (memory === "anonymous") return { method: "stream", ignoreShared, reason: "guest RAM is anonymous (memory: anonymous): captures stream it" }
  return { method: "mapped", ignoreShared, reason: "guest RAM is a file (memory-backend-file, share=on): captures save devices only (x-ignore-shared) and map the RAM file back" }
}

/**
 * The kernel the KVM probe boots: the configured one (a boot chosen per VM: the one a 1-vCPU VM
 * of 128 MiB gets; none when that choice throws, and the probe is QEMU's own check alone).
 */
const probeKernel = (boot: QemuConfig["boot"]): string | undefined => {
  try {
    const b = typeof boot === "function" ? boot({ vmId: "engram-kvm-probe", memMib: 128, vcpus: 1 }) : boot
    return "kernel" in b ? b.kernel : undefined
  } catch {
    return undefined
  }
}

/** Builds a QEMU runtime; its QMP connections live in the scope (the VMs outlive it). */
export const make = (config: QemuConfig): Effect.Effect<QemuRuntimeShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = config.binary ?? "qemu-system-x86_64"
    const qmpTimeoutMs = config.qmpTimeoutMs ?? 10_000
    const startTimeoutMs = config.startTimeoutMs ?? 30_000
    const migrationTimeoutMs = config.migrationTimeoutMs ?? 120_000
    const recoverAttachTimeoutMs = config.recoverAttachTimeoutMs ?? 3000
    const attachRetryMaxMs = config.attachRetryMaxMs ?? 10_000
    const switchoverFloorMs = config.switchoverFloorMs ?? 5000
    const runtimeScope = yield* Effect.scope
    const listenHost = config.migrationListenHost ?? "127.0.0.1"
    const advertiseHost = config.migrationAdvertiseHost ?? listenHost
    const accel: Accel.Accel =
      config.accelerator === "kvm"
        ? { accelerator: "kvm", detail: "KVM: configured" }
        : config.accelerator === "tcg"
          ? { accelerator: "tcg", detail: "TCG: configured" }
          : yield* Accel.probe(binary, undefined, probeKernel(config.boot))
    const qemuVersion = yield* Accel.version(binary)
    const ramPadKib = Accel.needsTcgSyncWorkaround(accel.accelerator, qemuVersion) ? 8 : 0
    const machineFor = (spec: VmSpec): P.Machine => ({
      boot: typeof config.boot === "function" ? config.boot(spec) : config.boot,
      machineType: config.machineType ?? "q35",
      accelerator: accel.accelerator,
      ...(ramPadKib === 0 ? {} : { ramPadKib }),
    })
    const snapshots = snapshotsOf(config.memory ?? "file", qemuVersion)
    const host = yield* Host.make({
      stateDir: config.stateDir,
      binary,
      qmpTimeoutMs,
      startTimeoutMs,
      migrationTimeoutMs,
      tcgTbSizeMib: config.tcgTbSizeMib ?? 64,
      extraArgs: config.extraArgs ?? [],
      snapshots,
      ramDir: config.ramDir,
      readyLine: config.readyLine,
      testHooks: config.testHooks,
      bootReadyTimeoutMs: config.bootReadyTimeoutMs ?? 300_000,
      resumeReadyTimeoutMs: config.resumeReadyTimeoutMs ?? 10_000,
    })
    const { vms, get, q, queryMigrate, runStatus, attach, launch, finish, awaitMigrationEnd } = host
    const cancelMigration = (vm: Vm) => host.cancelMigration(vm, "migrate")
    const descentBandwidth = config.descentBandwidthBytesPerSec ?? 16 * 1024 ** 3
    const moveCaps = M.capabilities({ pauseBeforeSwitchover: true, ignoreShared: snapshots.ignoreShared ? false : null })

    /**
     * After a failed or refused outgoing migration: cancels it if it still runs (waiting for QEMU
     * to say it ended) and makes sure a guest that ran runs here again. What QEMU does not answer
     * is unknown, not "not migrating" or "running": then nothing is resumed (a `cont` while the
     * migration may still complete could run a guest the target holds too), and the VM counts as
     * paused, so nothing says it runs; `unpark` resumes it once QEMU answers. Answers whether the
     * guest was given back (or never ran).
     */
    const giveBack = (vm: Vm, wasRunning: boolean) =>
      Effect.gen(function* () {
        const ended = yield* cancelMigration(vm)
        const status = ended === null ? null : yield* runStatus(vm, "migrate").pipe(Effect.orElseSucceed(() => null))
        const resumed = status === null || !wasRunning || status === "running" ? status : yield* q(vm, "migrate", "cont").pipe(Effect.as("running" as const), Effect.orElseSucceed(() => null))
        if (resumed === null) {
          yield* Effect.logWarning("a move's source could not be given back: QEMU does not answer whether the migration ended or the guest runs; the VM counts as paused until an unpark resumes it", { vmId: vm.spec.vmId, migration: ended })
        }
        vm.status = resumed ?? "paused"
        return resumed !== null
      })

    const migrate = <E>(vmId: string, req: MigrateRequest<E>): Effect.Effect<MigrateResult, RuntimeError | E> =>
      Effect.gen(function* () {
        const vm = yield* get("migrate", vmId)
        if (req.endpoint.runtime !== "qemu") return yield* err("migrate", vmId, `a ${req.endpoint.runtime} endpoint cannot take a QEMU VM`)
        if (!/^tcp:/.test(req.endpoint.uri)) return yield* err("migrate", vmId, `unsupported endpoint ${req.endpoint.uri}`)
        const b = req.budget
        // A guest a given-back stream left in QEMU's `postmigrate` is taken out of it first
        // (`cont`, `stop`: see VmHost's leavePostmigrate), before this stream begins.
        const before = yield* host.leavePostmigrate(vm, "migrate")
        const wasRunning = before.running
        // A guest paused before its stream (parked, or a committed move's paused source copy)
        // stays paused until the commit: the stream pauses it no further, and the guard (core's
        // rule) refuses it nothing on an estimate.
        const guest: MoveGuard.Guest = { alreadyPaused: !wasRunning }
        const upfront = MoveGuard.beforeStart(b, guest)
        if (upfront._tag === "Refuse") return { _tag: "Refused", stage: "pre-pause", estimateMs: upfront.estimateMs, reason: upfront.reason, rounds: [] } satisfies MigrateResult
        const tracker = new M.RoundTracker()

        const protocol = Effect.scoped(
          Effect.gen(function* () {
            const sub = yield* vm.client.subscribe
            yield* q(vm, "migrate", "migrate-set-capabilities", moveCaps)
            yield* q(vm, "migrate", "migrate-set-parameters", { "downtime-limit": 1, "max-bandwidth": config.moveBandwidthBytesPerSec ?? 1024 ** 3 })
            // The caller's last word before QEMU may pause the guest (its intent with the
            // coordinator): QEMU 7.2 stops the guest on its own at any pass once what is left fits
            // its 1 ms downtime-limit, and has no point to hold before that stop, so the word is
            // taken before the first round, the guest running (see the README).
            if (req.beforePause !== undefined) yield* req.beforePause
            yield* q(vm, "migrate", "migrate", { uri: req.endpoint.uri })
            let stop: Qmp.QmpEvent | null = null
            let resumedAt: number | null = null
            let released = false
            let refusal: Extract<MoveGuard.Step, { _tag: "Refuse" }> | null = null
            for (;;) {
              const e = yield* Qmp.awaitEvent(sub, (e) => e, migrationTimeoutMs, "migration event", vm.paths.socket).pipe(Effect.mapError(Host.asRuntimeError("migrate", vmId)))
              if (e.event === "STOP") stop = e
              else if (e.event === "RESUME") resumedAt = e.receivedAtMs
              else if (e.event === "SHUTDOWN") return yield* err("migrate", vmId, "QEMU shut down during the move")
              else if (e.event === "MIGRATION_PASS") {
                if (!tracker.started) {
                  tracker.start(e)
                  continue
                }
                // Passes after the stop belong to the final round.
                if (stop !== null) continue
                const round = tracker.close(e.qemuAtMs, yield* queryMigrate(vm, "migrate"))
                if (round === null) continue
                yield* req.onRound(round)
                if (released || refusal !== null) continue
                const step = MoveGuard.afterRound(tracker.rounds, b, guest)
                // A refusal the caller overrides (it holds the move committed) pauses as a fit would.
                const overridden = step._tag === "Refuse" && req.overBudget !== undefined && (yield* req.overBudget({ stage: "pre-pause", estimateMs: step.estimateMs, reason: step.reason }))
                if (step._tag === "Pause" || overridden) {
                  released = true
                  yield* q(vm, "migrate", "migrate-set-parameters", { "downtime-limit": M.maxDowntimeLimitMs })
                } else if (step._tag === "Refuse") {
                  refusal = step
                  yield* q(vm, "migrate", "migrate_cancel")
                }
              } else if (e.event === "MIGRATION") {
                const status = String(e.data["status"])
                if (status === "cancelled" || status === "failed") {
                  if (refusal === null) {
                    const info = yield* queryMigrate(vm, "migrate").pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
                    return yield* err("migrate", vmId, `migration ${status}${info["error-desc"] === undefined ? "" : `: ${info["error-desc"]}`}`)
                  }
                  if (stop === null) return { _tag: "Refused", stage: "pre-pause", estimateMs: refusal.estimateMs, reason: refusal.reason, rounds: tracker.rounds } satisfies MigrateResult
                  // QEMU stopped the guest before the refusal landed: the cancel resumed it.
                  const pausedMs = (resumedAt ?? (yield* nowMs)) - stop.receivedAtMs
                  return {
                    _tag: "Aborted",
                    stage: "post-capture",
                    estimateMs: refusal.estimateMs,
                    reason: `${refusal.reason} (QEMU had already paused the guest; resumed on the source)`,
                    rounds: tracker.rounds,
                    captureMs: pausedMs,
                    pausedMs,
                  } satisfies MigrateResult
                }
                if (status !== "pre-switchover" || refusal !== null) continue

                // The post-capture check point: guest stopped, the rest not sent.
                const info = yield* queryMigrate(vm, "migrate")
                const pausedAtMs = stop?.receivedAtMs ?? e.receivedAtMs
                const stopQemuMs = stop?.qemuAtMs ?? e.qemuAtMs
                const captureMs = Math.max(0, e.qemuAtMs - stopQemuMs)
                // Rounds QEMU finished before the stop that were not measured yet (passes read after the fact).
                // Recorded by the caller after the check, not here: a record would lengthen the pause.
                const late = tracker.close(tracker.lastPassQemuMs, info)
                const finalApparent = M.finalApparentBytes(info, tracker, stopQemuMs)
                const post = M.postCapture(tracker, captureMs, finalApparent, b, guest)
                if (post._tag === "Overrun" && !(req.overBudget !== undefined && (yield* req.overBudget({ stage: "post-capture", estimateMs: post.estimateMs, reason: post.reason })))) {
                  yield* giveBack(vm, wasRunning)
                  const pausedMs = (yield* nowMs) - pausedAtMs
                  return { _tag: "Aborted", stage: "post-capture", estimateMs: post.estimateMs, reason: post.reason, rounds: tracker.rounds, captureMs, pausedMs } satisfies MigrateResult
                }
                const sentBefore = info.ram?.transferred ?? 0
                // QEMU counts as downtime bytes every byte it sends while the guest is stopped: a
                // guest paused before the stream began has all its rounds counted so, the final
                // one is what it sends from here on.
                const downtimeBytesBefore = info.ram?.["downtime-bytes"] ?? 0
                vm.status = "paused"
                const switchover: Effect.Effect<Switched, RuntimeError> = Effect.scoped(
                  Effect.gen(function* () {
                    const sub2 = yield* vm.client.subscribe
                    const t0 = yield* nowMs
                    // The guest is paused: the final round has what is left of the downtime
                    // budget (at least the floor), not migrationTimeoutMs; past it the move is
                    // cancelled and the guest resumes here (giveBack, below).
                    const leftMs = Math.max(switchoverFloorMs, b.maxDowntimeMs - (t0 - pausedAtMs))
                    yield* q(vm, "switchover", "migrate-continue", { state: "pre-switchover" })
                    const end = yield* awaitMigrationEnd(vm, "switchover", sub2, { kind: "total", ms: leftMs })
                    const done = yield* queryMigrate(vm, "switchover")
                    return {
                      sendMs: end.receivedAtMs - t0,
                      sentAtMs: end.receivedAtMs,
                      // RAM sent since pre-switchover, the guest paused (QEMU's downtime-bytes since then;
                      // device state is not counted in either figure).
                      finalWireBytes: Math.max((done.ram?.transferred ?? sentBefore) - sentBefore, (done.ram?.["downtime-bytes"] ?? 0) - downtimeBytesBefore),
                      // QEMU's `downtime` times the final round from its start; a guest paused before the
                      // stream had no pause from this move (it was paused already and stays paused): none.
                      runtimeDowntimeMs: wasRunning ? (done.downtime ?? null) : null,
                    } satisfies Switched
                  }),
                ).pipe(
                  Effect.catch((e) =>
                    Effect.flatMap(giveBack(vm, wasRunning), (back) =>
                      Effect.fail(back ? e : err("switchover", vmId, `${e.message}; the guest could not be given back (QEMU does not answer): it counts as paused until an unpark resumes it`)),
                    ),
                  ),
                )
                return {
                  _tag: "AtSwitchover",
                  rounds: tracker.rounds,
                  unreported: late === null ? [] : [late],
                  final: { kind: "final", wireBytes: Math.round(MoveGuard.finalWireEstimate(tracker.rounds, { captureMs, apparentBytes: finalApparent })), apparentBytes: Math.round(finalApparent), sendMs: 0, captureMs },
                  estimateMs: post.estimateMs,
                  alreadyPaused: !wasRunning,
                  pausedAtMs,
                  captureMs,
                  selfConverged: !released,
                  switchover,
                  abort: Effect.asVoid(giveBack(vm, wasRunning)),
                } satisfies AtSwitchover
              }
            }
          }),
        )
        return yield* protocol.pipe(Effect.tapError(() => giveBack(vm, wasRunning)))
      })

    /** The VMs held and those attaching (their QEMU alive, their monitor not answering yet). */
    const residents = (): readonly { readonly spec: VmSpec; readonly pid: number; readonly status: VmStatus }[] => [
      ...vms.values(),
      ...[...host.attaching.values()].filter((a) => !vms.has(a.spec.vmId)),
    ]

    /**
     * Takes a live QEMU whose monitor answered after a restart as a resident VM. A restore or
     * template start cut short before its state loaded is ended (nothing to keep: the image or
     * template is as it was; the agent starts the session again). An outgoing move its agent
     * left behind in pre-copy (the guest runs) or held at pre-switchover (paused, nothing of the
     * final round sent) is cancelled, and the guest runs here again (the target cannot have the
     * whole guest; the agent runs the move again or aborts it). Past the switchover (`device`,
     * `completed`) it is left alone: the target may hold the whole guest, and only the agent's
     * owed commit decides which copy runs.
     */
    const adopt = (record: P.VmRecord, paths: P.VmPaths, pid: number, attached: Host.Attached) =>
      Effect.gen(function* () {
        const vm: Vm = { spec: record.spec, paths, pid, ...(yield* host.monitorOf(attached)), record, status: "paused", endpoint: null, exited: null }
        if (record.incomingMoveId === null && (yield* q<{ status: string }>(vm, "recover", "query-status").pipe(Effect.map((st) => st.status === "inmigrate"), Effect.orElseSucceed(() => false)))) {
          yield* Effect.logWarning("a restore or template start was cut short by a restart before its state loaded; its VM is ended", { vmId: record.spec.vmId })
          return yield* finish(vm)
        }
        if (record.incomingMoveId === null) {
          const info = yield* queryMigrate(vm, "recover").pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
          if (["setup", "active", "pre-switchover"].includes(info.status ?? "")) {
            yield* Effect.logWarning("QEMU VM recovered in the middle of an outgoing move; the move is cancelled, the guest runs here", { vmId: record.spec.vmId, migration: info.status })
            yield* cancelMigration(vm)
          }
        }
        vm.status = yield* runStatus(vm, "recover").pipe(Effect.orElseSucceed((): VmStatus => "paused"))
        yield* host.hold(vm)
      })

    /**
     * Keeps trying to attach a live QEMU whose monitor did not answer at recovery, pausing 100 ms,
     * then twice as long each time up to `attachRetryMaxMs`, each try bounded by `qmpTimeoutMs`;
     * listed meanwhile (`attaching`). A QEMU that exits meanwhile is a guest lost: its files go.
     */
    const attachLater = (pending: Host.Attaching) =>
      Effect.gen(function* () {
        const vmId = pending.spec.vmId
        host.attaching.set(vmId, pending)
        const loop = Effect.gen(function* () {
          for (let pauseMs = 100; ; pauseMs = Math.min(2 * pauseMs, attachRetryMaxMs)) {
            yield* Effect.sleep(pauseMs)
            if (!(yield* P.aliveAs(pending.pid, binary, pending.paths.pidFile))) {
              yield* Effect.logError("QEMU VM ended before its monitor answered; its guest is lost and its files are removed", { vmId, pid: pending.pid })
              return yield* host.removeFiles(pending.paths, pending.record.ram)
            }
            const attached = yield* attach(pending.paths, pending.pid, vmId, qmpTimeoutMs).pipe(Effect.result)
            if (attached._tag === "Failure") continue
            yield* Effect.logInfo("QEMU VM's monitor answers again; the VM is attached", { vmId, pid: pending.pid })
            return yield* Effect.uninterruptible(adopt(pending.record, pending.paths, pending.pid, attached.success))
          }
        })
        pending.fiber = yield* loop.pipe(
          Effect.ensuring(Effect.sync(() => host.attaching.get(vmId) === pending && host.attaching.delete(vmId))),
          Effect.forkIn(runtimeScope),
        )
      })

    const runtime: QemuRuntimeShape = {
      config,
      accel,
      qemuVersion,
      tcgSyncWorkaround: ramPadKib > 0,
      snapshots,
      ramPathOf: host.ramPathFor,
      consolePath: (vmId) => P.pathsOf(config.stateDir, vmId).console,
      pidOf: (vmId) => vms.get(vmId)?.pid,
      qmp: (vmId, command, args) => Effect.flatMap(get("qmp", vmId), (vm) => q(vm, "qmp", command, args)),
      info: Effect.succeed({
        kind: "qemu",
        accelerator: accel.accelerator,
        detail: [
          `${accel.detail}; QEMU ${qemuVersion === null ? "version unknown" : `${qemuVersion.major}.${qemuVersion.minor}.${qemuVersion.micro}`}`,
          ...(ramPadKib > 0 ? ["TCG dirty-sync workaround on (guest RAM + 8 KiB)"] : []),
          `snapshots ${snapshots.method}: ${snapshots.reason}`,
          config.readyLine === undefined ? "ready: when QEMU runs the guest (no readiness line configured)" : `ready: when the guest prints a line matching ${String(config.readyLine)}`,
        ].join("; "),
      } satisfies RuntimeInfo),
      start: (spec, options) =>
        options?.template !== undefined
          ? Snap.startFromTemplate(host, spec, options.template)
          : Effect.gen(function* () {
              const t0 = yield* nowMs
              const vm = yield* launch(spec, machineFor(spec), { incomingMoveId: null, incoming: false, ram: host.freshRam(spec.vmId), fresh: true })
              const ready = yield* host.awaitReady(vm, "start", "boot", 0, t0).pipe(Effect.tapError(() => finish(vm)))
              const ram = vm.record.ram?.kind === "file" ? "its RAM a file (mapped snapshots)" : `its RAM anonymous (stream snapshots: ${snapshots.reason})`
              return {
                ...spec,
                status: vm.status,
                launch: { from: "boot", method: null, template: null, readyMs: ready.readyMs, readiness: ready.readiness, detail: [`booted, ${ram}`, ready.note].filter((x) => x !== "").join("; ") },
              } satisfies VmStarted
            }),
      park: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("park", vmId)
          yield* q(vm, "park", "stop")
          vm.status = "paused"
        }),
      unpark: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("unpark", vmId)
          // A move's migration its failure could not cancel (QEMU did not answer then) is
          // cancelled first: the guest does not run while it may still complete.
          if (vm.record.incomingMoveId === null && (yield* cancelMigration(vm)) === null) return yield* err("unpark", vmId, "QEMU does not answer whether an outgoing migration still runs")
          if ((yield* runStatus(vm, "unpark")) === "running") {
            vm.status = "running"
            return
          }
          yield* host.resume(vm, "unpark", yield* nowMs)
        }),
      descend: (vmId, path) => Effect.flatMap(get("descend", vmId), (vm) => Snap.descend(host, vm, path, descentBandwidth)),
      restore: (spec, image) => Snap.restore(host, spec, image, machineFor),
      templates: Snap.listTemplates(host),
      buildTemplate: (t) => Snap.buildTemplate(host, t, machineFor({ vmId: t.name, memMib: t.memMib, vcpus: t.vcpus }), descentBandwidth),
      removeTemplate: (name) => Snap.removeTemplate(host, name),
      destroy: (vmId) =>
        Effect.gen(function* () {
          const vm = vms.get(vmId)
          if (vm !== undefined) return yield* finish(vm)
          // Attaching (its monitor has not answered since a restart), or not held at all: the
          // background attach stopped, then the process its files name ended, if it is QEMU.
          const pending = host.attaching.get(vmId)
          if (pending?.fiber != null) yield* Fiber.interrupt(pending.fiber)
          host.attaching.delete(vmId)
          const held = vms.get(vmId)
          if (held !== undefined) return yield* finish(held)
          const paths = P.pathsOf(config.stateDir, vmId)
          const pid = yield* P.readPidPatiently(paths)
          if (pid !== undefined && (yield* P.aliveAs(pid, binary, paths.pidFile))) yield* P.kill(pid, 5000)
          yield* host.removeFiles(paths, (yield* P.readRecord(paths.record))?.ram)
        }),
      // A template's build is the runtime's own guest: it is no VM of the agent's (its RAM is measured all the same).
      list: Effect.sync(() => residents().filter((vm) => !Host.isInternal(vm.spec.vmId)).map((vm): VmInfo => ({ ...vm.spec, status: vm.status }))),
      usage: Effect.sync(() =>
        residents().map((vm): VmUsage => ({ ...vm.spec, status: vm.status, rssBytes: P.rssBytes(vm.pid), ramBytes: P.unreclaimableBytes(vm.pid), pid: vm.pid, cpuMs: P.cpuMs(vm.pid) })),
      ),
      recover: (known) =>
        Effect.gen(function* () {
          const entries = yield* Effect.tryPromise(() => readdir(config.stateDir, { withFileTypes: true })).pipe(Effect.orElseSucceed(() => []))
          for (const entry of entries) {
            if (!entry.isDirectory()) continue
            const record = yield* P.readRecord(join(config.stateDir, entry.name, "vm.json"))
            if (record === undefined || vms.has(record.spec.vmId) || host.attaching.has(record.spec.vmId)) continue
            const paths = P.pathsOf(config.stateDir, record.spec.vmId)
            const pid = yield* P.readPidPatiently(paths)
            const alive = pid !== undefined && (yield* P.aliveAs(pid, binary, paths.pidFile))
            // A mapped restore cut short before it committed: its image still links the RAM file
            // (whole: the guest never ran on it). The VM is ended and its link removed; the
            // agent restores the session again from the image.
            if (record.ramOrigin !== undefined && record.ram?.kind === "file" && (yield* RamFile.sameFile(record.ram.path, record.ramOrigin))) {
              yield* Effect.logWarning("a restore was cut short by a restart before its guest ran; it is undone, its image is whole", { vmId: record.spec.vmId, image: record.ramOrigin })
              if (alive) yield* P.kill(pid, 5000)
              yield* host.removeFiles(paths, record.ram)
              continue
            }
            if (!alive) {
              yield* Effect.logWarning("QEMU VM found dead after a restart; its files are removed", { vmId: record.spec.vmId })
              yield* host.removeFiles(paths, record.ram)
              continue
            }
            if (Host.isInternal(record.spec.vmId)) {
              yield* Effect.logWarning("a template build was interrupted by a restart; its guest is ended", { vmId: record.spec.vmId })
              yield* P.kill(pid, 5000)
              yield* host.removeFiles(paths, record.ram)
              continue
            }
            const attached = yield* attach(paths, pid, record.spec.vmId, recoverAttachTimeoutMs).pipe(Effect.result)
            if (attached._tag === "Success") {
              yield* Effect.uninterruptible(adopt(record, paths, pid, attached.success))
              continue
            }
            // A live QEMU is a guest whatever its monitor does (busy: a descent's device save to a
            // slow disk, a move's final round to a target that stopped reading): listed and kept.
            const status = known.find((v) => v.vmId === record.spec.vmId)?.status ?? "paused"
            yield* Effect.logWarning("QEMU VM alive but its monitor does not answer; it is kept, listed as the agent knew it, and attached in the background once it answers", {
              vmId: record.spec.vmId,
              pid,
              status,
              error: attached.failure.message,
            })
            yield* attachLater({ spec: record.spec, paths, pid, record, status, fiber: null })
          }
          return yield* runtime.list
        }),
      prepareIncoming: (spec, moveId) =>
        Effect.gen(function* () {
          const endpointOf = (vm: Vm) =>
            Effect.gen(function* () {
              const port = M.listeningPort(yield* queryMigrate(vm, "prepareIncoming"))
              if (port === undefined) return yield* err("prepareIncoming", spec.vmId, "QEMU reported no listening port")
              const host = advertiseHost.includes(":") ? `[${advertiseHost}]` : advertiseHost
              return { runtime: "qemu", uri: `tcp:${host}:${port}` } satisfies IncomingEndpoint
            })
          const existing = vms.get(spec.vmId)
          if (existing !== undefined) {
            if (existing.record.incomingMoveId !== moveId) return yield* err("prepareIncoming", spec.vmId, "VM already resident")
            // The same move asked again (a retried request, or after an agent restart): the same
            // endpoint while it still waits for its stream. One whose stream began (a source that
            // died or gave up mid-move) cannot take another: it is replaced by a fresh one.
            // (Listening and not connected yet, QEMU shows no status, only the socket address.)
            const waiting =
              P.alive(existing.pid) &&
              (yield* queryMigrate(existing, "prepareIncoming").pipe(
                Effect.map((i) => (i.status === undefined || i.status === "setup") && M.listeningPort(i) !== undefined),
                Effect.orElseSucceed(() => false),
              ))
            if (waiting) return existing.endpoint ?? (yield* endpointOf(existing))
            yield* Effect.logInfo("incoming VM of a move asked again after its stream began; started afresh", { vmId: spec.vmId, moveId })
            yield* finish(existing)
          }
          const vm = yield* launch(spec, machineFor(spec), { incomingMoveId: moveId, incoming: true, ram: host.freshRam(spec.vmId), fresh: true })
          const endpoint = yield* Effect.gen(function* () {
            yield* q(vm, "prepareIncoming", "migrate-set-capabilities", moveCaps)
            yield* q(vm, "prepareIncoming", "migrate-incoming", { uri: `tcp:${listenHost.includes(":") ? `[${listenHost}]` : listenHost}:0` })
            return yield* endpointOf(vm)
          }).pipe(Effect.tapError(() => finish(vm)))
          vm.endpoint = endpoint
          return endpoint
        }),
      commitIncoming: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("commitIncoming", vmId)
          if (vm.record.incomingMoveId === null) return { ...vm.spec, status: vm.status }
          yield* Effect.scoped(
            Effect.gen(function* () {
              const sub = yield* vm.client.subscribe
              const info = yield* queryMigrate(vm, "commitIncoming")
              if (info.status === "failed" || info.status === "cancelled") return yield* err("commitIncoming", vmId, `incoming migration ${info.status}`)
              if (info.status !== "completed") yield* awaitMigrationEnd(vm, "commitIncoming", sub, { kind: "progress", ms: migrationTimeoutMs, measure: "loaded" })
              yield* q(vm, "commitIncoming", "cont")
            }),
          ).pipe(Effect.tapError(() => finish(vm)))
          vm.record = { ...vm.record, incomingMoveId: null }
          vm.endpoint = null
          vm.status = "running"
          yield* P.writeRecord(vm.paths, vm.record).pipe(Effect.ignore)
          return { ...vm.spec, status: vm.status }
        }),
      migrate,
    }
    return runtime
  })

/** The QEMU runtime as the agent's `VmRuntime` layer. */
export const layer = (config: QemuConfig) => Layer.effect(VmRuntime, make(config))
