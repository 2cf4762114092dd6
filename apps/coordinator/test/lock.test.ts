// One writer per embedded store (SPEC §12), with real processes: a second
// coordinator on the same ENGRAM_DATA_DIR exits 1 with one line naming the holder's pid; a
// lock left by a process that no longer runs is taken over (and said); a clean stop removes it;
// one whose lock another took over drops its embedded database and exits 1.
import { spawn, spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DataDirLock } from "@engram/coordinator"
import { Pid } from "@engram/process"
import { it as effectIt } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import { TestClock } from "effect/testing"
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

/**
 * Whether this machine lets us start a process in a PID namespace of its own (`unshare`, as root
 * or with user namespaces): there it is pid 1, as a coordinator in a container is.
 */
const canUnshare = spawnSync("unshare", ["--fork", "--pid", "--mount-proc", "--kill-child", "true"]).status === 0

/** A coordinator on `dataDir` as pid 1 of a PID namespace of its own (a container's first process), started; its log so far read by `output`. */
const startAsPidOne = (dataDir: string) => {
  const child = spawn("unshare", ["--fork", "--pid", "--mount-proc", "--kill-child", process.execPath, "--import", "tsx", "--conditions=@engram/source", "src/main.ts"], {
    cwd: join(import.meta.dirname, ".."),
    env: { ...env(dataDir), ENGRAM_PORT: "0" },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let out = ""
  child.stdout.on("data", (b: Buffer) => (out += b.toString()))
  child.stderr.on("data", (b: Buffer) => (out += b.toString()))
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)))
  return { child, output: () => out, exited }
}

/** Waits until `output` says the coordinator listens, or fails with what it said when it ends first or within 3 minutes. */
const listening = async (c: ReturnType<typeof startAsPidOne>): Promise<void> => {
  let ended = false
  void c.exited.then(() => (ended = true))
  for (const until = Date.now() + 180_000; Date.now() < until; ) {
    if (/listening on http:/.test(c.output())) return
    if (ended) throw new Error(`the coordinator ended before listening:\n${c.output()}`)
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`the coordinator did not listen within 3 minutes:\n${c.output()}`)
}

/** The JSON log lines in `output` that say a stale lock was taken over, as [level, message]. */
const staleLockLines = (output: string) =>
  output
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as { level: string; msg: string })
    .filter((l) => l.msg.includes("stale lock"))
    .map((l) => [l.level, l.msg])

/** Runs a coordinator on `dataDir` to its end. */
const runOn = (dataDir: string) => runToEnd({ ...env(dataDir), ENGRAM_PORT: "0" })

describe("one coordinator per embedded data directory", () => {
  it("a second coordinator on the same ENGRAM_DATA_DIR exits 1 with one line naming the holder's pid; the first keeps serving; a clean stop removes the lock", async () => {
    const dataDir = freshDir()
    const first = await startChild(env(dataDir), 180_000)
    try {
      const lockFile = join(dataDir, "coordinator.lock")
      // The holder as it runs: its pid, its start, this boot and this PID namespace.
      const holder = Pid.format({ pid: first.process.pid!, startTicks: Pid.startTicksOf(first.process.pid!), bootId: Pid.bootId(), pidNs: Pid.pidNamespace() })
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
      expect(staleLockLines(c.output())).toEqual([
        ["warn", `taking over a stale lock on the data directory: its holder (pid ${stalePid}) no longer runs`],
      ])
      expect((await fetch(`${c.url}/readyz`)).status).toBe(200)
    } finally {
      c.process.kill("SIGTERM")
      await c.exited
    }
    expect(existsSync(lockFile)).toBe(false)
  }, 300_000)

  it.runIf(process.platform === "linux")("a coordinator whose lock another took over (it was frozen that long) drops its embedded database where it stands and exits 1: PGlite is not closed, so nothing more is written to the other's directory", async () => {
    const dataDir = freshDir()
    const c = await startChild(env(dataDir), 180_000)
    try {
      expect((await fetch(`${c.url}/readyz`)).status).toBe(200)
      const lockFile = join(dataDir, "coordinator.lock")
      // What the other coordinator writes as it takes over: a holder this one cannot see.
      writeFileSync(lockFile, `${Pid.format({ ...Pid.self(), pid: 7, pidNs: String(Number(Pid.pidNamespace()) + 1) })}\n`)
      expect(await c.exited).toBe(1)
      expect(c.output()).toContain("names another coordinator (pid 7)")
      // The cluster's state in pg_control: 6 (in production) as the engine left it running; a
      // close (a shutdown checkpoint, written to what is now the other's directory) makes it 1.
      expect(readFileSync(join(dataDir, "pglite", "global", "pg_control")).readInt32LE(16)).toBe(6)
    } finally {
      c.process.kill("SIGKILL")
    }
  }, 300_000)
})

