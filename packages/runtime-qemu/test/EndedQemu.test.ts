// The runtime against a fake QEMU (test/support/fake-qemu.mjs) that ends by itself while the
// runtime holds its VM (an OOM kill, an operator's kill -9, a crash): the VM leaves the list the
// agent's reconcile reads, and is logged; an end the runtime asked for, or a monitor that stops
// answering or closes while QEMU lives, is no such end. A monitor connection that closes while
// QEMU lives is connected again.
import { existsSync, mkdirSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Logger, Scope } from "effect"
import { TestClock } from "effect/testing"
import { nowMs } from "@engram/runtime"
import { QemuProcess, QemuRuntime } from "../src/index.js"
import * as FakeQemu from "./support/FakeQemu.js"

const spec = (vmId: string) => ({ vmId, memMib: 64, vcpus: 1 })

interface Logged {
  readonly level: string
  readonly message: string
  readonly fields: Readonly<Record<string, unknown>>
}

/** Runs `f` with every log line it (and every fiber it forks) writes kept in `logged`. */
const withLogs = <A, E, R>(f: (logged: Logged[]) => Effect.Effect<A, E, R>) => {
  const logged: Logged[] = []
  const capture = Logger.make(({ logLevel, message }) => {
    const [text, fields] = Array.isArray(message) ? message : [message]
    logged.push({ level: logLevel, message: String(text), fields: (fields ?? {}) as Record<string, unknown> })
  })
  return f(logged).pipe(Effect.provide(Logger.layer([capture])))
}

/** The crash lines logged so far (a QEMU that ended by itself). */
const crashes = (logged: readonly Logged[]) => logged.filter((l) => l.message.startsWith("QEMU VM ended by itself"))
/** The lines saying a VM's monitor connection closed while its QEMU runs, and those saying it is back. */
const lost = (logged: readonly Logged[]) => logged.filter((l) => l.message.startsWith("QEMU VM's monitor connection closed while its QEMU runs"))
const back = (logged: readonly Logged[]) => logged.filter((l) => l.message.startsWith("QEMU VM's monitor is back"))

/** Waits (polling, 50 ms apart, 10 s at most) until the runtime lists exactly `vmIds`. */
const listedOnly = (rt: QemuRuntime.QemuRuntimeShape, vmIds: readonly string[]) =>
  FakeQemu.eventually(
    Effect.flatMap(rt.list, (vms) => {
      const listed = vms.map((v) => v.vmId).sort()
      return listed.join() === [...vmIds].sort().join() ? Effect.void : Effect.fail(`listed ${listed.join()}, not ${vmIds.join()}`)
    }),
    200,
  )

