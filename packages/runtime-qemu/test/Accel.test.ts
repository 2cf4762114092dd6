// The KVM probe's second step (the guest kernel must print its banner under KVM), checked under
// TCG so that it runs on any machine with QEMU: a kernel that boots prints its banner; a file
// that is no kernel never does, and the verdict is TCG with QEMU's reason.
import { copyFileSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { ensureGuest } from "@engram/guest"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Accel } from "../src/index.js"
import { runQemuTests } from "./support/Qemu.js"

const tcg = ["-accel", "tcg"]

describe.skipIf(!runQemuTests)("the KVM probe's boot step (needs qemu-system-x86_64: CI installs it)", () => {
  it("answers KVM only once the guest kernel printed its banner", async () => {
    const guest = await ensureGuest()
    const boots = await Effect.runPromise(Accel.bootsUnderKvm("qemu-system-x86_64", guest.kernel, 120_000, tcg))
    expect(boots).toEqual({ accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host and boots the guest kernel" })
  }, 300_000)

  it("answers TCG, with QEMU's reason, for a kernel that never prints its banner", async () => {
    const notKernel = join(mkdtempSync(join(tmpdir(), "eq-probe-")), "not-a-kernel")
    writeFileSync(notKernel, "no kernel here\n")
    const refused = await Effect.runPromise(Accel.bootsUnderKvm("qemu-system-x86_64", notKernel, 120_000, tcg))
    expect(refused.accelerator).toBe("tcg")
    expect(refused.detail).toMatch(/stopped under KVM before its banner \(QEMU exited 1/)
  }, 300_000)
})

describe.skipIf(!runQemuTests)("the KVM probe's kept verdict", () => {
  it("keeps a lasting verdict for the same kernel (a copy of it: its own key), in a directory only this user can write; not a failed start", async () => {
    const guest = await ensureGuest()
    const dir = mkdtempSync(join(tmpdir(), "eq-verdict-"))
    const kernel = join(dir, "vmlinuz")
    copyFileSync(guest.kernel, kernel)
    const first = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", kernel, 120_000, tcg))
    expect(first).toEqual({ accelerator: "kvm", detail: "KVM: /dev/kvm works with -cpu host and boots the guest kernel" })
    const again = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", kernel, 120_000, tcg))
    expect(again.accelerator).toBe("kvm")
    expect(again.detail).toMatch(/kept from this boot's first probe: (.+\.json)\)$/)
    const file = /kept from this boot's first probe: (.+\.json)\)$/.exec(again.detail)![1]!
    const where = statSync(dirname(file))
    expect(where.mode & 0o777).toBe(0o700)
    expect(statSync(file).mode & 0o777).toBe(0o600)
    rmSync(file)
    // A QEMU that failed (here: no kernel it can load) is not a lasting verdict: probed again each time.
    const notKernel = join(dir, "not-a-kernel")
    writeFileSync(notKernel, "no kernel here\n")
    const failed = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", notKernel, 120_000, tcg))
    expect(failed.accelerator).toBe("tcg")
    const failedAgain = await Effect.runPromise(Accel.kernelProbe("qemu-system-x86_64", notKernel, 120_000, tcg))
    expect(failedAgain.detail).not.toMatch(/kept from/)
    rmSync(dir, { recursive: true, force: true })
  }, 300_000)
})
