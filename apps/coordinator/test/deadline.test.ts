// A long-poll still answers at its deadline when nothing changes, on the Effect Clock (a
// TestClock here: no sleeping), and reads the store neither while it waits nor when it answers;
// a notice that changed nothing the poll waits for costs one re-read and the poll waits on.
// Deadlines are kept by one wheel: a wait answers up to `earlyMs` before its deadline, never
// after it, and many waits due at once are answered in one pass.
import { assert, describe, it } from "@effect/vitest"
import { Assignments, Config, earlyMs, Notifier, SessionWaiter, Settings, slotMs } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { counting } from "./support/counting.js"

const counted = counting(StoreSim.layer())
const layer = Layer.mergeAll(Assignments.Assignments.layer, SessionWaiter.layer).pipe(
  Layer.provideMerge(Notifier.layer),
  Layer.provideMerge(Layer.succeed(Settings, Settings.of({ config: Config.defaults(), backend: "custom" }))),
  Layer.provideMerge(counted.layer),
  Layer.provideMerge(Changes.local),
)

/** Lets the forked waiters run up to their wait (scheduling only: the store answers at once). */
const settle = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) yield* Effect.yieldNow
})

describe("deadlines", () => {
  it.effect("an assignments long-poll answers at its deadline, unchanged, without reading the store while it waits or when it answers", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const assignments = yield* Assignments.Assignments
      yield* store.registerHost({ id: "d1" })
      yield* store.reportHost("d1", { totalMib: 8192, allocatableMib: 6144, totalVcpus: 4 })
      const first = yield* assignments.read("d1")
      const reads = counted.counts.total()
      const poll = yield* Effect.forkChild(assignments.poll("d1", { waitMs: 30_000, since: first.version }))
      yield* settle
      // Early by at most `earlyMs` (1 s of 30 s), by the wheel's slot of 50 ms at most.
      yield* TestClock.adjust(30_000 - earlyMs(30_000) - slotMs - 1)
      assert.isUndefined(poll.pollUnsafe(), "still waiting before its deadline less the early margin")
      yield* TestClock.adjust(earlyMs(30_000) + slotMs + 1)
      assert.isDefined(poll.pollUnsafe(), "answered by its deadline")
      const answer = yield* Fiber.join(poll)
      assert.strictEqual(answer.version, first.version)
      assert.strictEqual(counted.counts.total(), reads)
    }).pipe(Effect.provide(layer)),
  )

  it.effect("a notice that changed nothing the poll waits for costs one re-read; the poll still answers at its deadline", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const assignments = yield* Assignments.Assignments
      const notifier = yield* Notifier
      yield* store.registerHost({ id: "d2" })
      yield* store.reportHost("d2", { totalMib: 8192, allocatableMib: 6144, totalVcpus: 4 })
      const first = yield* assignments.read("d2")
      const poll = yield* Effect.forkChild(assignments.poll("d2", { waitMs: 20_000, since: first.version }))
      yield* settle
      const before = counted.counts.byName.get("hostAssignments") ?? 0
      yield* TestClock.adjust(5_000)
      yield* notifier.notify(Topic.host("d2"))
      yield* settle
      assert.strictEqual((counted.counts.byName.get("hostAssignments") ?? 0) - before, 1)
      assert.isUndefined(poll.pollUnsafe())
      yield* TestClock.adjust(15_000)
      assert.strictEqual((yield* Fiber.join(poll)).version, first.version)
      assert.strictEqual((counted.counts.byName.get("hostAssignments") ?? 0) - before, 1)
    }).pipe(Effect.provide(layer)),
  )

  it.effect("2,000 waits due at once are answered in one pass of the deadline wheel, at their deadline, each once", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const assignments = yield* Assignments.Assignments
      const waiter = yield* SessionWaiter
      const notifier = yield* Notifier
      const hosts = Array.from({ length: 1000 }, (_, i) => `m${i}`)
      for (const id of hosts) {
        yield* store.registerHost({ id })
        yield* store.reportHost(id, { totalMib: 8192, allocatableMib: 6144, totalVcpus: 4 })
      }
      const sessions = Array.from({ length: 1000 }, (_, i) => `m-s${i}`)
      for (const id of sessions) yield* store.createSession({ id, budget: { memMib: 512, vcpus: 1 } })
      const versions = yield* Effect.forEach(hosts, (id) => Effect.map(assignments.read(id), (a) => a.version))
      const polls = yield* Effect.forEach(hosts, (id, i) => Effect.forkChild(assignments.poll(id, { waitMs: 20_000, since: versions[i] })))
      const waits = yield* Effect.forEach(sessions, (id) => Effect.forkChild(waiter.until(id, "parked", 20_000)))
      yield* settle
      assert.strictEqual(notifier.timed(), 2000, "every wait is on the wheel")
      const passes = notifier.passes()
      yield* TestClock.adjust(20_000 - earlyMs(20_000) - slotMs - 1)
      assert.isTrue([...polls, ...waits].every((f) => f.pollUnsafe() === undefined), "none answered before the early margin")
      yield* TestClock.adjust(earlyMs(20_000) + slotMs + 1)
      assert.isTrue([...polls, ...waits].every((f) => f.pollUnsafe() !== undefined), "every one answered by its deadline")
      assert.strictEqual(notifier.passes() - passes, 1, "in one pass")
      assert.strictEqual(notifier.timed(), 0)
      const outcomes = yield* Effect.forEach(waits, Fiber.join)
      assert.isTrue(outcomes.every((o) => o._tag === "TimedOut"))
    }).pipe(Effect.provide(layer)),
  )

  it.effect("a session wait times out at its deadline with the state it read when it began, and one read", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const waiter = yield* SessionWaiter
      yield* store.createSession({ id: "d-s1", budget: { memMib: 512, vcpus: 1 } })
      const before = counted.counts.byName.get("getSession") ?? 0
      const wait = yield* Effect.forkChild(waiter.until("d-s1", "running", 60_000))
      yield* settle
      yield* TestClock.adjust(60_000)
      const outcome = yield* Fiber.join(wait)
      assert.deepStrictEqual([outcome._tag, outcome.session.state], ["TimedOut", "queued"])
      assert.strictEqual((counted.counts.byName.get("getSession") ?? 0) - before, 1)
    }).pipe(Effect.provide(layer)),
  )
})
