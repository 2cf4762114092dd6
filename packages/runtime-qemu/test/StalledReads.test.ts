// Reads that stall (a VM's disk that stops answering, a QEMU stuck in the kernel holding its
// memory map lock) hold up the wait that made them, never the agent: each read is asynchronous
// and bounded on Effect's Clock (here a TestClock), one read of a file at a time.
import { execFileSync, spawn } from "node:child_process"
import { once } from "node:events"
import { closeSync, constants, mkdirSync, mkdtempSync, openSync, readFileSync, renameSync, rmSync, writeSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import { QemuProcess, QemuRuntime, Readiness } from "../src/index.js"
import * as FakeQemu from "./support/FakeQemu.js"

const bound = QemuProcess.readBoundMs
const ready = /^engram-ready/

/** A console reader whose reads answer only when the test says (`answer`), counted. */
const heldReader = () => {
  const pending: ((text: string) => void)[] = []
  let calls = 0
  const read: Readiness.ReadFrom = () =>
    new Promise((resolve) => {
      calls += 1
      pending.push((text) => resolve({ bytes: Buffer.from(text), size: Buffer.byteLength(text) }))
    })
  return { read, calls: () => calls, answer: (text: string) => pending.shift()?.(text) }
}

describe("a console read that stalls", () => {
  it.effect("is waited for again, not repeated: the wait ends at its timeout on the clock, its QEMU's end noticed meanwhile", () =>
    Effect.gen(function* () {
      const reader = heldReader()
      const waiting = yield* Effect.forkChild(Readiness.awaitLine("/stalled/console.log", 0, ready, 5 * bound, () => true, 5, reader.read))
      yield* TestClock.adjust(3 * bound)
      assert.isUndefined(waiting.pollUnsafe(), "still waiting: the read has not answered, the timeout is not reached")
      assert.strictEqual(reader.calls(), 1, "one read under way, not one more each poll")
      yield* TestClock.adjust(2 * bound)
      assert.strictEqual(yield* Fiber.join(waiting), "timeout")
      assert.strictEqual(reader.calls(), 1)

      let alive = true
      const other = heldReader()
      const exits = yield* Effect.forkChild(Readiness.awaitLine("/stalled/console.log", 0, ready, 20 * bound, () => alive, 5, other.read))
      yield* TestClock.adjust(bound)
      assert.isUndefined(exits.pollUnsafe())
      alive = false
      // The next poll gives up on the read at its bound and asks whether QEMU lives.
      yield* TestClock.adjust(bound + 5)
      assert.strictEqual(yield* Fiber.join(exits), "exited")
    }),
  )

  it.effect("a read that answers late is joined: its lines count", () =>
    Effect.gen(function* () {
      const reader = heldReader()
      const waiting = yield* Effect.forkChild(Readiness.awaitLine("/stalled/console.log", 0, ready, 20 * bound, () => true, 5, reader.read))
      yield* TestClock.adjust(2 * bound + 5)
      assert.strictEqual(reader.calls(), 1)
      reader.answer("boot\nengram-ready 1\n")
      // The answer settles (promise callbacks on the real event loop), then the next poll (5 ms on).
      yield* Effect.promise(() => new Promise((r) => setImmediate(r)))
      yield* TestClock.adjust(5)
      for (let i = 0; i < 100 && waiting.pollUnsafe() === undefined; i++) yield* Effect.promise(() => new Promise((r) => setImmediate(r)))
      assert.deepStrictEqual(waiting.pollUnsafe(), Exit.succeed("seen"))
      assert.strictEqual(reader.calls(), 1, "its lines were taken before another read")
    }),
  )
})

describe("aliveAs when the command line does not answer", () => {
  it.effect("answers at its bound, by the process's name: its binary's is ours, another's is not", () =>
    Effect.gen(function* () {
      const pidFile = "/run/engram-qemu-h/vm1/qemu.pid"
      const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 60000)", "--", "-pidfile", pidFile], { stdio: "ignore" })
      yield* Effect.promise(() => once(child, "spawn"))
      const pid = child.pid!
      // Until the child has exec'd, the kernel shows the parent's name (see QemuMigration.test.ts).
      for (let i = 0; i < 1000 && !readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("-pidfile"); i++) yield* Effect.promise(() => new Promise((r) => setTimeout(r, 5)))
      let reads = 0
      const stalled = { read: () => (reads++, new Promise<string>(() => undefined)) }
      try {
        const ours = yield* Effect.forkChild(QemuProcess.aliveAs(pid, process.execPath, pidFile, stalled))
        const other = yield* Effect.forkChild(QemuProcess.aliveAs(pid, "/usr/bin/qemu-system-x86_64", pidFile, stalled))
        yield* TestClock.adjust(bound - 1)
        assert.isUndefined(ours.pollUnsafe(), "not before its bound")
        yield* TestClock.adjust(1)
        assert.isTrue(yield* Fiber.join(ours), "a live process of the binary's name: ours (a stuck QEMU is not given up)")
        assert.isFalse(yield* Fiber.join(other), "another program's: not ours")
        assert.strictEqual(reads, 2)
      } finally {
        child.kill("SIGKILL")
        yield* Effect.promise(() => once(child, "exit"))
      }
      // Gone: answered without reading.
      assert.isFalse(yield* QemuProcess.aliveAs(pid, process.execPath, pidFile, stalled))
      assert.strictEqual(reads, 2)
    }),
  )
})

