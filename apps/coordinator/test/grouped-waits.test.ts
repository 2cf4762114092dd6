// Waiters woken at once share their store reads (fleet scale, issue 20). A possible miss of
// notices (a replica died without leaving cleanly, the LISTEN connection came back) wakes every
// waiter; before, each session wait and each move wait re-read with a read of its own: thousands
// of statements in one instant, on the pool ahead of heartbeats and creates. Now those of one
// tick go as reads of many ids (at most `maxGroupedReads` each), and each wait still answers as
// it did: reached, unreachable, timed out, or NotFound for a session that is gone.
import { assert, describe, it } from "@effect/vitest"
import { Config, Drainer, Metrics, MoveWaiter, Notifier, SessionWaiter, Settings } from "@engram/coordinator"
import type { MoveOutcome } from "@engram/coordinator"
import { Changes, makeHub, Store } from "@engram/store"
import type { Move } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Exit, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { maxGroupedReads } from "../src/GroupedReads.js"
import { counting } from "./support/counting.js"

// Notices within this process whose loss the test can announce (`hub.miss()`), as ChangesPg does.
const hub = makeHub()
const changes = Layer.succeed(
  Changes,
  Changes.of({ publish: (topics) => Effect.sync(() => hub.deliver([...new Set(topics)])), subscribe: hub.subscribe, live: () => true }),
)
const counted = counting(StoreSim.layer())
const layer = Layer.mergeAll(SessionWaiter.layer, MoveWaiter.layer).pipe(
  Layer.provideMerge(Drainer.layer),
  Layer.provideMerge(Notifier.layer),
  Layer.provideMerge(Metrics.layer),
  Layer.provideMerge(Layer.succeed(Settings, Settings.of({ config: Config.defaults(), backend: "custom" }))),
  Layer.provideMerge(counted.layer),
  Layer.provideMerge(changes),
)

/** The store's reads of `names` so far. */
const readsOf = (...names: string[]) => names.reduce((n, name) => n + (counted.counts.byName.get(name) ?? 0), 0)

/** Lets forked waiters run until `n` of them wait on the deadline wheel (scheduling only: the store answers at once). */
const waitingAre = (n: number) =>
  Effect.gen(function* () {
    const notifier = yield* Notifier
    for (let i = 0; i < 10_000 && notifier.timed() !== n; i++) yield* Effect.yieldNow
    assert.strictEqual(notifier.timed(), n, "every waiter waits")
  })

const big = { totalMib: 1_000_000, allocatableMib: 1_000_000, totalVcpus: 4000 }
const budget = { memMib: 64, vcpus: 1 }
/** Hosts `<prefix>0…` with room for `sessions` sessions (at most 32 entries a host, `maxEntriesPerNode`). */
const hostsFor = (prefix: string, sessions: number) =>
  Effect.gen(function* () {
    const store = yield* Store
    const ids = Array.from({ length: Math.ceil(sessions / 30) }, (_, i) => `${prefix}${i}`)
    for (const id of ids) {
      yield* store.registerHost({ id })
      yield* store.reportHost(id, { ...big, peerUrl: `http://peers.test:7100/${id}` })
    }
    return ids
  })
/** Reads of N waiters woken at once: the grouped reads, and a few more at most. */
const atMost = (n: number) => Math.ceil(n / maxGroupedReads) + 2

