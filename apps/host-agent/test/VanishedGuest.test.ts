/**
 * A VM that ends by itself while the agent runs (its QEMU crashed or was killed, or exited during
 * the runtime's background attach after a restart). Before, the agent compared its record with
 * the runtime only at start: its record still said running, so no pass acted, and the coordinator
 * kept the session running, its reservation heartbeated, with no guest anywhere. Guards: the next
 * pass notices the VM missing from the runtime's list, logs an error naming the session and what
 * follows, and boots a fresh guest (parked again for a parked session); and a VM the agent's own
 * action is destroying (the runtime's VM gone, its record not yet) is not taken for one that vanished.
 * The coordinator is told (`guestLost`: the session's history says its guest was lost and booted
 * fresh), once, also of a guest found gone at start; a report the coordinator did not answer is
 * told again on a later pass, and one of a session that ended meanwhile is dropped quietly. The
 * report is told in a fiber of its own: one the coordinator takes and never answers holds no later
 * action of the session (a park), and a descent waits for it (the session's history shows the loss
 * before the descent) and goes as soon as it is told. It is kept in the state file until told: an
 * agent restarted before the coordinator heard it tells it.
 */
import { assert, describe } from "@effect/vitest"
import { RuntimeError, SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Deferred, Effect, Exit, Random, Scope } from "effect"
import { TestClock } from "effect/testing"
import { type Agent, lostReasonOf } from "../src/Agent.js"
import { CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import type { StateFile } from "../src/LocalState.js"
import { makeResidents } from "../src/Residents.js"
import { type FakeCoordinator, makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { capture } from "./support/Logs.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

const vanishedLine = "session's guest vanished from this host"
const goneLine = "session's guest is gone from this host"

/** Host a's agent on a sim runtime that counts its starts, driven one pass at a time; s1 assigned to a. */
const hostA = (
  o: {
    readonly destroy?: (sim: SimRuntime.SimRuntimeShape, vmId: string) => Effect.Effect<void>
    readonly coordinator?: (c: CoordinatorShape) => CoordinatorShape
    /** Starts to refuse (a runtime that fails to boot), counted down. */
    readonly failStarts?: { n: number } | undefined
  } = {},
) =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    const sim = yield* SimRuntime.make({ startMs: 50 })
    const starts = { n: 0 }
    const runtime: VmRuntimeShape = {
      ...sim,
      start: (spec, options) =>
        Effect.andThen(
          Effect.sync(() => starts.n++),
          Effect.suspend(() =>
            o.failStarts !== undefined && o.failStarts.n > 0
              ? (o.failStarts.n--, Effect.fail(new RuntimeError({ op: "start", vmId: spec.vmId, message: "the hypervisor refused to start (a test's)" })))
              : sim.start(spec, options),
          ),
        ),
      // A descent writes no image here (the tests use no image store): the VM ends, as a capture's does.
      descend: (vmId, path) => Effect.as(sim.destroy(vmId), { vmId, path, bytes: 0, method: "stream" as const, detail: "a test's descent: no image written" }),
      ...(o.destroy === undefined ? {} : { destroy: (vmId: string) => o.destroy!(sim, vmId) }),
    }
    yield* fake.addSession("s1", "a", 1024, 1)
    const { agent, residents } = yield* quietAgent({ coordinator: (o.coordinator ?? ((c) => c))(fake.client("a")), runtime })
    return { fake, sim, starts, agent, residents }
  }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))

/** One pass on the coordinator's assignments for a, then until its actions are done. */
const pass = (fake: FakeCoordinator, agent: Agent) =>
  Effect.gen(function* () {
    yield* agent.reconcile(yield* fake.assignmentsOf("a"))
    yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
  })

/**
 * Host a's guest of s1 lost while its agent runs, with a coordinator that takes the report and
 * never answers it: once the fresh guest runs (the report still hanging).
 */
const freshGuestWhileReportHangs = Effect.gen(function* () {
  const host = yield* hostA({ coordinator: (c) => ({ ...c, guestLost: () => Effect.never }) })
  yield* pass(host.fake, host.agent)
  yield* host.sim.destroy("s1")
  yield* host.agent.reconcile(yield* host.fake.assignmentsOf("a"))
  yield* stepUntil("a fresh guest running while the report hangs", () => Effect.map(host.sim.list, (l) => l.some((v) => v.vmId === "s1" && v.status === "running")))
  return host
})

