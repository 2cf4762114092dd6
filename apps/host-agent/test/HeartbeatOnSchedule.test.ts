/**
 * A heartbeat that hangs does not hold back the next one. With one coordinator URL a call's bound
 * is 30 s whatever the heartbeat interval (`Failover.callTimeoutFor`); when each heartbeat was
 * awaited before the next sleep, one hung heartbeat meant none for 30 s, and with a short stale
 * window (12 s, a 4 s interval) the host went stale, its sessions lost and their guests
 * destroyed. Guards the README's promise (a heartbeat never more than its interval after the
 * last was sent) with heartbeats that hang or answer slowly, and the bound on how many are open
 * at once (`maxHeartbeatsInFlight`: past it the oldest is given up).
 */
import { assert, describe } from "@effect/vitest"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent, maxHeartbeatsInFlight } from "../src/Agent.js"
import { CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom } from "./support/PatientClock.js"

const highest = 1 - 1e-9

const gaps = (ts: readonly number[]) => ts.slice(1).map((t, i) => t - ts[i]!)

/**
 * An agent (4 s heartbeat interval, 12 s stale window) whose heartbeats take `takesMs` on the
 * TestClock, then answer (`fails` false) or fail (a timeout); the sends' instants and the most
 * heartbeats open at once.
 */
const run = (takesMs: number, fails: boolean) =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    const c = fake.client("a")
    const sends: number[] = []
    let open = 0
    let mostOpen = 0
    let answered = 0
    const client: CoordinatorShape = {
      ...c,
      heartbeat: Effect.gen(function* () {
        sends.push(yield* Clock.currentTimeMillis)
        open++
        mostOpen = Math.max(mostOpen, open)
        yield* Effect.sleep(takesMs)
        if (fails) return yield* Effect.fail(new CoordinatorError({ op: "heartbeat", status: null, message: "timed out" }))
        answered++
        return yield* c.heartbeat
      }).pipe(Effect.ensuring(Effect.sync(() => open--))),
    }
    const runtime = yield* SimRuntime.make({ startMs: 50 })
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const agent = yield* makeAgent(
      { ...defaultAgentConfig("a"), heartbeatIntervalMs: 4_000, heartbeatStaleWindowMs: 12_000 },
      {
        coordinator: client,
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-a-"))),
        link: PeerLink.inMemory(new Map()),
        target: yield* makeMoveTarget("a", runtime, residents),
      },
    )
    const fiber = yield* Effect.forkChild(agent.run)
    yield* TestClock.adjust("2 minutes")
    yield* Fiber.interrupt(fiber)
    return { sends, mostOpen, answered: () => answered }
  }).pipe(Effect.provideService(Random.Random, fixedRandom(highest)))

describe("heartbeats on schedule while one hangs (one coordinator URL, a 12 s stale window)", () => {
  effect("heartbeats that hang 30 s before failing are still sent within the 4 s interval, at most three open at once", () =>
    Effect.gen(function* () {
      const r = yield* run(30_000, true)
      assert.isAtLeast(r.sends.length, 25, "a heartbeat every interval for two minutes")
      for (const g of gaps(r.sends)) assert.isAtMost(g, 4_000, `heartbeats sent ${g} ms apart`)
      assert.strictEqual(r.mostOpen, maxHeartbeatsInFlight, "the oldest is given up once three are open")
    }),
  )

  effect("heartbeats answered after 6 s (longer than the interval) all count, sent within the interval", () =>
    Effect.gen(function* () {
      const r = yield* run(6_000, false)
      for (const g of gaps(r.sends)) assert.isAtMost(g, 4_000, `heartbeats sent ${g} ms apart`)
      assert.isAtMost(r.mostOpen, 2)
      // Every heartbeat sent more than 6 s before the end was answered: none was given up.
      assert.isAtLeast(r.answered(), r.sends.filter((t) => t <= 120_000 - 6_000).length)
    }),
  )
})