describe("a descent whose QEMU's memory map does not answer", () => {
  it.effect("fails saying so at its bound, the guest given back: a RAM file no longer at its path is not taken for one not yet moved", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const fake = yield* FakeQemu.make("")
        let reads = 0
        const readMaps = () => (reads++, new Promise<string>(() => undefined))
        // Mapped snapshots (the fake says QEMU 7.2); generous bounds: the clock is moved faster than real time.
        const config = { ...fake.config, memory: "file" as const, qmpTimeoutMs: 60_000, startTimeoutMs: 600_000, migrationTimeoutMs: 600_000, testHooks: { readMaps } }
        const rt = yield* FakeQemu.pumped(QemuRuntime.make(config))
        yield* FakeQemu.pumped(rt.start({ vmId: "m1", memMib: 64, vcpus: 1 }))
        const pid = rt.pidOf("m1")!
        // As after a descent cut short once it moved the RAM file: the VM's RAM file is not at its
        // path (the fake maps none), the image's is there.
        mkdirSync(join(fake.dir, "img"))
        writeFileSync(join(fake.dir, "img", "ram"), "")
        const result = yield* FakeQemu.pumped(Effect.result(rt.descend("m1", join(fake.dir, "img", "image"))))
        assert.strictEqual(result._tag, "Failure")
        if (result._tag === "Failure") {
          assert.match(result.failure.message, new RegExp(`memory map \\(/proc/\\d+/maps\\) could not be read within ${bound} ms`))
          assert.notMatch(result.failure.message, /RAM file:/, "not a misleading RAM-file error")
        }
        assert.strictEqual(reads, 1)
        assert.isTrue(FakeQemu.isAlive(pid))
        assert.deepStrictEqual(yield* rt.list, [{ vmId: "m1", memMib: 64, vcpus: 1, status: "running" }], "the guest runs again where it was")
        yield* FakeQemu.pumped(rt.destroy("m1"))
      }),
    ),
  )
})

