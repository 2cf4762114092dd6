// The runtime against a fake QEMU (test/support/fake-qemu.mjs) whose migrations stall: what
// is left running, paused or said afterwards. Bounds are small (migrationTimeoutMs 1.5 s); the
// tests assert what QEMU was told and what it answers, never how long anything took.
import { mkdirSync } from "node:fs"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { QemuRuntime } from "../src/index.js"
import * as FakeQemu from "./support/FakeQemu.js"

const spec = { vmId: "d1", memMib: 64, vcpus: 1 }

describe("a descent whose save stalls", () => {
  it.live(
    "fails once nothing was sent for migrationTimeoutMs, cancels the save (QEMU says cancelled) before it resumes the guest, and a second try is not refused",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("descent-stall")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec)
          const failed = yield* rt.descend(spec.vmId, join(fake.dir, "img", "image")).pipe(Effect.flip)
          const commands = fake.lines().filter((l) => l.startsWith("cmd ") || l.startsWith("event MIGRATION "))
          const cancelAt = commands.indexOf("cmd migrate_cancel")
          assert.isAbove(cancelAt, -1, "the save was cancelled")
          assert.isAbove(commands.indexOf(`event MIGRATION {"status":"cancelled"}`), cancelAt)
          assert.isAbove(commands.lastIndexOf("cmd cont"), commands.indexOf(`event MIGRATION {"status":"cancelled"}`), "the guest resumed once the save ended")
          assert.strictEqual((yield* rt.qmp<{ status?: string }>(spec.vmId, "query-migrate")).status, "cancelled", "nothing streams into the image any more")
          assert.strictEqual((yield* rt.qmp<{ status: string }>(spec.vmId, "query-status")).status, "running")
          assert.match(failed.message, /nothing sent for 1500 ms/)
          // Asked again: a new save starts (not "a migration in progress"), and stalls the same way.
          const again = yield* rt.descend(spec.vmId, join(fake.dir, "img", "image")).pipe(Effect.flip)
          assert.match(again.message, /nothing sent for 1500 ms/)
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )

  it.live(
    "that is slow but keeps sending completes, though it takes longer than migrationTimeoutMs in all",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          // 40 steps of 100 ms: 4 s in all, something sent at each.
          const fake = yield* FakeQemu.make("descent-slow", { steps: 40 })
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec)
          mkdirSync(join(fake.dir, "img")) // as the image store prepares it
          const image = yield* rt.descend(spec.vmId, join(fake.dir, "img", "image"))
          assert.strictEqual(image.method, "stream")
          assert.notInclude(fake.lines(), "cmd migrate_cancel")
          assert.deepStrictEqual(yield* rt.list, [], "the descended VM's QEMU is gone")
        }),
      ),
    60_000,
  )
})

const budget = { maxDowntimeMs: 600, commitAllowanceMs: 100, maxPreCopyRounds: 6 }
/** The fake sends nowhere: its final round stalls as one to a target that stopped reading. */
const endpoint = { runtime: "qemu", uri: "tcp:127.0.0.1:1" }

/**
 * A move of `spec` on a fake QEMU of `mode` (migrationTimeoutMs a minute: a switchover held for
 * it outlives the 20 s this waits) taken to its switchover, which must fail well before that.
 * Answers the fake, the runtime and the switchover's failure.
 */
const failedSwitchover = (mode: FakeQemu.FakeMode) =>
  Effect.gen(function* () {
    const fake = yield* FakeQemu.make(mode)
    const rt = yield* QemuRuntime.make({ ...fake.config, migrationTimeoutMs: 60_000, switchoverFloorMs: 500 })
    yield* rt.start(spec)
    const at = yield* rt.migrate(spec.vmId, { moveId: "mv", endpoint, budget, onRound: () => Effect.void })
    if (at._tag !== "AtSwitchover") return assert.fail(`the move reached ${at._tag}, not the switchover`)
    const failed = yield* at.switchover.pipe(Effect.flip, Effect.timeoutOption("20 seconds"))
    assert.isTrue(Option.isSome(failed), "the switchover ended well before migrationTimeoutMs")
    return { fake, rt, failed: Option.getOrThrow(failed) }
  })

