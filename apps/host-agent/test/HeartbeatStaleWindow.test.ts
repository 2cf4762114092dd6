/**
 * The agent learns the coordinator's heartbeat stale window from the assignments' limits
 * (`heartbeatStaleWindowMs`) and heartbeats within a third of the shorter of its own and the
 * coordinator's. Before, it heartbeated by its own setting alone: an agent left at the default
 * 120 s window (a 40 s interval) against a coordinator at 15 s went stale between heartbeats and
 * its guests were reclaimed. One warning when the windows differ; a coordinator that sends no
 * window (an older one) leaves the agent's own cadence.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Clock, Effect, Fiber, Logger, Random } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom, noImages } from "./support/PatientClock.js"

// Every drawn interval at its longest: the worst case for the stale window.
const highest = 1 - 1e-9

const gaps = (ts: readonly number[]) => ts.slice(1).map((t, i) => t - ts[i]!)

/**
 * Agent `a` (its own 120 s window: a 40 s interval) on `client`, on a simulated runtime, forked
 * running; the warnings whose text `keep` picks.
 */
const agentOn = (client: CoordinatorShape, keep: (text: string) => boolean) =>
  Effect.gen(function* () {
    const runtime = yield* SimRuntime.make({ startMs: 50 })
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const warnings: string[] = []
    const capture = Logger.layer([
      Logger.make(({ logLevel, message }) => {
        const text = JSON.stringify(message)
        if (logLevel === "Warn" && keep(text)) warnings.push(text)
      }),
    ])
    const agent = yield* makeAgent(defaultAgentConfig("a", 120_000), {
      coordinator: client,
      runtime,
      measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
      residents,
      // No image I/O: every step of the agent is one the TestClock tracks (the order does not depend on the machine).
      images: noImages,
      link: PeerLink.inMemory(new Map()),
      target: yield* makeMoveTarget("a", runtime, residents),
    })
    const fiber = yield* Effect.forkChild(agent.run.pipe(Effect.provide(capture)))
    return { runtime, warnings, fiber }
  })

/**
 * An agent with its own 120 s window (the default: a 40 s interval) against a coordinator that
 * sends `coordinatorWindowMs` (null: none), run for two minutes; its heartbeats' instants and
 * its warnings about the window.
 */
const run = (coordinatorWindowMs: number | null) =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    yield* fake.setStaleWindow(coordinatorWindowMs)
    const c = fake.client("a")
    const sends: number[] = []
    const client: CoordinatorShape = { ...c, heartbeat: Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.andThen(Effect.sync(() => sends.push(t)), c.heartbeat)) }
    const { warnings, fiber } = yield* agentOn(client, (text) => text.includes("stale window"))
    yield* TestClock.adjust("2 minutes")
    yield* Fiber.interrupt(fiber)
    return { sends, warnings }
  }).pipe(Effect.provideService(Random.Random, fixedRandom(highest)))

describe("the agent heartbeats within the coordinator's stale window", () => {
  effect("own window 120 s, the coordinator's 15 s: heartbeats at most 5 s apart, one warning", () =>
    Effect.gen(function* () {
      const r = yield* run(15_000)
      assert.isAtLeast(r.sends.length, 20, "a heartbeat every 5 s for two minutes")
      for (const g of gaps(r.sends)) assert.isAtMost(g, 5_000, `heartbeats sent ${g} ms apart`)
      assert.strictEqual(r.warnings.length, 1, r.warnings.join("\n"))
      assert.match(r.warnings[0]!, /shorter than this agent's/)
    }),
  )

  effect("a coordinator that sends no window (an older one): the agent's own 40 s interval, no warning", () =>
    Effect.gen(function* () {
      const r = yield* run(null)
      for (const g of gaps(r.sends)) assert.isAtMost(g, 40_000, `heartbeats sent ${g} ms apart`)
      assert.isAtLeast(Math.max(...gaps(r.sends)), 30_000, "the agent's own cadence")
      assert.deepStrictEqual(r.warnings, [])
    }),
  )

  effect("the coordinator's window longer than the agent's: the agent keeps its own interval, one warning", () =>
    Effect.gen(function* () {
      const r = yield* run(600_000)
      for (const g of gaps(r.sends)) assert.isAtMost(g, 40_000, `heartbeats sent ${g} ms apart`)
      assert.strictEqual(r.warnings.length, 1, r.warnings.join("\n"))
      assert.match(r.warnings[0]!, /longer than this agent's/)
    }),
  )
})

/**
 * An agent with its own 120 s window against a coordinator that sends `coordinatorWindowMs`
 * (longer), its session s1 running; then no heartbeat of it is answered for `silentMs` (its
 * polls are), s1 ends meanwhile and the heartbeats are answered again. Its warnings that the
 * host's reservations were reclaimed as stale.
 */
const silence = (coordinatorWindowMs: number, silentMs: number) =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    yield* fake.setStaleWindow(coordinatorWindowMs)
    yield* fake.addSession("s1", "a", 512)
    const c = fake.client("a")
    let down = false
    const client: CoordinatorShape = {
      ...c,
      heartbeat: Effect.suspend(() => (down ? Effect.fail(new CoordinatorError({ op: "heartbeat", status: null, message: "timed out" })) : c.heartbeat)),
    }
    const { runtime, warnings: reclaimed, fiber } = yield* agentOn(client, (text) => text.includes("reclaimed as stale"))
    yield* TestClock.adjust("1 minute")
    assert.deepStrictEqual((yield* runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
    down = true
    yield* TestClock.adjust(silentMs - 30_000)
    // The session ends while the heartbeats still go unanswered (an ordinary end, not a reclaim).
    yield* fake.setState("s1", "ended")
    yield* TestClock.adjust("30 seconds")
    down = false
    yield* TestClock.adjust("2 minutes")
    yield* Fiber.interrupt(fiber)
    assert.deepStrictEqual(yield* runtime.list, [], "the ended session's VM goes either way")
    return reclaimed
  }).pipe(Effect.provideService(Random.Random, fixedRandom(highest)))

describe("what the agent says of a heartbeat silence is judged by the coordinator's window", () => {
  effect("the coordinator's window (10 min) longer than the agent's (2 min): a 4 min silence reclaims nothing, and the agent does not say it did", () =>
    Effect.gen(function* () {
      // Before: judged by the shorter window, a warning that s1 was reclaimed as stale and its VM destroyed.
      assert.deepStrictEqual(yield* silence(600_000, 240_000), [])
    }),
  )

  effect("a silence longer than the coordinator's window: the reclaim is said, naming its window", () =>
    Effect.gen(function* () {
      const reclaimed = yield* silence(600_000, 660_000)
      assert.strictEqual(reclaimed.length, 1, reclaimed.join("\n"))
      assert.include(reclaimed[0]!, "longer than the coordinator's stale window (600000 ms")
    }),
  )
})
