/**
 * Reports that fail while heartbeats are answered: the coordinator keeps the host's reservations
 * but, past its stale window without a report, treats the host as silent and places nothing on
 * it. The agent says so (a warning past a third of the window, another past the window) and says
 * when its reports land again; heartbeats and the assignments poll say when they are answered
 * again after failures. An in-memory coordinator, the agent's own loops on the TestClock.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Effect, Logger } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect } from "./support/PatientClock.js"

interface Line {
  readonly level: string
  readonly text: string
  readonly fields: Record<string, unknown>
}

/** An agent of host `a` on a 12 s stale window (heartbeats and reports every 4 s at most), its log lines kept. */
const agentOf = Effect.gen(function* () {
  const fake = yield* makeFakeCoordinator
  const base = fake.client("a")
  const failing = { reports: false }
  const client: CoordinatorShape = {
    ...base,
    report: (r, active) => (failing.reports ? Effect.fail(new CoordinatorError({ op: "report", status: 500, message: "report refused (test)" })) : base.report(r, active)),
  }
  const runtime = yield* SimRuntime.make({ startMs: 50 })
  const residents = yield* makeResidents("a", null, () => Effect.void)
  const agent = yield* makeAgent(defaultAgentConfig("a", 12_000), {
    coordinator: client,
    runtime,
    measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
    residents,
    images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-streaks-"))),
    link: PeerLink.inMemory(new Map()),
    target: yield* makeMoveTarget("a", runtime, residents),
  })
  const lines: Line[] = []
  const capture = Logger.make<unknown, void>(({ logLevel, message }) => {
    const parts = (Array.isArray(message) ? message : [message]) as unknown[]
    lines.push({ level: String(logLevel), text: String(parts[0]), fields: (parts[1] ?? {}) as Record<string, unknown> })
  })
  yield* Effect.forkChild(agent.run.pipe(Effect.provide(Logger.layer([capture]))))
  /** Steps the TestClock a second at a time for `seconds`. */
  const advance = (seconds: number) =>
    Effect.gen(function* () {
      for (let i = 0; i < seconds; i++) yield* TestClock.adjust("1 second")
    })
  const said = (pattern: RegExp) => lines.filter((l) => pattern.test(l.text))
  return { fake, failing, lines, advance, said }
})

describe("an agent says when its calls keep failing, and when they are answered again", () => {
  effect("reports failing while heartbeats are answered: a warning past a third of the stale window, another past the window, then 'reports landing again'", () =>
    Effect.gen(function* () {
      const a = yield* agentOf
      yield* a.advance(5)
      assert.isAbove((yield* a.fake.get).reports.size, 0)
      a.failing.reports = true
      // Reports every 3.6-4 s: failing for 4 s (a third of 12) is not yet worth a warning.
      yield* a.advance(3)
      assert.deepStrictEqual(a.said(/^no report of this host has landed/), [])
      yield* a.advance(8)
      const third = a.said(/more than a third of the coordinator's stale window/)
      assert.strictEqual(third.length, 1, "one warning past a third of the window")
      assert.strictEqual(third[0]!.level, "Warn")
      assert.match(third[0]!.text, /^no report of this host has landed for \d+ ms, more than a third of the coordinator's stale window \(12000 ms\): once the window passes without one, the coordinator will treat this host as silent and place nothing on it$/)
      assert.isAbove(third[0]!.fields["silentForMs"] as number, 4000)
      assert.isBelow(third[0]!.fields["heartbeatAnsweredAgoMs"] as number, 12_000, "its heartbeats are answered meanwhile")
      assert.strictEqual(third[0]!.fields["error"], "report refused (test)")
      assert.deepStrictEqual(a.said(/^heartbeat failed/), [])
      yield* a.advance(10)
      const past = a.said(/longer than the coordinator's stale window/)
      assert.strictEqual(past.length, 1, "one warning past the window")
      assert.match(past[0]!.text, /the coordinator treats this host as silent and places nothing on it until a report lands$/)
      // Nothing more however long it goes on.
      yield* a.advance(20)
      assert.strictEqual(a.said(/^no report of this host has landed/).length, 2)
      a.failing.reports = false
      yield* a.advance(5)
      const back = a.said(/^reports landing again/)
      assert.strictEqual(back.length, 1)
      assert.strictEqual(back[0]!.level, "Info")
      // Failing longer than the window: the coordinator had judged the host silent.
      assert.strictEqual(back[0]!.text, "reports landing again (a host the coordinator judged silent takes placements again)")
      assert.isAtLeast(back[0]!.fields["reportFailures"] as number, 8)
      assert.isAbove(back[0]!.fields["failingForMs"] as number, 30_000)
      // A new trouble warns again.
      a.failing.reports = true
      yield* a.advance(10)
      assert.strictEqual(a.said(/more than a third of the coordinator's stale window/).length, 2)
    }))

  effect("a coordinator that answers nothing for a while: heartbeats and the poll say when they are answered again", () =>
    Effect.gen(function* () {
      const a = yield* agentOf
      yield* a.advance(5)
      assert.deepStrictEqual(a.said(/answered again$/), [])
      yield* a.fake.silence("a", true)
      yield* a.advance(20)
      assert.isNotEmpty(a.said(/^heartbeat failed/))
      assert.isNotEmpty(a.said(/^assignments poll failed/))
      yield* a.fake.silence("a", false)
      // The poll's back-off reaches 8-16 s after 20 s of failures.
      yield* a.advance(40)
      const beats = a.said(/^heartbeats answered again$/)
      const polls = a.said(/^assignments poll answered again$/)
      assert.deepStrictEqual([beats.length, polls.length], [1, 1])
      assert.isAtLeast(beats[0]!.fields["heartbeatFailures"] as number, 4)
      assert.isAtLeast(polls[0]!.fields["pollFailures"] as number, 3)
      assert.strictEqual(a.said(/^reports landing again/).length, 1)
    }))
})
