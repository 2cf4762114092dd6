/**
 * A move's abort and a commit of it reach its target together: the source's abort while the
 * target's agent commits the incoming VM itself (the coordinator holds the move committed), or
 * the agent's own drop of the incoming VM (its move ended) while the source's commit resumes it.
 * Before, an abort did not wait for a commit: it destroyed the VM a commit was resuming (and the
 * commit still answered that the guest runs here), and a commit resumed a VM an abort was
 * destroying. Guards: a move's commits and aborts on its target run one at a time; an abort the
 * agent decided on a VM it saw incoming keeps the guest a commit resumed meanwhile; the agent's
 * own commit makes the VM the session's in the same turn, so a source's abort after it finds
 * nothing of the move; a commit after an abort finds nothing to resume and refuses; a later move's
 * prepare drops the earlier move's incoming VM under that move's lock too, so never mid-resume.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Deferred, Effect, Fiber, Random, Ref } from "effect"
import { TestClock } from "effect/testing"
import { CoordinatorError } from "../src/Coordinator.js"
import { makeMoveTarget, type MoveTarget } from "../src/MoveTarget.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

const h = { moveId: "m1", sessionId: "s1", sourceHostId: "b", targetHostId: "a", memMib: 1024, vcpus: 1 }

/**
 * Host a's move target over a simulated runtime whose resume of an incoming VM (`commitIncoming`)
 * says it started (`resuming`) and ends when `resume` is released (at once unless `holdResume`),
 * and whose `destroy` says it started (`destroying`) and goes on when `destroy` is released (at
 * once unless `holdDestroy`);
 * its boots are counted (`starts`: a session booted fresh lost its memory).
 * Move m1 of s1 (from b) is prepared: its incoming VM is paused here.
 */
const gatedTarget = (o: { readonly holdResume: boolean; readonly holdDestroy: boolean; readonly persist?: () => Effect.Effect<void> }) =>
  Effect.gen(function* () {
    const sim = yield* SimRuntime.make({ startMs: 50 })
    const resuming = yield* Deferred.make<void>()
    const resume = yield* Deferred.make<void>()
    const destroying = yield* Deferred.make<void>()
    const destroy = yield* Deferred.make<void>()
    if (!o.holdResume) yield* Deferred.succeed(resume, undefined)
    if (!o.holdDestroy) yield* Deferred.succeed(destroy, undefined)
    const counts = { resumes: 0, destroys: 0, starts: 0 }
    const runtime: VmRuntimeShape = {
      ...sim,
      start: (spec, options) => Effect.suspend(() => (counts.starts++, sim.start(spec, options))),
      commitIncoming: (vmId) =>
        Effect.suspend(() => {
          counts.resumes++
          // Resumed, the VM is the runtime's like any other (its list holds it: a pass that finds a
          // record's VM missing from the list takes it for a guest that vanished).
          return Deferred.succeed(resuming, undefined).pipe(
            Effect.andThen(Deferred.await(resume)),
            Effect.andThen(sim.recover([{ vmId, memMib: 1024, vcpus: 1, status: "running" }])),
            Effect.as({ vmId, memMib: 1024, vcpus: 1, status: "running" as const }),
          )
        }),
      destroy: (vmId) =>
        Effect.suspend(() => {
          counts.destroys++
          return Deferred.succeed(destroying, undefined).pipe(Effect.andThen(Deferred.await(destroy)), Effect.andThen(sim.destroy(vmId)))
        }),
    }
    const residents = yield* makeResidents("a", null, o.persist ?? (() => Effect.void))
    const target = yield* makeMoveTarget("a", runtime, residents)
    yield* target.prepare(h)
    return { runtime, residents, target, counts, resuming, resume, destroying, destroy }
  })

/**
 * A state file whose next write can be held (`holdNextWrite`): it says when it starts
 * (`writing`) and ends when `go` is released, as a slow disk's write and fsync.
 */
const heldWrites = () => {
  let next: { readonly writing: Deferred.Deferred<void>; readonly go: Deferred.Deferred<void> } | null = null
  return {
    persist: () =>
      Effect.suspend(() => {
        const held = next
        next = null
        return held === null ? Effect.void : Deferred.succeed(held.writing, undefined).pipe(Effect.andThen(Deferred.await(held.go)))
      }),
    holdNextWrite: Effect.gen(function* () {
      const held = { writing: yield* Deferred.make<void>(), go: yield* Deferred.make<void>() }
      next = held
      return held
    }),
  }
}

