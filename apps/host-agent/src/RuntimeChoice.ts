/**
 * Which VM runtime an agent runs (`ENGRAM_RUNTIME`): the simulated one of `@engram/runtime`
 * (the default: tests and the demo) or QEMU (`@engram/runtime-qemu`, real guests).
 *
 * What it decides: the move data plane's addresses (the simulated wire over TCP when the agent
 * serves peers, in memory otherwise; QEMU's incoming migrations on the same host), and for
 * QEMU the guest every VM boots: the configured kernel (+ initramfs) or disk image. A QEMU
 * that is not installed or a guest file that is missing is refused at start with what to do
 * about it.
 */
import { existsSync } from "node:fs"
import { dirname, join } from "node:path"
import { SimRuntime, SimWire, type VmRuntimeShape } from "@engram/runtime"
import { Accel, QemuProcess, QemuRuntime } from "@engram/runtime-qemu"
import { Effect, Schema, type Scope } from "effect"

/** The QEMU runtime's agent settings (README "Configuration"). */
export interface QemuSettings {
  /** VM directories (console, pid, `vm.json`) and QMP sockets. VMs outlive the agent: keep it across restarts. */
  readonly stateDir: string
  /** What guests boot: a kernel (+ initramfs, command line) or a disk image. */
  readonly boot:
    | { readonly kind: "kernel"; readonly kernel: string; readonly initrd?: string; readonly append?: string }
    | { readonly kind: "disk"; readonly disk: string; readonly format?: string }
  readonly binary?: string
  readonly accelerator?: "auto" | "kvm" | "tcg"
  /** QEMU's `max-bandwidth` for live moves, bytes/s (default 1 GiB/s). */
  readonly moveBandwidthBytesPerSec?: number
  /** Guest RAM: RAM files (mapped snapshots, the default) or anonymous (stream snapshots). */
  readonly memory?: "file" | "anonymous"
  /** Where RAM files live (default: each VM's directory, on the state directory's filesystem). */
  readonly ramDir?: string
  /** The guest's readiness line (SPEC §13); none: a VM is ready when QEMU runs it. */
  readonly readyLine?: RegExp
}

/** Where a move's data plane listens on this host, and the address sources are told. */
export interface MigrationAddress {
  readonly listenHost: string
  readonly advertiseHost: string
}

/** The runtime cannot run here; `message` says why and what to do. */
export class RuntimeUnavailable extends Schema.TaggedError<RuntimeUnavailable>()("RuntimeUnavailable", {
  runtime: Schema.String,
  message: Schema.String,
}) {}

/** The simulated runtime: over TCP between agent processes when the agent serves peers, else in memory. */
export const makeSim = (config: Partial<SimRuntime.SimConfig>, address: MigrationAddress | null): Effect.Effect<VmRuntimeShape> =>
  SimRuntime.make(config, address === null ? SimWire.inMemory() : SimWire.tcp(address))

/** Builds the QEMU runtime in the agent's scope (its QMP connections; the VMs outlive it). */
export const makeQemu = (settings: QemuSettings, address: MigrationAddress): Effect.Effect<QemuRuntime.QemuRuntimeShape, RuntimeUnavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = settings.binary ?? "qemu-system-x86_64"
    const version = yield* Accel.version(binary)
    if (version === null) {
      return yield* new RuntimeUnavailable({ runtime: "qemu", message: `${binary} does not run here (or did not answer --version within ${Accel.versionTimeoutMs / 1000} s): install QEMU (Debian: apt-get install qemu-system-x86) or set ENGRAM_QEMU_BINARY` })
    }
    const socket = QemuProcess.pathsOf(settings.stateDir, "x").socket
    if (socket.length > QemuProcess.maxSocketPath) {
      return yield* new RuntimeUnavailable({
        runtime: "qemu",
        message: `ENGRAM_QEMU_STATE_DIR ${settings.stateDir} is too long for QMP sockets (${socket.length} > ${QemuProcess.maxSocketPath} bytes): use a shorter directory`,
      })
    }
    const b = settings.boot
    const boot: QemuProcess.Boot =
      b.kind === "kernel"
        ? { kernel: b.kernel, ...(b.initrd === undefined ? {} : { initrd: b.initrd }), ...(b.append === undefined ? {} : { append: b.append }) }
        : { disk: b.disk, ...(b.format === undefined ? {} : { format: b.format }) }
    for (const file of "kernel" in boot ? [boot.kernel, boot.initrd] : [boot.disk]) {
      if (file !== undefined && !existsSync(file)) return yield* new RuntimeUnavailable({ runtime: "qemu", message: `no such file: ${file}` })
    }
    return yield* QemuRuntime.make({
      stateDir: settings.stateDir,
      boot,
      binary,
      accelerator: settings.accelerator ?? "auto",
      migrationListenHost: address.listenHost,
      migrationAdvertiseHost: address.advertiseHost,
      ...(settings.moveBandwidthBytesPerSec === undefined ? {} : { moveBandwidthBytesPerSec: settings.moveBandwidthBytesPerSec }),
      ...(settings.memory === undefined ? {} : { memory: settings.memory }),
      ...(settings.ramDir === undefined ? {} : { ramDir: settings.ramDir }),
      ...(settings.readyLine === undefined ? {} : { readyLine: settings.readyLine }),
    })
  })

/**
 * The default of `ENGRAM_QEMU_STATE_DIR`: beside the agent's state file, or under the temp
 * directory; one per host either way (a runtime adopts every VM of its directory).
 */
export const defaultQemuStateDir = (hostId: string, stateFile: string | undefined, tmp: string): string =>
  join(stateFile === undefined ? tmp : dirname(stateFile), `engram-qemu-${encodeURIComponent(hostId)}`)