describe("a QEMU that ends by itself while the runtime holds its VM", () => {
  it.live("a started VM whose QEMU is killed leaves the list and usage, is logged as ended by SIGKILL, its files go, and it starts again", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec("k1"))
          yield* rt.start(spec("k2"))
          const pid = rt.pidOf("k1")!
          process.kill(pid, "SIGKILL")
          yield* listedOnly(rt, ["k2"])
          assert.deepStrictEqual((yield* rt.usage).map((u) => u.vmId), ["k2"], "no longer measured")
          assert.isFalse(existsSync(QemuProcess.pathsOf(fake.config.stateDir, "k1").dir), "its files are removed")
          const [line, ...more] = crashes(logged)
          assert.lengthOf(more, 0)
          assert.strictEqual(line?.level, "Error")
          assert.include(line?.fields, { vmId: "k1", pid, ended: "killed by SIGKILL", signal: "SIGKILL" })
          // The agent boots a fresh guest of the session: the same VM id starts.
          yield* rt.start(spec("k1"))
          assert.notStrictEqual(rt.pidOf("k1"), pid)
          yield* listedOnly(rt, ["k1", "k2"])
          yield* rt.destroy("k1")
          yield* rt.destroy("k2")
          assert.lengthOf(crashes(logged), 1, "a destroy is no crash")
        }),
      ),
    ),
  )

  it.live("a VM adopted after an agent restart whose QEMU is killed leaves the list, logged with its pid (its exit status unknown: no child)", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("")
          const first = yield* Scope.make()
          yield* QemuRuntime.make(fake.config).pipe(
            Effect.flatMap((rt) => rt.start(spec("a1"))),
            Scope.provide(first),
          )
          yield* Scope.close(first, Exit.void)
          const rt = yield* QemuRuntime.make(fake.config)
          assert.deepStrictEqual((yield* rt.recover([])).map((v) => v.vmId), ["a1"])
          const pid = rt.pidOf("a1")
          assert.isDefined(pid, "attached (its monitor answered)")
          process.kill(pid!, "SIGKILL")
          yield* listedOnly(rt, [])
          assert.deepStrictEqual(yield* rt.usage, [])
          const [line, ...more] = crashes(logged)
          assert.lengthOf(more, 0)
          assert.include(line?.fields, { vmId: "a1", pid })
          assert.match(String(line?.fields["ended"]), /exit status unknown.*adopted after a restart/)
          assert.lengthOf(lost(logged), 0, "the first runtime's end closed its connection: no lost monitor")
        }),
      ),
    ),
  )

  it.live("a VM destroyed through the runtime, or descended (its QEMU ended by the descent), is not logged as a crash", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec("d1"))
          const destroyed = rt.pidOf("d1")!
          yield* rt.destroy("d1")
          assert.isFalse(FakeQemu.isAlive(destroyed))
          yield* rt.start(spec("s1"))
          const descended = rt.pidOf("s1")!
          mkdirSync(join(fake.dir, "img")) // as the image store prepares it
          yield* rt.descend("s1", join(fake.dir, "img", "image"))
          assert.isFalse(FakeQemu.isAlive(descended))
          // A VM killed after them: once its end is logged, theirs would have been too.
          yield* rt.start(spec("d2"))
          process.kill(rt.pidOf("d2")!, "SIGKILL")
          yield* listedOnly(rt, [])
          yield* FakeQemu.eventually(Effect.suspend(() => (crashes(logged).length > 0 ? Effect.void : Effect.fail("not logged yet"))), 200)
          assert.deepStrictEqual(crashes(logged).map((l) => l.fields["vmId"]), ["d2"])
          assert.lengthOf(lost(logged), 0, "the runtime's own ends are no lost monitor")
        }),
      ),
    ),
  )

  it.live("a QEMU killed during a descent: the descent fails, the VM is dropped once and logged once, and it starts again", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("descent-stall")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec("m1"))
          const pid = rt.pidOf("m1")!
          mkdirSync(join(fake.dir, "img"))
          const descent = yield* Effect.forkChild(rt.descend("m1", join(fake.dir, "img", "image")))
          yield* FakeQemu.eventually(Effect.suspend(() => (fake.lines().includes("cmd migrate") ? Effect.void : Effect.fail("no save yet"))), 200)
          process.kill(pid, "SIGKILL")
          const failed = yield* Fiber.join(descent).pipe(Effect.flip)
          assert.strictEqual(failed.vmId, "m1")
          yield* listedOnly(rt, [])
          assert.deepStrictEqual(crashes(logged).map((l) => l.fields["vmId"]), ["m1"])
          yield* rt.destroy("m1") // the agent's destroy of what it held: nothing left, no second end
          yield* rt.start(spec("m1"))
          yield* listedOnly(rt, ["m1"])
          assert.lengthOf(crashes(logged), 1)
        }),
      ),
    ),
  )

  it.live("a live QEMU whose monitor stops answering stays listed, one whose monitor connection closes is reconnected; once killed, each leaves", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("", { wedgeMs: 600_000 })
          const rt = yield* QemuRuntime.make(fake.config)
          for (const id of ["w1", "c1", "x1"]) yield* rt.start(spec(id))
          const [wedged, closed, killed] = [rt.pidOf("w1")!, rt.pidOf("c1")!, rt.pidOf("x1")!]
          process.kill(wedged, "SIGUSR1") // its monitor answers nothing more (a long device save, say)
          process.kill(closed, "SIGUSR2") // its monitor closes the runtime's connection, QEMU lives on
          yield* FakeQemu.eventually(Effect.suspend(() => (back(logged).length > 0 ? Effect.void : Effect.fail("not reconnected yet"))), 200)
          assert.strictEqual((yield* rt.qmp<{ status: string }>("c1", "query-status")).status, "running", "its monitor answers on the new connection")
          assert.deepStrictEqual([...lost(logged), ...back(logged)].map((l) => [l.level, l.fields["vmId"], l.fields["pid"]]), [["Warn", "c1", closed], ["Info", "c1", closed]])
          yield* FakeQemu.eventually(Effect.suspend(() => (fake.lines().includes("wedged") ? Effect.void : Effect.fail("not wedged yet"))), 200)
          // A QEMU killed after both: once it has left the list, the others would have too.
          process.kill(killed, "SIGKILL")
          yield* listedOnly(rt, ["c1", "w1"])
          assert.deepStrictEqual(crashes(logged).map((l) => l.fields["vmId"]), ["x1"])
          assert.isTrue(FakeQemu.isAlive(wedged) && FakeQemu.isAlive(closed), "nothing of a live QEMU is ended")
          assert.isTrue(existsSync(QemuProcess.pathsOf(fake.config.stateDir, "c1").dir), "nor are its files removed")
          // Reconnected, the VM's QEMU is still watched: its end is noticed.
          process.kill(closed, "SIGKILL")
          yield* listedOnly(rt, ["w1"])
          assert.deepStrictEqual(crashes(logged).map((l) => l.fields["vmId"]), ["x1", "c1"])
        }),
      ),
    ),
  )
})

