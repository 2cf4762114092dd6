/**
 * Concurrency (SPEC §2, §6): many placements at once never over-commit a host, and every
 * compare-and-set race has exactly one winner. Every racer is started at once
 * (`concurrency: "unbounded"`); a backend that serializes them passes trivially, one that
 * runs them in parallel must keep placement atomic with its reservation.
 */
import { Placement } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect, Result } from "effect"
import { addHost, expectInvariants, finalRound, kase, placed, queued, queueNow, reservationsNow, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const all = <A, E, R>(effects: readonly Effect.Effect<A, E, R>[]) =>
  Effect.all(effects.map((e) => Effect.result(e)), { concurrency: "unbounded" })

type Tagged = { readonly _tag: string }

const wins = <A, E>(results: readonly Result.Result<A, E>[]) => results.filter(Result.isSuccess).length

export const concurrency: Group = {
  name: "concurrency",
  cases: [
    kase(
      "200 creates at once never over-commit a host and each session ends placed or queued exactly once",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192, 4)
        yield* addHost("h2", 6144, 2)
        yield* addHost("h3", 10240, 8)
        const sizes = [512, 1024, 1536, 2048]
        const ids = Array.from({ length: 200 }, (_, i) => `c${String(i).padStart(3, "0")}`)
        const results = yield* all(
          ids.map((id, i) => s.createSession({ id, budget: { memMib: sizes[i % sizes.length] as number, vcpus: 1 + (i % 3) } })),
        )
        expect(wins(results), "every create answers").toBe(200)
        const sessions = yield* s.listSessions()
        expect(sessions.map((x) => x.id).sort()).toStrictEqual(ids)
        const placedIds = sessions.filter((x) => x.state === "pending").map((x) => x.id)
        const queuedIds = sessions.filter((x) => x.state === "queued").map((x) => x.id)
        expect(placedIds.length + queuedIds.length).toBe(200)
        expect(placedIds.length).toBeGreaterThan(0)
        expect((yield* queueNow(s)).map((x) => x.id).sort()).toStrictEqual(queuedIds.sort())
        for (const r of results) {
          if (Result.isFailure(r)) continue
          const now = sessions.find((x) => x.id === r.success.session.id)
          expect(r.success._tag === "Placed" ? "pending" : "queued").toBe(now?.state)
        }
        yield* expectInvariants
        // Once the dust settles a drain leaves only sessions that fit on no host.
        const drained = yield* s.drainQueue()
        yield* expectInvariants
        const view = yield* s.fleetView()
        expect(drained.remaining).toBe(view.queue.length)
        for (const q of view.queue)
          expect(view.hosts.some((h) => Placement.fitsOn(h, q.budget, s.limits())), `${q.sessionId} fits somewhere`).toBe(false)
      }),
    ),
    kase(
      "two drains racing for one queued session place it once",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q1", { memMib: 1024, vcpus: 1 })
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const results = yield* all([s.drainQueue(), s.drainQueue()])
        const placedBy = results.flatMap((r) => (Result.isSuccess(r) ? r.success.placed : []))
        expect(placedBy.map((p) => p.sessionId)).toStrictEqual(["q1"])
        expect((yield* reservationsNow(s)).length).toBe(1)
        expect((yield* s.getSession("q1")).state).toBe("pending")
        yield* expectInvariants
      }),
    ),
    kase(
      "many drains racing over a queue place each session once and never over-commit",
      Effect.gen(function* () {
        const s = yield* store
        for (let i = 0; i < 30; i++) yield* queued(`q${String(i).padStart(2, "0")}`, { memMib: 1024, vcpus: 1 })
        yield* addHost("h1", 8192)
        yield* addHost("h2", 4096)
        const results = yield* all(Array.from({ length: 8 }, () => s.drainQueue()))
        const placedBy = results.flatMap((r) => (Result.isSuccess(r) ? r.success.placed.map((p) => p.sessionId) : []))
        expect(new Set(placedBy).size).toBe(placedBy.length)
        expect(placedBy.length).toBe(12)
        expect((yield* queueNow(s)).length).toBe(18)
        // A placement a drain decided but did not write is reported, and its session is still queued or placed by another drain.
        for (const r of results)
          if (Result.isSuccess(r))
            for (const u of r.success.unapplied) {
              expect(["refused", "stale"]).toContain(u.reason)
              expect(r.success.placed.some((p) => p.sessionId === u.sessionId)).toBe(false)
            }
        yield* expectInvariants
      }),
    ),
    kase(
      "two beginDescent calls on one parked session have exactly one winner",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("p1", "parked")
        const results = yield* all([s.beginDescent("p1"), s.beginDescent("p1")])
        expect(wins(results)).toBe(1)
        const loser = results.find(Result.isFailure)
        expect(loser?.failure._tag).toBe("IllegalTransition")
        expect((yield* s.getSession("p1")).state).toBe("descending")
        yield* expectInvariants
      }),
    ),
    kase(
      "an unpark racing a beginDescent has exactly one winner",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("p1", "parked")
        const racers: Effect.Effect<unknown, Tagged>[] = [s.unpark("p1"), s.beginDescent("p1")]
        const results = yield* all(racers)
        expect(wins(results)).toBe(1)
        const state = (yield* s.getSession("p1")).state
        expect(state).toBe(results[0] !== undefined && Result.isSuccess(results[0]) ? "running" : "descending")
        yield* expectInvariants
      }),
    ),
    kase(
      "concurrent reserves for the last room on a host have exactly one winner",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        const results = yield* all(
          Array.from({ length: 10 }, (_, i) => s.reserve({ id: `x${i}`, hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 3000, vcpus: 1 })),
        )
        expect(wins(results)).toBe(1)
        expect((yield* s.metrics()).reserveFailures).toBe(9)
        expect((yield* s.getHost("h1")).headroom.reserved.memMib).toBe(3000)
      }),
    ),
    kase(
      "concurrent reserves of one id have exactly one winner",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        const results = yield* all(
          Array.from({ length: 10 }, () => s.reserve({ id: "same", hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 100, vcpus: 1 })),
        )
        expect(wins(results)).toBe(1)
        expect(results.filter(Result.isFailure).every((r) => r.failure._tag === "Conflict")).toBe(true)
        expect((yield* reservationsNow(s)).length).toBe(1)
      }),
    ),
    kase(
      "two beginMove calls on one running session open exactly one move",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* addHost("h2", 16384)
        yield* addHost("h3", 16384)
        yield* sessionIn("s1", "running")
        const results = yield* all([
          s.beginMove({ sessionId: "s1", targetHostId: "h2", maxDowntimeMs: 600 }),
          s.beginMove({ sessionId: "s1", targetHostId: "h3", maxDowntimeMs: 600 }),
        ])
        expect(wins(results)).toBe(1)
        expect((yield* reservationsNow(s)).filter((r) => r.ownerKind === "move")).toHaveLength(1)
        yield* expectInvariants
      }),
    ),
    kase(
      "a create racing a drain for the last room places one of them; the other stays queued",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q1", { memMib: 2048, vcpus: 1 })
        yield* addHost("h1", 2048)
        const racers: Effect.Effect<unknown, Tagged>[] = [
          s.drainQueue(),
          s.createSession({ id: "c1", budget: { memMib: 2048, vcpus: 1 } }),
        ]
        const results = yield* all(racers)
        expect(wins(results)).toBe(2)
        const states = [(yield* s.getSession("q1")).state, (yield* s.getSession("c1")).state].sort()
        expect(states).toStrictEqual(["pending", "queued"])
        yield* expectInvariants
      }),
    ),
    kase(
      "concurrent ends of one session all answer it ended; it is ended once and releases once",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "running")
        const results = yield* all([s.endSession("s1"), s.endSession("s1"), s.endSession("s1")])
        expect(wins(results)).toBe(3)
        expect((yield* s.metrics()).totalReleasedMib).toBe(1024)
        const ended = (yield* s.sessionEvents("s1", { limit: 100 })).items.filter((e) => e.event._tag === "Ended")
        expect(ended).toHaveLength(1)
        yield* expectInvariants
      }),
    ),
    kase(
      "ending sessions while their moves commit or abort: each pair settles one way, with nothing half-done",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 65536)
        yield* addHost("b", 65536)
        const moves: { id: string; sessionId: string }[] = []
        for (let i = 0; i < 12; i++) {
          const id = `m${String(i).padStart(2, "0")}`
          yield* sessionIn(id, "running", { memMib: 512, vcpus: 1 })
          const move = yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
          yield* s.recordRound(move.id, finalRound)
          moves.push({ id: move.id, sessionId: id })
        }
        const phases = { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 380 }
        const racers: Effect.Effect<unknown, Tagged>[] = moves.flatMap((m, i) => [
          s.endSession(m.sessionId),
          i % 2 === 0 ? s.commitMove(m.id, phases) : s.abortMove(m.id, "racing an end"),
        ])
        const results = yield* all(racers)
        for (const [i, m] of moves.entries()) {
          // The end always lands: after a commit or an abort the session runs, and a running session ends.
          expect(Result.isSuccess(results[2 * i] as Result.Result<unknown, unknown>), `end of ${m.sessionId}`).toBe(true)
          expect((yield* s.getSession(m.sessionId)).state).toBe("ended")
          const move = yield* s.getMove(m.id)
          const settled = Result.isSuccess(results[2 * i + 1] as Result.Result<unknown, unknown>)
          // The move either settled first (committed or aborted by its caller) or was closed by the end.
          expect(move.state).toBe(settled ? (i % 2 === 0 ? "committed" : "aborted") : "aborted")
          if (!settled) expect(move.abortReason).toBe("session ended")
        }
        expect(yield* reservationsNow(s)).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "creates at once with bad ones among them: each bad create fails alone, every other is placed",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 16384, 8)
        yield* addHost("h2", 16384, 8)
        yield* placed("taken", { memMib: 1024, vcpus: 1 })
        const good = Array.from({ length: 30 }, (_, i) => `g${String(i).padStart(2, "0")}`)
        const results = yield* all<{ readonly _tag: string; readonly session: { readonly id: string; readonly hostId: string | null } }, Tagged, never>([
          ...good.map((id, i) => s.createSession({ id, budget: { memMib: 256 * (1 + (i % 3)), vcpus: 1 } })),
          // An existing id with another budget: a Conflict, and the session as it was.
          s.createSession({ id: "taken", budget: { memMib: 2048, vcpus: 1 } }),
          // Bad input: refused before anything is written.
          s.createSession({ id: "bad-budget", budget: { memMib: 0, vcpus: 1 } }),
          s.createSession({ id: "bad id", budget: { memMib: 256, vcpus: 1 } }),
          // Too big for any host: queued, not placed, and not in anyone's way.
          s.createSession({ id: "huge", budget: { memMib: 1_000_000, vcpus: 1 } }),
          // The same id twice in one burst, same budget: one session, answered twice as sequential creates are.
          s.createSession({ id: "twice", budget: { memMib: 512, vcpus: 1 } }),
          s.createSession({ id: "twice", budget: { memMib: 512, vcpus: 1 } }),
        ])
        const n = good.length
        for (let i = 0; i < n; i++) {
          const r = results[i] as Result.Result<{ readonly _tag: string }, Tagged>
          expect(Result.isSuccess(r) ? r.success._tag : r.failure._tag, good[i]).toBe("Placed")
        }
        const tagOf = (k: number) => {
          const r = results[n + k] as Result.Result<{ readonly _tag: string }, Tagged>
          return Result.isSuccess(r) ? r.success._tag : r.failure._tag
        }
        expect(tagOf(0)).toBe("Conflict")
        expect(tagOf(1)).toBe("InvalidInput")
        expect(tagOf(2)).toBe("InvalidInput")
        expect(tagOf(3)).toBe("Queued")
        expect([tagOf(4), tagOf(5)]).toStrictEqual(["Placed", "Placed"])
        const twice = results.slice(n + 4).map((r) => (Result.isSuccess(r) ? r.success.session.hostId : null))
        expect(twice[0]).not.toBeNull()
        expect(twice[1]).toBe(twice[0])
        expect((yield* s.getSession("taken")).budget.memMib).toBe(1024)
        const sessions = yield* s.listSessions()
        expect(sessions.map((x) => x.id).sort()).toStrictEqual([...good, "huge", "taken", "twice"].sort())
        expect((yield* reservationsNow(s)).length).toBe(n + 2)
        yield* expectInvariants
      }),
    ),
    kase(
      "resumes at once: descended sessions come back without over-commit, a park warm in place, and each refusal alone",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192, 8)
        yield* addHost("h2", 4096, 8)
        // 12 descended sessions of 1 GiB: more than the room left once the park and the runner hold theirs.
        const ids = Array.from({ length: 12 }, (_, i) => `d${String(i).padStart(2, "0")}`)
        for (const id of ids) yield* sessionIn(id, "descended", { memMib: 1024, vcpus: 1 })
        const park = yield* sessionIn("park", "parked", { memMib: 1024, vcpus: 1 })
        yield* sessionIn("runner", "running", { memMib: 1024, vcpus: 1 })
        const results = yield* all<{ readonly _tag: string; readonly session: { readonly id: string; readonly hostId: string | null; readonly state: string } }, Tagged, never>([
          ...ids.map((id) => s.resume(id)),
          s.resume("park"),
          s.resume("runner"),
          s.resume("nobody"),
          // The same session twice at once: one resume restores it, the other finds it no longer descended.
          s.resume("d00"),
        ])
        yield* expectInvariants
        const n = ids.length
        const tag = (r: Result.Result<{ readonly _tag: string }, Tagged>) => (Result.isSuccess(r) ? r.success._tag : r.failure._tag)
        const outcomes = results.slice(0, n).map((r) => tag(r as Result.Result<{ readonly _tag: string }, Tagged>))
        for (const [i, o] of outcomes.entries()) expect(["Placed", "Queued", "IllegalTransition"], ids[i]).toContain(o)
        expect(tag(results[n] as Result.Result<{ readonly _tag: string }, Tagged>)).toBe("Placed")
        expect(tag(results[n + 1] as Result.Result<{ readonly _tag: string }, Tagged>)).toBe("IllegalTransition")
        expect(tag(results[n + 2] as Result.Result<{ readonly _tag: string }, Tagged>)).toBe("NotFound")
        // d00 was resumed twice at once: exactly one of the two restored it.
        const d00 = [tag(results[0] as Result.Result<{ readonly _tag: string }, Tagged>), tag(results[n + 3] as Result.Result<{ readonly _tag: string }, Tagged>)]
        expect(d00.filter((x) => x === "IllegalTransition")).toHaveLength(1)
        expect(outcomes.slice(1).filter((x) => x === "IllegalTransition")).toStrictEqual([])
        // The park runs again on its own host; every resumed session is placed or queued as answered.
        const after = yield* s.getSession("park")
        expect([after.state, after.hostId]).toStrictEqual(["running", park.hostId])
        for (const [i, id] of ids.entries()) {
          const r = (i === 0 && Result.isFailure(results[0] as Result.Result<unknown, unknown>) ? results[n + 3] : results[i]) as Result.Result<
            { readonly _tag: string; readonly session: { readonly state: string } },
            Tagged
          >
          const now = yield* s.getSession(id)
          expect(Result.isSuccess(r), id).toBe(true)
          if (Result.isSuccess(r)) expect(now.state, id).toBe(r.success._tag === "Placed" ? "pending" : "queued")
        }
        const placedCount = (yield* s.listSessions()).filter((x) => ids.includes(x.id) && x.state === "pending").length
        expect(placedCount).toBeGreaterThan(0)
        expect((yield* reservationsNow(s)).length).toBe(placedCount + 2)
      }),
    ),
  ],
}
