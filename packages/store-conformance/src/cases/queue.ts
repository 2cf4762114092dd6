/**
 * The queue (SPEC §2): first in first out, drains into whatever room exists, no head-of-line
 * blocking, each placement a compare-and-set, and the drain limit.
 */
import { expect } from "@effect/vitest"
import { ParkPolicy } from "@engram/core"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, expectInvariants, kase, parkedNow, placed, queued, queueNow, reportAll, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const gib = (n: number) => ({ memMib: n * 1024, vcpus: 1 })

export const queue: Group = {
  name: "queue",
  cases: [
    kase(
      "a session queued past the starvation limit gets the host with the most free RAM held: a later, smaller session may not take its room, the holder places there when it is whole",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 8192)
        yield* placed("a-big", gib(5))
        yield* placed("a-small", gib(1))
        yield* addHost("b", 8192)
        yield* placed("b-big", gib(6))
        // a: 2 GiB free, b: 2 GiB free. "big" (4 GiB) queues first, "small" (3 GiB) after it.
        yield* queued("big", gib(4))
        yield* TestClock.adjust(1)
        yield* queued("small", gib(3))
        yield* TestClock.adjust(ParkPolicy.defaultOptions.starvationLimitMs)
        // The agents report on schedule meanwhile: no host is silent.
        yield* reportAll
        // a now has 3 GiB free, the most: it is held for "big", which still does not fit there.
        yield* s.endSession("a-small")
        const held = yield* s.drainQueue()
        expect(held.placed).toStrictEqual([])
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["big", "small"])
        // Once a has room for it, the holder places there first.
        yield* s.endSession("a-big")
        const whole = yield* s.drainQueue()
        expect(whole.placed[0]).toStrictEqual({ sessionId: "big", hostId: "a" })
        yield* expectInvariants
      }),
    ),
    kase(
      "a host held for a starving session takes no create and no cold resume: they go elsewhere or queue, and the holder places there once it has room",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 8192)
        // "d" (1 GiB, preferring a) descends: its resume is a cold one, placed anew.
        const d = yield* s.createSession({ id: "d", budget: gib(1), affinity: ["a"] })
        expect(d.session.hostId).toBe("a")
        yield* s.markRunning("d")
        yield* parkedNow("d")
        yield* s.beginDescent("d")
        yield* s.finishDescent("d")
        yield* placed("a-big", gib(5))
        yield* placed("a-small", gib(1))
        yield* addHost("b", 8192)
        yield* placed("b-big", gib(6))
        // a: 2 GiB free, b: 2 GiB free; "big" (4 GiB) fits nowhere and starves.
        yield* queued("big", gib(4))
        yield* TestClock.adjust(ParkPolicy.defaultOptions.starvationLimitMs)
        // The agents report on schedule meanwhile: no host is silent.
        yield* reportAll
        // a now has 3 GiB free, the most: it is held for "big", which still does not fit there.
        yield* s.endSession("a-small")
        // A create and a cold resume that prefer a go to b instead.
        const near = yield* s.createSession({ id: "near", budget: gib(1), affinity: ["a"] })
        expect(near._tag).toBe("Placed")
        expect(near.session.hostId, "a create placed on the host held for a starving session").toBe("b")
        const back = yield* s.resume("d")
        expect(back._tag).toBe("Placed")
        expect(back.session.hostId, "a cold resume placed on the host held for a starving session").toBe("b")
        // A create that would fit only on a queues behind the holder.
        const only = yield* s.createSession({ id: "only", budget: gib(2) })
        expect(only._tag, `"only" placed on ${String(only.session.hostId)}, the host held for a starving session`).toBe("Queued")
        expect((yield* s.drainQueue()).placed).toStrictEqual([])
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["big", "only"])
        // Once a has room for it, the holder places there first.
        yield* s.endSession("a-big")
        const whole = yield* s.drainQueue()
        expect(whole.placed[0]).toStrictEqual({ sessionId: "big", hostId: "a" })
        expect(yield* queueNow(s)).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "queued sessions are listed first in first out with 1-based positions",
      Effect.gen(function* () {
        const s = yield* store
        const q1 = yield* queued("zeta", gib(1))
        yield* TestClock.adjust(10)
        const q2 = yield* queued("alpha", gib(1))
        const q3 = yield* queued("beta", gib(1))
        expect([q1.position, q2.position, q3.position]).toStrictEqual([1, 2, 3])
        expect(q2.session.queuedAt).toBe(10)
        // Same queuedAt: ties go by id.
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["zeta", "alpha", "beta"])
      }),
    ),
    kase(
      "a queued session's standing: its position, each host's reason and free room, and whether it is too big",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* addHost("h2", 2048)
        yield* s.setHostState("h2", "cordoned")
        yield* placed("filler", gib(3))
        yield* queued("q1", gib(2))
        yield* TestClock.adjust(1)
        yield* queued("q2", gib(5))
        expect(yield* s.queueStanding("q1")).toStrictEqual({
          position: 1,
          noFit: [
            { hostId: "h1", reason: "ram_full", freeMib: 1024, freeVcpus: 31 },
            { hostId: "h2", reason: "cordoned", freeMib: 2048, freeVcpus: 32 },
          ],
          tooBig: false,
        })
        expect(yield* s.queueStanding("q2")).toMatchObject({ position: 2, tooBig: true })
        expect(yield* s.queueStanding("filler")).toBeNull()
        yield* expectFailure(s.queueStanding("nope"), "NotFound")
      }),
    ),
    kase(
      "too_big: a budget over every ready measured host's capacity even when empty; cordoned and unmeasured hosts do not count, and a bigger host clears it",
      Effect.gen(function* () {
        const s = yield* store
        const none = yield* queued("q0", gib(64))
        // No ready measured host: the fleet's size is unknown, nothing is too big.
        expect(none.tooBig).toBe(false)
        yield* addHost("small", 4096)
        yield* addHost("u", null)
        yield* addHost("big-cordoned", 131072)
        yield* s.setHostState("big-cordoned", "cordoned")
        expect((yield* s.queueStanding("q0"))?.tooBig).toBe(true)
        yield* addHost("huge", 65536)
        expect((yield* s.queueStanding("q0"))?.tooBig).toBe(false)
      }),
    ),
    kase(
      "too_big counts vCPUs too: a budget over every host's CPU budget is too big, one that fits a busy host's is not",
      Effect.gen(function* () {
        yield* addHost("h1", 8192, 2)
        yield* placed("filler", { memMib: 1024, vcpus: 8 })
        // 2 cores × 4 = 8 vCPUs at most, all taken now.
        expect((yield* queued("q1", { memMib: 1024, vcpus: 9 })).tooBig).toBe(true)
        expect((yield* queued("q2", { memMib: 1024, vcpus: 8 })).tooBig).toBe(false)
      }),
    ),
    kase(
      "pageQueue lists the queue first in first out, each session with its standing, a page at a time",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 1024)
        for (const id of ["q1", "q2", "q3"]) {
          yield* queued(id, gib(2))
          yield* TestClock.adjust(1)
        }
        const first = yield* s.pageQueue({ limit: 2 })
        expect(first.items.map((e) => [e.session.id, e.standing.position])).toStrictEqual([
          ["q1", 1],
          ["q2", 2],
        ])
        expect(first.items[0]?.standing.noFit).toStrictEqual([{ hostId: "h1", reason: "ram_full", freeMib: 1024, freeVcpus: 32 }])
        expect(first.items[0]?.standing.tooBig).toBe(true)
        const second = yield* s.pageQueue({ limit: 2, cursor: first.nextCursor ?? undefined })
        expect(second.items.map((e) => [e.session.id, e.standing.position])).toStrictEqual([["q3", 3]])
        expect(second.nextCursor).toBeNull()
      }),
    ),
    kase(
      "a drain places queued sessions in FIFO order",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["q1", "q2", "q3"]) {
          yield* queued(id, gib(1))
          yield* TestClock.adjust(1)
        }
        yield* addHost("h1", 2048)
        const result = yield* s.drainQueue()
        expect(result).toStrictEqual({
          placed: [
            { sessionId: "q1", hostId: "h1" },
            { sessionId: "q2", hostId: "h1" },
          ],
          unapplied: [],
          remaining: 1,
        })
        expect((yield* s.getSession("q1")).state).toBe("pending")
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["q3"])
        yield* expectInvariants
      }),
    ),
    kase(
      "a session that fits nowhere keeps its place while a later smaller one passes it",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("big", gib(8))
        yield* TestClock.adjust(1)
        yield* queued("small", gib(1))
        yield* addHost("h1", 4096)
        const result = yield* s.drainQueue()
        expect(result.placed).toStrictEqual([{ sessionId: "small", hostId: "h1" }])
        expect(result.remaining).toBe(1)
        const big = yield* s.getSession("big")
        expect(big).toMatchObject({ state: "queued", queuedAt: 0 })
        yield* TestClock.adjust(1)
        const later = yield* queued("later", gib(8))
        expect(later.position).toBe(2)
      }),
    ),
    kase(
      "a drain counts room taken by its own earlier placements",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["q1", "q2", "q3"]) yield* queued(id, gib(3))
        yield* addHost("h1", 7168)
        yield* addHost("h2", 3072)
        const result = yield* s.drainQueue()
        // Best fit: q1 to the snug h2, q2 and q3 can share h1 (6 GiB of 7).
        expect(result.placed).toStrictEqual([
          { sessionId: "q1", hostId: "h2" },
          { sessionId: "q2", hostId: "h1" },
          { sessionId: "q3", hostId: "h1" },
        ])
        yield* queued("q4", gib(3))
        expect((yield* s.drainQueue()).placed).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "a drain with a limit places at most that many and reports the rest as remaining",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["q1", "q2", "q3", "q4"]) yield* queued(id, gib(1))
        yield* addHost("h1", 65536)
        const first = yield* s.drainQueue({ limit: 2 })
        expect(first.placed.map((p) => p.sessionId)).toStrictEqual(["q1", "q2"])
        expect(first.remaining).toBe(2)
        const rest = yield* s.drainQueue()
        expect(rest.placed.map((p) => p.sessionId)).toStrictEqual(["q3", "q4"])
        expect(rest.remaining).toBe(0)
      }),
    ),
    kase(
      "a drain with nothing queued places nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        expect(yield* s.drainQueue()).toStrictEqual({ placed: [], unapplied: [], remaining: 0 })
      }),
    ),
    kase(
      "a drain without room leaves every queued session in its place",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 1024)
        yield* placed("s0", gib(1))
        yield* queued("q1", gib(1))
        yield* TestClock.adjust(5)
        yield* queued("q2", gib(1))
        const before = yield* queueNow(s)
        expect(yield* s.drainQueue()).toStrictEqual({ placed: [], unapplied: [], remaining: 2 })
        expect(yield* queueNow(s)).toStrictEqual(before)
      }),
    ),
    kase(
      "an ended queued session leaves the queue and is not placed by a drain",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q1", gib(1))
        yield* queued("q2", gib(1))
        yield* s.endSession("q1")
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["q2"])
        yield* addHost("h1", 8192)
        expect((yield* s.drainQueue()).placed).toStrictEqual([{ sessionId: "q2", hostId: "h1" }])
        expect(yield* s.getSession("q1")).toMatchObject({ state: "ended", hostId: null, reservationId: null })
      }),
    ),
    kase(
      "room released by a finished descent is taken by the next drain",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 2048)
        yield* sessionIn("d1", "descending", gib(2))
        yield* queued("q1", gib(2))
        expect((yield* s.drainQueue()).placed).toStrictEqual([])
        yield* s.finishDescent("d1")
        expect((yield* s.drainQueue()).placed).toStrictEqual([{ sessionId: "q1", hostId: "h1" }])
      }),
    ),
    kase(
      "a resume that finds no room joins the back of the queue",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 2048)
        yield* sessionIn("d1", "descended", gib(2))
        yield* placed("s1", gib(2))
        yield* queued("q1", gib(1))
        yield* TestClock.adjust(100)
        const outcome = yield* s.resume("d1")
        if (outcome._tag !== "Queued") return expect.fail("resume should queue")
        expect(outcome.position).toBe(2)
        expect(outcome.session).toMatchObject({ state: "queued", queuedAt: 100, hostId: null })
        expect(outcome.noFit).toStrictEqual([{ hostId: "h1", reason: "ram_full", freeMib: 0, freeVcpus: 31 }])
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["q1", "d1"])
      }),
    ),
    kase(
      "queue positions count only the sessions still ahead",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q1", gib(1))
        yield* queued("q2", gib(4))
        yield* addHost("h1", 1024)
        yield* s.drainQueue()
        const q3 = yield* queued("q3", gib(4))
        expect(q3.position).toBe(2)
        const again = yield* s.createSession({ id: "q2", budget: gib(4) })
        expect(again).toMatchObject({ _tag: "Queued", position: 1 })
      }),
    ),
  ],
}
