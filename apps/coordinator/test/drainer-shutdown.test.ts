// A drain cut by a shutdown right after its commit still tells what it placed. The drainer runs
// each drain in a fiber of its scope, which a shutdown closes: interrupted between the store's
// commit and the notices, the placement stood unheard (its host's agent never started it, its
// waiters slept to their deadlines). The drain, its hosts' notices and its sessions' are now one
// step the interruption does not cut. The in-memory store holds its answer after the commit until
// the test has interrupted the drain's fiber.
import { assert, describe, it } from "@effect/vitest"
import { Drainer, Metrics, Notifier } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { held as holdOf, holding, queuedUntilRoom } from "./support/held.js"

const held = holdOf("drainQueue")

describe("a drain cut by shutdown right after its commit", () => {
  it.effect("still tells the placement to its host's agent and to its session's waiters", () =>
    Effect.gen(function* () {
      const store = yield* Store
      assert.strictEqual((yield* queuedUntilRoom)._tag, "Queued")
      const heard: string[] = []
      yield* (yield* Changes).subscribe({ changed: (topics) => void heard.push(...topics), missed: () => undefined })
      // The drainer in a scope of its own, as the coordinator holds it until shutdown.
      const scope = yield* Scope.make()
      const context = yield* Effect.context<Store | Changes | Metrics | Notifier>()
      const drainer = yield* Layer.buildWithScope(Drainer.layer, scope).pipe(Effect.provideContext(context), Effect.map((c) => Context.get(c, Drainer)))
      yield* Effect.forkChild(drainer.roomAppeared(Topic.host("h1")))
      const drain = yield* Deferred.await(held.committed)
      heard.length = 0
      // The shutdown: the drain's fiber is interrupted between the commit and its answer.
      drain.interruptUnsafe()
      yield* Deferred.succeed(held.gate, undefined)
      yield* Scope.close(scope, Exit.void)
      yield* Fiber.await(drain)
      assert.deepStrictEqual([(yield* store.getSession("q1")).state, (yield* store.getSession("q1")).hostId], ["pending", "h1"])
      assert.include(heard, Topic.host("h1"))
      assert.include(heard, Topic.session("q1"))
    }).pipe(Effect.provide(Layer.mergeAll(Metrics.layer, Notifier.layer).pipe(Layer.provideMerge(Changes.local), Layer.provideMerge(holding(held))))),
  )
})
