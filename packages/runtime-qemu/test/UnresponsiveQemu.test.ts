// The runtime against a fake QEMU (test/support/fake-qemu.mjs) whose monitor is busy when an
// agent restarts: a live QEMU is a guest, adopted whatever its monitor does, never replaced.
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { QemuRuntime } from "../src/index.js"
import * as FakeQemu from "./support/FakeQemu.js"

const spec = { vmId: "r1", memMib: 64, vcpus: 1 }

/** Starts `spec` with a first runtime and lets that runtime go (the agent restarts): the VM's QEMU lives on. Answers its pid. */
const startAndLeave = (config: QemuRuntime.QemuConfig) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const first = yield* QemuRuntime.make(config).pipe(Scope.provide(scope))
    yield* first.start(spec)
    const pid = first.pidOf(spec.vmId)
    yield* Scope.close(scope, Exit.void)
    assert.isDefined(pid)
    return pid!
  })

/**
 * A fake QEMU of `spec` started by a first runtime that then went (the agent restarts), its monitor
 * wedged for `wedgeMs` from then on; and the new runtime that finds it. Answers both, and its pid.
 */
const wedgedAfterRestart = (wedgeMs: number) =>
  Effect.gen(function* () {
    const fake = yield* FakeQemu.make("", { wedgeMs })
    const config = { ...fake.config, recoverAttachTimeoutMs: 300, attachRetryMaxMs: 200 }
    const pid = yield* startAndLeave(config)
    process.kill(pid, "SIGUSR1")
    yield* FakeQemu.eventually(Effect.suspend(() => (fake.lines().includes("wedged") ? Effect.void : Effect.fail("not wedged yet"))))
    return { fake, pid, rt: yield* QemuRuntime.make(config) }
  })

describe("an agent restart while a QEMU's monitor does not answer", () => {
  it.live(
    "the VM is listed as the agent knew it, a start of it is refused and its QEMU kept, and it is attached once its monitor answers",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          // Its monitor is held for 6 s (a descent's device save to a slow disk, say).
          const { fake, pid, rt } = yield* wedgedAfterRestart(6000)
          const recovered = yield* rt.recover([{ ...spec, status: "running" }])
          // recover gave up waiting (its bound is elapsed time) before the monitor answered again.
          assert.notInclude(fake.lines(), "unwedged")
          assert.deepStrictEqual(recovered, [{ ...spec, status: "running" }], "listed, as the agent last knew it")
          assert.deepStrictEqual((yield* rt.usage).map((u) => [u.vmId, u.pid]), [[spec.vmId, pid]], "measured: its RAM is the host's")
          const refused = yield* rt.start(spec).pipe(Effect.flip)
          assert.match(refused.message, /monitor does not answer yet/)
          assert.isTrue(FakeQemu.isAlive(pid), "the guest's QEMU is not ended")
          const parked = yield* rt.park(spec.vmId).pipe(Effect.flip)
          assert.match(parked.message, /monitor does not answer yet/)
          // Attached in the background once the monitor answers: the same QEMU, its status QEMU's.
          const st = yield* FakeQemu.eventually(rt.qmp<{ status: string }>(spec.vmId, "query-status"))
          assert.strictEqual(st.status, "running")
          assert.strictEqual(rt.pidOf(spec.vmId), pid)
          assert.deepStrictEqual(yield* rt.list, [{ ...spec, status: "running" }])
          assert.deepStrictEqual(fake.pids(), [pid], "no second QEMU was started")
          yield* rt.destroy(spec.vmId)
          assert.isFalse(FakeQemu.isAlive(pid))
        }),
      ),
    60_000,
  )

  it.live(
    "a VM whose monitor never answers is listed paused when the agent knew nothing of it, and destroy ends it",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { pid, rt } = yield* wedgedAfterRestart(600_000)
          assert.deepStrictEqual(yield* rt.recover([]), [{ ...spec, status: "paused" }])
          yield* rt.destroy(spec.vmId)
          assert.isFalse(FakeQemu.isAlive(pid))
          assert.deepStrictEqual(yield* rt.list, [])
        }),
      ),
    60_000,
  )
})

describe("a QEMU that ends while the runtime attaches it in the background", () => {
  it.live(
    "is dropped from the list (the agent's reconcile reads the list to notice a guest that vanished) and no longer measured",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const { pid, rt } = yield* wedgedAfterRestart(600_000)
          assert.deepStrictEqual(yield* rt.recover([{ ...spec, status: "running" }]), [{ ...spec, status: "running" }], "listed while it attaches")
          // Killed (an OOM kill, an operator's kill -9) before its monitor answers.
          process.kill(pid, "SIGKILL")
          yield* FakeQemu.eventually(Effect.flatMap(rt.list, (vms) => (vms.length === 0 ? Effect.void : Effect.fail("still listed"))))
          assert.deepStrictEqual(yield* rt.usage, [])
          assert.isFalse(FakeQemu.isAlive(pid))
        }),
      ),
    60_000,
  )
})

describe("the runtime's view of a guest running", () => {
  it.live(
    "follows QEMU's STOP and RESUME: a park whose stop timed out and ran late leaves the VM listed paused, and a cont lists it running",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const fake = yield* FakeQemu.make("stop-late")
          const rt = yield* QemuRuntime.make(fake.config)
          yield* rt.start(spec)
          const parked = yield* rt.park(spec.vmId).pipe(Effect.flip)
          assert.match(parked.message, /no answer to stop/)
          // The stop runs after its timeout: QEMU says STOP, and so does the runtime.
          const listed = (status: string) => FakeQemu.eventually(Effect.flatMap(rt.list, (vms) => (vms[0]?.status === status ? Effect.void : Effect.fail(`listed ${vms[0]?.status}, not ${status}`))), 200)
          yield* listed("paused")
          assert.include(fake.lines(), "event STOP {}")
          assert.strictEqual((yield* rt.usage)[0]?.status, "paused")
          yield* rt.unpark(spec.vmId)
          yield* listed("running")
          yield* rt.destroy(spec.vmId)
        }),
      ),
    60_000,
  )
})
