/**
 * The downtime guard's learning (SPEC §13, the store's part): a commit keeps its source guard's
 * figures with their errors, and each host pair's recent commit phases with their times, the
 * policy's window of them; the pairs with a commit within the horizon come back in one read
 * (`recordedSince`), from which core's `Downtime.pairAllowance` makes the allowance; or, bounded
 * whatever the fleet's size, the commits a source's allowances may count (`listAllowanceCommits`:
 * core's `Downtime.allowanceCommits`).
 */
import { Downtime } from "@engram/core"
import type { MoveGuardReport } from "@engram/store"
import { expect } from "@effect/vitest"
import { Clock, Effect } from "effect"
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

const horizonMs = Downtime.defaultRecencyPolicy.horizonMs

/** The allowance of moves `from` → `to` now, from the one read the coordinator makes. */
const allowanceNow = (from: string, to: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const nowMs = yield* Clock.currentTimeMillis
    return Downtime.pairAllowance(yield* s.listPairCommits({ recordedSince: nowMs - horizonMs + 1 }), from, to, nowMs)
  })

/** The guard's pre-pause verdict of a move with nothing left to send: only the allowance against the budget. */
const verdict = (allowanceMs: number, maxDowntimeMs: number) =>
  Downtime.check({ lastDeltaWireBytes: 0, rateBytesPerMs: 0, commitAllowanceMs: allowanceMs, maxDowntimeMs })._tag

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
        expect(yield* expectFailure(s.listPairCommits({ recordedSince: Number.NaN }), "InvalidInput")).toMatchObject({ field: "recordedSince" })
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
      "a pair whose two slow commits aged out is admitted at a budget it was refused at",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        yield* TestClock.adjust(1000)
        yield* moveOnce(to, 900) // a load spike: two slow commits
        yield* TestClock.adjust(5)
        yield* moveOnce(from, 30)
        yield* moveOnce(to, 950)
        const [kept] = yield* s.listPairCommits({ sourceHostId: from })
        expect(kept).toMatchObject({ commitsMs: [900, 950], recordedAtMs: [1000, 1005], updatedAt: 1005 })
        const spike = yield* allowanceNow(from, to)
        expect(spike).toStrictEqual({ allowanceMs: 950, source: "learned", samples: 2 })
        expect(verdict(spike.allowanceMs, 600)).toBe("Overrun")
        // Refused moves commit nothing; an hour on, the spike no longer counts.
        yield* TestClock.adjust(horizonMs - 1)
        expect(yield* allowanceNow(from, to)).toStrictEqual({ allowanceMs: 950, source: "learned", samples: 1 }) // the 900 ms one aged out…
        yield* TestClock.adjust(5)
        expect(yield* s.listPairCommits({ recordedSince: (yield* Clock.currentTimeMillis) - horizonMs + 1 })).toStrictEqual([])
        const quiet = yield* allowanceNow(from, to) // …and now every one has
        expect(quiet).toStrictEqual({ allowanceMs: Downtime.defaultRecencyPolicy.priorMs, source: "prior", samples: 0 })
        expect(verdict(quiet.allowanceMs, 600)).toBe("Fits")
      }),
    ),
    kase(
      "a pair without history learns from moves into the same target, then from the fleet, once a pool holds 5 commits",
      Effect.gen(function* () {
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        yield* addHost("c", 8192)
        const { pooledMinSamples } = Downtime.defaultRecencyPolicy
        for (const [i, commitMs] of [50, 60, 70, 65, 55].entries()) {
          yield* TestClock.adjust(10)
          yield* moveOnce(to, commitMs)
          yield* moveOnce(from, 900)
          // Fewer than a pool needs: the prior, though others' commits are recent.
          if (i === 0) expect(yield* allowanceNow("c", to)).toStrictEqual({ allowanceMs: Downtime.defaultRecencyPolicy.priorMs, source: "prior", samples: 0 })
        }
        // c has moved nothing: into `to` it learns from `from`'s fast commits, into `from` from the slow ones back.
        expect(yield* allowanceNow("c", to)).toStrictEqual({ allowanceMs: 70, source: "target", samples: pooledMinSamples })
        expect(yield* allowanceNow("c", from)).toStrictEqual({ allowanceMs: 900, source: "target", samples: pooledMinSamples })
        expect(yield* allowanceNow(to, "c")).toStrictEqual({ allowanceMs: 900, source: "fleet", samples: 2 * pooledMinSamples })
        expect(yield* allowanceNow(from, to)).toStrictEqual({ allowanceMs: 70, source: "learned", samples: pooledMinSamples })
      }),
    ),
    kase(
      "`recordedSince` may be any finite number: a fractional one selects from the next whole ms, a huge one nothing, a very negative one every pair",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        yield* TestClock.adjust(1000)
        yield* moveOnce(to, 40)
        const since = (recordedSince: number) => s.listPairCommits({ recordedSince }).pipe(Effect.map((ps) => ps.map((p) => p.updatedAt)))
        expect(yield* since(999.5)).toStrictEqual([1000])
        expect(yield* since(1000)).toStrictEqual([1000])
        expect(yield* since(1000.25)).toStrictEqual([])
        expect(yield* since(1e300)).toStrictEqual([])
        expect(yield* since(-1e300)).toStrictEqual([1000])
        expect(yield* expectFailure(s.listPairCommits({ recordedSince: Number.NaN }), "InvalidInput")).toMatchObject({ field: "recordedSince" })
      }),
    ),
    kase(
      "the commits a source's allowances may count are core's `allowanceCommits` of every pair, and make the same allowances",
      Effect.gen(function* () {
        const s = yield* store
        let at = yield* twoHosts
        yield* addHost("c", 8192)
        yield* addHost("d", 8192)
        const hosts = ["a", "b", "c", "d"]
        // 80 moves around the four hosts; every third commit at the time of the one before (ties).
        for (let i = 0; i < 80; i++) {
          const to = hosts.filter((h) => h !== at)[(i * i + Math.floor(i / 5)) % 3] as string
          yield* TestClock.adjust(i % 3 === 0 ? 0 : 10)
          yield* moveOnce(to, 20 + ((i * 37) % 500))
          at = to
        }
        const nowMs = yield* Clock.currentTimeMillis
        const every = yield* s.listPairCommits()
        expect(every.length).toBeGreaterThan(8)
        for (const sourceHostId of hosts) {
          const others = hosts.filter((h) => h !== sourceHostId)
          for (const targetHostIds of [[], others.slice(0, 1), others.slice(0, 2), others])
            for (const limit of [1, 3, Downtime.poolLimit()])
              for (const recordedSince of [0, nowMs - 300, nowMs + 1]) {
                const q = { sourceHostId, targetHostIds, recordedSince, limit }
                expect(yield* s.listAllowanceCommits(q), JSON.stringify(q)).toStrictEqual(Downtime.allowanceCommits(every, q))
              }
        }
        // The allowances over them are those over every recent pair, now and as the first commits age out.
        for (const step of [0, horizonMs - 500, 200]) {
          yield* TestClock.adjust(step)
          const later = yield* Clock.currentTimeMillis
          const recordedSince = later - horizonMs + 1
          const recent = yield* s.listPairCommits({ recordedSince })
          for (const sourceHostId of hosts) {
            const others = hosts.filter((h) => h !== sourceHostId)
            const bounded = yield* s.listAllowanceCommits({ sourceHostId, targetHostIds: others, recordedSince, limit: Downtime.poolLimit() })
            for (const t of others) expect(Downtime.pairAllowance(bounded, sourceHostId, t, later)).toStrictEqual(Downtime.pairAllowance(recent, sourceHostId, t, later))
          }
        }
      }),
      {},
      // 80 moves and some 200 reads: four times the suite's timeout (17 s of 30 at load 20, c129).
      { timeoutFactor: 4 },
    ),
    kase(
      "a pair's commits stay oldest first, its last at its `updatedAt`, when the clock steps back; the bounded read is still core's over every pair",
      Effect.gen(function* () {
        const s = yield* store
        const from = yield* twoHosts
        const to = from === "a" ? "b" : "a"
        yield* addHost("c", 8192)
        // from → to at 5,000, back at 5,001, then from → to again with the clock stepped back to
        // 1,500 (a replica's clock behind), then to → c at 2,000.
        yield* TestClock.setTime(5000)
        yield* moveOnce(to, 300)
        yield* TestClock.setTime(5001)
        yield* moveOnce(from, 200)
        yield* TestClock.setTime(1500)
        yield* moveOnce(to, 100)
        yield* TestClock.setTime(2000)
        yield* moveOnce("c", 50)
        const every = yield* s.listPairCommits()
        expect(every.map((p) => [p.sourceHostId, p.targetHostId, p.commitsMs])).toStrictEqual(
          [
            [from, to, [300, 100]],
            [to, from, [200]],
            [to, "c", [50]],
          ].sort((x, y) => (`${x[0]} ${x[1]}` < `${y[0]} ${y[1]}` ? -1 : 1)),
        )
        const hosts = ["a", "b", "c"]
        for (const sourceHostId of hosts) {
          const others = hosts.filter((h) => h !== sourceHostId)
          for (const targetHostIds of [[], others.slice(0, 1), others])
            for (const limit of [1, 2, 3, Downtime.poolLimit()]) {
              const q = { sourceHostId, targetHostIds, recordedSince: 0, limit }
              expect(yield* s.listAllowanceCommits(q), JSON.stringify(q)).toStrictEqual(Downtime.allowanceCommits(every, q))
            }
        }
        // What makes that so on every store: the pair's times are kept in order, its last at `updatedAt`.
        for (const p of every) {
          expect([...p.recordedAtMs].sort((x, y) => x - y), `${p.sourceHostId} → ${p.targetHostId}`).toStrictEqual(p.recordedAtMs)
          expect(p.updatedAt, `${p.sourceHostId} → ${p.targetHostId}`).toBe(p.recordedAtMs[p.recordedAtMs.length - 1])
        }
      }),
    ),
    kase(
      "a bad allowance commits query is InvalidInput naming its field",
      Effect.gen(function* () {
        const s = yield* store
        const q = { sourceHostId: "a", targetHostIds: ["b"], recordedSince: 0, limit: 20 }
        const field = (bad: Partial<typeof q>) => expectFailure(s.listAllowanceCommits({ ...q, ...bad }), "InvalidInput").pipe(Effect.map((e) => e.field))
        expect(yield* field({ sourceHostId: "a\u0000" })).toBe("sourceHostId")
        expect(yield* field({ targetHostIds: ["b", "\u0000"] })).toBe("targetHostIds")
        expect(yield* field({ recordedSince: Number.NaN })).toBe("recordedSince")
        for (const limit of [0, 1.5, 1001]) expect(yield* field({ limit })).toBe("limit")
        expect(yield* s.listAllowanceCommits(q)).toStrictEqual([])
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
