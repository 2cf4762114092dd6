/**
 * The downtime guard's learning (SPEC §13, the store's part): a commit keeps its source guard's
 * figures with their errors, and each host pair's recent commit phases, the policy's window of
 * them, from which core's `Downtime.commitAllowance` makes the allowance.
 */
import { Downtime } from "@engram/core"
import type { MoveGuardReport } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, finalRound, kase, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 2048, vcpus: 2 }
const report: MoveGuardReport = { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: 470 }

/** A running session `s1` on `a`, and a second host `b`. */
const twoHosts = Effect.gen(function* () {
  yield* addHost("a", 8192)
  yield* addHost("b", 8192)
  const x = yield* sessionIn("s1", "running", budget)
  return x.hostId as string
})

/** Begins a move of `s1` to `to` and records its final round: what a commit needs. */
const readyToCommit = (to: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const move = yield* s.beginMove({ sessionId: "s1", targetHostId: to, maxDowntimeMs: 5000 })
    yield* s.recordRound(move.id, finalRound)
    return move
  })

/** Moves `s1` to the other host and commits with a commit phase of `commitMs`. */
const moveOnce = (to: string, commitMs: number, guard?: MoveGuardReport) =>
  Effect.gen(function* () {
    const s = yield* store
    const move = yield* readyToCommit(to)
    return yield* s.commitMove(move.id, { downtimeMs: commitMs + 100, captureMs: 40, sendMs: 50, commitMs }, guard)
  })

export const guard: Group = {
  name: "guard",
  cases: [
    kase(
      "a commit keeps its guard's figures and their errors; reads answer them",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        const done = yield* moveOnce(to, 300, report)
        const kept = { ...report, estimateErrorMs: 470 - 400, allowanceErrorMs: 400 - 300 }
        expect(done.guard).toStrictEqual(kept)
        expect((yield* s.getMove(done.id)).guard).toStrictEqual(kept)
        expect((yield* s.listMoves({ state: "committed" })).map((m) => m.guard)).toStrictEqual([kept])
        // Without a report the move keeps none, and its commit still counts for the pair.
        const back = yield* moveOnce(from, 200)
        expect((yield* s.getMove(back.id)).guard).toBeNull()
        expect((yield* s.listPairCommits({ sourceHostId: to })).map((p) => p.commitsMs)).toStrictEqual([[200]])
      }),
    ),
    kase(
      "a bad guard report is refused by name and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        const move = yield* readyToCommit(to)
        const phases = { downtimeMs: 400, captureMs: 40, sendMs: 50, commitMs: 300 }
        const bad: readonly [Partial<Record<keyof MoveGuardReport, unknown>>, string][] = [
          [{ allowanceMs: -1 }, "guard.allowanceMs"],
          [{ estimateMs: Number.NaN }, "guard.estimateMs"],
          [{ allowanceSource: "guessed" }, "guard.allowanceSource"],
          [{ allowanceSamples: 1.5 }, "guard.allowanceSamples"],
          [{ allowanceSamples: 3 }, "guard.allowanceSamples"],
        ]
        for (const [change, field] of bad) {
          const err = yield* expectFailure(s.commitMove(move.id, phases, { ...report, ...change } as MoveGuardReport), "InvalidInput")
          expect(err.field).toBe(field)
        }
        expect((yield* s.getMove(move.id)).state).toBe("pending")
        expect(yield* s.listPairCommits()).toStrictEqual([])
        expect(yield* expectFailure(s.listPairCommits({ sourceHostId: "a\u0000" }), "InvalidInput")).toMatchObject({ field: "sourceHostId" })
      }),
    ),
    kase(
      "each host pair keeps the policy's window of its recent commits, oldest first, and the allowance is made of them",
      Effect.gen(function* () {
        const s = yield* store
        const first = yield* twoHosts
        const second = first === "a" ? "b" : "a"
        const window = Downtime.defaultAllowancePolicy.window
        const n = window + 4
        for (let i = 1; i <= n; i++) {
          yield* TestClock.adjust(10)
          yield* moveOnce(second, 100 + i) // first → second
          yield* moveOnce(first, 500 + i) // and back
        }
        const pairs = yield* s.listPairCommits()
        const want = (base: number) => Array.from({ length: window }, (_, i) => base + n - window + 1 + i)
        expect(pairs.map((p) => [p.sourceHostId, p.targetHostId])).toStrictEqual([["a", "b"], ["b", "a"]])
        const out = pairs.find((p) => p.sourceHostId === first) as Downtime.PairCommits
        const back = pairs.find((p) => p.sourceHostId === second) as Downtime.PairCommits
        expect(out.commitsMs).toStrictEqual(want(100))
        expect(back.commitsMs).toStrictEqual(want(500))
        expect(out.updatedAt).toBeGreaterThan(0)
        expect(Downtime.commitAllowance(out.commitsMs)).toStrictEqual({ allowanceMs: 100 + n - 1, source: "learned", samples: window })
        expect(yield* s.listPairCommits({ sourceHostId: first, targetHostId: second })).toStrictEqual([out])
        expect(yield* s.listPairCommits({ targetHostId: "nowhere" })).toStrictEqual([])
      }),
    ),
    kase(
      "a commit on a resolution (no measured phases) keeps neither a guard nor a commit time",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        const move = yield* readyToCommit(to)
        const done = yield* s.commitMove(move.id, null, report)
        expect(done).toMatchObject({ state: "committed", phases: null, guard: null })
        expect(yield* s.listPairCommits()).toStrictEqual([])
      }),
    ),
  ],
}
