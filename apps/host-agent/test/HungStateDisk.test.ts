// A state disk that hangs (a write of the state file that never returns) stalls nothing: the
// record in memory serves, the file catches up when the disk answers, and only a move's debt,
// which must be on disk, is refused meanwhile. The hang is a Deferred never completed: no sleeps.
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import * as LocalState from "../src/LocalState.js"
import { makeResidents, writeWaitMs } from "../src/Residents.js"
import { makeFleet } from "./support/InProcess.js"
import { effect, stepUntil } from "./support/PatientClock.js"

const vm = (vmId: string): LocalState.ResidentVm => ({ vmId, memMib: 256, vcpus: 1, status: "running", reservationId: `res-${vmId}`, moveId: null })
const owed = (sessionId: string): LocalState.PendingCommit => ({ moveId: `m-${sessionId}`, sessionId, phases: null })

/** A disk whose writes hang while `hangs` (until `answer`), keeping what each write wrote in `written`. */
const hangingDisk = Effect.sync(() => {
  const written: LocalState.StateFile[] = []
  let gate: Deferred.Deferred<void> | undefined
  let begun = 0
  const persist = (s: LocalState.StateFile) =>
    Effect.suspend(() => (begun++, gate === undefined ? Effect.void : Deferred.await(gate))).pipe(Effect.andThen(Effect.sync(() => void written.push(s))))
  return {
    written,
    /** How many writes have begun (landed or not). */
    begun: () => begun,
    persist,
    hang: Effect.sync(() => void (gate = Deferred.makeUnsafe<void>())),
    answer: Effect.suspend(() => {
      const g = gate
      gate = undefined
      return g === undefined ? Effect.void : Deferred.succeed(g, undefined)
    }),
  }
})

/** What was logged, each line's level and text. */
const captured = () => {
  const lines: { readonly level: string; readonly message: string }[] = []
  const layer = Logger.layer([
    Logger.make(({ logLevel, message }) => void lines.push({ level: logLevel, message: String(Array.isArray(message) ? message[0] : message) })),
  ])
  const said = (level: string, prefix: string) => lines.filter((l) => l.level === level && l.message.startsWith(prefix)).length
  return { layer, said }
}

/** Whether the fiber has ended, after letting the fibers a step woke run. */
const ended = (f: Fiber.Fiber<unknown, unknown>) => Effect.andThen(Effect.yieldNow, Effect.sync(() => f.pollUnsafe() !== undefined))