/** `target` whose aborts say when they are asked for (`asked`), before they run. */
const tellingAborts = (target: MoveTarget, asked: Deferred.Deferred<void>): MoveTarget => ({
  ...target,
  abort: (moveId, options) => Deferred.succeed(asked, undefined).pipe(Effect.andThen(target.abort(moveId, options))),
})

const residentsOf = (residents: { readonly all: Effect.Effect<readonly { vmId: string; status: string; moveId: string | null; reservationId: string | null }[]> }) =>
  Effect.map(residents.all, (vms) => vms.map((v) => [v.vmId, v.status, v.moveId, v.reservationId]))

describe("a move's abort and a commit of it on its target at once", () => {
  effect("the source's abort while a commit resumes the VM waits for the resume, then destroys the guest (the source resumes its own copy): never a VM destroyed mid-resume", () =>
    Effect.gen(function* () {
      const { residents, target, counts, resuming, resume } = yield* gatedTarget({ holdResume: true, holdDestroy: false })
      const commit = yield* Effect.forkChild(Effect.result(target.commit(h)))
      yield* Deferred.await(resuming)
      const abort = yield* Effect.forkChild(target.abort("m1"))
      yield* TestClock.adjust("1 second")
      const destroysWhileResuming = counts.destroys
      yield* Deferred.succeed(resume, undefined)
      const committed = yield* Fiber.join(commit)
      const aborted = yield* Fiber.join(abort)
      assert.strictEqual(destroysWhileResuming, 0, "the abort waited for the resume")
      assert.strictEqual(committed._tag, "Success")
      assert.strictEqual(aborted, "dropped")
      assert.strictEqual(counts.destroys, 1)
      assert.deepStrictEqual(yield* residents.all, [])
    }),
  )

  effect("a commit while the source's abort destroys the VM waits for it, then is refused: nothing is resumed", () =>
    Effect.gen(function* () {
      const { residents, target, counts, destroying, destroy } = yield* gatedTarget({ holdResume: false, holdDestroy: true })
      const abort = yield* Effect.forkChild(target.abort("m1"))
      yield* Deferred.await(destroying)
      const commit = yield* Effect.forkChild(Effect.flip(target.commit(h)))
      yield* TestClock.adjust("1 second")
      const resumesWhileDestroying = counts.resumes
      yield* Deferred.succeed(destroy, undefined)
      const aborted = yield* Fiber.join(abort)
      const refused = yield* Fiber.join(commit)
      assert.strictEqual(resumesWhileDestroying, 0, "the commit waited for the abort")
      assert.isTrue(refused.refused, refused.message)
      assert.strictEqual(counts.resumes, 0, "a dropped VM is never resumed")
      assert.strictEqual(aborted, "dropped")
      assert.deepStrictEqual(yield* residents.all, [])
    }),
  )
})

describe("a move's abort while its prepare starts the incoming VM", () => {
  effect("waits for the prepare, then destroys the VM it started: none is left behind, unrecorded", () =>
    Effect.gen(function* () {
      const sim = yield* SimRuntime.make({ startMs: 50 })
      const preparing = yield* Deferred.make<void>()
      const prepared = yield* Deferred.make<void>()
      const destroyed: string[] = []
      // The runtime starts the incoming VM once released (QEMU takes seconds to listen).
      const runtime: VmRuntimeShape = {
        ...sim,
        prepareIncoming: (spec, moveId) => Deferred.succeed(preparing, undefined).pipe(Effect.andThen(Deferred.await(prepared)), Effect.andThen(sim.prepareIncoming(spec, moveId))),
        destroy: (vmId) => Effect.sync(() => void destroyed.push(vmId)).pipe(Effect.andThen(sim.destroy(vmId))),
      }
      const residents = yield* makeResidents("a", null, () => Effect.void)
      const target = yield* makeMoveTarget("a", runtime, residents)
      const prepare = yield* Effect.forkChild(Effect.result(target.prepare(h)))
      yield* Deferred.await(preparing)
      const abort = yield* Effect.forkChild(target.abort("m1"))
      yield* TestClock.adjust("1 second")
      const destroyedWhilePreparing = [...destroyed]
      yield* Deferred.succeed(prepared, undefined)
      assert.strictEqual((yield* Fiber.join(prepare))._tag, "Success")
      const aborted = yield* Fiber.join(abort)
      assert.deepStrictEqual(destroyedWhilePreparing, [], "the abort waited for the prepare")
      assert.deepStrictEqual(destroyed, ["s1"], "then destroyed the VM the runtime started")
      assert.strictEqual(aborted, "dropped")
      assert.deepStrictEqual(yield* residents.all, [])
      // Nothing of the move is left in the runtime: a commit there has no incoming VM to resume.
      const resumed = yield* Effect.flip(sim.commitIncoming("s1"))
      assert.match(resumed.message, /no incoming VM/)
    }),
  )
})

