/**
 * The QEMU runtime: one `qemu-system-x86_64` per session, driven over QMP.
 *
 * - start: a QEMU booting the configured kernel (+ initramfs) or disk, KVM when the probe says
 *   it works, TCG otherwise; serial console to `console.log` in the VM's directory.
 * - park / unpark: QMP `stop` / `cont` (RAM stays resident).
 * - descend: `stop`, migrate to `exec:cat > <image>`, then `quit`: the process and its RAM are
 *   gone. restore: a new QEMU with `-incoming defer`, `migrate-incoming exec:cat <image>`, `cont`:
 *   the guest continues, it does not reboot.
 * - live move: the target starts QEMU with `-incoming` on a port QEMU picks; the source runs
 *   QEMU's migration to it under engram's guard (QemuMigration.ts) and stops at
 *   `pre-switchover`; the target's commit is `cont` once its incoming migration completed.
 * - usage: VmRSS from `/proc/<pid>/status`. recover: VMs outlive the agent; a new runtime adopts
 *   every VM of its state directory whose QMP socket answers. destroy: `quit`, then kill.
 */
import { readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Effect, Exit, Layer, Schedule, Scope } from "effect"
import {
  type AtSwitchover,
  type DescentImage,
  type IncomingEndpoint,
  type MigrateRequest,
  type MigrateResult,
  MoveGuard,
  nowMs,
  RuntimeError,
  type RuntimeInfo,
  type Switched,
  type VmInfo,
  VmRuntime,
  type VmRuntimeShape,
  type VmSpec,
  type VmStatus,
  type VmUsage,
} from "@engram/runtime"
import * as Accel from "./Accel.js"
import * as Qmp from "./Qmp.js"
import * as M from "./QemuMigration.js"
import * as P from "./QemuProcess.js"

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
  /** Where incoming moves listen (default 127.0.0.1) and the address sources are told (default the same). */
  readonly migrationListenHost?: string
  readonly migrationAdvertiseHost?: string
  /** QEMU's `max-bandwidth` for live moves, bytes/s. Default 1 GiB/s. */
  readonly moveBandwidthBytesPerSec?: number
  /** QEMU's `max-bandwidth` for descents (to a local file), bytes/s. Default 16 GiB/s. */
  readonly descentBandwidthBytesPerSec?: number
  /** TCG translation cache, MiB (QEMU's default is 1 GiB of address space per VM). Default 64. */
  readonly tcgTbSizeMib?: number
  /** Per QMP command. Default 10 s. */
  readonly qmpTimeoutMs?: number
  /** From spawn to a QMP connection. Default 30 s. */
  readonly startTimeoutMs?: number
  /** The longest wait for the next migration event (a bulk round included). Default 120 s. */
  readonly migrationTimeoutMs?: number
  /** Appended to every QEMU command line. */
  readonly extraArgs?: readonly string[]
}

/** The QEMU runtime: the interface plus what tests and operators inspect. */
export interface QemuRuntimeShape extends VmRuntimeShape {
  readonly config: QemuConfig
  readonly accel: Accel.Accel
  readonly qemuVersion: Accel.QemuVersion | null
  /** Whether guests get the TCG dirty-sync workaround (8 KiB more RAM; see Accel.ts). */
  readonly tcgSyncWorkaround: boolean
  /** The serial console file of a VM (a restore or an incoming move starts a new one). */
  readonly consolePath: (vmId: string) => string
  /** The QEMU process of a resident VM. */
  readonly pidOf: (vmId: string) => number | undefined
  /** Runs a QMP command on a resident VM (diagnostics, tests). */
  readonly qmp: <A = unknown>(vmId: string, command: string, args?: Readonly<Record<string, unknown>>) => Effect.Effect<A, RuntimeError>
}

interface Vm {
  readonly spec: VmSpec
  readonly paths: P.VmPaths
  readonly pid: number
  readonly client: Qmp.QmpClient
  readonly scope: Scope.Closeable
  record: P.VmRecord
  status: VmStatus
  endpoint: IncomingEndpoint | null
}

/** The descent image's side file: the machine to restore it into. */
interface ImageMachine {
  readonly engram: "qemu-image/v1"
  readonly spec: VmSpec
  readonly machine: P.Machine
}

