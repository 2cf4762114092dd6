// QEMU's figures turned into engram's rounds and guard inputs (figures recorded from real runs).
import { describe, expect, it } from "vitest"
import { Accel, QemuMigration, QemuProcess } from "../src/index.js"

const pass = (qemuAtMs: number) => ({ event: "MIGRATION_PASS", data: {}, qemuAtMs, receivedAtMs: qemuAtMs })
const info = (transferred: number, pages: number, remaining = 0, dirtyPagesRate = 0): QemuMigration.MigrationInfo => ({
  status: "active",
  ram: { transferred, remaining, total: 134_217_728, normal: pages, duplicate: 0, "page-size": 4096, "dirty-pages-rate": dirtyPagesRate },
})

describe("the rounds of a QEMU migration", () => {
  it("closes a round at each dirty sync with what was sent since the previous one", () => {
    const t = new QemuMigration.RoundTracker()
    t.start(pass(1000))
    expect(t.close(2200, info(72_000_000, 30_000))).toEqual({ kind: "full", wireBytes: 72_000_000, apparentBytes: 30_000 * 4096, sendMs: 1200, captureMs: 0 })
    expect(t.close(2400, info(73_600_000, 30_400))).toEqual({ kind: "delta", wireBytes: 1_600_000, apparentBytes: 400 * 4096, sendMs: 200, captureMs: 0 })
    expect(t.rounds.map((r) => r.kind)).toEqual(["full", "delta"])
  })

  it("a pass read after QEMU had already sent its round makes an empty delta: nothing is counted twice", () => {
    const t = new QemuMigration.RoundTracker()
    t.start(pass(0))
    t.close(1000, info(50_000_000, 12_000))
    // A burst of passes read after the fact: the first query already saw everything.
    expect(t.close(1003, info(50_400_000, 12_100))).toMatchObject({ kind: "delta", wireBytes: 400_000 })
    expect(t.close(1004, info(50_400_000, 12_100))).toEqual({ kind: "delta", wireBytes: 0, apparentBytes: 0, sendMs: 1, captureMs: 0 })
    expect(t.close(1004, info(50_400_000, 12_100))).toBeNull()
    // A round that has only begun (pages still to send, none sent yet) waits for the next pass.
    expect(t.close(1010, info(50_400_000, 12_100, 8_192))).toBeNull()
    expect(t.close(1020, info(50_410_000, 12_102, 0))).toMatchObject({ kind: "delta", wireBytes: 10_000, sendMs: 16 })
    expect(t.rounds.reduce((n, r) => n + r.wireBytes, 0)).toBe(50_410_000)
    expect(t.lastPassQemuMs).toBe(1020)
  })

  it("estimates the final round: still dirty plus what the guest dirtied between the last sync and the stop", () => {
    const t = new QemuMigration.RoundTracker()
    t.start(pass(0))
    t.close(1000, info(50_000_000, 12_000))
    t.close(1100, info(51_000_000, 12_250)) // 1 024 000 bytes dirtied during the 1000 ms round before
    expect(t.dirtyBytesPerMs(info(0, 0))).toBeCloseTo(1024)
    // 100 KiB still dirty, stopped 10 ms after the last sync.
    expect(QemuMigration.finalApparentBytes(info(51_000_000, 12_250, 102_400), t, 1110)).toBeCloseTo(102_400 + 10_240)
  })

  it("checks at pre-switchover with core's estimate: a fit and an overrun from the same rounds", () => {
    const t = new QemuMigration.RoundTracker()
    t.start(pass(0))
    t.close(1000, info(100_000_000, 24_000)) // 100 000 B/ms
    t.close(1100, info(110_000_000, 26_440)) // a 10 MB delta in 100 ms
    const budget = { maxDowntimeMs: 600, commitAllowanceMs: 400, maxPreCopyRounds: 8 }
    // rate 110 000 000 / 1100 = 100 000 B/ms; final wire = 10 MB (the delta) → 100 ms; + 2 + 400.
    expect(QemuMigration.postCapture(t, 2, 0, budget)).toEqual({ _tag: "Fits", estimateMs: 502 })
    const over = QemuMigration.postCapture(t, 2, 0, { ...budget, maxDowntimeMs: 500 })
    expect(over._tag).toBe("Overrun")
  })

  it("reads the port QEMU picked for an incoming migration", () => {
    expect(QemuMigration.listeningPort({ "socket-address": [{ type: "inet", host: "127.0.0.1", port: "38501" }] })).toBe(38501)
    expect(QemuMigration.listeningPort({})).toBeUndefined()
  })

  it("quotes paths for exec: URIs", () => {
    expect(QemuMigration.shellQuote("/a b/it's")).toBe(`'/a b/it'\\''s'`)
  })
})

describe("the QEMU process", () => {
  const spec = { vmId: "s1", memMib: 128, vcpus: 1 }
  const paths = QemuProcess.pathsOf("/tmp/x", "s1")

  it("keeps the QMP socket path short whatever the VM id", () => {
    expect(QemuProcess.pathsOf("/tmp/x", "a".repeat(100)).socket.length).toBeLessThanOrEqual(QemuProcess.maxSocketPath)
  })

  it("builds the command line: TCG with a bounded translation cache, KVM with -cpu host, an incoming VM paused", () => {
    const tcg = QemuProcess.argv(spec, { boot: { kernel: "/k", initrd: "/i", append: "console=ttyS0" }, machineType: "q35", accelerator: "tcg", ramPadKib: 8 }, paths, {
      incoming: true,
      tcgTbSizeMib: 64,
      extra: [],
    })
    expect(tcg.join(" ")).toContain("-accel tcg,tb-size=64 -m 131080k -smp 1")
    expect(tcg.join(" ")).toContain("-kernel /k -initrd /i -append console=ttyS0")
    expect(tcg.slice(-3)).toEqual(["-S", "-incoming", "defer"])
    const kvm = QemuProcess.argv(spec, { boot: { disk: "/d,x.img" }, machineType: "q35", accelerator: "kvm" }, paths, { incoming: false, tcgTbSizeMib: 64, extra: ["-no-reboot"] })
    expect(kvm.join(" ")).toContain("-accel kvm -cpu host -m 128 ")
    expect(kvm).toContain("file=/d,,x.img,if=virtio,format=raw")
    expect(kvm.at(-1)).toBe("-no-reboot")
  })

  it("reads VmRSS from /proc status text, and this process's own", () => {
    expect(QemuProcess.parseRss("Name:\tqemu\nVmRSS:\t  205344 kB\n")).toBe(205344 * 1024)
    expect(QemuProcess.parseRss("Name:\tx\n")).toBeNull()
    expect(QemuProcess.rssBytes(process.pid)).toBeGreaterThan(0)
    expect(QemuProcess.alive(process.pid)).toBe(true)
  })
})

describe("the TCG dirty-sync workaround", () => {
  it("is on for TCG before QEMU 8.1 only", () => {
    expect(Accel.parseVersion("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)")).toEqual({ major: 7, minor: 2, micro: 22 })
    expect(Accel.needsTcgSyncWorkaround("tcg", { major: 7, minor: 2, micro: 22 })).toBe(true)
    expect(Accel.needsTcgSyncWorkaround("tcg", { major: 8, minor: 1, micro: 0 })).toBe(false)
    expect(Accel.needsTcgSyncWorkaround("kvm", { major: 7, minor: 2, micro: 0 })).toBe(false)
  })
})