describe("waiters woken at once", () => {
  it.effect(
    "1200 session waits woken by a possible miss share a few reads; each answers as before (reached, unreachable, NotFound, timed out)",
    () =>
      Effect.gen(function* () {
        const store = yield* Store
        const waiter = yield* SessionWaiter
        const n = 1200
        yield* hostsFor("h", n)
        const ids = Array.from({ length: n }, (_, i) => `s${i}`)
        for (const id of ids) assert.strictEqual((yield* store.createSession({ id, budget }))._tag, "Placed")
        const waits = yield* Effect.forEach(ids, (id) => Effect.forkChild(Effect.exit(waiter.until(id, "running", 60_000))))
        yield* waitingAre(n)
        // Changed in the store without a notice (as through a replica that died before telling):
        // one ended and pruned (gone), a third started, a third ended; the rest still pending.
        yield* store.endSession("s2")
        yield* TestClock.adjust(10)
        assert.strictEqual((yield* store.pruneHistory({ endedBefore: 5, limit: 10 })).sessions, 1)
        for (let i = 0; i < n; i++) {
          if (i % 3 === 0) yield* store.markRunning(ids[i] as string)
          else if (i % 3 === 1) yield* store.endSession(ids[i] as string)
        }
        const before = readsOf("getSession", "getSessions")
        hub.miss()
        // The woken waiters re-read; those still pending wait again.
        yield* waitingAre(n / 3 - 1)
        const reads = readsOf("getSession", "getSessions") - before
        assert.isAtMost(reads, atMost(n), `${n} waiters re-read in ${reads} reads`)
        yield* TestClock.adjust(60_000)
        const outcomes = yield* Effect.forEach(waits, Fiber.join)
        for (let i = 0; i < n; i++) {
          const exit = outcomes[i] as Exit.Exit<{ readonly _tag: string; readonly session: { readonly id: string; readonly state: string } }, { readonly _tag: string }>
          if (i === 2) {
            assert.isTrue(Exit.isFailure(exit) && exit.cause.reasons.some((r) => r._tag === "Fail" && r.error._tag === "NotFound"), "the pruned session is NotFound")
            continue
          }
          assert.isTrue(Exit.isSuccess(exit), `s${i} answered`)
          if (!Exit.isSuccess(exit)) continue
          const want = i % 3 === 0 ? ["Reached", "running"] : i % 3 === 1 ? ["Unreachable", "ended"] : ["TimedOut", "pending"]
          assert.deepStrictEqual([exit.value._tag, exit.value.session.id, exit.value.session.state], [want[0], `s${i}`, want[1]])
        }
      }).pipe(Effect.provide(layer)),
    60_000,
  )

  it.effect(
    "1200 session waits woken by changes of their sessions in one tick share a few reads",
    () =>
      Effect.gen(function* () {
        const store = yield* Store
        const waiter = yield* SessionWaiter
        const notifier = yield* Notifier
        const n = 1200
        yield* hostsFor("k", n)
        const ids = Array.from({ length: n }, (_, i) => `c${i}`)
        for (const id of ids) assert.strictEqual((yield* store.createSession({ id, budget }))._tag, "Placed")
        const waits = yield* Effect.forEach(ids, (id) => Effect.forkChild(waiter.until(id, "running", 60_000)))
        yield* waitingAre(n)
        for (const id of ids) yield* store.markRunning(id)
        const before = readsOf("getSession", "getSessions")
        yield* notifier.notify(...ids.map((id) => `session:${id}`))
        const outcomes = yield* Effect.forEach(waits, Fiber.join)
        const reads = readsOf("getSession", "getSessions") - before
        assert.isAtMost(reads, atMost(n), `${n} waiters re-read in ${reads} reads`)
        assert.deepStrictEqual(
          outcomes.map((o) => [o._tag, o.session.state]),
          ids.map(() => ["Reached", "running"]),
        )
      }).pipe(Effect.provide(layer)),
    60_000,
  )

  it.effect(
    "600 move waits woken by a possible miss share a few reads; each answers its move's outcome",
    () =>
      Effect.gen(function* () {
        const store = yield* Store
        const waiter = yield* MoveWaiter
        const n = 600
        const sources = yield* hostsFor("src", n)
        const targets = yield* hostsFor("dst", n)
        const begun: Move[] = []
        for (let i = 0; i < n; i++) {
          const id = `m${i}`
          yield* store.createSession({ id, budget, affinity: [sources[i % sources.length] as string] })
          yield* store.markRunning(id)
          begun.push(yield* store.beginMove({ sessionId: id, targetHostId: targets[i % targets.length] as string, maxDowntimeMs: 600 }))
        }
        const waits = yield* Effect.forEach(begun, (m) => Effect.forkChild(waiter.outcome(m)))
        yield* waitingAre(n)
        // Settled in the store without a notice: even ones aborted, odd ones committed.
        for (let i = 0; i < n; i++) {
          const id = (begun[i] as Move).id
          if (i % 2 === 0) yield* store.abortMove(id, "operator")
          else {
            yield* store.recordRound(id, { kind: "final", wireBytes: 10, apparentBytes: 20, sendMs: 10, captureMs: 5 })
            yield* store.commitMove(id, { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 })
          }
        }
        const before = readsOf("getMove", "getMoves")
        hub.miss()
        const outcomes: MoveOutcome[] = yield* Effect.forEach(waits, Fiber.join)
        const reads = readsOf("getMove", "getMoves") - before
        assert.isAtMost(reads, atMost(n), `${n} move waiters re-read in ${reads} reads`)
        assert.deepStrictEqual(
          outcomes.map((o) => [o._tag, o.move.id]),
          begun.map((m, i) => [i % 2 === 0 ? "Aborted" : "Committed", m.id]),
        )
      }).pipe(Effect.provide(layer)),
    60_000,
  )
})