const err = (op: string, vmId: string, message: string) => new RuntimeError({ op, vmId, message })
const asRuntimeError = (op: string, vmId: string) => (e: { readonly message: string; readonly _tag: string }) => err(op, vmId, `${e._tag}: ${e.message}`)

/** Builds a QEMU runtime; its QMP connections live in the scope (the VMs outlive it). */
export const make = (config: QemuConfig): Effect.Effect<QemuRuntimeShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = config.binary ?? "qemu-system-x86_64"
    const qmpTimeoutMs = config.qmpTimeoutMs ?? 10_000
    const startTimeoutMs = config.startTimeoutMs ?? 30_000
    const migrationTimeoutMs = config.migrationTimeoutMs ?? 120_000
    const listenHost = config.migrationListenHost ?? "127.0.0.1"
    const advertiseHost = config.migrationAdvertiseHost ?? listenHost
    const accel: Accel.Accel =
      config.accelerator === "kvm"
        ? { accelerator: "kvm", detail: "KVM: configured" }
        : config.accelerator === "tcg"
          ? { accelerator: "tcg", detail: "TCG: configured" }
          : yield* Accel.probe(binary)
    const qemuVersion = yield* Accel.version(binary)
    const ramPadKib = Accel.needsTcgSyncWorkaround(accel.accelerator, qemuVersion) ? 8 : 0
    const machineFor = (spec: VmSpec): P.Machine => ({
      boot: typeof config.boot === "function" ? config.boot(spec) : config.boot,
      machineType: config.machineType ?? "q35",
      accelerator: accel.accelerator,
      ...(ramPadKib === 0 ? {} : { ramPadKib }),
    })
    const vms = new Map<string, Vm>()
    yield* Effect.addFinalizer(() => Effect.forEach([...vms.values()], (vm) => Scope.close(vm.scope, Exit.void), { discard: true }))

    const get = (op: string, vmId: string) => {
      const vm = vms.get(vmId)
      return vm === undefined ? Effect.fail(err(op, vmId, `no VM ${vmId} on this host`)) : Effect.succeed(vm)
    }
    const q = <A = unknown>(vm: Vm, op: string, command: string, args?: Readonly<Record<string, unknown>>, timeoutMs = qmpTimeoutMs) =>
      vm.client.execute<A>(command, args, timeoutMs).pipe(Effect.mapError(asRuntimeError(op, vm.spec.vmId)))
    const queryMigrate = (vm: Vm, op: string) => q<M.MigrationInfo>(vm, op, "query-migrate")
    const runStatus = (vm: Vm, op: string) =>
      Effect.map(q<{ status: string; running: boolean }>(vm, op, "query-status"), (s): VmStatus => (s.running ? "running" : "paused"))

    /** Connects to a VM's QMP socket, retrying while its process lives, within `timeoutMs`. */
    const attach = (paths: P.VmPaths, pid: number, vmId: string, timeoutMs: number) =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const once = Effect.suspend(() =>
          P.alive(pid) ? Qmp.connect(paths.socket, { timeoutMs: qmpTimeoutMs }) : Effect.fail(new Qmp.QmpClosed({ socket: paths.socket, command: "connect", message: "QEMU exited" })),
        ).pipe(Scope.provide(scope))
        const client = yield* once.pipe(
          Effect.retry({ while: (e) => e.message !== "QEMU exited", times: Math.ceil(timeoutMs / 25), schedule: Schedule.spaced("25 millis") }),
          Effect.tapError(() => Scope.close(scope, Exit.void)),
          Effect.mapError((e) => err("attach", vmId, `QMP at ${paths.socket}: ${e.message}${P.stderrTail(paths) === "" ? "" : ` (qemu: ${P.stderrTail(paths)})`}`)),
        )
        return { client, scope }
      })

    /** VMs whose QEMU is being spawned (one launch per VM at a time). */
    const launching = new Set<string>()

    /**
     * Spawns a VM's QEMU and connects to it. Not interruptible: a QEMU spawned and never
     * registered would run on unseen. A live QEMU left in the VM's files (one this runtime does
     * not hold: its QMP never answered after a restart) is ended first: one QEMU per VM.
     */
    const launch = (spec: VmSpec, m: P.Machine, incomingMoveId: string | null, incoming: boolean) =>
      Effect.uninterruptible(
        Effect.gen(function* () {
          if (vms.has(spec.vmId) || launching.has(spec.vmId)) return yield* err("start", spec.vmId, "VM already resident")
          launching.add(spec.vmId)
          return yield* Effect.gen(function* () {
            const paths = P.pathsOf(config.stateDir, spec.vmId)
            const stray = P.readPid(paths)
            if (stray !== undefined && P.aliveAs(stray, binary)) {
              yield* Effect.logWarning("a QEMU this runtime does not hold runs in the VM's files; it is ended before a new one starts", { vmId: spec.vmId, pid: stray })
              yield* P.kill(stray, 5000)
            }
            const args = P.argv(spec, m, paths, { incoming, tcgTbSizeMib: config.tcgTbSizeMib ?? 64, extra: config.extraArgs ?? [] })
            const pid = yield* P.spawnQemu(binary, args, paths, spec.vmId)
            const attached = yield* attach(paths, pid, spec.vmId, startTimeoutMs).pipe(Effect.tapError(() => P.kill(pid, 2000)))
            const record: P.VmRecord = { engram: "qemu-vm/v1", spec, machine: m, socket: paths.socket, incomingMoveId }
            yield* P.writeRecord(paths, record).pipe(Effect.tapError(() => P.kill(pid, 2000)))
            const vm: Vm = { spec, paths, pid, ...attached, record, status: incoming ? "paused" : "running", endpoint: null }
            vms.set(spec.vmId, vm)
            return vm
          }).pipe(Effect.ensuring(Effect.sync(() => launching.delete(spec.vmId))))
        }),
      )

    /** Ends a VM's QEMU (`quit`, then signals) and removes its files. Never fails. */
    const finish = (vm: Vm) =>
      Effect.gen(function* () {
        vms.delete(vm.spec.vmId)
        yield* vm.client.execute("quit", undefined, 5000).pipe(Effect.ignore)
        if (!(yield* P.awaitExit(vm.pid, 10_000))) yield* P.kill(vm.pid, 5000)
        yield* Scope.close(vm.scope, Exit.void)
        yield* Effect.promise(() => Promise.all([rm(vm.paths.dir, { recursive: true, force: true }), rm(vm.paths.socket, { force: true })]))
      })

    /** Waits for the end of a migration (either side): `completed`, or a failure as an error. */
    const awaitMigrationEnd = (vm: Vm, op: string, sub: Parameters<typeof Qmp.awaitEvent>[0]) =>
      Effect.gen(function* () {
        const end = yield* Qmp.awaitEvent(
          sub,
          (e) => (e.event === "MIGRATION" && ["completed", "failed", "cancelled"].includes(String(e.data["status"])) ? e : e.event === "SHUTDOWN" ? e : undefined),
          migrationTimeoutMs,
          "end of migration",
          vm.paths.socket,
        ).pipe(Effect.mapError(asRuntimeError(op, vm.spec.vmId)))
        if (end.event === "MIGRATION" && end.data["status"] === "completed") return end
        const info = yield* queryMigrate(vm, op).pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
        return yield* err(op, vm.spec.vmId, `migration ${end.event === "SHUTDOWN" ? "ended by a QEMU shutdown" : String(end.data["status"])}${info["error-desc"] === undefined ? "" : `: ${info["error-desc"]}`}`)
      })

    /** Cancels a VM's outgoing migration and waits until QEMU says it ended (a cancel at pre-switchover resumes a guest that ran). Never fails. */
    const cancelMigration = (vm: Vm) =>
      Effect.scoped(
        Effect.gen(function* () {
          const sub = yield* vm.client.subscribe
          yield* q(vm, "migrate", "migrate_cancel")
          yield* Qmp.awaitEvent(sub, (e) => (e.event === "MIGRATION" && ["cancelled", "failed", "completed"].includes(String(e.data["status"])) ? e : undefined), 10_000, "cancelled")
        }),
      ).pipe(Effect.ignore)

    /** After a failed or refused outgoing migration: cancel it if it still runs, and make sure the guest runs here. */
    const giveBack = (vm: Vm, wasRunning: boolean) =>
      Effect.gen(function* () {
        const info = yield* queryMigrate(vm, "migrate").pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
        if (["setup", "active", "pre-switchover", "device"].includes(info.status ?? "")) yield* cancelMigration(vm)
        if (wasRunning && (yield* runStatus(vm, "migrate").pipe(Effect.orElseSucceed(() => "running" as VmStatus))) === "paused") {
          yield* q(vm, "migrate", "cont").pipe(Effect.ignore)
        }
        vm.status = wasRunning ? "running" : vm.status
      })

    const migrate = <E>(vmId: string, req: MigrateRequest<E>): Effect.Effect<MigrateResult, RuntimeError | E> =>
      Effect.gen(function* () {
        const vm = yield* get("migrate", vmId)
        if (req.endpoint.runtime !== "qemu") return yield* err("migrate", vmId, `a ${req.endpoint.runtime} endpoint cannot take a QEMU VM`)
        if (!/^tcp:/.test(req.endpoint.uri)) return yield* err("migrate", vmId, `unsupported endpoint ${req.endpoint.uri}`)
        const b = req.budget
        const upfront = MoveGuard.beforeStart(b)
        if (upfront._tag === "Refuse") return { _tag: "Refused", stage: "pre-pause", estimateMs: upfront.estimateMs, reason: upfront.reason, rounds: [] } satisfies MigrateResult
        const wasRunning = (yield* runStatus(vm, "migrate")) === "running"
        const tracker = new M.RoundTracker()

        const protocol = Effect.scoped(
          Effect.gen(function* () {
            const sub = yield* vm.client.subscribe
            yield* q(vm, "migrate", "migrate-set-capabilities", M.capabilities(true))
            yield* q(vm, "migrate", "migrate-set-parameters", { "downtime-limit": 1, "max-bandwidth": config.moveBandwidthBytesPerSec ?? 1024 ** 3 })
            yield* q(vm, "migrate", "migrate", { uri: req.endpoint.uri })
            let stop: Qmp.QmpEvent | null = null
            let resumedAt: number | null = null
            let released = false
            let refusal: Extract<MoveGuard.Step, { _tag: "Refuse" }> | null = null
            for (;;) {
              const e = yield* Qmp.awaitEvent(sub, (e) => e, migrationTimeoutMs, "migration event", vm.paths.socket).pipe(Effect.mapError(asRuntimeError("migrate", vmId)))
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
                const step = MoveGuard.afterRound(tracker.rounds, b)
                if (step._tag === "Pause") {
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
                const late = tracker.close(tracker.lastPassQemuMs, info)
                if (late !== null) yield* req.onRound(late)
                const finalApparent = M.finalApparentBytes(info, tracker, stopQemuMs)
                const post = M.postCapture(tracker, captureMs, finalApparent, b)
                if (post._tag === "Overrun") {
                  yield* giveBack(vm, wasRunning)
                  const pausedMs = (yield* nowMs) - pausedAtMs
                  return { _tag: "Aborted", stage: "post-capture", estimateMs: post.estimateMs, reason: post.reason, rounds: tracker.rounds, captureMs, pausedMs } satisfies MigrateResult
                }
                const sentBefore = info.ram?.transferred ?? 0
                vm.status = "paused"
                const switchover: Effect.Effect<Switched, RuntimeError> = Effect.scoped(
                  Effect.gen(function* () {
                    const sub2 = yield* vm.client.subscribe
                    const t0 = yield* nowMs
                    yield* q(vm, "switchover", "migrate-continue", { state: "pre-switchover" })
                    const end = yield* awaitMigrationEnd(vm, "switchover", sub2)
                    const done = yield* queryMigrate(vm, "switchover")
                    return {
                      sendMs: end.receivedAtMs - t0,
                      sentAtMs: end.receivedAtMs,
                      // RAM sent while paused (QEMU's downtime-bytes; device state is not counted in either figure).
                      finalWireBytes: Math.max((done.ram?.transferred ?? sentBefore) - sentBefore, done.ram?.["downtime-bytes"] ?? 0),
                      runtimeDowntimeMs: done.downtime ?? null,
                    } satisfies Switched
                  }),
                ).pipe(Effect.tapError(() => giveBack(vm, wasRunning)))
                return {
                  _tag: "AtSwitchover",
                  rounds: tracker.rounds,
                  final: { kind: "final", wireBytes: Math.round(MoveGuard.finalWireEstimate(tracker.rounds, { captureMs, apparentBytes: finalApparent })), apparentBytes: Math.round(finalApparent), sendMs: 0, captureMs },
                  estimateMs: post.estimateMs,
                  pausedAtMs,
                  captureMs,
                  selfConverged: !released,
                  switchover,
                  abort: giveBack(vm, wasRunning),
                } satisfies AtSwitchover
              }
            }
          }),
        )
        return yield* protocol.pipe(Effect.tapError(() => giveBack(vm, wasRunning)))
      })

    const runtime: QemuRuntimeShape = {
      config,
      accel,
      qemuVersion,
      tcgSyncWorkaround: ramPadKib > 0,
      consolePath: (vmId) => P.pathsOf(config.stateDir, vmId).console,
      pidOf: (vmId) => vms.get(vmId)?.pid,
      qmp: (vmId, command, args) => Effect.flatMap(get("qmp", vmId), (vm) => q(vm, "qmp", command, args)),
      info: Effect.succeed({
        kind: "qemu",
        accelerator: accel.accelerator,
        detail: `${accel.detail}; QEMU ${qemuVersion === null ? "version unknown" : `${qemuVersion.major}.${qemuVersion.minor}.${qemuVersion.micro}`}${ramPadKib > 0 ? "; TCG dirty-sync workaround on (guest RAM + 8 KiB)" : ""}`,
      } satisfies RuntimeInfo),
      start: (spec) => Effect.map(launch(spec, machineFor(spec), null, false), (vm): VmInfo => ({ ...spec, status: vm.status })),
      park: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("park", vmId)
          yield* q(vm, "park", "stop")
          vm.status = "paused"
        }),
      unpark: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("unpark", vmId)
          yield* q(vm, "unpark", "cont")
          vm.status = "running"
        }),
      descend: (vmId, path) =>
        Effect.gen(function* () {
          const vm = yield* get("descend", vmId)
          const wasRunning = (yield* runStatus(vm, "descend")) === "running"
          const part = `${path}.part`
          yield* Effect.scoped(
            Effect.gen(function* () {
              const sub = yield* vm.client.subscribe
              yield* q(vm, "descend", "migrate-set-capabilities", M.capabilities(false))
              yield* q(vm, "descend", "migrate-set-parameters", { "max-bandwidth": config.descentBandwidthBytesPerSec ?? 16 * 1024 ** 3 })
              // Stopped first: the image is one consistent capture, sent in a single pass.
              if (wasRunning) yield* q(vm, "descend", "stop")
              yield* q(vm, "descend", "migrate", { uri: `exec:cat > ${M.shellQuote(part)}` })
              yield* awaitMigrationEnd(vm, "descend", sub)
            }),
          ).pipe(Effect.tapError(() => (wasRunning ? q(vm, "descend", "cont").pipe(Effect.ignore) : Effect.void)))
          const side: ImageMachine = { engram: "qemu-image/v1", spec: vm.spec, machine: vm.record.machine }
          const bytes = yield* Effect.tryPromise({
            try: async () => {
              await writeFile(join(dirname(path), "machine.json"), JSON.stringify(side, null, 2))
              await rename(part, path)
              return (await stat(path)).size
            },
            catch: (e) => err("descend", vmId, `image write failed: ${String(e)}`),
          }).pipe(Effect.tapError(() => (wasRunning ? q(vm, "descend", "cont").pipe(Effect.ignore) : Effect.void)))
          yield* finish(vm)
          return { vmId, path, bytes } satisfies DescentImage
        }),
      restore: (spec, image) =>
        Effect.gen(function* () {
          const side = yield* Effect.tryPromise(() => readFile(join(dirname(image.path), "machine.json"), "utf8")).pipe(
            Effect.map((t) => JSON.parse(t) as Partial<ImageMachine>),
            Effect.orElseSucceed((): Partial<ImageMachine> => ({})),
          )
          if (side.spec !== undefined && side.spec.vmId !== spec.vmId) return yield* err("restore", spec.vmId, `${image.path} is an image of ${side.spec.vmId}`)
          const m = side.machine ?? machineFor(spec)
          const vm = yield* launch(spec, m, null, true)
          yield* Effect.scoped(
            Effect.gen(function* () {
              const sub = yield* vm.client.subscribe
              yield* q(vm, "restore", "migrate-set-capabilities", M.capabilities(false))
              yield* q(vm, "restore", "migrate-incoming", { uri: `exec:cat ${M.shellQuote(image.path)}` })
              yield* awaitMigrationEnd(vm, "restore", sub)
              yield* q(vm, "restore", "cont")
            }),
          ).pipe(Effect.tapError(() => finish(vm)))
          vm.status = "running"
          return { ...spec, status: vm.status }
        }),
      destroy: (vmId) =>
        Effect.gen(function* () {
          const vm = vms.get(vmId)
          if (vm !== undefined) return yield* finish(vm)
          // Not adopted (its QMP did not answer): end the process its files name, if it is QEMU.
          const paths = P.pathsOf(config.stateDir, vmId)
          const pid = P.readPid(paths)
          if (pid !== undefined && P.aliveAs(pid, binary)) yield* P.kill(pid, 5000)
          yield* Effect.promise(() => Promise.all([rm(paths.dir, { recursive: true, force: true }), rm(paths.socket, { force: true })]))
        }),
      list: Effect.sync(() => [...vms.values()].map((vm): VmInfo => ({ ...vm.spec, status: vm.status }))),
      usage: Effect.sync(() => [...vms.values()].map((vm): VmUsage => ({ ...vm.spec, status: vm.status, rssBytes: P.rssBytes(vm.pid), pid: vm.pid }))),
      recover: () =>
        Effect.gen(function* () {
          const entries = yield* Effect.tryPromise(() => readdir(config.stateDir, { withFileTypes: true })).pipe(Effect.orElseSucceed(() => []))
          for (const entry of entries) {
            if (!entry.isDirectory()) continue
            const record = yield* P.readRecord(join(config.stateDir, entry.name, "vm.json"))
            if (record === undefined || vms.has(record.spec.vmId)) continue
            const paths = P.pathsOf(config.stateDir, record.spec.vmId)
            const pid = P.readPid(paths)
            if (pid === undefined || !P.aliveAs(pid, binary)) {
              yield* Effect.logWarning("QEMU VM found dead after a restart; its files are removed", { vmId: record.spec.vmId })
              yield* Effect.promise(() => Promise.all([rm(paths.dir, { recursive: true, force: true }), rm(paths.socket, { force: true })]))
              continue
            }
            const attached = yield* attach(paths, pid, record.spec.vmId, 3000).pipe(Effect.result)
            if (attached._tag === "Failure") {
              yield* Effect.logWarning("QEMU VM alive but its QMP socket does not answer; left alone", { vmId: record.spec.vmId, error: attached.failure.message })
              continue
            }
            const vm: Vm = { spec: record.spec, paths, pid, ...attached.success, record, status: "paused", endpoint: null }
            // An outgoing move its agent left behind: in pre-copy (the guest runs) or held at
            // pre-switchover (paused, nothing of the final round sent), the target cannot have
            // the whole guest, so the move is cancelled and the guest runs here again (the agent
            // runs the move again or aborts it). Past the switchover (`device`, `completed`) it
            // is left alone: the target may hold the whole guest, and only the agent's owed
            // commit decides which copy runs.
            if (record.incomingMoveId === null) {
              const info = yield* queryMigrate(vm, "recover").pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
              if (["setup", "active", "pre-switchover"].includes(info.status ?? "")) {
                yield* Effect.logWarning("QEMU VM recovered in the middle of an outgoing move; the move is cancelled, the guest runs here", {
                  vmId: record.spec.vmId,
                  migration: info.status,
                })
                yield* cancelMigration(vm)
              }
            }
            vm.status = yield* runStatus(vm, "recover").pipe(Effect.orElseSucceed((): VmStatus => "paused"))
            vms.set(record.spec.vmId, vm)
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
          const vm = yield* launch(spec, machineFor(spec), moveId, true)
          const endpoint = yield* Effect.gen(function* () {
            yield* q(vm, "prepareIncoming", "migrate-set-capabilities", M.capabilities(true))
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
              if (info.status !== "completed") yield* awaitMigrationEnd(vm, "commitIncoming", sub)
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
