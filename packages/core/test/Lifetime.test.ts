import { describe, expect, it } from "vitest"
import { Lifetime, ParkPolicy, Session } from "../src/index.js"

const record = (over: Partial<Session.Record> = {}): Session.Record => ({
  id: "s1",
  state: "running",
  budget: { memMib: 1024, vcpus: 1 },
  affinity: [],
  hostId: "h1",
  reservationId: "r1",
  queuedAt: null,
  parkedAt: null,
  idleTimeoutMs: null,
  lastActiveAt: 0,
  endsAt: null,
  template: null,
  imageHostId: null,
  createdAt: 0,
  updatedAt: 0,
  ...over,
})

describe("Lifetime", () => {
  it("a running session is idle once no activity was reported for its idle timeout, not a millisecond before", () => {
    const s = record({ idleTimeoutMs: 60_000 })
    expect(Lifetime.isIdle(s, 1000, 60_999)).toBe(false)
    expect(Lifetime.isIdle(s, 1000, 61_000)).toBe(true)
    expect(Lifetime.idleAt(s, 1000)).toBe(61_000)
  })

  it("without an idle timeout, or in any state but running, a session never becomes idle", () => {
    expect(Lifetime.isIdle(record(), 0, Number.MAX_SAFE_INTEGER)).toBe(false)
    for (const state of Session.states.filter((x) => x !== "running"))
      expect(Lifetime.isIdle(record({ state, idleTimeoutMs: 1 }), 0, 10), state).toBe(false)
  })

  it("the TTL ends a session in every state but ended, once its deadline is reached", () => {
    for (const state of Session.states) {
      const s = record({ state, endsAt: 5000 })
      expect(Lifetime.isExpired(s, 4999), state).toBe(false)
      expect(Lifetime.isExpired(s, 5000), state).toBe(state !== "ended")
    }
    expect(Lifetime.isExpired(record(), Number.MAX_SAFE_INTEGER)).toBe(false)
  })

  it("a guest was active when it used at least 1% of the wall time on the CPU between two readings", () => {
    expect(Lifetime.wasActive(1000, 1600, 60_000)).toBe(true)
    expect(Lifetime.wasActive(1000, 1599, 60_000)).toBe(false)
    expect(Lifetime.wasActive(1000, 1000, 60_000)).toBe(false)
    // No time passed (or the clock went back): nothing to judge.
    expect(Lifetime.wasActive(0, 500, 0)).toBe(false)
  })

  it("a lifetime is an integer from 1 ms to ten years", () => {
    for (const ok of [1, 60_000, Lifetime.maxLifetimeMs]) expect(Lifetime.validLifetimeMs(ok), String(ok)).toBe(true)
    for (const bad of [0, -1, 1.5, Number.NaN, Infinity, Lifetime.maxLifetimeMs + 1, "60000", null]) expect(Lifetime.validLifetimeMs(bad), String(bad)).toBe(false)
  })
})

describe("Session.step and lifetimes", () => {
  it("a create stores the idle timeout and the TTL's deadline; the idle clock starts at the create", () => {
    const plan = Session.step(null, { _tag: "create", id: "s1", budget: { memMib: 1, vcpus: 1 }, affinity: [], placement: null, idleTimeoutMs: 300_000, ttlMs: 7_200_000 }, 1000)
    expect(plan._tag === "Plan" && plan.sessions[0]?.record).toMatchObject({ idleTimeoutMs: 300_000, endsAt: 7_201_000, lastActiveAt: 1000 })
  })

  it("a session that begins to run again starts its idle clock anew", () => {
    const parked = record({ state: "parked", parkedAt: 10, idleTimeoutMs: 100, lastActiveAt: 5 })
    const plan = Session.step(parked, { _tag: "unpark" }, 500)
    expect(plan._tag === "Plan" && plan.sessions[0]?.record.lastActiveAt).toBe(500)
  })

  it("a TTL set anew moves the deadline from now, keeps the state and says so in the history; an ended session has none", () => {
    const s = record({ state: "parked", parkedAt: 10, endsAt: 1000 })
    const plan = Session.step(s, { _tag: "setTtl", ttlMs: 3_600_000 }, 500)
    expect(plan._tag).toBe("Plan")
    if (plan._tag !== "Plan") return
    expect(plan.sessions[0]).toMatchObject({ from: "parked", record: { state: "parked", endsAt: 3_600_500 } })
    expect(plan.events.map((e) => e.event)).toStrictEqual([{ _tag: "TtlSet", endsAt: 3_600_500 }])
    expect(Session.step(record({ state: "ended", hostId: null, reservationId: null }), { _tag: "setTtl", ttlMs: 1 }, 500)._tag).toBe("Illegal")
  })

  it("an end for the TTL says why on its Ended event", () => {
    const plan = Session.step(record({ endsAt: 10 }), { _tag: "end", openMove: null, reason: Lifetime.ttlExpiredReason }, 20)
    expect(plan._tag === "Plan" && plan.events.map((e) => e.event)).toStrictEqual([{ _tag: "Ended", hostId: "h1", reason: "ttl expired" }])
  })

  it("the reaper's steps (onlyIfDue) are refused on a session no longer due as it stands, at the step's own time; a caller's are not", () => {
    const idlePolicy = { policy: ParkPolicy.defaultRule, view: { host: null, queueWithoutRoom: false } }
    const moved = record({ endsAt: 5000 })
    const notDue = Session.step(moved, { _tag: "end", openMove: null, reason: Lifetime.ttlExpiredReason, onlyIfDue: true }, 4999)
    expect(notDue._tag === "Illegal" && notDue.message).toContain("not expired")
    expect(Session.step(moved, { _tag: "end", openMove: null, reason: Lifetime.ttlExpiredReason, onlyIfDue: true }, 5000)._tag).toBe("Plan")
    expect(Session.step(moved, { _tag: "end", openMove: null }, 10)._tag).toBe("Plan")
    const active = record({ idleTimeoutMs: 1000, lastActiveAt: 4000 })
    const stillActive = Session.step(active, { _tag: "idle", ...idlePolicy, onlyIfDue: true }, 4999)
    expect(stillActive._tag === "Illegal" && stillActive.message).toContain("not idle")
    expect(Session.step(active, { _tag: "idle", ...idlePolicy, onlyIfDue: true }, 5000)._tag).toBe("Plan")
    expect(Session.step(active, { _tag: "idle", ...idlePolicy }, 10)._tag).toBe("Plan")
  })
})
