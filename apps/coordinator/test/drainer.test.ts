// The drainer, "room appeared" in one place: concurrent callers share drains, and every caller's change is
// drained by a drain that started after it (no sleeps: a latch holds the first drain open).
import { assert, describe, it } from "@effect/vitest"
import { Drainer, Metrics, Notifier } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Fiber, Layer } from "effect"

describe("Drainer.roomAppeared", () => {
  it.effect("callers that arrive while a drain runs share the next drain, which sees their change", () => {
    const inner = StoreSim.make().store
    let drains = 0
    const firstDone = Deferred.makeUnsafe<void>()
    const releaseFirst = Deferred.makeUnsafe<void>()
    // The first drain reads the queue, then waits at a latch: its answer is of the old state.
    const store = Store.of({
      ...inner,
      drainQueue: () =>
        Effect.gen(function* () {
          drains += 1
          const result = yield* inner.drainQueue()
          if (drains === 1) {
            yield* Deferred.succeed(firstDone, undefined)
            yield* Deferred.await(releaseFirst)
          }
          return result
        }),
    })
    const layer = Drainer.layer.pipe(Layer.provideMerge(Layer.mergeAll(Metrics.layer, Notifier.layer)), Layer.provideMerge(Changes.local), Layer.provideMerge(Layer.succeed(Store, store)))
    return Effect.gen(function* () {
      const drainer = yield* Drainer
      // A queued session and, so far, no host.
      const q = yield* inner.createSession({ id: "q1", budget: { memMib: 512, vcpus: 1 } })
      assert.strictEqual(q._tag, "Queued")
      const first = yield* Effect.forkChild(drainer.roomAppeared())
      yield* Deferred.await(firstDone)
      // Room appears while the first drain is still running: a host registers and reports.
      yield* inner.registerHost({ id: "h1" })
      yield* inner.reportHost("h1", { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })
      const callers = yield* Effect.forEach([1, 2, 3, 4, 5], () => Effect.forkChild(drainer.roomAppeared()))
      // Let the callers reach their wait (scheduling only: they do no I/O before it).
      for (let i = 0; i < 3; i++) yield* Effect.yieldNow
      yield* Deferred.succeed(releaseFirst, undefined)
      const before = yield* Fiber.join(first)
      const after = yield* Fiber.joinAll(callers)
      assert.deepStrictEqual(before.placed, [])
      // One more drain for the five of them, and it placed the queued session on the new host.
      assert.strictEqual(drains, 2)
      for (const r of after) assert.deepStrictEqual(r.placed, [{ sessionId: "q1", hostId: "h1" }])
      assert.strictEqual((yield* inner.getSession("q1")).state, "pending")
    }).pipe(Effect.provide(layer))
  })

  it.effect("a failing drain is logged and places nothing; the caller does not fail", () => {
    const inner = StoreSim.make().store
    const store = Store.of({ ...inner, drainQueue: () => Effect.die(new Error("drain exploded (test)")) })
    const layer = Drainer.layer.pipe(Layer.provideMerge(Layer.mergeAll(Metrics.layer, Notifier.layer)), Layer.provideMerge(Changes.local), Layer.provideMerge(Layer.succeed(Store, store)))
    return Effect.gen(function* () {
      const drainer = yield* Drainer
      assert.deepStrictEqual(yield* drainer.roomAppeared(), { placed: [], unapplied: [], remaining: -1 })
      // The next call starts a new drain (the failed one does not wedge the service).
      assert.deepStrictEqual(yield* drainer.roomAppeared(), { placed: [], unapplied: [], remaining: -1 })
    }).pipe(Effect.provide(layer))
  })

  it.effect("while the queue is known empty, room appearing drains nothing; a queued session's notice makes the next call drain", () => {
    const inner = StoreSim.make().store
    let drains = 0
    const store = Store.of({ ...inner, drainQueue: (o) => Effect.suspend(() => ((drains += 1), inner.drainQueue(o))) })
    const layer = Drainer.layer.pipe(Layer.provideMerge(Layer.mergeAll(Metrics.layer, Notifier.layer)), Layer.provideMerge(Changes.local), Layer.provideMerge(Layer.succeed(Store, store)))
    return Effect.gen(function* () {
      const drainer = yield* Drainer
      const notifier = yield* Notifier
      yield* inner.registerHost({ id: "e1" })
      yield* inner.reportHost("e1", { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })
      // The first call cannot know: it drains, and finds nothing queued.
      assert.strictEqual((yield* drainer.roomAppeared()).remaining, 0)
      assert.strictEqual(drains, 1)
      // Reports, releases…: nothing to drain, no drain.
      for (let i = 0; i < 5; i++) yield* drainer.roomAppeared()
      assert.strictEqual(drains, 1)
      // A session queued (through any replica: its notice) makes the next call drain again.
      yield* inner.createSession({ id: "e-q", budget: { memMib: 65_536, vcpus: 1 } })
      yield* notifier.notify(Topic.queue)
      assert.strictEqual((yield* drainer.roomAppeared()).remaining, 1)
      assert.strictEqual(drains, 2)
      yield* drainer.roomAppeared()
      assert.strictEqual(drains, 3)
    }).pipe(Effect.provide(layer))
  })
})
