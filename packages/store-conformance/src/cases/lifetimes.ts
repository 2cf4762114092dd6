/**
 * Session lifetimes (SPEC §13): an idle timeout and a TTL given at create are stored and read
 * back; the store finds a running session with no activity for its idle timeout, and a session
 * whose TTL passed, by its lifetime read (core's `Lifetime` decides); agent activity moves the
 * idle clock; a TTL set anew moves the deadline; bad values are refused by name and change nothing.
 */
import { Lifetime } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, kase, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }
const ids = (xs: readonly { readonly id: string }[]) => xs.map((x) => x.id)

export const lifetimes: Group = {
  name: "lifetimes",
  cases: [
    kase(
      "an idle timeout and a TTL given at create are stored and read back; without them a session has neither",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* TestClock.adjust(100)
        const o = yield* s.createSession({ id: "s1", budget, idleTimeoutMs: 60_000, ttlMs: 7_200_000 })
        expect(o.session).toMatchObject({ idleTimeoutMs: 60_000, endsAt: 7_200_100, lastActiveAt: 100 })
        expect(yield* s.getSession("s1")).toMatchObject({ idleTimeoutMs: 60_000, endsAt: 7_200_100, lastActiveAt: 100 })
        yield* s.createSession({ id: "s2", budget })
        expect(yield* s.getSession("s2")).toMatchObject({ idleTimeoutMs: null, endsAt: null })
        // A queued create keeps them too.
        const q = yield* s.createSession({ id: "big", budget: { memMib: 1 << 20, vcpus: 1 }, ttlMs: 5 })
        expect(q._tag).toBe("Queued")
        expect(yield* s.getSession("big")).toMatchObject({ state: "queued", endsAt: 105 })
      }),
    ),
    kase(
      "a running session with no activity for its idle timeout is due idle, not a millisecond before; activity on its host restarts the clock",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* s.createSession({ id: "s1", budget, idleTimeoutMs: 1000, affinity: ["h1"] })
        yield* s.createSession({ id: "quiet", budget, affinity: ["h1"] })
        yield* TestClock.adjust(10)
        yield* s.markRunning("s1")
        yield* s.markRunning("quiet")
        yield* TestClock.adjust(999)
        expect(ids((yield* s.lifetimesDue()).idle)).toStrictEqual([])
        // Reported by another host's agent: not this session's activity.
        expect(yield* s.recordActivity("h2", ["s1"])).toBe(0)
        expect(yield* s.recordActivity("h1", ["s1", "nobody"])).toBe(1)
        yield* TestClock.adjust(999)
        expect(ids((yield* s.lifetimesDue()).idle)).toStrictEqual([])
        yield* TestClock.adjust(1)
        const due = yield* s.lifetimesDue()
        expect(ids(due.idle)).toStrictEqual(["s1"])
        expect(due.idle[0]?.lastActiveAt).toBe(1009)
        // The reaper's answer to it is the explicit idle step: parked (the gate decides park or descent).
        expect((yield* s.idle("s1")).state).toBe("parked")
        expect(ids((yield* s.lifetimesDue()).idle)).toStrictEqual([])
        // A park takes no activity: its guest is paused, and only a resume runs it again.
        expect(yield* s.recordActivity("h1", ["s1"])).toBe(0)
      }),
    ),
    kase(
      "a session whose TTL passed is due to end in any live state, and ends with the reason in its history",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.createSession({ id: "run", budget, ttlMs: 1000 })
        yield* s.createSession({ id: "park", budget, ttlMs: 1000 })
        yield* s.createSession({ id: "later", budget, ttlMs: 5000 })
        yield* s.markRunning("run")
        yield* s.markRunning("park")
        yield* s.idle("park")
        yield* TestClock.adjust(999)
        expect(ids((yield* s.lifetimesDue()).expired)).toStrictEqual([])
        yield* TestClock.adjust(1)
        expect(ids((yield* s.lifetimesDue()).expired).sort()).toStrictEqual(["park", "run"])
        const ended = yield* s.endSession("park", { reason: Lifetime.ttlExpiredReason })
        expect(ended.session).toMatchObject({ state: "ended", hostId: null, reservationId: null })
        const history = yield* s.sessionEvents("park")
        expect(history.items.at(-1)?.event).toStrictEqual({ _tag: "Ended", hostId: "h1", reason: "ttl expired" })
        expect(ids((yield* s.lifetimesDue()).expired)).toStrictEqual(["run"])
      }),
    ),
    kase(
      "a TTL set anew moves the deadline from now and keeps the state; an ended session has none to set",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.createSession({ id: "s1", budget, ttlMs: 1000 })
        yield* TestClock.adjust(900)
        const extended = yield* s.setTtl("s1", 3_600_000)
        expect(extended).toMatchObject({ state: "pending", endsAt: 3_600_900 })
        yield* TestClock.adjust(200)
        expect(ids((yield* s.lifetimesDue()).expired)).toStrictEqual([])
        expect((yield* s.sessionEvents("s1")).items.at(-1)?.event).toStrictEqual({ _tag: "TtlSet", endsAt: 3_600_900 })
        yield* s.endSession("s1")
        yield* expectFailure(s.setTtl("s1", 1000), "IllegalTransition")
        yield* expectFailure(s.setTtl("nobody", 1000), "NotFound")
      }),
    ),
    kase(
      "the reaper's steps (onlyIfDue) act only on a session still due in their own change: a TTL moved or activity reported after the due read keeps it, unchanged",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.createSession({ id: "ttl", budget, ttlMs: 1000, affinity: ["h1"] })
        yield* s.createSession({ id: "busy", budget, idleTimeoutMs: 1000, affinity: ["h1"] })
        yield* s.createSession({ id: "now", budget, idleTimeoutMs: 10_000_000, ttlMs: 10_000_000, affinity: ["h1"] })
        yield* s.markRunning("ttl")
        yield* s.markRunning("busy")
        yield* s.markRunning("now")
        yield* TestClock.adjust(1000)
        const due = yield* s.lifetimesDue()
        expect(ids(due.expired)).toStrictEqual(["ttl"])
        expect(ids(due.idle)).toStrictEqual(["busy"])
        // After the read, before the reaper's writes: the TTL is moved, the guest is active.
        yield* s.setTtl("ttl", 3_600_000)
        expect(yield* s.recordActivity("h1", ["busy"])).toBe(1)
        const events = (id: string) => Effect.map(s.sessionEvents(id), (p) => p.items.length)
        const before = { ttl: yield* s.getSession("ttl"), busy: yield* s.getSession("busy"), ttlEvents: yield* events("ttl"), busyEvents: yield* events("busy") }
        const notExpired = yield* expectFailure(s.endSession("ttl", { reason: Lifetime.ttlExpiredReason, onlyIfDue: true }), "IllegalTransition")
        expect(notExpired.message).toContain("not expired")
        const notIdle = yield* expectFailure(s.idle("busy", { onlyIfDue: true }), "IllegalTransition")
        expect(notIdle.message).toContain("not idle")
        expect(yield* s.getSession("ttl")).toStrictEqual(before.ttl)
        expect(yield* s.getSession("busy")).toStrictEqual(before.busy)
        expect(yield* events("ttl")).toBe(before.ttlEvents)
        expect(yield* events("busy")).toBe(before.busyEvents)
        // Still due: they act as the plain steps do.
        yield* TestClock.adjust(1000)
        expect((yield* s.idle("busy", { onlyIfDue: true })).state).toBe("parked")
        yield* TestClock.adjust(3_600_000)
        const ended = yield* s.endSession("ttl", { reason: Lifetime.ttlExpiredReason, onlyIfDue: true })
        expect(ended.session.state).toBe("ended")
        // An end repeated on an ended session answers it as it is, as every end does.
        expect((yield* s.endSession("ttl", { reason: Lifetime.ttlExpiredReason, onlyIfDue: true })).session.state).toBe("ended")
        // A caller's steps take no notice of lifetimes.
        expect((yield* s.idle("now")).state).toBe("parked")
        expect((yield* s.endSession("now")).session.state).toBe("ended")
      }),
    ),
    kase(
      "bad lifetimes are refused naming the field and the rule, and change nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        for (const [field, value] of [
          ["idleTimeoutMs", 0],
          ["idleTimeoutMs", 1.5],
          ["ttlMs", -1],
          ["ttlMs", Number.NaN],
          ["ttlMs", Lifetime.maxLifetimeMs + 1],
        ] as const) {
          const e = yield* expectFailure(s.createSession({ id: "bad", budget, [field]: value }), "InvalidInput")
          expect(e.field).toBe(field)
          expect(e.rule).toBe(Lifetime.lifetimeRule)
        }
        yield* expectFailure(s.getSession("bad"), "NotFound")
        yield* s.createSession({ id: "s1", budget, ttlMs: 1000 })
        const e = yield* expectFailure(s.setTtl("s1", 0), "InvalidInput")
        expect(e.field).toBe("ttlMs")
        expect((yield* s.getSession("s1")).endsAt).toBe(1000)
        const a = yield* expectFailure(s.recordActivity("h1", ["no spaces allowed"]), "InvalidInput")
        expect(a.field).toBe("activeSessions.0")
      }),
    ),
  ],
}
