// A long-poll still answers at its deadline when nothing changes, on the Effect Clock (a
// TestClock here: no sleeping), and reads the store neither while it waits nor when it answers;
// a notice that changed nothing the poll waits for costs one re-read and the poll waits on.
import { assert, describe, it } from "@effect/vitest"
import { Assignments, Config, Notifier, SessionWaiter, Settings } from "@engram/coordinator"
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
      yield* TestClock.adjust(29_999)
      assert.isUndefined(poll.pollUnsafe(), "still waiting 1 ms before its deadline")
      yield* TestClock.adjust(1)
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
      const before = counted.counts.byName.get("listSessions") ?? 0
      yield* TestClock.adjust(5_000)
      yield* notifier.notify(Topic.host("d2"))
      yield* settle
      assert.strictEqual((counted.counts.byName.get("listSessions") ?? 0) - before, 1)
      assert.isUndefined(poll.pollUnsafe())
      yield* TestClock.adjust(15_000)
      assert.strictEqual((yield* Fiber.join(poll)).version, first.version)
      assert.strictEqual((counted.counts.byName.get("listSessions") ?? 0) - before, 1)
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
