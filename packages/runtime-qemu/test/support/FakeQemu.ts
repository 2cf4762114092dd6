// The fake QEMU of the runtime's stall tests (fake-qemu.mjs): a directory of its own per test,
// the runtime's settings that run it, its log, and the end of every fake it started (they run
// detached, as QEMU does, and outlive the runtime unless ended).
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Fiber, Schedule } from "effect"
import { TestClock } from "effect/testing"
import { QemuProcess } from "../../src/index.js"
import type { QemuRuntime } from "../../src/index.js"

export type FakeMode = "" | "descent-stall" | "descent-slow" | "descent-fail" | "load-stall" | "switchover-stall" | "switchover-mute" | "cancel-ignored" | "stop-late"

export interface FakeQemu {
  readonly dir: string
  /** Settings for a runtime on this fake (tight bounds: seconds, not minutes). */
  readonly config: QemuRuntime.QemuConfig
  /** The log's lines without their time: `cmd <name>`, `event <name> <data>`, `wedged`, … */
  readonly lines: () => string[]
  /** Every fake process this test started. */
  readonly pids: () => number[]
}

/**
 * A fake QEMU for one test, in the scope: at its end every fake process it started is killed
 * (SIGKILL) and its directory removed. `wedgeMs`: how long a SIGUSR1 holds its monitor;
 * `dropOnMigrate`: its monitor wedges and closes the connection once it answered a `migrate`;
 * `failedStops`: which `stop`s (counted from 1) answer an error and do nothing.
 */
export const make = (mode: FakeMode, o: { readonly wedgeMs?: number; readonly steps?: number; readonly dropOnMigrate?: boolean; readonly failedStops?: readonly number[] } = {}) =>
  Effect.acquireRelease(
    Effect.sync((): FakeQemu => {
      const dir = mkdtempSync(join(tmpdir(), "rq-"))
      const logFile = join(dir, "qmp.log")
      const pidsFile = join(dir, "pids")
      // Named as QEMU and run with argv[0] kept: the runtime knows its QEMU by the binary's name in /proc/<pid>/cmdline.
      const binary = join(dir, "qemu-system-x86_64")
      // And by its process name (`/proc/<pid>/stat`, the executable's name cut to 15 characters)
      // when its command line does not answer in time (`aliveAs`): Node run through a link whose
      // name starts as QEMU's does, as a real QEMU's process is named. A test that moves its
      // TestClock past the read's bound while the read is under way (in real time) would
      // otherwise see a process named `node`, not its QEMU.
      const node = join(dir, "qemu-system-x86_64-node")
      symlinkSync(process.execPath, node)
      writeFileSync(binary, `#!/bin/bash\nexec -a "$0" '${node}' '${join(import.meta.dirname, "fake-qemu.mjs")}' "$@"\n`)
      chmodSync(binary, 0o755)
      const extraArgs = ["-fake-mode", mode, "-fake-log", logFile, "-fake-pids", pidsFile, "-fake-wedge-ms", String(o.wedgeMs ?? 5000), "-fake-steps", String(o.steps ?? 30), "-fake-drop-on-migrate", o.dropOnMigrate === true ? "1" : "0", "-fake-failed-stops", (o.failedStops ?? []).join(",")]
      return {
        dir,
        config: { stateDir: join(dir, "s"), boot: { kernel: "/nonexistent" }, binary, accelerator: "tcg", memory: "anonymous", qmpTimeoutMs: 1000, startTimeoutMs: 10_000, migrationTimeoutMs: 1500, extraArgs },
        lines: () => (existsSync(logFile) ? readFileSync(logFile, "utf8").split("\n").filter((l) => l !== "").map((l) => l.slice(l.indexOf(" ") + 1)) : []),
        pids: () => (existsSync(pidsFile) ? readFileSync(pidsFile, "utf8").split("\n").filter((l) => l !== "").map(Number) : []),
      }
    }),
    (fake) =>
      Effect.sync(() => {
        for (const pid of fake.pids()) if (QemuProcess.alive(pid)) process.kill(pid, "SIGKILL")
        rmSync(fake.dir, { recursive: true, force: true })
      }),
  )

/**
 * Whether `pid` runs: as the runtime judges it (`QemuProcess.alive`), an exited process not yet
 * reaped by this test process (a zombie, for a moment after its exit on a busy machine) does not.
 */
export const isAlive = QemuProcess.alive

/** Polls `f` every 50 ms until it succeeds (at most `times` tries: 60 s by default): an outcome awaited, not a sleep. */
export const eventually = <A, E>(f: Effect.Effect<A, E>, times = 1200): Effect.Effect<A, E> => f.pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times }))

/** Real time for the fake's processes (their I/O runs on the event loop), whatever clock the test is on: a turn of the loop, not a stand-in for a wait the runtime times. */
const realMs = (ms: number) => Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

/** Waits until `ok()` without moving any clock (real time: polled every 10 ms, 60 s at most). */
export const until = (ok: () => boolean, what: string): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let i = 0; i < 6000; i++) {
      if (ok()) return
      yield* realMs(10)
    }
    return yield* Effect.die(new Error(`not within 60 s: ${what}`))
  })

/**
 * On a TestClock: moves it by 25 ms after each 5 ms or more of real time until `ok()` (4000 steps
 * at most), so that the runtime's polls and pauses go on while the fake answers in real time.
 * The clock runs at most 5 times faster than real time: give the runtime generous bounds.
 */
export const pumpUntil = (ok: () => boolean, what: string): Effect.Effect<void> =>
  Effect.gen(function* () {
    for (let i = 0; i < 4000; i++) {
      if (ok()) return
      yield* TestClock.adjust(25)
      yield* realMs(5)
    }
    return yield* Effect.die(new Error(`not within 4000 steps of the TestClock: ${what}`))
  })

/** Moves a TestClock by `ms` as `pumpUntil` moves it (the runtime's background work goes on meanwhile). */
export const pumpFor = (ms: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    let steps = 0
    return pumpUntil(() => steps++ * 25 >= ms, `${ms} ms of the TestClock`)
  })

/** Runs `f` to its end on a TestClock moved as `pumpUntil` moves it. */
export const pumped = <A, E, R>(f: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(f)
    yield* pumpUntil(() => fiber.pollUnsafe() !== undefined, "the effect to end")
    return yield* Fiber.join(fiber)
  })
