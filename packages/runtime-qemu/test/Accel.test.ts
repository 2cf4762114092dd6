// The KVM probe's second step (the guest kernel must print its banner under KVM), checked under
// TCG so that it runs on any machine with QEMU: a kernel that boots prints its banner, and that
// verdict is kept for the host's boot; a file that is no kernel never prints one, and the verdict
// (TCG, with QEMU's reason) is not kept. Booting to the banner under TCG takes seconds on a quiet
// machine and a minute or more on a loaded one: the bounds are wide, and only one boot is made.
import { copyFileSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { ensureGuest } from "@engram/guest"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Accel } from "../src/index.js"
import { runQemuTests } from "./support/Qemu.js"

const tcg = ["-accel", "tcg"]
const bootBoundMs = 600_000

describe.skipIf(!runQemuTests)("the KVM probe's boot step (needs qemu-system-x86_64: CI installs it)", () => {
  it("answers KVM once the guest kernel printed its banner, and keeps that verdict for the same kernel in a directory only this user can write", async () => {
    const guest = await ensureGuest()
    const dir = mkdtempSync(join(tmpdir(), "eq-verdict-"))
    try {
      // A copy of the kernel: its own key, so no verdict of another run is found.
      const kernel = join(dir, "vmlinuz")
      copyFileSync(guest.kernel, kernel)
      const first = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", kernel, bootBoundMs, tcg))
      expect(first).toEqual({ accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host and boots the guest kernel" })
      const again = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", kernel, bootBoundMs, tcg))
      expect(again.accelerator).toBe("kvm")
      const kept = /kept from this boot's first probe: (.+\.json)\)$/.exec(again.detail)
      expect(kept, again.detail).not.toBeNull()
      const file = kept![1]!
      expect(statSync(dirname(file)).mode & 0o777).toBe(0o700)
      expect(statSync(file).mode & 0o777).toBe(0o600)
      rmSync(file)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 1_800_000)

  it("answers TCG, with QEMU's reason, for a kernel QEMU cannot load, and keeps no verdict of it (a failed start is probed again)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "eq-probe-"))
    try {
      const notKernel = join(dir, "not-a-kernel")
      writeFileSync(notKernel, "no kernel here\n")
      const refused = await Effect.runPromise(Accel.bootsUnderKvm("qemu-system-x86_64", notKernel, bootBoundMs, tcg))
      expect(refused.accelerator).toBe("tcg")
      expect(refused.detail).toMatch(/stopped under KVM before its banner \(QEMU exited 1/)
      const failed = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", notKernel, bootBoundMs, tcg))
      expect(failed.accelerator).toBe("tcg")
      const failedAgain = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", notKernel, bootBoundMs, tcg))
      expect(failedAgain.detail).not.toMatch(/kept from/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 300_000)
})
