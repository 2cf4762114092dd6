// One writer per embedded store (SPEC §12), with real processes: a second
// coordinator on the same ENGRAM_DATA_DIR exits 1 with one line naming the holder's pid; a
// lock left by a process that no longer runs is taken over (and said); a clean stop removes it.
import { spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DataDirLock } from "@engram/coordinator"
import { Pid } from "@engram/process"
import { Effect, Exit } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { runToEnd, startChild } from "./support/child.js"

const dirs: string[] = []
const freshDir = () => {
  const d = mkdtempSync(join(tmpdir(), "engram-lock-"))
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true })
})

const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("ENGRAM_")))
const env = (dataDir: string) => ({ ...clean, ENGRAM_LOG_FORMAT: "json", ENGRAM_DATA_DIR: dataDir, ENGRAM_ADMIN_TOKEN: "lock-test-admin-token-0123" })

/** Runs a coordinator on `dataDir` to its end. */
const runOn = (dataDir: string) => runToEnd({ ...env(dataDir), ENGRAM_PORT: "0" })

describe("one coordinator per embedded data directory", () => {
  it("a second coordinator on the same ENGRAM_DATA_DIR exits 1 with one line naming the holder's pid; the first keeps serving; a clean stop removes the lock", async () => {
    const dataDir = freshDir()
    const first = await startChild(env(dataDir), 180_000)
    try {
      const lockFile = join(dataDir, "coordinator.lock")
      // The holder as it runs: its pid, its start and this boot.
      const holder = Pid.format({ pid: first.process.pid!, startTicks: Pid.startTicksOf(first.process.pid!), bootId: Pid.bootId() })
      expect(readFileSync(lockFile, "utf8").trim()).toBe(holder)
      const second = await runOn(dataDir)
      expect(second.code).toBe(1)
      const fatal = second.lines.filter((l) => l.level === "fatal")
      expect(fatal.map((l) => l.msg)).toEqual([
        `engram coordinator: the data directory ${dataDir} is in use by another coordinator (pid ${first.process.pid}, lock file ${lockFile}): stop that one, or give this one another ENGRAM_DATA_DIR`,
      ])
      // The first one is untouched: it serves, and still holds the lock.
      expect((await fetch(`${first.url}/readyz`)).status).toBe(200)
      expect(readFileSync(lockFile, "utf8").trim()).toBe(holder)
      first.process.kill("SIGTERM")
      expect(await first.exited).toBe(0)
      expect(existsSync(lockFile)).toBe(false)
    } finally {
      first.process.kill("SIGKILL")
    }
  }, 400_000)

  it("a lock left by a process that no longer runs is taken over, with a log line naming that pid", async () => {
    const dataDir = freshDir()
    // A pid that ran and ended: a coordinator SIGKILLed leaves exactly such a lock.
    const gone = spawnSync(process.execPath, ["-e", "0"])
    expect(gone.status).toBe(0)
    const stalePid = gone.pid
    const lockFile = join(dataDir, "coordinator.lock")
    writeFileSync(lockFile, `${stalePid}\n`)
    const c = await startChild(env(dataDir), 180_000)
    try {
      expect(Pid.parse(readFileSync(lockFile, "utf8"))?.pid).toBe(c.process.pid)
      const lines = c
        .output()
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as { level: string; msg: string })
      expect(lines.filter((l) => l.msg.includes("stale lock")).map((l) => [l.level, l.msg])).toEqual([
        ["warn", `taking over a stale lock on the data directory: its holder (pid ${stalePid}) no longer runs`],
      ])
      expect((await fetch(`${c.url}/readyz`)).status).toBe(200)
    } finally {
      c.process.kill("SIGTERM")
      await c.exited
    }
    expect(existsSync(lockFile)).toBe(false)
  }, 300_000)
})

describe("DataDirLock.acquire", () => {
  const held = (dataDir: string) => Effect.runPromiseExit(Effect.scoped(DataDirLock.acquire(dataDir).pipe(Effect.andThen(Effect.sync(() => readFileSync(join(dataDir, "coordinator.lock"), "utf8").trim())))))

  const me = Pid.format(Pid.self())

  it("holds the directory with this process (pid, start, boot) while its scope lasts, and removes the lock after", async () => {
    const dataDir = freshDir()
    expect(await held(dataDir)).toStrictEqual(Exit.succeed(me))
    expect(Pid.parse(me)?.pid).toBe(process.pid)
    expect(existsSync(join(dataDir, "coordinator.lock"))).toBe(false)
  })

  it("refuses a second hold of the directory within the same process while the first lasts", async () => {
    const dataDir = freshDir()
    const exit = await Effect.runPromiseExit(Effect.scoped(Effect.andThen(DataDirLock.acquire(dataDir), Effect.scoped(DataDirLock.acquire(dataDir)))))
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain(`"pid":${process.pid}`)
    expect(existsSync(join(dataDir, "coordinator.lock"))).toBe(false)
  })

  it("takes over a lock naming this process's pid that this process does not hold (a container's coordinator restarted after a crash gets the pid it had), in the old form and the new", async () => {
    const self = Pid.self()
    for (const left of [`${process.pid}\n`, `${Pid.format({ ...self, startTicks: self.startTicks === undefined ? undefined : String(Number(self.startTicks) - 1) })}\n`]) {
      const dataDir = freshDir()
      writeFileSync(join(dataDir, "coordinator.lock"), left)
      expect(await held(dataDir)).toStrictEqual(Exit.succeed(me))
    }
  })

  it.runIf(process.platform === "linux")("judges a lock by its holder's start and boot: pid 1 as it runs holds the directory; pid 1 with another start or boot (the pid reused) does not", async () => {
    const init: Pid.Owner = { pid: 1, startTicks: Pid.startTicksOf(1), bootId: Pid.bootId() }
    const refused = freshDir()
    writeFileSync(join(refused, "coordinator.lock"), `${Pid.format(init)}\n`)
    const exit = await held(refused)
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain('"pid":1')
    expect(readFileSync(join(refused, "coordinator.lock"), "utf8")).toBe(`${Pid.format(init)}\n`)
    for (const reused of [{ ...init, startTicks: String(Number(init.startTicks) + 100) }, { ...init, bootId: "00000000-0000-4000-8000-000000000000" }]) {
      const dataDir = freshDir()
      writeFileSync(join(dataDir, "coordinator.lock"), `${Pid.format(reused)}\n`)
      expect(await held(dataDir)).toStrictEqual(Exit.succeed(me))
    }
  })

  it("refuses a directory a running process holds (pid 1 runs; a lock of before, the pid alone), naming it; the lock stays", async () => {
    const dataDir = freshDir()
    writeFileSync(join(dataDir, "coordinator.lock"), "1\n")
    const exit = await held(dataDir)
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain('"pid":1')
    expect(readFileSync(join(dataDir, "coordinator.lock"), "utf8")).toBe("1\n")
  })

  it("takes over a lock naming no process (an empty or garbled file)", async () => {
    const dataDir = freshDir()
    writeFileSync(join(dataDir, "coordinator.lock"), "not a pid")
    expect(await held(dataDir)).toStrictEqual(Exit.succeed(me))
  })
})
