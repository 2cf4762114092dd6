/**
 * Which accelerator guests get: KVM when `/dev/kvm` really works, TCG otherwise. Decided once
 * per runtime by a probe in two steps:
 *
 * 1. a QEMU with `-accel kvm -cpu host` must start, run its firmware, say `query-kvm` enabled and
 *    quit cleanly (nested KVM can expose a `/dev/kvm` on which `-cpu host` asserts);
 * 2. when guests boot a kernel, that kernel must get as far as its banner (`Linux version`) on
 *    the serial console under KVM. Some nested hypervisors (seen: a `kvm-pvm` host module) pass
 *    step 1 but stop a Linux kernel in its decompressor ("Invalid physical address chosen!"), so
 *    every guest would hang at boot. The banner comes within a second on a working KVM; no banner
 *    within the bound (15 s) is TCG. A lasting verdict of step 2 (the banner, or none while QEMU
 *    ran on) is kept for the host's boot, in a directory of the user's own (mode 0700) in the
 *    temporary directory, keyed by the kernel, the QEMU binary and the host's boot id, so the
 *    agents of one machine pay for it once; a TCG verdict never replaces a kept KVM one. (A kernel that prints nothing on `ttyS0`, say one with only a
 *    virtio console, reads as a KVM that cannot run it: set the accelerator explicitly there.)
 *
 * Either step failing falls back to TCG and says why.
 */
