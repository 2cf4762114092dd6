/**
 * One QEMU process per VM: its command line, its directory (`<stateDir>/<vmId>/`: `vm.json`,
 * `console.log`, `qemu.pid`, `qemu.stderr`, and `ram`, the guest's RAM file when its RAM is a
 * file), its QMP socket (`<stateDir>/q-<hash>.sock`: short,
 * unix socket paths hold at most 107 bytes), spawning it detached so it outlives the agent, and
 * reading its life and RSS from `/proc`.
 */
import { spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { readFileSync } from "node:fs"
import { mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Option, Schedule } from "effect"
import { nowMs, pathSegment, RuntimeError, type VmSpec } from "@engram/runtime"
import type * as RamFile from "./RamFile.js"

/** How the guest boots: a kernel (+ initramfs and command line) or a disk image. */
export type Boot =
  | { readonly kernel: string; readonly initrd?: string; readonly append?: string }
  | {
      /** A disk image. It is not copied by a move or a descent: keep it on storage both hosts see, or read-only. */
      readonly disk: string
      readonly format?: string
    }

/** The machine a VM runs on: what a restore or an incoming VM must reproduce exactly. */
export interface Machine {
  readonly boot: Boot
  /** QEMU machine type. Default `q35`. */
  readonly machineType: string
  readonly accelerator: "kvm" | "tcg"
  /** Extra guest RAM in KiB (8): the TCG dirty-sync workaround of QEMU before 8.1 (see Accel.ts). */
  readonly ramPadKib?: number
}

/** What `vm.json` records, so a new agent (or a restore) knows the VM. */
export interface VmRecord {
  readonly engram: "qemu-vm/v1"
  readonly spec: VmSpec
  readonly machine: Machine
  readonly socket: string
  /** Set while the VM waits for (or holds, uncommitted) an incoming move. */
  readonly incomingMoveId: string | null
  /** Where its RAM lives (absent in records of runtimes before RAM files: anonymous). */
  readonly ram?: RamFile.RamBacking
  /**
   * A mapped restore's image RAM file, of which the VM's RAM file is a second link until the
   * restore commits (the image's link removed just before the guest runs). While the two are
   * one file the restore has not committed: its image is whole, and recovery ends the VM.
   */
  readonly ramOrigin?: string
}

/** The files of one VM. */
export interface VmPaths {
  readonly dir: string
  readonly record: string
  readonly console: string
  readonly pidFile: string
  readonly stderr: string
  readonly socket: string
  /** The guest's RAM file, when its RAM is a file in the VM's directory. */
  readonly ram: string
}

/** The longest unix socket path Linux takes (`sun_path` is 108 bytes with the NUL). */
export const maxSocketPath = 107

/** The files of `vmId` under `stateDir`. */
export const pathsOf = (stateDir: string, vmId: string): VmPaths => {
  const dir = join(stateDir, pathSegment(vmId))
  const hash = createHash("sha256").update(vmId).digest("hex").slice(0, 16)
  return {
    dir,
    record: join(dir, "vm.json"),
    console: join(dir, "console.log"),
    pidFile: join(dir, "qemu.pid"),
    stderr: join(dir, "qemu.stderr"),
    ram: join(dir, "ram"),
    socket: join(stateDir, `q-${hash}.sock`),
  }
}

/** QEMU's option syntax doubles a comma inside a value. */
const optValue = (s: string) => s.replaceAll(",", ",,")

/** The memory backend's id on the command line (and in the migration stream: a restore must use the same). */
export const ramBackendId = "ram0"

/** The `-object` arguments of a RAM file of `size` (QEMU's `-m` syntax); none for anonymous RAM. */
export const ramObjectArgs = (ram: RamFile.RamBacking, size: string): string[] =>
  ram.kind === "anonymous" ? [] : ["-object", `memory-backend-file,id=${ramBackendId},size=${size},mem-path=${optValue(ram.path)},share=${ram.shared ? "on" : "off"}`]

/** QEMU's `-m` size of a VM: its MiB, plus the TCG workaround's pad. */
export const memSize = (spec: VmSpec, machine: Machine): string =>
  machine.ramPadKib === undefined || machine.ramPadKib === 0 ? `${spec.memMib}M` : `${spec.memMib * 1024 + machine.ramPadKib}k`

/** The command line of a VM (without the binary). `incoming`: started paused, waiting for `migrate-incoming`. */
export const argv = (
  spec: VmSpec,
  machine: Machine,
  paths: VmPaths,
  options: { readonly incoming: boolean; readonly tcgTbSizeMib: number; readonly extra: readonly string[]; readonly ram?: RamFile.RamBacking },
): string[] => {
  const ram = options.ram ?? { kind: "anonymous" }
  const size = memSize(spec, machine)
  const boot =
    "kernel" in machine.boot
      ? [
          "-kernel",
          machine.boot.kernel,
          ...(machine.boot.initrd === undefined ? [] : ["-initrd", machine.boot.initrd]),
          ...(machine.boot.append === undefined ? [] : ["-append", machine.boot.append]),
        ]
      : ["-drive", `file=${optValue(machine.boot.disk)},if=virtio,format=${machine.boot.format ?? "raw"}`]
  return [
    "-name",
    `engram-${spec.vmId}`,
    "-machine",
    ram.kind === "anonymous" ? machine.machineType : `${machine.machineType},memory-backend=${ramBackendId}`,
    ...(machine.accelerator === "kvm" ? ["-accel", "kvm", "-cpu", "host"] : ["-accel", `tcg,tb-size=${options.tcgTbSizeMib}`]),
    "-m",
    size,
    ...ramObjectArgs(ram, size),
    "-smp",
    String(spec.vcpus),
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    ...boot,
    "-chardev",
    `file,id=con0,path=${optValue(paths.console)},append=on`,
    "-serial",
    "chardev:con0",
    "-qmp",
    `unix:${optValue(paths.socket)},server=on,wait=off`,
    "-pidfile",
    paths.pidFile,
    ...(options.incoming ? ["-S", "-incoming", "defer"] : []),
    ...options.extra,
  ]
}

const fail = (op: string, vmId: string, message: string) => new RuntimeError({ op, vmId, message })

/** Writes `vm.json` atomically. */
export const writeRecord = (paths: VmPaths, record: VmRecord) =>
  Effect.tryPromise({
    try: async () => {
      await writeFile(`${paths.record}.tmp`, JSON.stringify(record, null, 2))
      await rename(`${paths.record}.tmp`, paths.record)
    },
    catch: (e) => fail("record", record.spec.vmId, `vm.json write failed: ${String(e)}`),
  })

/** Reads `vm.json`; undefined when absent or not a record. */
export const readRecord = (path: string): Effect.Effect<VmRecord | undefined> =>
  Effect.tryPromise(() => readFile(path, "utf8")).pipe(
    Effect.map((text) => {
      try {
        const r = JSON.parse(text) as Partial<VmRecord>
        return r.engram === "qemu-vm/v1" && r.spec !== undefined && r.machine !== undefined && typeof r.socket === "string" ? (r as VmRecord) : undefined
      } catch {
        return undefined
      }
    }),
    Effect.orElseSucceed(() => undefined),
  )

/** How a process ended: its exit code, or the signal that ended it. */
export interface ProcessEnd {
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

/** A QEMU this agent spawned: its pid, and its end (known of children only: an adopted QEMU's is not). */
export interface Spawned {
  readonly pid: number
  /** Completes once the process exited (and was reaped). */
  readonly exited: Effect.Effect<ProcessEnd>
}

/** Says how a process ended, for a log line. */
export const describeEnd = (end: ProcessEnd | null): string =>
  end === null ? "its exit status unknown" : end.signal !== null ? `killed by ${end.signal}` : `exited with code ${end.code ?? "unknown"}`

/** Spawns QEMU detached (its own session: it outlives the agent); answers its pid and its end. */
export const spawnQemu = (binary: string, args: readonly string[], paths: VmPaths, vmId: string): Effect.Effect<Spawned, RuntimeError> =>
  Effect.gen(function* () {
    if (paths.socket.length > maxSocketPath) {
      return yield* fail("start", vmId, `QMP socket path ${paths.socket} is longer than ${maxSocketPath} bytes: use a shorter state directory`)
    }
    // Its stderr opened asynchronously (the VM's disk may stall: the agent's event loop runs on).
    const err = yield* Effect.tryPromise({
      try: async () => {
        await mkdir(paths.dir, { recursive: true })
        await rm(paths.socket, { force: true })
        await rm(paths.pidFile, { force: true })
        return await open(paths.stderr, "a")
      },
      catch: (e) => fail("start", vmId, `cannot prepare ${paths.dir}: ${String(e)}`),
    })
    return yield* Effect.try({
      try: () => {
        const child = spawn(binary, args, { detached: true, stdio: ["ignore", "ignore", err.fd] })
        child.on("error", () => undefined)
        const exited = new Promise<ProcessEnd>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })))
        child.unref()
        if (child.pid === undefined) throw new Error(`${binary} did not start`)
        return { pid: child.pid, exited: Effect.promise(() => exited) } satisfies Spawned
      },
      catch: (e) => fail("start", vmId, `spawning ${binary}: ${e instanceof Error ? e.message : String(e)}`),
    }).pipe(Effect.ensuring(Effect.promise(() => err.close().catch(() => undefined))))
  })