describe("a guest that vanishes while the agent runs", () => {
  effect("a running session's VM destroyed behind the agent's back: the next pass logs it and boots a fresh guest", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fake, sim, starts, agent, residents } = yield* hostA()
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "running")
      assert.strictEqual(starts.n, 1)
      // The hypervisor ends by itself: the runtime knows, the agent's record does not.
      yield* sim.destroy("s1")
      assert.deepStrictEqual(yield* sim.list, [])
      yield* pass(fake, agent)
      const vanished = errors.lines.filter((l) => l.message.startsWith(vanishedLine))
      assert.strictEqual(vanished.length, 1)
      assert.include(vanished[0]!.message, "booting a fresh guest in its place")
      assert.strictEqual(vanished[0]!.fields["sessionId"], "s1")
      assert.strictEqual(vanished[0]!.fields["state"], "running")
      assert.strictEqual(errors.lines.filter((l) => l.message.startsWith(goneLine)).length, 1)
      assert.strictEqual(starts.n, 2, "a fresh guest")
      // The coordinator heard of it once (not a second time for the fresh boot that followed).
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }])
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status, v.reservationId]), [["s1", "running", "res-s1"]])
      // Said once: the pass after finds the fresh guest.
      yield* pass(fake, agent)
      assert.strictEqual(errors.lines.filter((l) => l.message.startsWith(vanishedLine)).length, 1)
      assert.strictEqual(starts.n, 2)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
    }).pipe(Effect.provide(errors.layer))
  })

  effect("a parked session's paused VM destroyed behind the agent's back: a fresh guest boots and is parked again", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fake, sim, starts, agent, residents } = yield* hostA()
      yield* pass(fake, agent)
      yield* fake.setState("s1", "parked")
      yield* pass(fake, agent)
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
      yield* sim.destroy("s1")
      yield* pass(fake, agent)
      const vanished = errors.lines.filter((l) => l.message.startsWith(vanishedLine))
      assert.strictEqual(vanished.length, 1)
      assert.include(vanished[0]!.message, "parking it")
      assert.strictEqual(vanished[0]!.fields["status"], "paused")
      assert.strictEqual(starts.n, 2)
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
      assert.deepStrictEqual((yield* residents.all).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "parked") }])
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "parked", "the session's state stays")
    }).pipe(Effect.provide(errors.layer))
  })

  effect("a descending session's VM destroyed behind the agent's back: reported descended without an image (its session names no image host), said", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fake, sim, agent, residents } = yield* hostA()
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      yield* fake.setState("s1", "descending")
      yield* pass(fake, agent)
      const vanished = errors.lines.filter((l) => l.message.startsWith(vanishedLine))
      assert.strictEqual(vanished.length, 1)
      assert.include(vanished[0]!.message, "reporting it descended")
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "descended")
      assert.deepStrictEqual(yield* residents.all, [])
      // Told before the descent: once descended the session is no longer on this host.
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "descending") }])
      // The descent left no image and says so: a resume then boots fresh without fetching from a,
      // and reports nothing more (this loss is told here, once).
      assert.deepStrictEqual((yield* fake.get).calls.filter((c) => c.includes(" s1")).slice(-2), ["guestLost s1", "descended s1 image=none"])
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.imageHostId, null)
    }).pipe(Effect.provide(errors.layer))
  })

  effect("a VM the agent's own action is destroying (its VM gone, its record not yet) is not taken for one that vanished", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const destroyed = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      // The runtime's VM goes at once; the destroy answers once released (a QEMU that quits slowly).
      const { fake, sim, starts, agent, residents } = yield* hostA({
        destroy: (sim, vmId) => sim.destroy(vmId).pipe(Effect.andThen(Deferred.succeed(destroyed, undefined)), Effect.andThen(Deferred.await(release))),
      })
      yield* pass(fake, agent)
      // The session moved on to host b: a's pass destroys its VM (once the coordinator confirms).
      yield* fake.place("s1", "b", "running")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* Deferred.await(destroyed)
      assert.deepStrictEqual(yield* sim.list, [])
      assert.deepStrictEqual((yield* residents.all).map((v) => v.vmId), ["s1"], "the record still holds it: the action is between its two steps")
      // A pass meanwhile (a poll's answer) sees a record the runtime does not: the action's, not a vanish.
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* TestClock.adjust("1 second")
      yield* Deferred.succeed(release, undefined)
      yield* stepUntil("the destroy done", () => Effect.map(agent.busy, (b) => !b))
      assert.deepStrictEqual(yield* residents.all, [])
      assert.deepStrictEqual(errors.lines.map((l) => l.message), [])
      assert.strictEqual(starts.n, 1)
    }).pipe(Effect.provide(errors.layer))
  })

  effect("a guest found gone at start (the coordinator has it running here, no VM is): booted fresh and told as not found", () =>
    Effect.gen(function* () {
      const { fake, starts, agent } = yield* hostA()
      yield* fake.setState("s1", "running")
      yield* pass(fake, agent)
      assert.strictEqual(starts.n, 1)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("notFound", "running") }])
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
    }),
  )

  effect("the coordinator unreachable when the guest vanishes: the fresh guest boots at once; the report is told on a later pass, once", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const { fake, sim, starts, agent } = yield* hostA()
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      yield* fake.silence("a", true)
      yield* pass(fake, agent)
      assert.strictEqual(starts.n, 2, "a fresh guest, without the coordinator")
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
      assert.isTrue(warnings.lines.some((l) => l.message.startsWith("action failed") && l.fields["sessionId"] === "s1"), JSON.stringify(warnings.lines))
      yield* fake.silence("a", false)
      yield* pass(fake, agent)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }])
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
      assert.strictEqual(starts.n, 2)
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("a coordinator that takes the report and never answers does not hold the fresh guest: it boots before the report is told", () =>
    Effect.gen(function* () {
      const { starts } = yield* freshGuestWhileReportHangs
      assert.strictEqual(starts.n, 2)
    }),
  )

  effect("a descent retried after its descended call failed tells the lost guest once", () =>
    Effect.gen(function* () {
      const failed = { once: false }
      const { fake, agent } = yield* hostA({
        coordinator: (c) => ({
          ...c,
          descended: (id, options) => (failed.once ? c.descended(id, options) : Effect.fail(new CoordinatorError({ op: "descended", status: 503, message: "the store call timed out" })).pipe(Effect.ensuring(Effect.sync(() => void (failed.once = true))))),
        }),
      })
      // Descending here, and no VM ever ran here: its guest is lost, told before the descent.
      yield* fake.setState("s1", "descending")
      yield* pass(fake, agent)
      assert.isTrue(failed.once)
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "descending")
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "descended")
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("notFound", "descending") }])
      // The retry still says the descent left no image.
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.imageHostId, null)
    }),
  )

  effect("a fresh boot that fails once keeps the loss's report and its reason: told once, as the vanish the pass noticed", () =>
    Effect.gen(function* () {
      const failStarts = { n: 0 }
      const { fake, sim, agent } = yield* hostA({ failStarts })
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      failStarts.n = 1
      yield* pass(fake, agent)
      yield* pass(fake, agent)
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      yield* pass(fake, agent)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }])
    }),
  )

  effect("a report of a session that ended before the coordinator heard it is dropped quietly; another session's is told", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const { fake, sim, agent } = yield* hostA()
      yield* fake.addSession("s2", "a", 1024, 1)
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      yield* sim.destroy("s2")
      yield* fake.silence("a", true)
      yield* pass(fake, agent)
      const warned = warnings.lines.length
      yield* fake.setState("s1", "ended")
      yield* fake.silence("a", false)
      yield* pass(fake, agent)
      yield* pass(fake, agent)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s2", reason: lostReasonOf("exited", "running") }])
      assert.isFalse((yield* fake.get).calls.includes("guestLost s1"))
      assert.deepStrictEqual(warnings.lines.slice(warned).filter((l) => l.message.includes("lost")), [])
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("a report the coordinator takes and never answers holds no later action of the session: a park goes while it hangs", () =>
    Effect.gen(function* () {
      const { fake, sim, starts, agent } = yield* freshGuestWhileReportHangs
      // The coordinator parks the session while the report still hangs: the next pass parks it.
      yield* fake.setState("s1", "parked")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the fresh guest parked while the report hangs", () => Effect.map(sim.list, (l) => l.some((v) => v.vmId === "s1" && v.status === "paused")))
      assert.strictEqual(starts.n, 2)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
    }),
  )

  effect("a descent waits for a hanging report, then goes as soon as it is told: reported before descended, once", () =>
    Effect.gen(function* () {
      const answer = yield* Deferred.make<void>()
      const { fake, sim, agent } = yield* hostA({ coordinator: (c) => ({ ...c, guestLost: (id, reason) => Deferred.await(answer).pipe(Effect.andThen(c.guestLost(id, reason))) }) })
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("a fresh guest running while the report hangs", () => Effect.map(sim.list, (l) => l.some((v) => v.vmId === "s1" && v.status === "running")))
      // The session goes idle and is told to descend while its report still hangs.
      yield* fake.setState("s1", "descending")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      for (let i = 0; i < 60; i++) yield* TestClock.adjust("1 second")
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "descending", "not descended before the loss is told")
      assert.isFalse((yield* fake.get).calls.includes("descended s1"))
      assert.isTrue(yield* agent.busy, "the descent waits")
      // The coordinator answers the report: the descent follows at once, no other pass needed.
      yield* Deferred.succeed(answer, undefined)
      yield* stepUntil("descended", () => Effect.map(fake.get, (f) => f.sessions.get("s1")!.state === "descended"))
      assert.deepStrictEqual((yield* fake.get).calls.filter((c) => c.endsWith(" s1")).slice(-2), ["guestLost s1", "descended s1"])
      // The fresh guest descended to an image: a holds it.
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.imageHostId, "a")
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }])
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
    }),
  )

  effect("a second loss while the first one's report hangs: the first's answer does not drop the second; both reach the coordinator", () =>
    Effect.gen(function* () {
      const answer = yield* Deferred.make<void>()
      let calls = 0
      const { fake, sim, starts, agent, residents } = yield* hostA({
        coordinator: (c) => ({ ...c, guestLost: (id, reason) => (calls++ === 0 ? Deferred.await(answer).pipe(Effect.andThen(c.guestLost(id, reason))) : c.guestLost(id, reason)) }),
      })
      yield* pass(fake, agent)
      yield* sim.destroy("s1")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("a fresh guest running while the first report hangs", () => Effect.map(sim.list, (l) => l.some((v) => v.vmId === "s1" && v.status === "running")))
      // The fresh guest is lost too, while the first report is still out: the same reason, a new loss.
      yield* sim.destroy("s1")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("a second fresh guest running", () => Effect.map(sim.list, (l) => l.some((v) => v.vmId === "s1" && v.status === "running")))
      assert.strictEqual(starts.n, 3)
      assert.strictEqual((yield* residents.lostReports).length, 1, "the second loss kept, replacing the first")
      // The coordinator answers the first report: the second is told at once, no other pass needed.
      yield* Deferred.succeed(answer, undefined)
      // Before: the first's answer dropped the second report, never told.
      yield* stepUntil("both losses told", () => Effect.map(fake.get, (f) => f.guestsLost.length === 2))
      const lost = { hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }
      assert.deepStrictEqual((yield* fake.get).guestsLost, [lost, lost])
      assert.deepStrictEqual(yield* residents.lostReports, [])
      yield* pass(fake, agent)
      assert.strictEqual((yield* fake.get).guestsLost.length, 2, "each told once")
    }),
  )

  effect("an agent restarted before the coordinator heard of a lost guest tells it from its state file, once", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const sim = yield* SimRuntime.make({ startMs: 50 })
      yield* fake.addSession("s1", "a", 1024, 1)
      // The state file: the last record written.
      let file: StateFile | null = null
      const persist = (s: StateFile) => Effect.sync(() => void (file = s))
      // The first agent, in a scope of its own (closing it is the agent stopping).
      const first = yield* Scope.make()
      const one = yield* quietAgent({ coordinator: fake.client("a"), runtime: sim, residents: yield* makeResidents("a", null, persist) }).pipe(Scope.provide(first))
      yield* pass(fake, one.agent)
      yield* sim.destroy("s1")
      yield* fake.silence("a", true)
      yield* pass(fake, one.agent)
      assert.deepStrictEqual((yield* sim.list).map((v) => [v.vmId, v.status]), [["s1", "running"]], "a fresh guest")
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
      // Stopped before the coordinator heard the report (its fresh guest outlives it).
      yield* Scope.close(first, Exit.void)
      yield* fake.silence("a", false)
      const two = yield* quietAgent({ coordinator: fake.client("a"), runtime: sim, residents: yield* makeResidents("a", file, persist) })
      yield* pass(fake, two.agent)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }])
      yield* pass(fake, two.agent)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
      assert.deepStrictEqual(file!.lostReports, [], "dropped from the state file once told")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )
})
