// A reaper pass cut by a shutdown right after one of its writes committed still sends that
// write's notices. SIGTERM closes the reaper loop's scope, which interrupts the loop's fiber
// wherever its pass is: between the store's commit and the notice, the write stood unheard (a
// TTL's end left its host's agent running a guest whose session had ended; a drain's placement
// was never started by its host's agent). Each write and what it tells is now one step the
// interruption does not cut; the pass stops at the next step. The real reaper loop runs here on
// the in-memory store under a TestClock; the store holds its answer after the commit until the
// test has interrupted the loop's fiber (as the loop's scope does when it closes).
import { assert, describe, it } from "@effect/vitest"
import { Auth, Config, Leader, Metrics, Notifier, ReaperLoop, Settings } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import { Deferred, Effect, Exit, Fiber, Layer, Scope } from "effect"
import { TestClock } from "effect/testing"
import { held as holdOf, holding, queuedUntilRoom } from "./support/held.js"
import type { Held } from "./support/held.js"

const settings = (() => {
  const parsed = Config.parse({ ENGRAM_ADMIN_TOKEN: "reaper-shutdown-admin-token-0123456789" })
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Settings.of({ config: parsed.config, backend: "custom" })
})()

/** What the reaper loop needs beside the store: one process that always leads. */
const services = (store: Layer.Layer<Store>) =>
  Layer.mergeAll(
    Metrics.layer,
    Notifier.layer,
    Leader.single,
    Layer.succeed(Settings, settings),
    Layer.succeed(Auth.AdminToken, Auth.AdminToken.of({ tokenHash: "", token: "", file: null, fingerprint: "", metricsTokenHash: null })),
  ).pipe(Layer.provideMerge(Changes.local), Layer.provideMerge(store))

/**
 * Starts the reaper loop in a scope of its own (its first pass runs at once), waits for the held
 * write to commit, interrupts the loop's fiber there, releases the answer, and closes the scope
 * as a shutdown does. Answers the topics published from the commit on, and how the loop ended.
 */
const cutAfterCommit = (held: Held) =>
  Effect.gen(function* () {
    const heard: string[] = []
    yield* (yield* Changes).subscribe({ changed: (topics) => void heard.push(...topics), missed: () => undefined })
    const scope = yield* Scope.make()
    const context = yield* Effect.context<Store | Changes | Metrics | Notifier | Leader | Settings | Auth.AdminToken>()
    yield* Layer.buildWithScope(ReaperLoop, scope).pipe(Effect.provideContext(context))
    const loop = yield* Deferred.await(held.committed)
    heard.length = 0
    // SIGTERM: the loop's scope interrupts its fiber, here between the commit and the answer.
    loop.interruptUnsafe()
    yield* Deferred.succeed(held.gate, undefined)
    yield* Scope.close(scope, Exit.void)
    return { heard, exit: yield* Fiber.await(loop) }
  })

describe("a reaper pass cut by shutdown right after a commit", () => {
  it.effect("still tells a TTL's end to the session's host and waiters, and stops there", () => {
    const held = holdOf("endSession")
    return Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 8 })
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], ttlMs: 1000 })
      yield* store.markRunning("s1")
      // Another session due after the first: a pass that went on would end it too.
      yield* store.createSession({ id: "s2", budget: { memMib: 1024, vcpus: 1 }, affinity: ["h1"], ttlMs: 1001 })
      yield* store.markRunning("s2")
      yield* TestClock.adjust(1001)
      const { heard, exit } = yield* cutAfterCommit(held)
      assert.strictEqual((yield* store.getSession("s1")).state, "ended")
      assert.include(heard, Topic.host("h1"))
      assert.include(heard, Topic.session("s1"))
      // The shutdown stopped the pass at the next step: the second end was not begun.
      assert.isTrue(Exit.hasInterrupts(exit))
      assert.strictEqual((yield* store.getSession("s2")).state, "running")
    }).pipe(Effect.provide(services(holding(held))))
  })

  it.effect("still tells a drain's placement to its host's agent", () => {
    const held = holdOf("drainQueue")
    return Effect.gen(function* () {
      const store = yield* Store
      // Queued: no room on h1 until its report says more.
      assert.strictEqual((yield* queuedUntilRoom)._tag, "Queued")
      const { heard, exit } = yield* cutAfterCommit(held)
      assert.deepStrictEqual([(yield* store.getSession("q1")).state, (yield* store.getSession("q1")).hostId], ["pending", "h1"])
      assert.include(heard, Topic.host("h1"))
      assert.isTrue(Exit.hasInterrupts(exit))
    }).pipe(Effect.provide(services(holding(held))))
  })
})
