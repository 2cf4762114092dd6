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
 *    within the bound is TCG. The verdict of step 2 is kept for the host's boot (a file in the
 *    temporary directory keyed by the kernel, the QEMU binary and the host's boot id), so the
 *    agents of one machine pay for it once.
 *
 * Either step failing falls back to TCG and says why.
 */
import { spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { constants, readFileSync, renameSync, statSync, writeFileSync } from "node:fs"
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
export const kernelProbeTimeoutMs = 10_000

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

/** Where step 2's verdict for this kernel, binary and host boot is kept; null when it cannot be keyed. */
const verdictFile = (binary: string, kernel: string): string | null => {
  try {
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()
    const k = statSync(kernel)
    const key = createHash("sha256").update(JSON.stringify([binary, kernel, k.size, k.mtimeMs, bootId])).digest("hex").slice(0, 24)
    return join(tmpdir(), `engram-kvm-probe-${key}.json`)
  } catch {
    return null
  }
}

const kernelProbe = (binary: string, kernel: string, timeoutMs: number): Effect.Effect<Accel> =>
  Effect.suspend(() => {
    const file = verdictFile(binary, kernel)
    if (file !== null) {
      try {
        const kept = JSON.parse(readFileSync(file, "utf8")) as Accel
        if ((kept.accelerator === "kvm" || kept.accelerator === "tcg") && typeof kept.detail === "string") return Effect.succeed(kept)
      } catch {
        // none kept yet
      }
    }
    return Effect.map(bootsUnderKvm(binary, kernel, timeoutMs), (accel) => {
      if (file !== null) {
        try {
          const tmp = `${file}.${process.pid}`
          writeFileSync(tmp, JSON.stringify(accel))
          renameSync(tmp, file)
        } catch {
          // a verdict not kept is probed again by the next runtime
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
  Effect.callback<Accel>((resume) => {
    const args = ["-machine", "q35", ...accel, "-m", "128", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]
    const child = spawn(binary, [...args, "-kernel", kernel, "-append", "console=ttyS0 loglevel=8 panic=-1", "-serial", "stdio"], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    let done = false
    const finish = (accel: Accel) => {
      if (done) return
      done = true
      clearTimeout(timer)
      child.kill("SIGKILL")
      resume(Effect.succeed(accel))
    }
    const timer = setTimeout(
      () => finish({ accelerator: "tcg", detail: `TCG: /dev/kvm passed QEMU's own check, but the guest kernel printed no banner within ${timeoutMs} ms under KVM (a nested KVM that cannot run it)` }),
      timeoutMs,
    )
    child.stdout.on("data", (d: Buffer) => {
      out = (out + d.toString()).slice(-4096)
      if (out.includes("Linux version")) finish({ accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host and boots the guest kernel" })
    })
    child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-4096)))
    child.on("error", (e) => finish({ accelerator: "tcg", detail: `TCG: the KVM boot probe failed (${e.message})` }))
    child.on("close", (code, signal) => {
      const tail = err.trim().split("\n").at(-1) ?? ""
      finish({ accelerator: "tcg", detail: `TCG: the guest kernel stopped under KVM before its banner (QEMU ${signal ?? `exited ${code}`}${tail === "" ? "" : `: ${tail}`})` })
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

/** The version of `binary`; null when it does not run. */
export const version = (binary: string): Effect.Effect<QemuVersion | null> =>
  Effect.callback<QemuVersion | null>((resume) => {
    const child = spawn(binary, ["--version"], { stdio: ["ignore", "pipe", "ignore"] })
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.on("error", () => resume(Effect.succeed(null)))
    child.on("close", () => resume(Effect.succeed(parseVersion(out))))
    return Effect.sync(() => void child.kill("SIGKILL"))
  })

/**
 * Whether TCG guests need the dirty-sync workaround: before QEMU 8.1 ("physmem: Fix migration
 * dirty bitmap coherency with TCG memory access"), the fast path of the migration bitmap sync
 * clears dirty bits without re-arming TCG's TLB, so stores after a sync go unlogged and a live
 * migration with more than one pass corrupts the guest. A RAM size that is not a multiple of
 * 64 pages sends the sync down the slow path, which re-arms the TLB.
 */
export const needsTcgSyncWorkaround = (accelerator: "kvm" | "tcg", v: QemuVersion | null): boolean =>
  accelerator === "tcg" && (v === null || v.major < 8 || (v.major === 8 && v.minor < 1))
