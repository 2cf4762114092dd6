/**
 * An assignments answer older than the one last reconciled never undoes it, and never costs a
 * guest. The retry pass (a fresh read after a failed action) and the poll read the assignments
 * each on its own and nothing orders their answers: an answer read before a move to this host
 * committed, reconciled after a newer one, leaves out the guest the move just brought here (its
 * source already dropped its copy). Guards (a) the ordering: reconciles are serialized and an
 * answer whose read was sent before the last applied answer arrived is dropped (the two
 * overlapped: with the long-poll always open, a retry read served before a change that woke it
 * can come back after the long-poll's answer); and (b)
 * the destroy of a resident VM an answer leaves out: only once a fresh read of its session says
 * it is not this host's, and never when that read fails.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Deferred, Effect, Random } from "effect"
import { TestClock } from "effect/testing"
import { type Assignments, CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { makeFleet } from "./support/InProcess.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"
import { quietAgent } from "./support/QuietAgent.js"

describe("an assignments answer read before a move's commit, reconciled after a newer one", () => {
  effect("keeps the guest the move committed to this target: the fresh read of its session says it is this host's", () =>
    Effect.gen(function* () {
      const fleet = yield* makeFleet([
        { hostId: "a", sim: SimRuntime.defaultSimConfig },
        { hostId: "b", sim: SimRuntime.defaultSimConfig },
      ])
      const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.settle()
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      // b's retry pass reads its assignments now (s1 is a's, moving) ...
      const stale = yield* fleet.coordinator.assignmentsOf("b")
      // ... the move commits, and b's poll reconciles the newer view (s1 running on b, its moveId cleared) ...
      yield* fleet.settle()
      assert.strictEqual((yield* fleet.coordinator.get).moves.get("m1")!.state, "committed")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      // ... then the retry pass's older answer arrives and is reconciled.
      yield* b.agent.reconcile(stale)
      yield* fleet.quiesce
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]], "the only copy of the guest survives the stale answer")
      assert.deepStrictEqual((yield* b.residents.all).map((v) => v.vmId), ["s1"])
    }),
  )

  effect("keeps a VM an answer leaves out while its session cannot be read, and destroys it once the read says it is not this host's", () =>
    Effect.gen(function* () {
      let readable = false
      const fleet = yield* makeFleet([{ hostId: "a", sim: SimRuntime.defaultSimConfig }], {
        wrapCoordinator: (client) => ({
          ...client,
          getSession: (id) => (readable ? client.getSession(id) : Effect.fail(new CoordinatorError({ op: "getSession", status: null, message: "timed out" }))),
        }),
      })
      const a = fleet.hosts[0]!
      yield* fleet.coordinator.addSession("s1", "a", 1024, 1)
      yield* fleet.settle()
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => v.vmId), ["s1"])
      // The session ends: the answers leave its VM out, but the read that would confirm it fails.
      yield* fleet.coordinator.setState("s1", "ended")
      yield* fleet.settle(2)
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => v.vmId), ["s1"], "kept while unconfirmed")
      readable = true
      yield* fleet.settle(1)
      assert.deepStrictEqual(yield* a.runtime.list, [], "destroyed once the coordinator says the session ended")
      assert.deepStrictEqual(yield* a.residents.all, [])
    }),
  )
})

describe("the retry pass's answer and the poll's", () => {
  effect("an answer whose read was sent before the last reconciled one's is dropped: a parked guest is not unparked by it", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const c = fake.client("a")
      let startedFailures = 1
      let readsAtOnce = 0
      const retryServed = yield* Deferred.make<void>()
      const releaseRetry = yield* Deferred.make<void>()
      const retryDelivered = yield* Deferred.make<void>()
      const client: CoordinatorShape = {
        ...c,
        // The first `started` fails: the retry pass starts and reads afresh.
        started: (id) => (startedFailures-- > 0 ? Effect.fail(new CoordinatorError({ op: "started", status: 503, message: "away" })) : c.started(id)),
        // The retry pass's read (the second read at once, after the first poll's) is served at
        // once, its answer held back until released.
        assignments: (o) =>
          Effect.suspend(() =>
            o.waitMs === 0 && readsAtOnce++ === 1
              ? Effect.gen(function* () {
                  const view = yield* c.assignments(o)
                  yield* Deferred.succeed(retryServed, undefined)
                  yield* Deferred.await(releaseRetry)
                  yield* Deferred.succeed(retryDelivered, undefined)
                  return view
                })
              : c.assignments(o),
          ),
      }
      const sim = yield* SimRuntime.make({ startMs: 50 })
      let unparks = 0
      const runtime: VmRuntimeShape = { ...sim, unpark: (id) => Effect.andThen(Effect.sync(() => unparks++), sim.unpark(id)) }
      // No I/O: every step is one the TestClock tracks, so the order below is the same on any machine.
      const { agent } = yield* quietAgent({ coordinator: client, runtime })
      yield* fake.addSession("s1", "a", 1024, 1)
      yield* Effect.forkChild(agent.run)
      const status = Effect.map(sim.list, (vms) => vms.map((v) => [v.vmId, v.status]))
      yield* stepUntil("the retry pass's read", () => Deferred.isDone(retryServed))
      // Parked meanwhile: the poll reconciles it (from reads sent after the retry pass's).
      yield* fake.setState("s1", "parked")
      yield* stepUntil("the guest parked", () => Effect.map(status, (st) => JSON.stringify(st) === JSON.stringify([["s1", "paused"]])))
      yield* Deferred.succeed(releaseRetry, undefined)
      yield* stepUntil("the retry pass's answer", () => Deferred.isDone(retryDelivered))
      // A minute of the clock: what the answer would start, done.
      for (let i = 0; i < 600; i++) yield* TestClock.adjust("100 millis")
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(unparks, 0, "the older answer (s1 pending) was not reconciled")
      assert.deepStrictEqual(yield* status, [["s1", "paused"]])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )

  effect("a retry read served before a change that woke the open long-poll, answered after the long-poll's answer, is dropped: a guest the coordinator parked is not unparked", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const c = fake.client("a")
      let startedFailures = 1
      let readsAtOnce = 0
      let longPolls = 0
      const longPollOpen = yield* Deferred.make<void>()
      const changed = yield* Deferred.make<void>()
      const retryServed = yield* Deferred.make<void>()
      const releaseRetry = yield* Deferred.make<void>()
      const retryDelivered = yield* Deferred.make<void>()
      let retryView: Assignments | undefined
      const client: CoordinatorShape = {
        ...c,
        // The first `started` fails: the retry pass starts and reads afresh.
        started: (id) => (startedFailures-- > 0 ? Effect.fail(new CoordinatorError({ op: "started", status: 503, message: "away" })) : c.started(id)),
        assignments: (o) =>
          Effect.suspend(() => {
            // A long-poll: the first one is open until the change, the later ones until the test ends.
            if (o.waitMs > 0) return longPolls++ === 0 ? Deferred.succeed(longPollOpen, undefined).pipe(Effect.andThen(Deferred.await(changed)), Effect.andThen(c.assignments(o))) : Effect.never
            // The second read at once is the retry pass's: served now, its answer held back until released.
            if (readsAtOnce++ !== 1) return c.assignments(o)
            return Effect.gen(function* () {
              const view = yield* c.assignments(o)
              retryView = view
              yield* Deferred.succeed(retryServed, undefined)
              yield* Deferred.await(releaseRetry)
              yield* Deferred.succeed(retryDelivered, undefined)
              return view
            })
          }),
      }
      const sim = yield* SimRuntime.make({ startMs: 50 })
      let unparks = 0
      const runtime: VmRuntimeShape = { ...sim, unpark: (id) => Effect.andThen(Effect.sync(() => unparks++), sim.unpark(id)) }
      const { agent } = yield* quietAgent({ coordinator: client, runtime })
      yield* fake.addSession("s1", "a", 1024, 1)
      yield* Effect.forkChild(agent.run)
      const status = Effect.map(sim.list, (vms) => vms.map((v) => [v.vmId, v.status]))
      yield* stepUntil("the retry pass's read", () => Deferred.isDone(retryServed))
      assert.isTrue(yield* Deferred.isDone(longPollOpen), "the long-poll was open before the retry pass's read was sent")
      assert.deepStrictEqual(retryView!.sessions.map((x) => [x.id, x.state]), [["s1", "pending"]])
      // The coordinator parks the guest: the change wakes the long-poll, whose answer is applied first.
      yield* fake.setState("s1", "parked")
      yield* Deferred.succeed(changed, undefined)
      yield* stepUntil("the guest parked", () => Effect.map(status, (st) => JSON.stringify(st) === JSON.stringify([["s1", "paused"]])))
      // Then the retry pass's answer (read before the change, sent after the long-poll) arrives.
      yield* Deferred.succeed(releaseRetry, undefined)
      yield* stepUntil("the retry pass's answer", () => Deferred.isDone(retryDelivered))
      // A minute of the clock: what the answer would start, done.
      for (let i = 0; i < 600; i++) yield* TestClock.adjust("100 millis")
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(unparks, 0, "the older answer (s1 pending) was not reconciled")
      assert.deepStrictEqual(yield* status, [["s1", "paused"]])
      assert.strictEqual((yield* fake.get).sessions.get("s1")!.state, "parked")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )
})

describe("the fresh reads that confirm a destroy", () => {
  effect("are at most four at once: twenty VMs an answer leaves out (their sessions all lost) do not send twenty reads together", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const c = fake.client("a")
      let open = 0
      let most = 0
      let reads = 0
      const gate = yield* Deferred.make<void>()
      const client: CoordinatorShape = {
        ...c,
        // Each read held open until the gate opens (a coordinator slow to answer).
        getSession: (id) =>
          Effect.acquireUseRelease(
            Effect.sync(() => {
              reads++
              most = Math.max(most, ++open)
            }),
            () => Effect.andThen(Deferred.await(gate), c.getSession(id)),
            () => Effect.sync(() => open--),
          ),
      }
      const sim = yield* SimRuntime.make({ startMs: 50 })
      const { agent, residents } = yield* quietAgent({ coordinator: client, runtime: sim, report: { totalMib: 65536, allocatableMib: 65536, totalVcpus: 64 } })
      const ids = Array.from({ length: 20 }, (_, i) => `s${i + 1}`)
      for (const id of ids) yield* fake.addSession(id, "a", 256, 1)
      yield* Effect.forkChild(agent.run)
      yield* stepUntil("twenty guests running", () => Effect.map(sim.list, (vms) => vms.length === 20 && vms.every((v) => v.status === "running")))
      yield* stepUntil("the actions done", () => Effect.map(agent.busy, (b) => !b))
      // Every session made lost at once (a partition healed): the answers leave all twenty out.
      for (const id of ids) yield* fake.setState(id, "lost")
      yield* stepUntil("four reads open", () => Effect.succeed(open >= 4))
      // A minute of the clock with the reads held: no more open.
      for (let i = 0; i < 600; i++) yield* TestClock.adjust("100 millis")
      assert.strictEqual(most, 4, "at most four reads open at once")
      yield* Deferred.succeed(gate, undefined)
      yield* stepUntil("every VM destroyed", () => Effect.map(sim.list, (vms) => vms.length === 0))
      assert.strictEqual(most, 4)
      assert.strictEqual(reads, 20)
      assert.deepStrictEqual(yield* residents.all, [])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5))),
  )
})
