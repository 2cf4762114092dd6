// QEMU's figures turned into engram's rounds and guard inputs (figures recorded from real runs),
// its command line, the snapshot method and the guest's readiness line (no QEMU needed).
import { spawn } from "node:child_process"
import { once } from "node:events"
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { Accel, QemuMigration, QemuProcess, QemuRuntime, Readiness } from "../src/index.js"

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

  it("keeps a VM's directory inside the state directory: an id of .. or . or nothing names no directory (a removal of it would take the state directory or its parent)", () => {
    expect(QemuProcess.pathsOf("/tmp/x", "s1").dir).toBe("/tmp/x/s1")
    for (const id of ["..", ".", ""]) expect(() => QemuProcess.pathsOf("/tmp/x", id), JSON.stringify(id)).toThrow(/cannot name a file/)
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
    expect(kvm.join(" ")).toContain("-accel kvm -cpu host -m 128M ")
    expect(kvm).toContain("file=/d,,x.img,if=virtio,format=raw")
    expect(kvm.at(-1)).toBe("-no-reboot")
  })

  it("puts guest RAM in a file when asked: the memory backend on the machine, its size the -m size, shared or private", () => {
    const machine = { boot: { kernel: "/k" }, machineType: "q35", accelerator: "tcg" as const, ramPadKib: 8 }
    const shared = QemuProcess.argv(spec, machine, paths, { incoming: false, tcgTbSizeMib: 64, extra: [], ram: { kind: "file", path: "/r/a,b", shared: true } }).join(" ")
    expect(shared).toContain("-machine q35,memory-backend=ram0 ")
    expect(shared).toContain("-m 131080k -object memory-backend-file,id=ram0,size=131080k,mem-path=/r/a,,b,share=on ")
    const priv = QemuProcess.argv(spec, machine, paths, { incoming: true, tcgTbSizeMib: 64, extra: [], ram: { kind: "file", path: "/img/ram", shared: false } }).join(" ")
    expect(priv).toContain("mem-path=/img/ram,share=off")
    const anon = QemuProcess.argv(spec, machine, paths, { incoming: false, tcgTbSizeMib: 64, extra: [], ram: { kind: "anonymous" } }).join(" ")
    expect(anon).not.toContain("memory-backend")
  })

  it("reads VmRSS, and RssAnon + RssShmem (what MemAvailable does not count), from /proc status text, and this process's own", () => {
    const status = "Name:\tqemu\nVmRSS:\t  205344 kB\nRssAnon:\t   70000 kB\nRssFile:\t  120000 kB\nRssShmem:\t   15344 kB\n"
    expect(QemuProcess.parseRss(status)).toBe(205344 * 1024)
    expect(QemuProcess.parseUnreclaimable(status)).toBe((70000 + 15344) * 1024)
    expect(QemuProcess.parseUnreclaimable("Name:\tx\nRssAnon:\t 1 kB\n")).toBeNull()
    expect(QemuProcess.unreclaimableBytes(process.pid)).toBeGreaterThan(0)
    expect(QemuProcess.parseRss("Name:\tx\n")).toBeNull()
    expect(QemuProcess.rssBytes(process.pid)).toBeGreaterThan(0)
    expect(QemuProcess.alive(process.pid)).toBe(true)
  })

  it("aliveAs: a live process is a VM's QEMU only if it runs the binary with a -pidfile in that VM's directory (another VM's QEMU given the pid is not)", async () => {
    // `--`: the script's arguments, not Node's options (Node refuses `-pidfile` as a bad option and
    // exits at once, so the process was alive only while it parsed them).
    const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 60000)", "--", "-pidfile", "/run/engram-qemu-h/vm1/qemu.pid"], { stdio: "ignore" })
    await once(child, "spawn")
    const pid = child.pid!
    // Until the child has exec'd, the kernel shows the parent's command line: wait until it shows
    // the child's (a QEMU the runtime judges has run for a while). The empty command lines this
    // once met (1 in about 200) were the child's end: Node refused `-pidfile` and exited.
    for (let i = 0; i < 1000 && !readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("-pidfile"); i++) await new Promise((r) => setTimeout(r, 5))
    try {
      const aliveAs = (pid: number, binary: string, pidFile: string) => Effect.runPromise(QemuProcess.aliveAs(pid, binary, pidFile))
      expect(await aliveAs(pid, process.execPath, "/run/engram-qemu-h/vm1/qemu.pid")).toBe(true)
      // The state directory named otherwise by a restarted agent (relative, through a link): the VM's directory decides.
      expect(await aliveAs(pid, process.execPath, "/srv/state/../engram-qemu-h/vm1/qemu.pid")).toBe(true)
      expect(await aliveAs(pid, process.execPath, "/run/engram-qemu-h/vm2/qemu.pid")).toBe(false)
      expect(await aliveAs(pid, "/usr/bin/qemu-system-x86_64", "/run/engram-qemu-h/vm1/qemu.pid")).toBe(false)
    } finally {
      child.kill("SIGKILL")
      await once(child, "exit")
    }
    expect(await Effect.runPromise(QemuProcess.aliveAs(pid, process.execPath, "/run/engram-qemu-h/vm1/qemu.pid"))).toBe(false)
  })

  it("version: a binary that never answers --version counts as not running once its bound passes (killed), not a hang; one that answers is read", async () => {
    const dir = mkdtempSync(join(tmpdir(), "eq-version-"))
    const hung = join(dir, "hung-qemu")
    writeFileSync(hung, "#!/bin/sh\nexec sleep 600\n", { mode: 0o755 })
    const answers = join(dir, "qemu-7.2")
    writeFileSync(answers, "#!/bin/sh\necho 'QEMU emulator version 7.2.9 (Debian 1:7.2+dfsg-7+deb12u7)'\n", { mode: 0o755 })
    expect(await Effect.runPromise(Accel.version(hung, 300))).toBeNull()
    expect(await Effect.runPromise(Accel.version(answers))).toEqual({ major: 7, minor: 2, micro: 9 })
  })

  it("reads the CPU time (utime + stime, in 10 ms ticks) from /proc stat text, also with spaces and parentheses in the name, and this process's own", () => {
    const tail = "S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 100"
    expect(QemuProcess.parseCpuMs(`4242 (qemu-system-x86) ${tail}`)).toBe(3000)
    expect(QemuProcess.parseCpuMs(`4242 (a (b) c) ${tail}`)).toBe(3000)
    expect(QemuProcess.parseCpuMs("4242 (x) S")).toBeNull()
    expect(QemuProcess.cpuMs(process.pid)).toBeGreaterThanOrEqual(0)
    expect(QemuProcess.cpuMs(2 ** 22 + 7)).toBeNull()
  })
})