describe("a state disk that hangs", () => {
  it.effect("a change waits for a hung write at most writeWaitMs, then goes on from memory; later changes do not wait; the file catches up with the latest record when the disk answers", () => {
    const logs = captured()
    return Effect.gen(function* () {
      const disk = yield* hangingDisk
      const residents = yield* makeResidents("a", null, disk.persist)
      yield* residents.put(vm("s1"))
      yield* disk.hang
      const first = yield* Effect.forkChild(residents.put(vm("s2")), { startImmediately: true })
      assert.isFalse(yield* ended(first), "a change waits for its write a while")
      yield* TestClock.adjust(writeWaitMs)
      assert.isTrue(yield* ended(first), "and no longer than writeWaitMs")
      assert.strictEqual(logs.said("Error", "state file write has not returned"), 1)
      // While the write hangs, changes hold at once, with no clock moved.
      const later = yield* Effect.forkChild(Effect.andThen(residents.remove("s1"), residents.put(vm("s3"))), { startImmediately: true })
      assert.isTrue(yield* ended(later), "a change made while a write hangs does not wait")
      assert.deepStrictEqual((yield* residents.all).map((v) => v.vmId), ["s2", "s3"])
      // A move's debt is refused at once (it must be on disk), the record unchanged.
      const debt = yield* Effect.flip(residents.owePaused(owed("s2")))
      assert.strictEqual(debt._tag, "StateFileHangs")
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
      assert.strictEqual((yield* residents.get("s2"))?.status, "running")
      assert.strictEqual(logs.said("Error", "state file write has not returned"), 1, "said once per hang")
      // The disk answers: the hung write lands, then one more with the record as it is now.
      yield* disk.answer
      yield* stepUntil("the file caught up", () => Effect.succeed(disk.written.length === 3))
      assert.deepStrictEqual(disk.written[1]!.vms.map((v) => v.vmId), ["s1", "s2"], "the write that hung")
      assert.deepStrictEqual(disk.written[2]!.vms.map((v) => v.vmId), ["s2", "s3"], "the latest record, in one write")
      assert.strictEqual(logs.said("Warn", "state file write returned after hanging"), 1)
      // Healthy again: a move's debt is written and held.
      yield* residents.owePaused(owed("s2"))
      assert.deepStrictEqual((yield* residents.pendingCommits).map((p) => p.moveId), ["m-s2"])
      assert.deepStrictEqual(disk.written.at(-1)!.pendingCommits.map((p) => p.moveId), ["m-s2"])
    }).pipe(Effect.provide(logs.layer))
  })

  it.effect("a move's debt whose caller stopped waiting (the pause's bound) is not taken in the record when its write lands later", () =>
    Effect.gen(function* () {
      const disk = yield* hangingDisk
      const residents = yield* makeResidents("a", { ...LocalState.empty("a"), vms: [vm("s1")] }, disk.persist)
      yield* disk.hang
      const gaveUp = yield* residents.owePaused(owed("s1")).pipe(Effect.timeoutOption("500 millis"), Effect.forkChild({ startImmediately: true }))
      yield* TestClock.adjust("500 millis")
      assert.strictEqual((yield* Fiber.join(gaveUp))._tag, "None")
      // As the move does once the pause is given back: this change waits its while for the hung write.
      const removing = yield* Effect.forkChild(residents.removePendingCommit("m-s1"), { startImmediately: true })
      yield* TestClock.adjust(writeWaitMs)
      yield* Fiber.join(removing)
      yield* disk.answer
      yield* stepUntil("the file caught up", () => Effect.succeed(disk.written.length === 2))
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
      assert.strictEqual((yield* residents.get("s1"))?.status, "running")
      assert.deepStrictEqual(disk.written[1]!.pendingCommits, [], "the next write puts the file back in line with the record")
    }))

  effect("an agent on a hung state disk goes on: its reconcile pass is not held, a session placed here starts and is reported, one ended here is destroyed", () =>
    Effect.gen(function* () {
      const gate = Deferred.makeUnsafe<void>()
      let hanging = false
      const f = yield* makeFleet([{ hostId: "a" }], { onPersist: () => Effect.suspend(() => (hanging ? Deferred.await(gate) : Effect.void)) })
      const a = f.hosts[0]!
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.coordinator.addSession("s2", "a", 512)
      yield* f.settle(2)
      hanging = true
      // s1 takes a new reservation here (the pass adopts it: a change of the record in the pass itself).
      yield* f.coordinator.place("s1", "a", "running")
      yield* f.coordinator.addSession("s3", "a", 512)
      yield* f.coordinator.setState("s2", "ended")
      const pass = yield* Effect.forkChild(f.pass, { startImmediately: true })
      yield* stepUntil("the pass ends", () => ended(pass))
      yield* f.quiesce
      yield* f.pass
      yield* f.quiesce
      const s = yield* f.coordinator.get
      assert.strictEqual(s.sessions.get("s3")?.state, "running", "the new session started and was reported")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => v.vmId).sort(), ["s1", "s3"], "the ended session's VM is destroyed")
      assert.deepStrictEqual((yield* a.residents.all).map((v) => [v.vmId, v.reservationId]).sort(), [["s1", "res-s1-a"], ["s3", "res-s3"]])
      yield* Deferred.succeed(gate, undefined)
    }))

  effect("a debt given up before its write begins is not written after the change that meant to clear it (one queued ahead of it)", () =>
    Effect.gen(function* () {
      const disk = yield* hangingDisk
      const residents = yield* makeResidents("a", null, disk.persist)
      yield* residents.put(vm("s1"))
      yield* disk.hang
      // A write in flight on a slow disk, and another change queued behind it.
      yield* Effect.forkChild(residents.put(vm("s2")), { startImmediately: true })
      yield* stepUntil("the write began", () => Effect.sync(() => disk.begun() === 2))
      yield* Effect.forkChild(residents.put(vm("s3")), { startImmediately: true })
      // The move's debt: its write waits behind both, and its caller gives up first (the pause's bound).
      const debt = yield* Effect.forkChild(residents.owePaused(owed("s1")).pipe(Effect.timeoutOption("500 millis")), { startImmediately: true })
      yield* TestClock.adjust("500 millis")
      yield* Fiber.join(debt)
      // The move ends: its debt goes (a change that joins the write queued ahead of the debt's).
      yield* Effect.forkChild(residents.removePendingCommit("m-s1"), { startImmediately: true })
      yield* disk.answer
      yield* stepUntil("every write landed", () => Effect.sync(() => disk.written.length >= 4 && disk.begun() === disk.written.length))
      yield* TestClock.adjust(writeWaitMs)
      const last = disk.written.at(-1)!
      assert.deepStrictEqual(last.pendingCommits, [], "the file's last record owes nothing")
      assert.strictEqual(last.vms.find((v) => v.vmId === "s1")?.status, "running")
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
    }),
  )
})
