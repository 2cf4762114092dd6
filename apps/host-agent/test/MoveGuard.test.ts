import { assert, describe, it } from "@effect/vitest"
import { Downtime } from "@engram/core"
import { Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { defaultSimConfig, type SimConfig } from "../src/SimRuntime.js"
import { makeFleet } from "./support/InProcess.js"

/** Seed 004's hardware run: a 4 GiB guest rewriting a hot 64 MiB; capture ≈ 40 ms, send ≈ 85 ms, commit ≈ 420 ms. */
const seed004: Partial<SimConfig> = defaultSimConfig

const runMove = (opts: { readonly maxDowntimeMs: number; readonly source?: Partial<SimConfig>; readonly memMib?: number }) =>
  Effect.gen(function* () {
    const fleet = yield* makeFleet([
      { hostId: "a", sim: { ...seed004, ...opts.source } },
      { hostId: "b", sim: seed004 },
    ])
    const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
    const settle = Effect.gen(function* () {
      for (let i = 0; i < 4; i++) {
        yield* fleet.pass
        yield* TestClock.adjust("1 minute")
        yield* a.agent.idle
        yield* b.agent.idle
      }
    })
    yield* fleet.coordinator.addSession("s1", "a", opts.memMib ?? 4096, 2)
    yield* settle
    assert.strictEqual((yield* fleet.coordinator.get).sessions.get("s1")?.state, "running")
    yield* fleet.coordinator.beginMove("m1", "s1", "b", opts.maxDowntimeMs)
    yield* settle
    const state = yield* fleet.coordinator.get
    return { fleet, a, b, move: state.moves.get("m1")!, session: state.sessions.get("s1")!, outcome: (yield* a.agent.status).moves[0]! }
  })

describe("the seed 004 hardware table on the simulated runtime", () => {
  it.effect("a 600 ms budget succeeds: capture ≈ 40, send ≈ 85, commit ≈ 420, within the pause", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 600 })
      assert.strictEqual(move.state, "committed")
      const p = move.phases!
      console.log("seed 004 @600 ms:", JSON.stringify({ phases: p, rounds: move.rounds }))
      assert.isTrue(p.captureMs >= 36 && p.captureMs <= 43, `captureMs ${p.captureMs}`)
      assert.isTrue(p.sendMs >= 74 && p.sendMs <= 92, `sendMs ${p.sendMs}`)
      assert.isTrue(p.commitMs >= 411 && p.commitMs <= 428, `commitMs ${p.commitMs}`)
      assert.isTrue(p.downtimeMs <= 600, `downtimeMs ${p.downtimeMs}`)
      assert.isTrue(Downtime.phasesConsistent(p))
      // Rounds: a full round, deltas until the dirty set stops shrinking, then the final one.
      assert.deepStrictEqual(move.rounds.map((r) => r.kind), ["full", "delta", "delta", "final"])
      assert.strictEqual(session.hostId, "b")
      assert.strictEqual(session.state, "running")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.strictEqual((yield* b.target.staged).length, 0)
      assert.strictEqual(outcome._tag, "Committed")
      assert.deepStrictEqual((yield* a.residents.pendingCommits), [])
    }))

  it.effect("a 480 ms budget is refused before any pause", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 480 })
      assert.strictEqual(move.state, "aborted")
      console.log("seed 004 @480 ms:", move.abortReason)
      assert.match(move.abortReason ?? "", /^ErrMoveDowntime: pre-pause estimate/)
      assert.isTrue((move.estimateMs ?? 0) > 480, `estimate ${move.estimateMs}`)
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0)
      assert.strictEqual(outcome._tag, "Refused")
      if (outcome._tag === "Refused") assert.strictEqual(outcome.stage, "pre-pause")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.isFalse((yield* a.runtime.stats("s1")).tracking)
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.strictEqual((yield* b.target.staged).length, 0)
    }))
})

describe("the post-capture check", () => {
  it.effect("a slow final capture aborts before the final round: the guest resumes on the source, the target holds nothing", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 600, source: { finalCaptureExtraMs: 300 } })
      assert.strictEqual(move.state, "aborted")
      console.log("slow final capture @600 ms:", move.abortReason)
      assert.match(move.abortReason ?? "", /^ErrMoveDowntime: post-capture estimate/)
      assert.isTrue((move.estimateMs ?? 0) > 600)
      assert.isFalse(move.rounds.some((r) => r.kind === "final"), "no final round sent")
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 1, "paused once for the final capture")
      assert.strictEqual(outcome._tag, "Refused")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* a.residents.all).map((v) => v.status), ["running"])
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.deepStrictEqual(yield* b.residents.all, [])
      assert.strictEqual((yield* b.target.staged).length, 0)
    }))

})