/**
 * Move m1 of s1 from b to host a (`gatedTarget`), in a fake coordinator: the source's late commit
 * is resuming the incoming VM (held: `resume` releases it; `commit` is its outcome) when an
 * operator aborts the move.
 */
const lateCommitMeetsAbort = Effect.gen(function* () {
  const fake = yield* makeFakeCoordinator
  const gated = yield* gatedTarget({ holdResume: true, holdDestroy: false })
  yield* fake.addSession("s1", "b", 1024, 1)
  yield* fake.beginMove("m1", "s1", "a", 600)
  const commit = yield* Effect.forkChild(Effect.result(gated.target.commit(h)))
  yield* Deferred.await(gated.resuming)
  yield* fake.abortMove("m1", "an operator's abort")
  return { ...gated, fake, commit }
})

describe("the target's agent and the source act on one move together", () => {
  effect("the agent drops the incoming VM of a move that ended while the source's commit resumes it: the drop waits, keeps the guest, and the session placed here runs on it", () =>
    Effect.gen(function* () {
      // The source's commit is on its way (its final round sent) when the move is aborted and
      // the session placed here.
      const { fake, runtime, residents, target, counts, resume, commit } = yield* lateCommitMeetsAbort
      yield* fake.place("s1", "a", "pending")
      const asked = yield* Deferred.make<void>()
      const { agent } = yield* quietAgent({ coordinator: fake.client("a"), runtime, residents, target: tellingAborts(target, asked) })
      yield* Effect.forkChild(agent.run)
      yield* stepUntil("the agent's drop of the incoming VM", () => Deferred.isDone(asked))
      yield* TestClock.adjust("1 second")
      const destroysWhileResuming = counts.destroys
      yield* Deferred.succeed(resume, undefined)
      assert.strictEqual((yield* Fiber.join(commit))._tag, "Success", "the source is told the guest runs here")
      yield* stepUntil("s1 started", () => Effect.map(fake.get, (s) => s.sessions.get("s1")!.state === "running"))
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(destroysWhileResuming, 0, "the drop waited for the resume")
      assert.strictEqual(counts.destroys, 0, "the guest the commit resumed is kept")
      assert.strictEqual(counts.starts, 0, "the session runs on the resumed guest, not a fresh boot")
      assert.deepStrictEqual(yield* residentsOf(residents), [["s1", "running", null, "res-s1-a"]])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )

  effect("the agent commits the incoming VM of a move the coordinator holds committed while the source's abort comes: the abort waits, then finds nothing of the move (the VM is the session's in the commit's own turn), and the guest runs on", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const disk = heldWrites()
      const { runtime, residents, target, counts, resuming, resume } = yield* gatedTarget({ holdResume: true, holdDestroy: false, persist: disk.persist })
      yield* fake.addSession("s1", "b", 1024, 1)
      yield* fake.beginMove("m1", "s1", "a", 600)
      // An operator commits the in-doubt move (as `engram moves commit m1`): the session runs here.
      yield* Ref.update(fake.ref, (s) => ({
        ...s,
        moves: new Map(s.moves).set("m1", { ...s.moves.get("m1")!, state: "committed" }),
        sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "a", reservationId: "res-move-m1" }),
      }))
      const { agent } = yield* quietAgent({ coordinator: fake.client("a"), runtime, residents, target })
      yield* Effect.forkChild(agent.run)
      yield* stepUntil("the agent's commit resumes the VM", () => Deferred.isDone(resuming))
      // The source, which gave the guest back, tells the target to drop its copy.
      const abort = yield* Effect.forkChild(target.abort("m1"))
      yield* TestClock.adjust("1 second")
      const destroysWhileResuming = counts.destroys
      // The state file is busy when the commit ends: its record of the resumed guest is written
      // while another record waits to be (a write of another VM's), which is written next.
      const commitsWrite = yield* disk.holdNextWrite
      yield* Deferred.succeed(resume, undefined)
      yield* Deferred.await(commitsWrite.writing)
      const othersWrite = yield* disk.holdNextWrite
      const other = yield* Effect.forkChild(residents.update("s9", (v) => v))
      yield* Effect.yieldNow
      yield* Deferred.succeed(commitsWrite.go, undefined)
      yield* Deferred.await(othersWrite.writing)
      yield* TestClock.adjust("1 second")
      const destroysWhileOtherWrite = counts.destroys
      yield* Deferred.succeed(othersWrite.go, undefined)
      const aborted = yield* Fiber.join(abort)
      yield* Fiber.join(other)
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(destroysWhileResuming, 0, "the abort waited for the resume")
      assert.strictEqual(destroysWhileOtherWrite, 0, "the abort found the VM the session's, not the move's")
      assert.strictEqual(aborted, "none", "nothing of the move is left once the agent's commit ends")
      assert.strictEqual(counts.destroys, 0)
      assert.deepStrictEqual(yield* residentsOf(residents), [["s1", "running", null, "res-move-m1"]])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )

  effect("the agent's reconcile drops the incoming VM of a move no longer pending (its session elsewhere) while the source's commit resumes it: the drop waits and keeps the guest, which then goes only on an explicit word (unreadable here: kept)", () =>
    Effect.gen(function* () {
      // The source's late commit is on its way when the move is aborted (the session back on b).
      const { fake, runtime, residents, target, counts, resume, commit } = yield* lateCommitMeetsAbort
      // The move cannot be read from here (an outage after the assignments answer).
      const client = fake.client("a")
      const unreadable = { ...client, getMove: () => Effect.fail(new CoordinatorError({ op: "getMove", status: 503, message: "the store is away" })) }
      const asked = yield* Deferred.make<void>()
      const { agent } = yield* quietAgent({ coordinator: unreadable, runtime, residents, target: tellingAborts(target, asked) })
      yield* Effect.forkChild(agent.run)
      // Past the staging grace the reconcile drops the VM it sees incoming.
      yield* stepUntil("the reconcile's drop of the incoming VM", () => Deferred.isDone(asked))
      yield* TestClock.adjust("1 second")
      const destroysWhileResuming = counts.destroys
      yield* Deferred.succeed(resume, undefined)
      assert.strictEqual((yield* Fiber.join(commit))._tag, "Success", "the source is told the guest runs here")
      // More passes: the guest ran here, its move cannot be read, so it stays.
      yield* TestClock.adjust("30 seconds")
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(destroysWhileResuming, 0, "the drop waited for the resume")
      assert.strictEqual(counts.destroys, 0, "a guest that ran here is not dropped without an explicit word")
      assert.deepStrictEqual(yield* residentsOf(residents), [["s1", "running", "m1", null]])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )

})

describe("a later move's prepare meets the earlier move's incoming VM", () => {
  effect("a prepare of a later move of the session while a late commit of the earlier one resumes its incoming VM: the prepare waits for the resume, keeps the guest and is refused (never a VM destroyed mid-resume)", () =>
    Effect.gen(function* () {
      const { residents, target, counts, resuming, resume } = yield* gatedTarget({ holdResume: true, holdDestroy: false })
      const commit = yield* Effect.forkChild(Effect.result(target.commit(h)))
      yield* Deferred.await(resuming)
      const later = yield* Effect.forkChild(Effect.flip(target.prepare({ ...h, moveId: "m2" })))
      yield* TestClock.adjust("1 second")
      const destroysWhileResuming = counts.destroys
      yield* Deferred.succeed(resume, undefined)
      assert.strictEqual((yield* Fiber.join(commit))._tag, "Success", "the source is told the guest runs here")
      const refused = yield* Fiber.join(later)
      assert.strictEqual(destroysWhileResuming, 0, "the prepare waited for the resume")
      assert.include(refused.message, "already has a VM")
      assert.strictEqual(counts.destroys, 0)
      assert.deepStrictEqual(yield* residentsOf(residents), [["s1", "running", "m1", null]])
    }),
  )

  effect("a prepare of a later move of the session drops the earlier move's incoming VM (that move is over) and prepares its own", () =>
    Effect.gen(function* () {
      const { residents, target, counts } = yield* gatedTarget({ holdResume: false, holdDestroy: false })
      yield* target.prepare({ ...h, moveId: "m2" })
      assert.strictEqual(counts.destroys, 1)
      assert.deepStrictEqual(yield* residentsOf(residents), [["s1", "paused", "m2", null]])
    }),
  )
})