describe("a move whose final round stalls", () => {
  it.live(
    "is cancelled once what is left of its downtime budget (at least the floor) has passed, not migrationTimeoutMs, and the guest runs on the source again",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, rt, failed } = yield* failedSwitchover("switchover-stall")
          assert.match(failed.message, /not ended within/)
          const lines = fake.lines()
          assert.include(lines, "cmd migrate_cancel")
          assert.isAbove(lines.lastIndexOf("event RESUME {}"), lines.indexOf("event STOP {}"), "the guest resumed after the stop")
          assert.strictEqual((yield* rt.qmp<{ status: string }>(spec.vmId, "query-status")).status, "running")
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "running" }])
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )

  it.live(
    "with a monitor that stops answering in it: nothing says the paused guest runs, no cont is sent, and unpark fails until QEMU answers",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, rt, failed } = yield* failedSwitchover("switchover-mute")
          assert.match(failed.message, /could not be given back/)
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "paused" }])
          assert.deepStrictEqual((yield* rt.usage).map((u) => u.status), ["paused"])
          assert.notInclude(fake.lines(), "cmd cont (muted: no answer)", "no cont while the migration may still complete")
          const unpark = yield* rt.unpark(spec.vmId).pipe(Effect.flip)
          assert.match(unpark.message, /does not answer/)
        }),
      ),
    60_000,
  )
})

/**
 * A parked guest on a fake QEMU whose `stop`s numbered `failedStops` fail (the park is the
 * first), streamed and given back at pre-switchover: QEMU leaves it in `postmigrate`.
 */
const inPostmigrate = (failedStops: readonly number[]) =>
  Effect.gen(function* () {
    const fake = yield* FakeQemu.make("switchover-stall", { failedStops })
    const rt = yield* QemuRuntime.make(fake.config)
    yield* rt.start(spec)
    yield* rt.park(spec.vmId)
    const at = yield* rt.migrate(spec.vmId, { moveId: "mv", endpoint, budget, onRound: () => Effect.void, overBudget: () => Effect.succeed(true) })
    if (at._tag !== "AtSwitchover") return assert.fail(`the move reached ${at._tag}, not the switchover`)
    yield* at.abort
    assert.strictEqual((yield* rt.qmp<{ status: string }>(spec.vmId, "query-status")).status, "postmigrate")
    return { fake, rt }
  })
/** The commands the fake was sent after its last `cont`. */
const afterLastCont = (fake: FakeQemu.FakeQemu) => {
  const commands = fake.lines().filter((l) => l.startsWith("cmd "))
  return commands.slice(commands.lastIndexOf("cmd cont"))
}

describe("a paused guest taken out of QEMU's postmigrate (cont, stop) before it is streamed again", () => {
  it.live(
    "whose stop fails twice: the stream fails saying the guest runs, and the VM is not listed paused",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, rt } = yield* inPostmigrate([2, 3])
          const failed = yield* rt.migrate(spec.vmId, { moveId: "mv", endpoint, budget, onRound: () => Effect.void }).pipe(Effect.flip)
          assert.match(failed.message, /could not be taken out of QEMU's postmigrate/)
          assert.match(failed.message, /fake: stop 3 failed; it was resumed \(cont\) and not stopped again: it runs here/)
          assert.deepStrictEqual(afterLastCont(fake).slice(0, 3), ["cmd cont", "cmd stop", "cmd stop"], "the stop was sent once more")
          assert.notInclude(afterLastCont(fake), "cmd migrate", "no stream of a running guest")
          assert.isTrue((yield* rt.qmp<{ running: boolean }>(spec.vmId, "query-status")).running)
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "running" }])
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )

  it.live(
    "whose first stop fails: the stop sent again pauses it, and the stream goes on",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { fake, rt } = yield* inPostmigrate([2])
          const at = yield* rt.migrate(spec.vmId, { moveId: "mv", endpoint, budget, onRound: () => Effect.void, overBudget: () => Effect.succeed(true) })
          assert.strictEqual(at._tag, "AtSwitchover")
          const sent = afterLastCont(fake)
          assert.deepStrictEqual(sent.slice(0, 3), ["cmd cont", "cmd stop", "cmd stop"])
          assert.include(sent, "cmd migrate")
          if (at._tag === "AtSwitchover") yield* at.abort
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "paused" }])
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )
})
