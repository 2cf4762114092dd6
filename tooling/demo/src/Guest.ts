/**
 * What a demo host boots under `ENGRAM_RUNTIME=qemu` when the user names no guest of their own
 * (`ENGRAM_QEMU_KERNEL` or `ENGRAM_QEMU_DISK`): the repository's test guest (`tooling/guest`:
 * a Debian kernel and a busybox initramfs), built on first use and handed to the agents as an
 * ordinary kernel boot. The agent itself knows nothing of the test guest.
 */
import { agentEnvironment, calmLoad, defaultCacheDir } from "@engram/guest"
import { Fatal } from "@engram/process"
import { Effect } from "effect"

type Env = Readonly<Record<string, string | undefined>>

const set = (env: Env, name: string) => env[name] !== undefined && env[name] !== ""

/** `env` with the test guest's kernel, initramfs and command line, where QEMU runs and no guest was named. */
export const guestEnvironment = (env: Env): Effect.Effect<Env, Fatal> =>
  Effect.gen(function* () {
    if (env["ENGRAM_RUNTIME"] !== "qemu" || set(env, "ENGRAM_QEMU_KERNEL") || set(env, "ENGRAM_QEMU_DISK")) return env
    yield* Effect.logInfo(
      `qemu: no ENGRAM_QEMU_KERNEL or ENGRAM_QEMU_DISK: guests boot the repository's test guest (kernel of linux-image-amd64 + a busybox initramfs), cached in ${env["ENGRAM_GUEST_CACHE"] ?? defaultCacheDir}; the first build downloads the kernel package (about 15 s)`,
    )
    const logLine = Effect.runSyncWith(yield* Effect.context<never>())
    const boot = yield* Effect.tryPromise({
      try: () => agentEnvironment(calmLoad, { log: (line) => logLine(Effect.logInfo(`qemu: ${line}`)) }),
      catch: (e) =>
        new Fatal({
          message: `cannot build the test guest: ${e instanceof Error ? e.message : String(e)}. It needs busybox-static installed and apt's package lists (apt-get update) for linux-image-amd64; or set ENGRAM_QEMU_KERNEL (+ ENGRAM_QEMU_INITRD) or ENGRAM_QEMU_DISK`,
          exitCode: 1,
        }),
    })
    // A command line of the user's (e.g. `engram.dirty_kib_s=4096`) replaces the calm default.
    return { ...env, ...boot, ...(set(env, "ENGRAM_QEMU_APPEND") ? { ENGRAM_QEMU_APPEND: env["ENGRAM_QEMU_APPEND"] } : {}) }
  })
