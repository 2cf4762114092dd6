/**
 * A descent on a host that still holds an earlier image of the same session: its first descent
 * here, then a resume restored it here and the image stayed (the coordinator recorded `started`
 * and its answer was lost, so the image was never removed), and the session ran on. Its guest then
 * vanishes before or during the next descent (its VM crashed). Before, a descent with no resident
 * VM took any image under the session's id for its own and reported the session descended with
 * it: the coordinator named this host as holding the image, and a resume restored the earlier
 * image (a descent whose capture failed had cleared its tag, which passes for the session's):
 * the user's guest silently went back to an earlier state. Now only an image whose tag names this
 * descent (or one this agent wrote for it) is reported: the descent is imageless
 * (`descended?image=none`), the loss is told once, the earlier image is tagged as superseded
 * (kept, never restored into the session) and the resume boots fresh. A descent that wrote its
 * image and whose `descended` report failed is still reported with it when retried.
 */
import { assert, describe } from "@effect/vitest"
import { Effect, Ref } from "effect"
import { lostReasonOf } from "../src/Agent.js"
import { CoordinatorError } from "../src/Coordinator.js"
import { makeFleet, type TestHost } from "./support/InProcess.js"
import { effect } from "./support/PatientClock.js"

type Fleet = Effect.Success<ReturnType<typeof makeFleet>>

/**
 * Switches the tests turn on: lose `started`'s answer once (recorded), fail `descended` once (not
 * recorded), crash the VM as its descent starts, refuse the image store's removals (a disk that
 * fails them: the agent removes an image superseded by a guest running here, `SupersededImage`).
 */
const faults = { loseStarted: false, failDescended: false, crashOnDescend: false, refuseRemove: false }
let fleet: Fleet | undefined

const makeOne = Effect.gen(function* () {
  faults.loseStarted = false
  faults.failDescended = false
  faults.crashOnDescend = false
  faults.refuseRemove = false
  const f = yield* makeFleet([{ hostId: "a" }], {
    wrapImages: (images) => ({ ...images, remove: (id) => Effect.suspend(() => (faults.refuseRemove ? Effect.die(new Error("EBUSY: the disk refused the removal")) : images.remove(id))) }),
    wrapCoordinator: (c) => ({
      ...c,
      started: (id) =>
        Effect.andThen(
          c.started(id),
          Effect.suspend(() =>
            faults.loseStarted ? ((faults.loseStarted = false), Effect.fail(new CoordinatorError({ op: "started", status: null, message: "timed out (the answer was lost)" }))) : Effect.void,
          ),
        ),
      descended: (id, options) =>
        Effect.suspend(() =>
          faults.failDescended ? ((faults.failDescended = false), Effect.fail(new CoordinatorError({ op: "descended", status: 503, message: "the store call timed out" }))) : c.descended(id, options),
        ),
    }),
    // The VM crashes as its descent begins: the capture finds no VM and fails.
    onDescend: (_c, _hostId, vmId) => (faults.crashOnDescend ? Effect.suspend(() => fleet!.hosts[0]!.runtime.destroy(vmId)) : Effect.void),
  })
  fleet = f
  // s1 carries its figures, as the coordinator sends them: the descent tags its image with them.
  yield* f.coordinator.addSession("s1", "a", 1024, 1)
  yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 1_000, lastActiveAt: 1_000 }) }))
  return f
})

const session = (f: Fleet) => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")!)
/** How many guests a booted (a restore from an image is not a boot). */
const boots = (a: TestHost) => Ref.get(a.runtime.starts)

/**
 * s1 descended on a, resumed and restored there with `started`'s answer lost (the image stays),
 * running on: a holds the earlier descent's image while the session runs (its removal, as
 * superseded by the guest running here, failed meanwhile: the disk refused it).
 */
const earlierImageLeftBehind = Effect.gen(function* () {
  const f = yield* makeOne
  const a = f.hosts[0]!
  yield* f.settle()
  yield* f.coordinator.setState("s1", "descending")
  yield* f.settle()
  assert.strictEqual((yield* session(f)).imageHostId, "a")
  faults.loseStarted = true
  faults.refuseRemove = true
  yield* f.coordinator.place("s1", "a", "pending")
  yield* f.settle()
  faults.refuseRemove = false
  assert.strictEqual((yield* session(f)).state, "running")
  assert.strictEqual(yield* boots(a), 1, "restored from its image, not booted")
  assert.isDefined(yield* a.images.get("s1"), "the earlier descent's image is still on a")
  return { f, a }
})

/** Resumes s1 on a and answers how its guest came to run there: booted fresh, or restored from an image. */
const resumeHere = (f: Fleet, a: TestHost) =>
  Effect.gen(function* () {
    const before = yield* boots(a)
    yield* f.coordinator.place("s1", "a", "pending")
    yield* f.settle()
    assert.strictEqual((yield* session(f)).state, "running")
    return (yield* boots(a)) > before ? "boot" : "image"
  })

describe("a descent beside an earlier image of its session", () => {
  effect("the guest crashes during the descent: reported without an image, the loss told once, and the resume boots fresh (not the earlier image)", () =>
    Effect.gen(function* () {
      const { f, a } = yield* earlierImageLeftBehind
      faults.crashOnDescend = true
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      faults.crashOnDescend = false
      const s = yield* session(f)
      assert.strictEqual(s.state, "descended")
      assert.strictEqual(s.imageHostId, null, "no host is named as holding this descent's image")
      assert.include((yield* f.coordinator.get).calls, "descended s1 image=none")
      assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "descending") }])
      assert.strictEqual(yield* resumeHere(f, a), "boot", "a fresh guest, not the earlier image's")
      assert.strictEqual((yield* f.coordinator.get).guestsLost.length, 1, "the loss told once")
    }),
  )

  effect("the guest vanishes before the descent: reported without an image, the loss told once, and the resume boots fresh", () =>
    Effect.gen(function* () {
      const { f, a } = yield* earlierImageLeftBehind
      yield* a.runtime.destroy("s1")
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      const s = yield* session(f)
      assert.strictEqual(s.state, "descended")
      assert.strictEqual(s.imageHostId, null)
      assert.include((yield* f.coordinator.get).calls, "descended s1 image=none")
      assert.strictEqual(yield* resumeHere(f, a), "boot")
      assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "descending") }])
    }),
  )

  effect("a descent that wrote its image and whose descended call failed is reported with it when retried, and restored", () =>
    Effect.gen(function* () {
      const { f, a } = yield* earlierImageLeftBehind
      faults.failDescended = true
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      const s = yield* session(f)
      assert.strictEqual(s.state, "descended")
      assert.strictEqual(s.imageHostId, "a", "this descent's image, on a")
      assert.notInclude((yield* f.coordinator.get).calls, "descended s1 image=none")
      assert.strictEqual(yield* resumeHere(f, a), "image")
      assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [])
    }),
  )
})
