// One writer per embedded store (SPEC §12), with real processes: a second
// coordinator on the same ENGRAM_DATA_DIR exits 1 with one line naming the holder's pid; a
// lock left by a process that no longer runs is taken over (and said); a clean stop removes it.
import { spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DataDirLock } from "@engram/coordinator"
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
      expect(readFileSync(lockFile, "utf8").trim()).toBe(String(first.process.pid))
      const second = await runOn(dataDir)
      expect(second.code).toBe(1)
      const fatal = second.lines.filter((l) => l.level === "fatal")
      expect(fatal.map((l) => l.msg)).toEqual([
        `engram coordinator: the data directory ${dataDir} is in use by another coordinator (pid ${first.process.pid}, lock file ${lockFile}): stop that one, or give this one another ENGRAM_DATA_DIR`,
      ])
      // The first one is untouched: it serves, and still holds the lock.
      expect((await fetch(`${first.url}/readyz`)).status).toBe(200)
      expect(readFileSync(lockFile, "utf8").trim()).toBe(String(first.process.pid))
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
      expect(readFileSync(lockFile, "utf8").trim()).toBe(String(c.process.pid))
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

  it("holds the directory with this pid while its scope lasts, and removes the lock after", async () => {
    const dataDir = freshDir()
    expect(await held(dataDir)).toStrictEqual(Exit.succeed(String(process.pid)))
    expect(existsSync(join(dataDir, "coordinator.lock"))).toBe(false)
  })

  it("refuses a directory a running process holds (pid 1 runs), naming it; the lock stays", async () => {
    const dataDir = freshDir()
    writeFileSync(join(dataDir, "coordinator.lock"), "1\n")
    const exit = await held(dataDir)
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain('"pid":1')
    expect(readFileSync(join(dataDir, "coordinator.lock"), "utf8")).toBe("1\n")
  })

  it("takes over a lock naming no process (an empty or garbled file)", async () => {
    const dataDir = freshDir()
    writeFileSync(join(dataDir, "coordinator.lock"), "not a pid")
    expect(await held(dataDir)).toStrictEqual(Exit.succeed(String(process.pid)))
  })
})