/**
 * How long one read of a file this runtime polls (a VM's console, pid file or stderr, a QEMU's
 * `/proc/<pid>/cmdline`) may take before its caller gives up on it (on Effect's Clock). Such a
 * read can stall: the VM's files are on the disk that holds its RAM file (a stalled disk), and
 * `cmdline` waits for the process's memory map lock (a QEMU stuck in the kernel, `D` state). The
 * reads are asynchronous (the agent's event loop, its heartbeats, runs on meanwhile), and bounded.
 * 30 s: a read of a small file or of `/proc` that has not answered by then is stalled, not slow
 * (a busy machine's file-I/O threads answer in milliseconds; 2 s was tried, and a test on a
 * TestClock that runs up to 5 times faster than real time took a read slowed by a loaded CI
 * machine for a stalled one), and a caller waits that long only when a read really stalls.
 */
export const readBoundMs = 30_000

/** Reads a whole text file (asynchronously). */
export type ReadText = (path: string) => Promise<string>

const inFlight = new Map<string, Promise<string>>()

/**
 * Reads a whole text file, one read of a path at a time: a caller while a read of the path is
 * under way (one that stalled, given up on by an earlier caller) joins it rather than adding
 * another, so stalled reads do not pile up on the few threads of Node's file I/O pool.
 */
