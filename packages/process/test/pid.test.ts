// A file's owner process told apart from a later process given the same pid (Pid): real
// processes, read through /proc.
import { spawn } from "node:child_process"
import { once } from "node:events"
import { describe, expect, it } from "vitest"
import { Pid } from "../src/index.js"

const onLinux = process.platform === "linux"

describe("Pid: a recorded owner and a reused pid", () => {
  it("this process runs as it records itself; the same pid with another start or another boot does not", () => {
    const me = Pid.self()
    expect(Pid.runs(me)).toBe(true)
    expect(Pid.runs({ pid: me.pid })).toBe(true)
    if (!onLinux) return
    expect(me.startTicks).toMatch(/^\d+$/)
    expect(me.bootId).toMatch(/^[0-9a-f-]{36}$/)
    expect(me.pidNs).toMatch(/^\d+$/)
    expect(Pid.judge(me)).toBe("runs")
    // A process of another PID namespace (another container): no pid here names it.
    const elsewhere = { ...me, pidNs: String(Number(me.pidNs) + 1) }
    expect(Pid.judge(elsewhere)).toBe("unseen")
    expect(Pid.runs(elsewhere)).toBe(true)
    // The pid reused by a process that started at another time (a restarted container's first
    // process, a daemon after a reboot): not the owner.
    expect(Pid.runs({ ...me, startTicks: String(Number(me.startTicks) + 1) })).toBe(false)
    // Another boot id: an earlier boot, or another machine whose file this is (a shared
    // volume): no pid here names it, whatever its pid and namespace.
    expect(Pid.judge({ ...me, bootId: "00000000-0000-0000-0000-000000000000" })).toBe("unseen")
    expect(Pid.judge({ ...elsewhere, bootId: "00000000-0000-0000-0000-000000000000" })).toBe("unseen")
  })

  it("a process that ended does not run, and a live one's start is its own, not ours", async () => {
    const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 60000)"], { stdio: "ignore" })
    await once(child, "spawn")
    const owner: Pid.Owner = { pid: child.pid!, startTicks: Pid.startTicksOf(child.pid!), bootId: Pid.bootId() }
    expect(Pid.runs(owner)).toBe(true)
    if (onLinux) expect(Number(owner.startTicks)).toBeGreaterThanOrEqual(Number(Pid.self().startTicks))
    child.kill("SIGKILL")
    await once(child, "exit")
    expect(Pid.runs(owner)).toBe(false)
    expect(Pid.startTicksOf(child.pid!)).toBeUndefined()
  })

  it("format and parse: one line, read back; a lone pid (the form of before) too; anything else is no owner", () => {
    const full: Pid.Owner = { pid: 4242, startTicks: "123456", bootId: "3c1f7e2a-9b0d-4c1e-8f2a-0123456789ab", pidNs: "4026531836" }
    expect(Pid.format(full)).toBe("4242 123456 3c1f7e2a-9b0d-4c1e-8f2a-0123456789ab 4026531836")
    expect(Pid.parse(Pid.format(full))).toEqual(full)
    expect(Pid.parse(`${Pid.format(full)}\n`)).toEqual(full)
    expect(Pid.parse("4242 123456 3c1f7e2a-9b0d-4c1e-8f2a-0123456789ab")).toEqual({ ...full, pidNs: undefined })
    expect(Pid.parse("4242\n")).toEqual({ pid: 4242, startTicks: undefined, bootId: undefined, pidNs: undefined })
    expect(Pid.format({ pid: 7 })).toBe("7")
    for (const bad of ["", "0", "-3", "12x", "12 ab", "1.5", "4242 123 NOT-A-BOOT-ID", "4242 123 3c1f7e2a-9b0d-4c1e-8f2a-0123456789ab ns"]) expect(Pid.parse(bad)).toBeUndefined()
  })
})