describe("a pid file read that stalls, for a destroy or a recovery", () => {
  it.effect("is read again until it answers, its pauses growing, warned of at once and then at most once a minute", () =>
    Effect.gen(function* () {
      // A FIFO no one writes: reading it blocks in the kernel, as a read of a stalled disk does.
      const dir = mkdtempSync(join(tmpdir(), "rq-pid-"))
      const paths = QemuProcess.pathsOf(dir, "p1")
      mkdirSync(paths.dir)
      execFileSync("mkfifo", [paths.pidFile])
      const warnings: string[] = []
      const capture = Logger.make(({ logLevel, message }) => {
        if (logLevel === "Warn") warnings.push(String(Array.isArray(message) ? message[0] : message))
      })
      try {
        const waiting = yield* Effect.forkChild(QemuProcess.readPidPatiently(paths).pipe(Effect.provide(Logger.layer([capture]))))
        yield* TestClock.adjust(QemuProcess.readBoundMs)
        assert.lengthOf(warnings, 1, "the first stall is said at once")
        // Ten minutes of a disk that does not answer.
        for (let i = 0; i < 600; i++) yield* TestClock.adjust(1000)
        assert.isUndefined(waiting.pollUnsafe(), "still waiting: no pid is not known")
        assert.isAtLeast(warnings.length, 5, "said again while it waits")
        assert.isAtMost(warnings.length, 11, "at most once a minute")
        // The disk answers: the read under way gets the pid, and so does any read after it (a file now).
        // The FIFO's writer stays open until the file is in its place: a read that opens the FIFO
        // in between finds a writer (an open without one would block its pool thread for good).
        const fd = openSync(paths.pidFile, constants.O_WRONLY | constants.O_NONBLOCK)
        writeSync(fd, "4242\n")
        writeFileSync(`${paths.pidFile}.new`, "4242\n")
        renameSync(`${paths.pidFile}.new`, paths.pidFile)
        closeSync(fd)
        // The reads stalled before it wait in libuv's thread pool (each blocked on the FIFO until
        // the write above); the one that answers may come after many turns of the loop, so the
        // wait is bounded by real time (a loaded CI machine, c132: 1,000 turns in 455 ms were not
        // enough), not by a count of turns.
        for (const deadline = Date.now() + 120_000; waiting.pollUnsafe() === undefined && Date.now() < deadline; ) {
          yield* Effect.promise(() => new Promise((r) => setTimeout(r, 5)))
          yield* TestClock.adjust(1000)
        }
        assert.deepStrictEqual(waiting.pollUnsafe(), Exit.succeed(4242))
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    }),
  )
})

describe("a resume's console size lookup that stalls", () => {
  it.effect("is made before cont and waited for by the tail, not made again after it: the ready line the guest writes after cont is seen", () =>
    Effect.gen(function* () {
      // The console: a boot's ready line in it already. A size lookup sees the size when it is
      // made, and answers when the test says (a stalled disk); reads from a point answer at once.
      let text = "boot\nengram-ready 1\n"
      const before = Buffer.byteLength(text)
      const held: (() => void)[] = []
      const asked: (number | "end")[] = []
      const read: Readiness.ReadFrom = (_path, offset) => {
        asked.push(offset)
        const size = Buffer.byteLength(text)
        if (offset === "end") return new Promise((resolve) => held.push(() => resolve({ bytes: Buffer.alloc(0), size })))
        const bytes = Buffer.from(text).subarray(offset)
        return Promise.resolve({ bytes, size: offset + bytes.length })
      }
      const starting = yield* Effect.forkChild(Readiness.tailFromEnd("/stalled/console.log", read))
      yield* TestClock.adjust(bound)
      const tail = yield* Fiber.join(starting)
      // `cont`: the guest runs and says it is ready.
      text += "engram-ready 2\n"
      const waiting = yield* Effect.forkChild(Readiness.awaitLine("/stalled/console.log", tail, ready, 20 * bound, () => true, 5))
      yield* TestClock.adjust(2 * bound)
      assert.isUndefined(waiting.pollUnsafe(), "the lookup has not answered: nothing read yet")
      assert.deepStrictEqual(asked, ["end"], "the lookup is waited for, not made again after cont")
      held.shift()?.()
      for (let i = 0; i < 100 && waiting.pollUnsafe() === undefined; i++) {
        yield* Effect.promise(() => new Promise((r) => setImmediate(r)))
        yield* TestClock.adjust(5)
      }
      assert.deepStrictEqual(waiting.pollUnsafe(), Exit.succeed("seen"))
      assert.deepStrictEqual(asked, ["end", before], "read from the size looked up before cont")
    }),
  )
})