export const readShared: ReadText = (path) => {
  const running = inFlight.get(path)
  if (running !== undefined) return running
  const read = readFile(path, "utf8").finally(() => inFlight.delete(path))
  inFlight.set(path, read)
  return read
}

/**
 * `path`'s text read by `read` within `boundMs` (on Effect's Clock): None when unreadable (absent,
 * no right), failing with `"stalled"` when the read did not answer in time (it is left to end).
 */
export const readWithin = (path: string, boundMs: number, read: ReadText = readShared): Effect.Effect<Option.Option<string>, "stalled"> =>
  Effect.promise(() => read(path).then(Option.some, () => Option.none<string>())).pipe(
    Effect.timeoutOrElse({ duration: boundMs, orElse: () => Effect.fail("stalled" as const) }),
  )

/** The text of `/proc/<pid>/stat`, read synchronously: the kernel makes it from the task's own fields, without the memory map lock a stuck process may hold, and from no disk. */
const statOf = (pid: number): string | undefined => {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8")
  } catch {
    return undefined
  }
}

/** Whether a `/proc/<pid>/stat` text is of a live (not zombie) process: its state follows the parenthesised command name. */
const liveStat = (stat: string): boolean => {
  const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3)
  return state !== "Z" && state !== "X"
}

/** Whether `pid` is a live (not zombie) process. */
export const alive = (pid: number): boolean => {
  const stat = statOf(pid)
  return stat !== undefined && liveStat(stat)
}

/** The last part of a path. */
const base = (path: string) => path.split("/").at(-1) ?? path

/**
 * Whether `pid` is alive and is the QEMU of the VM whose pid file is `pidFile`: it runs
 * `binary`'s program with a `-pidfile` in the same VM directory (the path's last two parts: the
 * state directory may be named otherwise by a restarted agent, relative or through a link). A
 * reused pid is not our VM, and neither is another VM's QEMU that got it (after a reboot, or a
 * restarted agent's container, pids are handed out again in much the same order).
 *
 * Its command line is read asynchronously within `boundMs` (`readBoundMs`): a QEMU stuck in the
 * kernel holding its memory map lock stalls that read. A live process whose command line did not
 * answer in time is judged by its name in `/proc/<pid>/stat` (the binary's, cut to 15
 * characters, as the kernel keeps it): a stuck QEMU still counts as one (its guest is not given up
 * for lost), a pid reused by another program does not.
 */