import { spawn } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import { accessSync, chmodSync, closeSync, constants, fstatSync, linkSync, lstatSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs"
import { access } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"

/** The accelerator and why. */
export interface Accel {
  readonly accelerator: "kvm" | "tcg"
  readonly detail: string
}

const probeScript = ['{"execute":"qmp_capabilities"}', '{"execute":"query-kvm"}', '{"execute":"quit"}', ""].join("\n")

/** The kernel banner's bound: a working KVM prints it well within a second. */
export const kernelProbeTimeoutMs = 15_000

/**
 * Runs the KVM probe with `binary` (step 2 with `kernel`, when guests boot one); never fails (a
 * failed probe answers TCG with the reason).
 */
export const probe = (binary: string, timeoutMs = 20_000, kernel?: string, kernelTimeoutMs = kernelProbeTimeoutMs): Effect.Effect<Accel> =>
  Effect.flatMap(firmwareProbe(binary, timeoutMs), (firmware) =>
    firmware.accelerator === "tcg" || kernel === undefined ? Effect.succeed(firmware) : kernelProbe(binary, kernel, kernelTimeoutMs),
  )

const firmwareProbe = (binary: string, timeoutMs: number): Effect.Effect<Accel> =>
  Effect.gen(function* () {
    const usable = yield* Effect.tryPromise(() => access("/dev/kvm", constants.R_OK | constants.W_OK)).pipe(Effect.result)
    if (usable._tag === "Failure") return { accelerator: "tcg", detail: "TCG: /dev/kvm is absent or not read-writable" } as Accel
    const run = yield* Effect.callback<{ code: number | null; signal: string | null; out: string; err: string }>((resume) => {
      const child = spawn(binary, ["-machine", "q35", "-accel", "kvm", "-cpu", "host", "-m", "64", "-nodefaults", "-no-user-config", "-display", "none", "-qmp", "stdio"], {
        stdio: ["pipe", "pipe", "pipe"],
      })
      let out = ""
      let err = ""
      child.stdout.on("data", (d: Buffer) => (out += d.toString()))
      child.stderr.on("data", (d: Buffer) => (err += d.toString()))
      child.on("error", (e) => resume(Effect.succeed({ code: null, signal: null, out, err: e.message })))
      child.on("close", (code, signal) => resume(Effect.succeed({ code, signal, out, err })))
      child.stdin.on("error", () => undefined)
      child.stdin.end(probeScript)
      return Effect.sync(() => void child.kill("SIGKILL"))
    }).pipe(Effect.timeoutOption(timeoutMs))
    if (run._tag === "None") return { accelerator: "tcg", detail: `TCG: the KVM probe did not finish in ${timeoutMs} ms` } as Accel
    const r = run.value
    const enabled = /"return":\s*\{[^}]*"enabled":\s*true/.test(r.out)
    if (r.code === 0 && enabled) return { accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host" } as Accel
    const why = r.signal !== null ? `QEMU died of ${r.signal}` : `QEMU exited ${r.code}`
    const tail = r.err.trim().split("\n").at(-1) ?? ""
    return { accelerator: "tcg", detail: `TCG: the KVM probe failed (${why}${tail === "" ? "" : `: ${tail}`})` } as Accel
  })

/** `binary` as run: a path as given, else the first executable of that name on `PATH`. */
const resolveBinary = (binary: string): string | null => {
  if (binary.includes("/")) return binary
  for (const dir of (process.env["PATH"] ?? "").split(":")) {
    if (dir === "") continue
    try {
      const candidate = join(dir, binary)
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  return null
}

/**
 * The directory step 2's verdicts are kept in: the user's own (`engram-kvm-probe-<uid>` in the
 * temporary directory, mode 0700), trusted only while it is a real directory of this user that
 * nobody else can write. Null when it is not (another user made it first, a symlink): then
 * nothing is kept, and each runtime probes.
 */
const verdictDir = (): string | null => {
  const uid = typeof process.getuid === "function" ? process.getuid() : -1
  if (uid < 0) return null
  const dir = join(tmpdir(), `engram-kvm-probe-${uid}`)
  try {
    mkdirSync(dir, { mode: 0o700 })
  } catch {
    // there already (checked below)
  }
  try {
    const st = lstatSync(dir)
    if (!st.isDirectory() || st.isSymbolicLink() || st.uid !== uid) return null
    // Ours but open to others (made by hand, a umask): closed again before it is trusted.
    if ((st.mode & 0o077) !== 0) chmodSync(dir, 0o700)
    return (lstatSync(dir).mode & 0o077) === 0 ? dir : null
  } catch {
    return null
  }
}

/**
 * Where step 2's verdict for this kernel, QEMU binary and host boot is kept (the binary and the
 * kernel by path, size and modification time: an upgrade of either probes again); null when it
 * cannot be keyed or kept safely.
 */
const verdictFile = (binary: string, kernel: string): string | null => {
  try {
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    const k = statSync(kernel)
    const path = resolveBinary(binary)
    if (path === null) return null
    const b = statSync(path)
    const dir = verdictDir()
    if (dir === null) return null
    const key = createHash("sha256").update(JSON.stringify([path, b.size, b.mtimeMs, kernel, k.size, k.mtimeMs, bootId])).digest("hex").slice(0, 24)
    return join(dir, `${key}.json`)
  } catch {
    return null
  }
}

/** A kept verdict: read without following a link, only from a regular file of this user. */
const readVerdict = (file: string): Accel | null => {
  let fd: number | undefined
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW)
    const st = fstatSync(fd)
    if (!st.isFile() || (typeof process.getuid === "function" && st.uid !== process.getuid())) return null
    const kept = JSON.parse(readFileSync(fd, "utf8")) as Accel
    if ((kept.accelerator !== "kvm" && kept.accelerator !== "tcg") || typeof kept.detail !== "string") return null
    return { accelerator: kept.accelerator, detail: `${kept.detail} (kept from this boot's first probe: ${file})` }
  } catch {
    return null
  } finally {
    if (fd !== undefined) closeSync(fd)
  }
}

/**
 * Step 2 with its kept verdict: the one this boot's first lasting probe of the same kernel and
 * binary kept, else a probe (kept when it lasts). `accel` is for tests (under TCG).
 */
export const kernelProbe = (binary: string, kernel: string, timeoutMs: number, accel?: readonly string[]): Effect.Effect<Accel> =>
  Effect.suspend(() => {
    const file = verdictFile(binary, kernel)
    const kept = file === null ? null : readVerdict(file)
    if (kept !== null) return Effect.succeed(kept)
    return Effect.map(bootProbe(binary, kernel, timeoutMs, accel), ({ accel, lasting }) => {
      // Only a lasting verdict is kept: the banner (KVM), or no banner while QEMU kept running (a
      // KVM that stops the kernel). A QEMU that failed to start or died (no memory, a busy
      // /dev/kvm) may do better next time: the next runtime probes again. A KVM verdict replaces
      // any kept one; a TCG one never replaces a kept verdict (first writer wins).
      if (file !== null && lasting) {
        const tmp = `${file}.${randomBytes(8).toString("hex")}`
        try {
          writeFileSync(tmp, JSON.stringify(accel), { flag: "wx", mode: 0o600 })
          if (accel.accelerator === "kvm") renameSync(tmp, file)
          else linkSync(tmp, file)
        } catch {
          // a verdict not kept is probed again by the next runtime
        } finally {
          rmSync(tmp, { force: true })
        }
      }
      return accel
    })
  })

/**
 * Boots `kernel` under KVM (no initramfs: only its banner matters) and waits for the banner.
 * `accel` is for tests, which check the banner logic under TCG.
 */
export const bootsUnderKvm = (binary: string, kernel: string, timeoutMs: number, accel: readonly string[] = ["-accel", "kvm", "-cpu", "host"]): Effect.Effect<Accel> =>
  Effect.map(bootProbe(binary, kernel, timeoutMs, accel), (r) => r.accel)

/** A process's CPU time so far (user + system, ms; `/proc/<pid>/stat`), 0 when unknown. */
const cpuTimeMs = (pid: number | undefined): number => {
  if (pid === undefined) return 0
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the command): clock ticks, 100 a second on Linux.
    return Math.round(((Number(fields[11]) + Number(fields[12])) * 1000) / 100)
  } catch {
    return 0
  }
}