describe("mapped or stream snapshots", () => {
  it("mapped on a QEMU with x-ignore-shared (4.0+) and RAM files; stream otherwise, saying why", () => {
    expect(QemuRuntime.snapshotsOf("file", { major: 7, minor: 2, micro: 22 })).toMatchObject({ method: "mapped", ignoreShared: true })
    expect(QemuRuntime.snapshotsOf("anonymous", { major: 7, minor: 2, micro: 22 })).toMatchObject({ method: "stream", ignoreShared: true, reason: expect.stringMatching(/anonymous/) })
    expect(QemuRuntime.snapshotsOf("file", { major: 3, minor: 1, micro: 0 })).toMatchObject({ method: "stream", ignoreShared: false, reason: expect.stringMatching(/no x-ignore-shared/) })
    expect(QemuRuntime.snapshotsOf("file", null).method).toBe("stream")
  })

  it("every migration sets x-ignore-shared where QEMU has it: on for a snapshot's devices, off for a move (QEMU keeps capabilities between migrations)", () => {
    const caps = (o: Parameters<typeof QemuMigration.capabilities>[0]) => QemuMigration.capabilities(o).capabilities.map((c) => [c.capability, c.state])
    expect(caps({ pauseBeforeSwitchover: true, ignoreShared: false })).toEqual([["events", true], ["pause-before-switchover", true], ["x-ignore-shared", false]])
    expect(caps({ pauseBeforeSwitchover: false, ignoreShared: true })).toEqual([["events", true], ["pause-before-switchover", false], ["x-ignore-shared", true]])
    expect(caps({ pauseBeforeSwitchover: false, ignoreShared: null })).toEqual([["events", true], ["pause-before-switchover", false]])
  })
})

describe("the guest's readiness line", () => {
  it("is looked for after a point of the console, in whole lines; a guest whose process is gone stops the wait", async () => {
    const dir = mkdtempSync(join(tmpdir(), "eq-ready-"))
    const con = join(dir, "console.log")
    writeFileSync(con, "engram-ready 0b3c5a3e-1111-4222-8333-944455556666\nengram-tick partial")
    const ready = /^engram-(ready|tick) [0-9a-f-]{36}/
    // From the start: the ready line is there.
    expect(await Effect.runPromise(Readiness.awaitLine(con, 0, ready, 1000))).toBe("seen")
    // From the end: nothing new (a partial line is no line), then a whole line appended.
    const tail = await Effect.runPromise(Readiness.tailFromEnd(con))
    expect(await Effect.runPromise(Readiness.awaitLine(con, tail, ready, 50))).toBe("timeout")
    const waiting = Effect.runPromise(Readiness.awaitLine(con, tail, ready, 10_000))
    appendFileSync(con, " more\r\nengram-tick 0b3c5a3e-1111-4222-8333-944455556666 7 1.5\r\n")
    expect(await waiting).toBe("seen")
    expect(await Effect.runPromise(Readiness.awaitLine(con, await Effect.runPromise(Readiness.tailFromEnd(con)), ready, 10_000, () => false))).toBe("exited")
    // A console QEMU has not created yet: from its start.
    const none = await Effect.runPromise(Readiness.tailFromEnd(join(dir, "none")))
    writeFileSync(join(dir, "none"), "engram-ready 0b3c5a3e-1111-4222-8333-944455556666\n")
    expect(await Effect.runPromise(Readiness.awaitLine(join(dir, "none"), none, ready, 10_000))).toBe("seen")
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