describe("a coordinator restarted in a container after a crash (the pid it had: 1)", () => {
  // Needs a PID namespace of its own (unshare as root, as CI runs, or user namespaces): without
  // one no process here can be given the pid a crashed one had, which is the case under test.
  it.skipIf(!canUnshare)("takes over the lock its crashed predecessor left, though that lock names its own pid (once watched untouched for staleAfterMs), and says so", async () => {
    const dataDir = freshDir()
    const lockFile = join(dataDir, "coordinator.lock")
    const first = startAsPidOne(dataDir)
    try {
      await listening(first)
      expect(Pid.parse(readFileSync(lockFile, "utf8"))?.pid).toBe(1)
    } finally {
      // The crash: SIGKILL (unshare's --kill-child passes it on), nothing removes the lock.
      first.child.kill("SIGKILL")
      await first.exited
    }
    expect(Pid.parse(readFileSync(lockFile, "utf8"))?.pid).toBe(1)
    const second = startAsPidOne(dataDir)
    try {
      await listening(second)
      expect(staleLockLines(second.output())).toEqual([
        ["warn", "taking over a stale lock on the data directory: its holder (pid 1) no longer runs"],
      ])
      expect(Pid.parse(readFileSync(lockFile, "utf8"))?.pid).toBe(1)
    } finally {
      // unshare does not pass SIGTERM on: SIGKILL (the lock is left, as by a crash).
      second.child.kill("SIGKILL")
      await second.exited
    }
  }, 400_000)
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

  it.runIf(process.platform === "linux")("judges a lock by its holder's start and boot: pid 1 as it runs holds the directory; pid 1 with another start (the pid reused) does not", async () => {
    const init: Pid.Owner = { pid: 1, startTicks: Pid.startTicksOf(1), bootId: Pid.bootId() }
    const refused = freshDir()
    writeFileSync(join(refused, "coordinator.lock"), `${Pid.format(init)}\n`)
    const exit = await held(refused)
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain('"pid":1')
    expect(readFileSync(join(refused, "coordinator.lock"), "utf8")).toBe(`${Pid.format(init)}\n`)
    const reused = freshDir()
    writeFileSync(join(reused, "coordinator.lock"), `${Pid.format({ ...init, startTicks: String(Number(init.startTicks) + 100) })}\n`)
    expect(await held(reused)).toStrictEqual(Exit.succeed(me))
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
  describe.runIf(process.platform === "linux")("a holder in another PID namespace or boot (Linux: /proc tells them), judged by its touches of the lock", () => {
    /**
     * A lock of a coordinator that no pid here names, as it writes it: of another PID namespace of
     * this boot (another container on the volume), or of another boot id (another machine
     * mounting the volume).
     */
    const otherNamespace = (dataDir: string, other: "pidNs" | "bootId" = "pidNs") => {
      const me = Pid.self()
      const file = join(dataDir, "coordinator.lock")
      const elsewhere = other === "pidNs" ? { pidNs: String(Number(me.pidNs) + 1) } : { bootId: "00000000-0000-4000-8000-000000000000" }
      writeFileSync(file, `${Pid.format({ ...me, pid: me.pid === 7 ? 8 : 7, ...elsewhere })}\n`)
      return file
    }
    /** Sets the lock's last touch to the test clock's time less `agoMs`. */
    const touch = (file: string, agoMs = 0) =>
      Effect.flatMap(Effect.clockWith((c) => c.currentTimeMillis), (nowMs) => Effect.sync(() => utimesSync(file, (nowMs - agoMs) / 1000, (nowMs - agoMs) / 1000)))
    /** The test clock's time moved on in steps of the holder's refresh, `each` run after each. */
    const steps = (n: number, each: Effect.Effect<void> = Effect.void) => Effect.repeat(Effect.andThen(TestClock.adjust(DataDirLock.refreshMs), each), { times: n - 1 })

    effectIt.effect("one that keeps touching it holds the directory (another container, or another machine on a shared volume, its clock 20 s ahead, 20 s or 10 minutes behind: its touches then look 10 minutes old): this one refuses naming its pid once it sees a touch; the lock stays", () =>
      Effect.gen(function* () {
        for (const [other, skewMs] of [["pidNs", 0], ["bootId", 20_000], ["bootId", -20_000], ["bootId", 10 * 60_000]] as const) {
          yield* TestClock.setTime(Date.now())
          const dataDir = freshDir()
          const file = otherNamespace(dataDir, other)
          const written = readFileSync(file, "utf8")
          yield* touch(file, skewMs)
          const taking = yield* Effect.forkChild(Effect.exit(Effect.scoped(DataDirLock.acquire(dataDir))))
          yield* steps((DataDirLock.staleAfterMs + 2 * DataDirLock.refreshMs) / DataDirLock.refreshMs, touch(file, skewMs))
          const exit = yield* Fiber.join(taking)
          expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain(`"pid":${Pid.parse(written)!.pid}`)
          expect(readFileSync(file, "utf8")).toBe(written)
        }
      }))

    effectIt.effect("one that stopped touching it (a restarted container's crashed predecessor, a machine before its reboot): taken over once watched untouched for staleAfterMs, however old its last touch looks (another machine's clock may be minutes behind)", () =>
      Effect.gen(function* () {
        for (const [other, agoMs] of [["pidNs", 0], ["pidNs", 10 * 60_000], ["bootId", 60 * 60_000]] as const) {
          yield* TestClock.setTime(Date.now())
          const waited = freshDir()
          yield* touch(otherNamespace(waited, other), agoMs)
          const taking = yield* Effect.forkChild(Effect.exit(Effect.scoped(DataDirLock.acquire(waited).pipe(Effect.andThen(Effect.sync(() => readFileSync(join(waited, "coordinator.lock"), "utf8").trim()))))))
          yield* steps(DataDirLock.staleAfterMs / DataDirLock.refreshMs - 1)
          expect(taking.pollUnsafe()).toBeUndefined()
          yield* steps(2)
          expect(yield* Fiber.join(taking)).toStrictEqual(Exit.succeed(me))
        }
      }))

    effectIt.effect("a holder whose lock another took over (it was frozen or cut off), or whose lock is gone at two touches in a row, is told once and stops touching it", () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(Date.now())
        for (const lose of ["taken", "removed"] as const) {
          const dataDir = freshDir()
          const file = join(dataDir, "coordinator.lock")
          const told: string[] = []
          yield* Effect.scoped(
            Effect.gen(function* () {
              yield* DataDirLock.acquire(dataDir, { onLost: (why) => void told.push(why) })
              const other = `${Pid.format({ ...Pid.self(), pid: 7, pidNs: "1" })}\n`
              if (lose === "taken") writeFileSync(file, other)
              else rmSync(file)
              yield* TestClock.adjust(DataDirLock.refreshMs)
              if (lose === "removed") {
                // Gone at one touch: a takeover may have moved it aside for a moment.
                expect(told).toEqual([])
                yield* TestClock.adjust(DataDirLock.refreshMs)
              }
              expect(told).toHaveLength(1)
              expect(told[0]).toMatch(lose === "taken" ? /names another coordinator \(pid 7\): it took the lock over while this one was frozen or cut off/ : /lock file .* is gone/)
              yield* TestClock.adjust(10 * DataDirLock.refreshMs)
              expect(told).toHaveLength(1)
              if (lose === "taken") expect(readFileSync(file, "utf8")).toBe(other)
            }),
          )
        }
      }))

    effectIt.effect("a holder touches its lock every refreshMs", () =>
      Effect.gen(function* () {
        const startMs = Date.now()
        yield* TestClock.setTime(startMs)
        const dataDir = freshDir()
        const file = join(dataDir, "coordinator.lock")
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* DataDirLock.acquire(dataDir)
            yield* touch(file, 60_000)
            yield* TestClock.adjust(DataDirLock.refreshMs)
            expect(Math.abs(statSync(file).mtimeMs - (startMs + DataDirLock.refreshMs))).toBeLessThan(1_000)
          }),
        )
      }))
  })
})
