/**
 * Which VM runtime an agent runs (`ENGRAM_RUNTIME`): the simulated one of `@engram/runtime`
 * (the default: tests and the demo) or QEMU (`@engram/runtime-qemu`, real guests).
 *
 * What it decides: the move data plane's addresses (the simulated wire over TCP when the agent
 * serves peers, in memory otherwise; QEMU's incoming migrations on the same host), and for
 * QEMU the guest every VM boots: the configured kernel (+ initramfs) or disk image, or else
 * the repository's test guest (`tooling/guest`), built on first use. A QEMU that is not
 * installed or a guest that cannot be built is refused at start with what to do about it.
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
  /** What guests boot; `guest`: the repository's test guest, with an optional kernel command line. */
  readonly boot:
    | { readonly kind: "kernel"; readonly kernel: string; readonly initrd?: string; readonly append?: string }
    | { readonly kind: "disk"; readonly disk: string; readonly format?: string }
    | { readonly kind: "guest"; readonly append?: string }
  readonly binary?: string
  readonly accelerator?: "auto" | "kvm" | "tcg"
  /** QEMU's `max-bandwidth` for live moves, bytes/s (default 1 GiB/s). */
  readonly moveBandwidthBytesPerSec?: number
  /** Guest RAM: RAM files (mapped snapshots, the default) or anonymous (stream snapshots). */
  readonly memory?: "file" | "anonymous"
  /** Where RAM files live (default: each VM's directory, on the state directory's filesystem). */
  readonly ramDir?: string
  /** The guest's readiness line; the test guest's by default when it boots the test guest, else none (QEMU running). */
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

/** The default guest's kernel command line: a calm guest (256 KiB/s over a 4 MiB ring, a counter every 100 ms). */
export const defaultGuestLoad = { dirtyKibPerSec: 256, hotMib: 4, tickMs: 100 } as const

/** The simulated runtime: over TCP between agent processes when the agent serves peers, else in memory. */
export const makeSim = (config: Partial<SimRuntime.SimConfig>, address: MigrationAddress | null): Effect.Effect<VmRuntimeShape> =>
  SimRuntime.make(config, address === null ? SimWire.inMemory() : SimWire.tcp(address))

/** The guest files and command line of the repository's test guest, built on first use. */
const testGuest = (append: string | undefined) =>
  Effect.gen(function* () {
    // Loaded only here: the test guest is a private workspace package, needed by nothing else.
    const guest = yield* Effect.tryPromise({
      try: () => import("@engram/guest"),
      catch: (e) => new RuntimeUnavailable({ runtime: "qemu", message: `the test guest package is missing (${String(e)}): set ENGRAM_QEMU_KERNEL or ENGRAM_QEMU_DISK` }),
    })
    yield* Effect.logInfo(
      `qemu: no ENGRAM_QEMU_KERNEL or ENGRAM_QEMU_DISK: guests boot the repository's test guest (kernel of linux-image-amd64 + a busybox initramfs), cached in ${process.env["ENGRAM_GUEST_CACHE"] ?? guest.defaultCacheDir}; the first build downloads the kernel package (about 15 s)`,
    )
    const logLine = Effect.runSyncWith(yield* Effect.context<never>())
    const files = yield* Effect.tryPromise({
      try: () => guest.ensureGuest({ log: (line) => logLine(Effect.logInfo(`qemu: ${line}`)) }),
      catch: (e) =>
        new RuntimeUnavailable({
          runtime: "qemu",
          message: `cannot build the test guest: ${e instanceof Error ? e.message : String(e)}. It needs busybox-static installed and apt's package lists (apt-get update) for linux-image-amd64; or set ENGRAM_QEMU_KERNEL (+ ENGRAM_QEMU_INITRD) or ENGRAM_QEMU_DISK`,
        }),
    })
    return { boot: { kernel: files.kernel, initrd: files.initrd, append: append ?? guest.cmdline(defaultGuestLoad) } satisfies QemuProcess.Boot, readyLine: guest.readyLine }
  })

/** Builds the QEMU runtime in the agent's scope (its QMP connections; the VMs outlive it). */
export const makeQemu = (settings: QemuSettings, address: MigrationAddress): Effect.Effect<QemuRuntime.QemuRuntimeShape, RuntimeUnavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const binary = settings.binary ?? "qemu-system-x86_64"
    const version = yield* Accel.version(binary)
    if (version === null) {
      return yield* new RuntimeUnavailable({ runtime: "qemu", message: `${binary} does not run here: install QEMU (Debian: apt-get install qemu-system-x86) or set ENGRAM_QEMU_BINARY` })
    }
    const socket = QemuProcess.pathsOf(settings.stateDir, "x").socket
    if (socket.length > QemuProcess.maxSocketPath) {
      return yield* new RuntimeUnavailable({
        runtime: "qemu",
        message: `ENGRAM_QEMU_STATE_DIR ${settings.stateDir} is too long for QMP sockets (${socket.length} > ${QemuProcess.maxSocketPath} bytes): use a shorter directory`,
      })
    }
    const b = settings.boot
    const chosen: { readonly boot: QemuProcess.Boot; readonly readyLine?: RegExp } =
      b.kind === "guest"
        ? yield* testGuest(b.append)
        : b.kind === "kernel"
          ? { boot: { kernel: b.kernel, ...(b.initrd === undefined ? {} : { initrd: b.initrd }), ...(b.append === undefined ? {} : { append: b.append }) } }
          : { boot: { disk: b.disk, ...(b.format === undefined ? {} : { format: b.format }) } }
    const boot = chosen.boot
    const readyLine = settings.readyLine ?? chosen.readyLine
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
      ...(readyLine === undefined ? {} : { readyLine }),
    })
  })

/**
 * The default of `ENGRAM_QEMU_STATE_DIR`: beside the agent's state file, or under the temp
 * directory; one per host either way (a runtime adopts every VM of its directory).
 */
export const defaultQemuStateDir = (hostId: string, stateFile: string | undefined, tmp: string): string =>
  join(stateFile === undefined ? tmp : dirname(stateFile), `engram-qemu-${encodeURIComponent(hostId)}`)
