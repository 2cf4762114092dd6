// A leader that thaws after a takeover (its VM paused: its clock stood still, so it still
// believes it leads under its old epoch until its next lease check) starts no descent from the
// immediate reaction (ReactAtOnce): the reaction's writes carry the fence it began with, and
// PostgreSQL refuses them once a newer epoch exists (SPEC §13). The new leader's reaction does.
import { assert, describe, it } from "@effect/vitest"
import { Leader, Metrics, Notifier } from "@engram/coordinator"
import { defaultTriggerWindowMs, Trigger } from "@engram/reaper"
import { Changes, Leadership, Store } from "@engram/store"
import type { LeadershipShape, StoreShape } from "@engram/store"
import { Lease, StorePg } from "@engram/store-pg"
import { freshDatabase } from "@engram/test-pg"
import { Context, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { ReactAtOnce } from "../src/Reaper.js"

const times = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000 }

/** Waits (real time, at most `ms`) until `done` answers true; answers whether it did. */
const until = (done: () => Effect.Effect<boolean>, ms = 30_000) =>
  Effect.gen(function* () {
    const end = Date.now() + ms
    while (Date.now() < end) {
      if (yield* done()) return true
      yield* Effect.promise(() => new Promise((r) => setTimeout(r, 25)))
    }
    return false
  })

/**
 * A reaction run by a replica with `leader`: poked, its window passed. Its layer lives in the
 * test's scope (the reaction runs in it after the poke returns).
 */
const poke = (store: StoreShape, leader: LeadershipShape) =>
  Effect.gen(function* () {
    const services = Layer.mergeAll(Metrics.layer, Notifier.layer.pipe(Layer.provide(Changes.local)), Layer.succeed(Leader, leader), Layer.succeed(Store, store))
    const trigger = Context.get(yield* Layer.build(ReactAtOnce.pipe(Layer.provide(services))), Trigger)
    yield* trigger.poke
    yield* TestClock.adjust(defaultTriggerWindowMs)
  })

describe("the immediate reaction under a lease (PostgreSQL, TestClock)", () => {
  it.effect("a leader that thawed after a takeover starts no descent (refused as fenced); the new leader's reaction starts it", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const { store } = yield* StorePg.openUrl({ url: database.url, poolSize: 2 })
      const lease = (holder: string) => Effect.map(Layer.build(Lease.layer({ url: database.url, ...times, holder })), (c) => Context.get(c, Leadership))
      const a = yield* lease("a")
      const b = yield* lease("b")
      assert.isTrue(yield* a.tick)
      assert.isFalse(yield* b.tick)
      const epoch1 = a.fence()
      assert.deepStrictEqual(epoch1, { name: "reaper", epoch: 1 })
      // A freezes for a whole lease; B takes over at epoch 2.
      yield* TestClock.adjust(times.leaseDurationMs)
      assert.isTrue(yield* b.tick)
      assert.deepStrictEqual(b.fence(), { name: "reaper", epoch: 2 })
      // A parked session on a full host, and a queued one that needs its room.
      yield* store.registerHost({ id: "h1" })
      yield* store.reportHost("h1", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
      yield* store.createSession({ id: "p1", budget: { memMib: 2048, vcpus: 1 }, affinity: ["h1"] })
      yield* store.markRunning("p1")
      yield* store.idle("p1")
      assert.strictEqual((yield* store.getSession("p1")).state, "parked")
      const queued = yield* store.createSession({ id: "q1", budget: { memMib: 2048, vcpus: 1 } })
      assert.strictEqual(queued._tag, "Queued")
      // A as it thaws, before its next lease check: it believes it leads under epoch 1.
      const thawed = Leader.of({ tick: Effect.succeed(true), isLeader: () => true, fence: () => epoch1 })
      const warnings: string[] = []
      const capture = Logger.layer([
        Logger.make(({ logLevel, message }) => {
          if (logLevel === "Warn") warnings.push(JSON.stringify(message))
        }),
      ])
      yield* poke(store, thawed).pipe(Effect.provide(capture))
      const refusal = () => warnings.some((w) => w.includes("descent not started"))
      // Done when the refusal is logged, or (the bug) when p1 no longer parks.
      yield* until(() => (refusal() ? Effect.succeed(true) : Effect.map(store.getSession("p1"), (s) => s.state !== "parked").pipe(Effect.orDie)))
      assert.isTrue(refusal(), "the thawed leader's reaction ended with a refused descent")
      assert.match(warnings.join("\n"), /fenced/)
      assert.strictEqual((yield* store.getSession("p1")).state, "parked")
      // The leader at epoch 2 reacts: the descent starts.
      yield* poke(store, b)
      const descending = yield* until(() => Effect.map(store.getSession("p1"), (s) => s.state === "descending").pipe(Effect.orDie))
      assert.isTrue(descending, "the new leader's reaction starts the descent")
    }).pipe(Effect.scoped),
  )
})