export const aliveAs = (pid: number, binary: string, pidFile: string, options: { readonly boundMs?: number; readonly read?: ReadText } = {}): Effect.Effect<boolean> =>
  Effect.suspend(() => {
    const stat = statOf(pid)
    if (stat === undefined || !liveStat(stat)) return Effect.succeed(false)
    return readWithin(`/proc/${pid}/cmdline`, options.boundMs ?? readBoundMs, options.read).pipe(
      Effect.map(
        Option.match({
          onNone: () => false,
          onSome: (cmdline) => {
            const argv = cmdline.split("\0")
            if (!(argv[0] ?? "").endsWith(base(binary))) return false
            const at = argv.indexOf("-pidfile")
            const tail = (path: string) => path.split("/").slice(-2).join("/")
            return at >= 0 && tail(argv[at + 1] ?? "") === tail(pidFile)
          },
        }),
      ),
      Effect.catch(() => {
        const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
        const ours = name === base(binary).slice(0, 15)
        return Effect.as(
          Effect.logWarning("a process's command line did not answer in time (stuck in the kernel?); judged by its name alone", { pid, name, ours, boundMs: options.boundMs ?? readBoundMs }),
          ours,
        )
      }),
    )
  })

/**
 * The pid QEMU wrote to its pidfile (undefined: no pid file, or none in it), read within
 * `readBoundMs`. Fails with `"stalled"` when the read did not answer in time (the VM's disk): no
 * pid is not known then.
 */
export const readPid = (paths: VmPaths): Effect.Effect<number | undefined, "stalled"> =>
  readWithin(paths.pidFile, readBoundMs).pipe(
    Effect.map(
      Option.match({
        onNone: () => undefined,
        onSome: (text) => {
          const n = Number(text.trim())
          return Number.isInteger(n) && n > 0 ? n : undefined
        },
      }),
    ),
  )

/** `readPid`, failing as `op` of `vmId` when the read stalled. */
export const readPidOrFail = (paths: VmPaths, op: string, vmId: string): Effect.Effect<number | undefined, RuntimeError> =>
  readPid(paths).pipe(Effect.mapError(() => fail(op, vmId, `reading ${paths.pidFile} did not answer within ${readBoundMs} ms (a stalled disk?)`)))

/** Pauses between reads of a pid file that stalled (`readPidPatiently`): 1 s, doubling, at most 30 s. */
const pidRetryPauses = Schedule.min([Schedule.exponential("1 second"), Schedule.spaced("30 seconds")])
/** How often a pid file read that stays stalled is warned of again (the first stall is warned of at once). */
export const pidStallWarnEveryMs = 60_000

/**
 * `readPid`, waiting for a read that stalled for as long as it takes (read again after pauses
 * growing to 30 s; warned of at the first stall, then at most once a minute): for a destroy and a
 * recovery, which cannot fail, and cannot go on without the pid. Told "no pid" wrongly, a destroy
 * would remove the files of a QEMU that runs on (its RAM file the guest's RAM) and say it ended; a
 * recovery would take a live guest for dead and remove its files.
 */
export const readPidPatiently = (paths: VmPaths): Effect.Effect<number | undefined> =>
  Effect.gen(function* () {
    const t0 = yield* nowMs
    let warnedAtMs: number | null = null
    const pid = yield* readPid(paths).pipe(
      Effect.tapError(() =>
        Effect.gen(function* () {
          const now = yield* nowMs
          if (warnedAtMs !== null && now - warnedAtMs < pidStallWarnEveryMs) return
          warnedAtMs = now
          yield* Effect.logWarning(`reading a QEMU's pid file did not answer within ${readBoundMs} ms (a stalled disk?); read again until it answers (said again at most once a minute)`, {
            pidFile: paths.pidFile,
            waitedMs: now - t0,
          })
        }),
      ),
      Effect.retry(pidRetryPauses),
      // The schedule never ends: a read that stalls is read again, never given up.
      Effect.orDie,
    )
    if (warnedAtMs !== null) yield* Effect.logInfo("a QEMU's pid file that stalled answered", { pidFile: paths.pidFile, waitedMs: (yield* nowMs) - t0 })
    return pid
  })

/**
 * Whether the process `pid` maps the file now at `path` (`/proc/<pid>/maps` names a mapped file
 * by its path today: a file renamed since it was mapped shows its new name). False when
 * unreadable (no such process). Fails with `"stalled"` when the read did not answer within
 * `boundMs` (`readBoundMs`): it waits for the process's memory map lock, which a QEMU stuck in the
 * kernel holds, and whether the file is mapped is then unknown, not "no".
 */
