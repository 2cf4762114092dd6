/**
 * A descent image superseded by a newer state of its session is removed from the host's disk;
 * the only image a session could still be restored from never is.
 *
 * Before, the agent removed an image only after `started` answered for the restore that took it:
 * with that answer lost (the coordinator recorded the start) the image stayed on the host's disk
 * for as long as the session lived there (never restored again: descents judge images by their
 * tag), and so did an image kept as not of the session's last descent, and the earlier image a
 * descent marked superseded. Now an image under a session's id goes once the coordinator has the
 * session running or parked here and its guest is resident here (`supersededHere`: after
 * `started`, and by the scan beside the reconcile for what a lost answer left), and the earlier
 * image a descent marked superseded goes once that descent is recorded without it. A session
 * pending here keeps its image until its start is recorded. Only an image its tag proves older is
 * removed this way (a tag-less one a restore took is tagged then); a tag-less image not taken,
 * judged by the figures' clocks alone, is kept.
 */
import { rmSync } from "node:fs"
import { dirname, join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { Effect, Ref } from "effect"
import { CoordinatorError } from "../src/Coordinator.js"
import { makeFleet, type TestHost } from "./support/InProcess.js"
import { effect } from "./support/PatientClock.js"

type Fleet = Effect.Success<ReturnType<typeof makeFleet>>

/**
 * Switches the tests turn on: lose `started`'s answer once (recorded), fail `started` before it
 * is recorded (every call while on), crash the VM as its descent starts, refuse the image
 * store's removals (a disk that fails them).
 */
const faults = { loseStarted: false, refuseStarted: false, crashOnDescend: false, refuseRemove: false }
let fleet: Fleet | undefined

/** Host a with s1 (its figures carried, as the coordinator sends them: `createdAt` and `lastActiveAt`). */
const makeOne = Effect.gen(function* () {
  faults.loseStarted = false
  faults.refuseStarted = false
  faults.crashOnDescend = false
  faults.refuseRemove = false
  const f = yield* makeFleet([{ hostId: "a" }], {
    wrapCoordinator: (c) => ({
      ...c,
      started: (id) =>
        faults.refuseStarted
          ? Effect.fail(new CoordinatorError({ op: "started", status: 503, message: "the store call timed out" }))
          : Effect.andThen(
              c.started(id),
              Effect.suspend(() =>
                faults.loseStarted ? ((faults.loseStarted = false), Effect.fail(new CoordinatorError({ op: "started", status: null, message: "timed out (the answer was lost)" }))) : Effect.void,
              ),
            ),
    }),
    wrapImages: (images) => ({ ...images, remove: (id) => Effect.suspend(() => (faults.refuseRemove ? Effect.die(new Error("EBUSY: the disk refused the removal")) : images.remove(id))) }),
    onDescend: (_c, _hostId, vmId) => (faults.crashOnDescend ? Effect.suspend(() => fleet!.hosts[0]!.runtime.destroy(vmId)) : Effect.void),
  })
  fleet = f
  yield* f.coordinator.addSession("s1", "a", 1024, 1)
  yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 1_000, lastActiveAt: 1_000 }) }))
  return f
})

const session = (f: Fleet) => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")!)
const boots = (a: TestHost) => Ref.get(a.runtime.starts)

/** s1 runs on a, then descends there: a holds its image, the session descended. */
const descendedOnA = Effect.gen(function* () {
  const f = yield* makeOne
  const a = f.hosts[0]!
  yield* f.settle()
  yield* f.coordinator.setState("s1", "descending")
  yield* f.settle()
  assert.strictEqual((yield* session(f)).imageHostId, "a")
  assert.isDefined(yield* a.images.get("s1"))
  return { f, a }
})

describe("a descent image superseded by a newer state of its session", () => {
  effect("restored here with started's answer lost: removed once the session runs here, the guest untouched", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      faults.loseStarted = true
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      const s = yield* session(f)
      assert.strictEqual(s.state, "running")
      assert.include((yield* f.coordinator.get).calls, "started s1")
      assert.strictEqual(yield* boots(a), 1, "restored from its image, not booted")
      assert.isUndefined(yield* a.images.get("s1"), "the image the guest was restored from is gone from a's disk")
      assert.strictEqual((yield* a.runtime.list).find((v) => v.vmId === "s1")?.status, "running", "the guest runs on")
      // The next descent writes its own image, and a resume restores it.
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).imageHostId, "a")
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "running")
      assert.strictEqual(yield* boots(a), 1, "restored again, never booted")
      assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [])
    }),
  )

  effect("pending here, its start not recorded: the image is kept (the only copy) until the start is", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      faults.refuseStarted = true
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "pending")
      assert.isDefined(yield* a.images.get("s1"), "kept while the session is pending here")
      // The guest restored from it vanishes before the start is recorded: restored again from it.
      yield* a.runtime.destroy("s1")
      yield* f.settle()
      assert.strictEqual(yield* boots(a), 1, "restored again, not booted")
      faults.refuseStarted = false
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "running")
      assert.isUndefined(yield* a.images.get("s1"))
    }),
  )

  effect("an image not of the session's last descent (an ended session's of the same id) goes once the session runs here", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      // s1 ended and was pruned; a new s1 (never ran) is placed on a, where the old image lies.
      yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 9_000, lastActiveAt: 9_000, imageHostId: null }) }))
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "running")
      assert.strictEqual(yield* boots(a), 2, "booted fresh: the image is another session's")
      assert.isUndefined(yield* a.images.get("s1"), "the ended session's image is gone once the new one runs here")
    }),
  )

  effect("an older agent's tag-less image restored here with started's answer lost: tagged at the restore, then removed", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      yield* Effect.sync(() => rmSync(join(dirname(a.images.pathFor("s1")), "descent.json")))
      faults.loseStarted = true
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "running")
      assert.strictEqual(yield* boots(a), 1, "restored from its image, not booted")
      assert.isUndefined(yield* a.images.get("s1"))
    }),
  )

  effect("a tag-less image not taken (the new session never ran) is kept: nothing but the figures' clocks says whose it is", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      yield* Effect.sync(() => rmSync(join(dirname(a.images.pathFor("s1")), "descent.json")))
      yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 9_000, lastActiveAt: 9_000, imageHostId: null }) }))
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      assert.strictEqual((yield* session(f)).state, "running")
      assert.strictEqual(yield* boots(a), 2, "booted fresh")
      assert.isDefined(yield* a.images.get("s1"), "kept")
    }),
  )

  effect("the earlier image a descent marked superseded goes once that descent is recorded without it", () =>
    Effect.gen(function* () {
      const { f, a } = yield* descendedOnA
      // Restored on a with started's answer lost, and the disk refusing the removal meanwhile: the image stays.
      faults.loseStarted = true
      faults.refuseRemove = true
      yield* f.coordinator.place("s1", "a", "pending")
      yield* f.settle()
      faults.refuseRemove = false
      assert.isDefined(yield* a.images.get("s1"))
      // The guest crashes during the next descent: reported without an image, the earlier one marked superseded.
      faults.crashOnDescend = true
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      faults.crashOnDescend = false
      assert.include((yield* f.coordinator.get).calls, "descended s1 image=none")
      assert.isUndefined(yield* a.images.get("s1"), "the superseded image is gone once the descent is recorded")
    }),
  )
})
