/**
 * Which accelerator guests get: KVM when `/dev/kvm` really works, TCG otherwise. Decided once
 * per runtime by a probe: a QEMU with `-accel kvm -cpu host` must start, run its firmware, say
 * `query-kvm` enabled and quit cleanly. (Nested KVM can expose a `/dev/kvm` on which `-cpu host`
 * asserts; the probe catches that and falls back to TCG, saying why.)
 */
import { spawn } from "node:child_process"
import { constants } from "node:fs"
import { access } from "node:fs/promises"
import { Effect } from "effect"

/** The accelerator and why. */
export interface Accel {
  readonly accelerator: "kvm" | "tcg"
  readonly detail: string
}

const probeScript = ['{"execute":"qmp_capabilities"}', '{"execute":"query-kvm"}', '{"execute":"quit"}', ""].join("\n")

/** Runs the KVM probe with `binary`; never fails (a failed probe answers TCG with the reason). */
export const probe = (binary: string, timeoutMs = 20_000): Effect.Effect<Accel> =>
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