export const mapsFile = (pid: number, path: string, options: { readonly boundMs?: number; readonly read?: ReadText } = {}): Effect.Effect<boolean, "stalled"> =>
  readWithin(`/proc/${pid}/maps`, options.boundMs ?? readBoundMs, options.read).pipe(
    Effect.map(Option.match({ onNone: () => false, onSome: (maps) => maps.split("\n").some((line) => line.endsWith(` ${path}`)) })),
  )

/** `VmRSS` of `pid` from `/proc/<pid>/status`, in bytes; null when unreadable. */
export const rssBytes = (pid: number): number | null => {
  try {
    return parseRss(readFileSync(`/proc/${pid}/status`, "utf8"))
  } catch {
    return null
  }
}

/** The CPU time (user + system, ms) the process has used, from `/proc/<pid>/stat`; null when unreadable. */
export const cpuMs = (pid: number): number | null => {
  try {
    return parseCpuMs(readFileSync(`/proc/${pid}/stat`, "utf8"))
  } catch {
    return null
  }
}

// Linux reports utime and stime in clock ticks, USER_HZ, which is 100 on every Linux ABI.
const msPerTick = 10

/** Parses utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` text, in ms. The name (field 2) may hold spaces: fields count from its closing parenthesis. */
export const parseCpuMs = (stat: string): number | null => {
  const after = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  // `after[0]` is field 3 (state): utime is field 14, stime field 15.
  const utime = Number(after[11])
  const stime = Number(after[12])
  return Number.isFinite(utime) && Number.isFinite(stime) ? (utime + stime) * msPerTick : null
}

/** Parses the `VmRSS` of a `/proc/<pid>/status` text, in bytes. */
export const parseRss = (status: string): number | null => statusKib(status, "VmRSS")

const statusKib = (status: string, field: string): number | null => {
  const m = new RegExp(`^${field}:\\s+(\\d+)\\s*kB`, "m").exec(status)
  return m?.[1] === undefined ? null : Number(m[1]) * 1024
}

/**
 * The RAM of `pid` the host cannot count as available (`RssAnon` + `RssShmem`), in bytes: a
 * RAM file on disk is page cache, already in MemAvailable. Null when unreadable.
 */
export const unreclaimableBytes = (pid: number): number | null => {
  try {
    return parseUnreclaimable(readFileSync(`/proc/${pid}/status`, "utf8"))
  } catch {
    return null
  }
}

/** Parses `RssAnon` + `RssShmem` of a `/proc/<pid>/status` text, in bytes. */
export const parseUnreclaimable = (status: string): number | null => {
  const anon = statusKib(status, "RssAnon")
  const shmem = statusKib(status, "RssShmem")
  return anon === null || shmem === null ? null : anon + shmem
}

/** Waits (polling on Effect's Clock) until `pid` is gone; false when it outlived `timeoutMs`. */
export const awaitExit = (pid: number, timeoutMs: number): Effect.Effect<boolean> =>
  Effect.suspend(() => (alive(pid) ? Effect.fail("alive" as const) : Effect.succeed(true))).pipe(
    Effect.retry({ schedule: Schedule.spaced("20 millis"), times: Math.max(1, Math.ceil(timeoutMs / 20)) }),
    Effect.orElseSucceed(() => false),
  )

/** Ends `pid`: SIGTERM, then SIGKILL if it is still there after `graceMs`. */
export const kill = (pid: number, graceMs: number): Effect.Effect<void> =>
  Effect.gen(function* () {
    if (!alive(pid)) return
    try {
      process.kill(pid, "SIGTERM")
    } catch {
      return
    }
    if (yield* awaitExit(pid, graceMs)) return
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      return
    }
    yield* awaitExit(pid, graceMs)
  })

/** The last lines QEMU wrote to stderr (for error messages), read within `readBoundMs`: empty when unreadable or stalled. */
export const stderrTail = (paths: VmPaths): Effect.Effect<string> =>
  readWithin(paths.stderr, readBoundMs).pipe(
    Effect.map(Option.match({ onNone: () => "", onSome: (text) => text.trim().split("\n").slice(-3).join(" | ") })),
    Effect.orElseSucceed(() => ""),
  )