/** {@link bootsUnderKvm}, and whether its verdict lasts (the banner, or none while QEMU ran on). */
const bootProbe = (
  binary: string,
  kernel: string,
  timeoutMs: number,
  accel: readonly string[] = ["-accel", "kvm", "-cpu", "host"],
): Effect.Effect<{ readonly accel: Accel; readonly lasting: boolean }> =>
  Effect.callback<{ readonly accel: Accel; readonly lasting: boolean }>((resume) => {
    const args = ["-machine", "q35", ...accel, "-m", "128", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]
    // earlyprintk: the decompressor prints too, so a kernel stopped there shows it was running.
    const child = spawn(binary, [...args, "-kernel", kernel, "-append", "console=ttyS0 earlyprintk=serial,ttyS0 loglevel=8 panic=-1", "-serial", "stdio"], {
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    let err = ""
    let done = false
    const finish = (accel: Accel, lasting: boolean) => {
      if (done) return
      done = true
      clearTimeout(timer)
      child.kill("SIGKILL")
      resume(Effect.succeed({ accel, lasting }))
    }
    // No banner within the bound while QEMU ran on is lasting: a working KVM prints it within a
    // second, and a kernel stopped by a broken one prints nothing at all (seen: no output, QEMU
    // idle). A host too starved to print it in the bound would be kept on TCG for this boot, and
    // its `info` says how much CPU the probe got; a TCG verdict never replaces a kept KVM one.
    const timer = setTimeout(() => {
      const cpuMs = cpuTimeMs(child.pid)
      const last = out.trim().split("\n").at(-1)?.slice(0, 120) ?? ""
      finish(
        {
          accelerator: "tcg",
          detail: `TCG: /dev/kvm passed QEMU's own check, but the guest kernel printed no banner within ${timeoutMs} ms under KVM (a nested KVM that cannot run it; the probe's QEMU used ${cpuMs} ms of CPU${last === "" ? ", printed nothing" : `; its last output: ${JSON.stringify(last)}`})`,
        },
        true,
      )
    }, timeoutMs)
    child.stdout.on("data", (d: Buffer) => {
      out = (out + d.toString()).slice(-4096)
      if (out.includes("Linux version")) finish({ accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host and boots the guest kernel" }, true)
    })
    child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-4096)))
    child.on("error", (e) => finish({ accelerator: "tcg", detail: `TCG: the KVM boot probe failed (${e.message})` }, false))
    child.on("close", (code, signal) => {
      const tail = err.trim().split("\n").at(-1) ?? ""
      finish({ accelerator: "tcg", detail: `TCG: the guest kernel stopped under KVM before its banner (QEMU ${signal ?? `exited ${code}`}${tail === "" ? "" : `: ${tail}`})` }, false)
    })
    return Effect.sync(() => {
      done = true
      clearTimeout(timer)
      child.kill("SIGKILL")
    })
  })

/** A QEMU version. */
export interface QemuVersion {
  readonly major: number
  readonly minor: number
  readonly micro: number
}

/** Parses `qemu-system-x86_64 --version`'s first line. */
export const parseVersion = (text: string): QemuVersion | null => {
  const m = /QEMU emulator version (\d+)\.(\d+)(?:\.(\d+))?/.exec(text)
  return m === null ? null : { major: Number(m[1]), minor: Number(m[2]), micro: Number(m[3] ?? 0) }
}

/** How long `version` waits for `binary --version` before it counts the binary as not running. */
export const versionTimeoutMs = 10_000

/**
 * The version of `binary`; null when it does not run, or does not answer within `timeoutMs` (a
 * binary on a hung mount: its process is killed, and the start says so rather than hang).
 */
export const version = (binary: string, timeoutMs = versionTimeoutMs): Effect.Effect<QemuVersion | null> =>
  Effect.callback<QemuVersion | null>((resume) => {
    const child = spawn(binary, ["--version"], { stdio: ["ignore", "pipe", "ignore"] })
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.on("error", () => resume(Effect.succeed(null)))
    child.on("close", () => resume(Effect.succeed(parseVersion(out))))
    return Effect.sync(() => void child.kill("SIGKILL"))
  }).pipe(Effect.timeoutOrElse({ duration: timeoutMs, orElse: () => Effect.succeed(null) }))

/**
 * Whether TCG guests need the dirty-sync workaround: before QEMU 8.1 ("physmem: Fix migration
 * dirty bitmap coherency with TCG memory access"), the fast path of the migration bitmap sync
 * clears dirty bits without re-arming TCG's TLB, so stores after a sync go unlogged and a live
 * migration with more than one pass corrupts the guest. A RAM size that is not a multiple of
 * 64 pages sends the sync down the slow path, which re-arms the TLB.
 */
export const needsTcgSyncWorkaround = (accelerator: "kvm" | "tcg", v: QemuVersion | null): boolean =>
  accelerator === "tcg" && (v === null || v.major < 8 || (v.major === 8 && v.minor < 1))