/**
 * A VM of a fake QEMU, started on a TestClock, whose monitor then held its greeting (`wedgeMs`,
 * real time) and closed the runtime's connection, QEMU living on: answers once the runtime said
 * the monitor is lost (a warning) and reconnects. Bounds are generous: the TestClock is moved
 * faster than real time while the fake starts (`FakeQemu.pumped`).
 */
const monitorLost = (logged: Logged[], wedgeMs: number) =>
  Effect.gen(function* () {
    const fake = yield* FakeQemu.make("", { wedgeMs })
    const config = { ...fake.config, qmpTimeoutMs: 60_000, startTimeoutMs: 600_000 }
    const rt = yield* FakeQemu.pumped(QemuRuntime.make(config))
    yield* FakeQemu.pumped(rt.start(spec("v1")))
    const pid = rt.pidOf("v1")!
    process.kill(pid, "SIGUSR1") // no greeting for a new client until it is unwedged
    yield* FakeQemu.until(() => fake.lines().includes("wedged"), "the fake's monitor wedged")
    process.kill(pid, "SIGUSR2")
    yield* FakeQemu.pumpUntil(() => lost(logged).length > 0, "the runtime to say the monitor is lost")
    return { fake, config, rt, pid }
  })

describe("a VM whose monitor connection closes while its QEMU lives (on a TestClock)", () => {
  it.effect("is reconnected: a park issued meanwhile waits for it and runs, later commands work, the loss and the return are logged", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, rt, pid } = yield* monitorLost(logged, 1500)
          assert.include(lost(logged)[0]?.fields, { vmId: "v1", pid })
          assert.strictEqual(lost(logged)[0]?.level, "Warn")
          // The TestClock stands still: the park waits for the reconnect (the fake greets again after 1.5 s of real time), not for its bound.
          const park = yield* Effect.forkChild(rt.park("v1"))
          yield* FakeQemu.until(() => park.pollUnsafe() !== undefined, "the park to end")
          yield* Fiber.join(park)
          assert.deepStrictEqual(yield* rt.list, [{ ...spec("v1"), status: "paused" }])
          yield* FakeQemu.pumped(rt.unpark("v1"))
          assert.deepStrictEqual(yield* rt.list, [{ ...spec("v1"), status: "running" }])
          const afterClose = fake.lines().slice(fake.lines().indexOf("monitor closed"))
          assert.includeMembers(afterClose, ["cmd qmp_capabilities", "cmd stop", "cmd cont"], "negotiated again, then the commands on the new connection")
          assert.deepStrictEqual(fake.pids(), [pid], "the same QEMU: no second one started")
          const [up, ...more] = back(logged)
          assert.lengthOf(more, 0)
          assert.strictEqual(up?.level, "Info")
          assert.include(up?.fields, { vmId: "v1", pid })
          yield* FakeQemu.pumped(rt.destroy("v1"))
          assert.isFalse(FakeQemu.isAlive(pid))
          assert.lengthOf(crashes(logged), 0, "a destroy is no crash")
          assert.lengthOf(lost(logged), 1, "nor a lost monitor")
        }),
      ),
    ),
  )

  it.effect("a command waits for the reconnect no longer than its timeout and fails unsent, saying so; a destroy meanwhile ends the VM, no crash, its files removed", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, config, rt, pid } = yield* monitorLost(logged, 600_000)
          const asked = yield* Effect.forkChild(rt.qmp("v1", "query-status"))
          yield* TestClock.adjust(config.qmpTimeoutMs)
          yield* FakeQemu.until(() => asked.pollUnsafe() !== undefined, "the command to end")
          const failed = yield* Fiber.join(asked).pipe(Effect.flip)
          assert.match(failed.message, /not sent: the monitor's connection closed while QEMU runs and it was not reconnected within 60000 ms/)
          assert.notInclude(fake.lines().slice(fake.lines().indexOf("monitor closed")), "cmd query-status")
          yield* FakeQemu.pumped(rt.destroy("v1"))
          assert.isFalse(FakeQemu.isAlive(pid))
          assert.isFalse(existsSync(QemuProcess.pathsOf(config.stateDir, "v1").dir), "its files are removed")
          assert.deepStrictEqual(yield* rt.list, [])
          // Past the reconnect's pauses (1 s at most each): it would have said something by now.
          yield* FakeQemu.pumpFor(3000)
          assert.lengthOf(crashes(logged), 0, "a destroy is no crash")
          assert.lengthOf(back(logged), 0)
        }),
      ),
    ),
  )

  it.effect("its QEMU dying during the reconnect drops it once, as a crash; a command waiting meanwhile fails", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const { config, rt, pid } = yield* monitorLost(logged, 600_000)
          const asked = yield* Effect.forkChild(rt.qmp("v1", "query-status"))
          process.kill(pid, "SIGKILL")
          yield* FakeQemu.pumpUntil(() => rt.pidOf("v1") === undefined && crashes(logged).length > 0, "the VM to be dropped")
          const failed = yield* Fiber.join(asked).pipe(Effect.flip)
          assert.match(failed.message, /the VM was ended/)
          assert.deepStrictEqual(yield* rt.list, [])
          assert.isFalse(existsSync(QemuProcess.pathsOf(config.stateDir, "v1").dir), "its files are removed")
          yield* FakeQemu.pumpFor(3000)
          const [line, ...more] = crashes(logged)
          assert.lengthOf(more, 0, "dropped once")
          assert.strictEqual(line?.level, "Error")
          assert.include(line?.fields, { vmId: "v1", pid, ended: "killed by SIGKILL" })
          assert.lengthOf(back(logged), 0)
        }),
      ),
    ),
  )

  /**
   * A descent (`descent-slow`: 5 rounds, 100 ms of real time each, then `completed`; or
   * `descent-fail`: then `failed`) whose monitor closes once it answered the `migrate` and holds
   * its greeting for 1.5 s of real time: QEMU's end of the save goes to no connection. Its
   * progress bound is 10 minutes of the TestClock; the clock is moved until the descent ends.
   */
  const descentLost = (mode: "descent-slow" | "descent-fail") =>
    Effect.gen(function* () {
      const fake = yield* FakeQemu.make(mode, { wedgeMs: 1500, steps: 5, dropOnMigrate: true })
      const config = { ...fake.config, qmpTimeoutMs: 60_000, startTimeoutMs: 600_000, migrationTimeoutMs: 600_000 }
      const rt = yield* FakeQemu.pumped(QemuRuntime.make(config))
      yield* FakeQemu.pumped(rt.start(spec("v1")))
      const pid = rt.pidOf("v1")!
      mkdirSync(join(fake.dir, "img"))
      const t0 = yield* nowMs
      const descent = yield* Effect.forkChild(Effect.result(rt.descend("v1", join(fake.dir, "img", "image"))))
      yield* FakeQemu.pumpUntil(() => descent.pollUnsafe() !== undefined, "the descent to end")
      const result = yield* Fiber.join(descent)
      const afterClose = fake.lines().slice(fake.lines().indexOf("monitor closed"))
      return { fake, rt, pid, result, tookMs: (yield* nowMs) - t0, afterClose }
    })

  it.effect("a descent whose save completes while its monitor is being reconnected completes once it is back, not at its progress bound", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const { rt, pid, result, tookMs, afterClose } = yield* descentLost("descent-slow")
          assert.isTrue(afterClose.some((l) => l.startsWith("event MIGRATION {\"status\":\"completed\"}")), "QEMU completed the save while no connection was up")
          assert.strictEqual(result._tag, "Success", `the descent completed: ${result._tag === "Failure" ? result.failure.message : ""}`)
          assert.isBelow(tookMs, 60_000, "well before its 10-minute progress bound")
          assert.isFalse(FakeQemu.isAlive(pid), "its QEMU ended by the descent")
          assert.deepStrictEqual(yield* rt.list, [])
          assert.include(back(logged)[0]?.fields, { vmId: "v1", migration: "completed" })
          assert.lengthOf(crashes(logged), 0)
        }),
      ),
    ),
  )

  it.effect("a descent whose save fails while its monitor is being reconnected fails once it is back, with QEMU's reason, and the guest is given back", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          const { rt, pid, result, tookMs, afterClose } = yield* descentLost("descent-fail")
          assert.isTrue(afterClose.some((l) => l.startsWith("event MIGRATION {\"status\":\"failed\"}")), "QEMU failed the save while no connection was up")
          assert.strictEqual(result._tag, "Failure")
          if (result._tag === "Failure") assert.match(result.failure.message, /migration failed: fake: Unable to write to command: Broken pipe/)
          assert.isBelow(tookMs, 60_000, "well before its 10-minute progress bound")
          assert.isTrue(FakeQemu.isAlive(pid))
          assert.deepStrictEqual(yield* rt.list, [{ ...spec("v1"), status: "running" }], "the guest runs again where it was")
          yield* FakeQemu.pumped(rt.destroy("v1"))
          assert.lengthOf(crashes(logged), 0)
        }),
      ),
    ),
  )

  it.effect("a move whose source reaches pre-switchover while its monitor is being reconnected acts on it once it is back, its pause counted from the loss", () =>
    withLogs((logged) =>
      Effect.scoped(
        Effect.gen(function* () {
          // The fake stops the guest and waits at pre-switchover 80 ms after the `migrate`: both unseen.
          const fake = yield* FakeQemu.make("switchover-stall", { wedgeMs: 1500, dropOnMigrate: true })
          const config = { ...fake.config, qmpTimeoutMs: 60_000, startTimeoutMs: 600_000, migrationTimeoutMs: 600_000 }
          const rt = yield* FakeQemu.pumped(QemuRuntime.make(config))
          yield* FakeQemu.pumped(rt.start(spec("v1")))
          const budget = { maxDowntimeMs: 600, commitAllowanceMs: 100, maxPreCopyRounds: 6 }
          const t0 = yield* nowMs
          const moved = yield* FakeQemu.pumped(rt.migrate("v1", { moveId: "mv", endpoint: { runtime: "qemu", uri: "tcp:127.0.0.1:1" }, budget, onRound: () => Effect.void }))
          assert.isBelow((yield* nowMs) - t0, 60_000, "well before migrationTimeoutMs")
          const afterClose = fake.lines().slice(fake.lines().indexOf("monitor closed"))
          assert.includeMembers(afterClose, ["event STOP {}", 'event MIGRATION {"status":"pre-switchover"}'], "QEMU stopped the guest and waited while no connection was up")
          if (moved._tag !== "Aborted") return assert.fail(`the move ended ${moved._tag}, not Aborted at post-capture`)
          assert.strictEqual(moved.stage, "post-capture")
          // The capture and the pause span the 1.5 s the monitor held its greeting: counted long, never short.
          assert.isAtLeast(moved.captureMs, 1000)
          assert.isAbove(moved.pausedMs, 0)
          assert.include(afterClose, "cmd migrate_cancel", "cancelled at pre-switchover: the guest resumes on the source")
          assert.deepStrictEqual(yield* rt.list, [{ ...spec("v1"), status: "running" }])
          assert.include(back(logged)[0]?.fields, { vmId: "v1", migration: "pre-switchover", status: "paused" })
          yield* FakeQemu.pumped(rt.destroy("v1"))
        }),
      ),
    ),
  )
})
