/**
 * The reservation ledger (SPEC §3): the admission checks in their order, duplicates, release
 * and heartbeats, stale and expired reclaim on the TestClock, clock skew, sessions made lost,
 * summaries and cumulative metrics.
 */
import { Validate } from "@engram/store"
import type { ReserveInput } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, commitAfterFinal, expectFailure, expectInvariants, expectUnchanged, hostsNow, hostSummaryOf, kase, placed, reservationsNow, sessionIn, snapshot, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const ext = (id: string | null, hostId: string | null, memMib = 512, more: Partial<ReserveInput> = {}): ReserveInput => ({
  id,
  hostId,
  ownerKind: "external",
  ownerId: "ops",
  memMib,
  vcpus: 1,
  ...more,
})

const staleWindowMs = 2 * 60 * 1000

/** Reserve must be refused by `check`; nothing but reserveFailures (+1) changes. */
const refusedBy = (input: ReserveInput, check: string) =>
  Effect.gen(function* () {
    const s = yield* store
    const before = yield* snapshot
    const failures = (yield* s.metrics()).reserveFailures
    const err = yield* expectFailure(s.reserve(input), "Refused")
    expect(err.check, err.reason).toBe(check)
    yield* expectUnchanged(before, `a reserve refused by ${check}`)
    expect((yield* s.metrics()).reserveFailures).toBe(failures + 1)
    return err
  })

export const ledger: Group = {
  name: "ledger",
  cases: [
    kase(
      "reserve records an entry stamped now with nulls for what was not given",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* TestClock.adjust(1234)
        const r = yield* s.reserve(ext("x1", "h1"))
        expect(r).toStrictEqual({
          id: "x1",
          hostId: "h1",
          ownerKind: "external",
          ownerId: "ops",
          memMib: 512,
          vcpus: 1,
          vramMib: null,
          createdAt: 1234,
          lastHeartbeatAt: 1234,
          expiresAt: null,
          description: null,
        })
        expect(yield* s.getReservation("x1")).toStrictEqual(r)
      }),
    ),
    kase(
      "reserve stores vramMib, expiresAt and description when given",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const r = yield* s.reserve(ext("x1", "h1", 512, { vramMib: 2048, expiresAt: 60_000, description: "warm pool" }))
        expect(r).toMatchObject({ vramMib: 2048, expiresAt: 60_000, description: "warm pool" })
      }),
    ),
    kase(
      "a reservation whose expiry has already passed (-1, or any time before now) is refused naming expiresAt; nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* TestClock.adjust(10_000)
        const before = yield* snapshot
        const failures = (yield* s.metrics()).reserveFailures
        for (const expiresAt of [-1, 0, 9_999]) {
          const err = yield* expectFailure(s.reserve(ext(`x${expiresAt}`, "h1", 512, { expiresAt })), "InvalidInput")
          expect([err.field, err.rule], String(expiresAt)).toStrictEqual(["expiresAt", "must not be in the past (now is 10000 epoch ms)"])
        }
        yield* expectUnchanged(before, "a reserve with an expiry in the past")
        // Bad input is not a ledger refusal: reserveFailures counts the ledger's checks only.
        expect((yield* s.metrics()).reserveFailures).toBe(failures)
        // Now and later are accepted.
        expect((yield* s.reserve(ext("now", "h1", 512, { expiresAt: 10_000 }))).expiresAt).toBe(10_000)
        expect((yield* s.reserve(ext("later", "h1", 512, { expiresAt: 70_000 }))).expiresAt).toBe(70_000)
      }),
    ),
    kase(
      "reserve refuses a missing id first, before every other check",
      Effect.gen(function* () {
        yield* refusedBy(ext(null, null, 0), "id_missing")
        yield* refusedBy(ext(null, "nope", -5), "id_missing")
      }),
    ),
    kase(
      "reserve refuses a missing host second, before checking memMib",
      Effect.gen(function* () {
        yield* refusedBy(ext("x1", null, 0), "host_missing")
        yield* refusedBy(ext("x1", null, 512), "host_missing")
      }),
    ),
    kase(
      "an empty or malformed reservation id or hostId (the id rule) is InvalidInput naming it, not a ledger refusal: nothing stored, no reserve failure counted",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        for (const [input, field] of [
          [ext("", "h1"), "id"],
          [ext(" ", "h1"), "id"],
          [ext("a/b", "h1"), "id"],
          [ext("..", "h1"), "id"],
          [ext("x1", ""), "hostId"],
          [ext("x1", "h1:x"), "hostId"],
          [ext("x1", "h 1"), "hostId"],
          [ext("x1", "x".repeat(101)), "hostId"],
          // Checked before the figures: a bad id with a bad memMib still names the id.
          [ext("", "", -5), "id"],
        ] as const) {
          const err = yield* expectFailure(s.reserve(input), "InvalidInput")
          expect([err.field, err.rule], JSON.stringify(input)).toStrictEqual([field, Validate.idRule])
        }
        yield* expectUnchanged(before, "reserves with malformed ids")
        expect((yield* s.metrics()).reserveFailures).toBe(0)
        // A well-formed id of no host is the ledger's host_unknown, and counts.
        yield* refusedBy(ext("x1", "h2"), "host_unknown")
      }),
    ),
    kase(
      "reserve refuses memMib <= 0 before looking for a duplicate id",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        yield* refusedBy(ext("x1", "h1", 0), "mem_not_positive")
        yield* refusedBy(ext("x2", "h1", -1), "mem_not_positive")
      }),
    ),
    kase(
      "a duplicate id is a Conflict that does not count as a reserve failure",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        const before = yield* snapshot
        // Checked before the host: a duplicate on an unknown host is still a duplicate.
        const err = yield* expectFailure(s.reserve(ext("x1", "nope", 100)), "Conflict")
        expect(err).toMatchObject({ entity: "reservation", id: "x1" })
        yield* expectFailure(s.reserve(ext("x1", "h1")), "Conflict")
        yield* expectUnchanged(before, "a duplicate reserve")
        expect((yield* s.metrics()).reserveFailures).toBe(0)
      }),
    ),
    kase(
      "a reservation id held by a session placement is a duplicate too",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* placed("s1", { memMib: 1024, vcpus: 1 })
        yield* expectFailure(s.reserve(ext(x.reservationId, "h1")), "Conflict")
      }),
    ),
    kase(
      "reserve on an unknown host is refused as host_unknown",
      Effect.gen(function* () {
        yield* refusedBy(ext("x1", "nope"), "host_unknown")
      }),
    ),
    kase(
      "an external reservation on a cordoned or draining host is refused as host_not_ready naming its state; a capture still lands",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        for (const state of ["cordoned", "draining"] as const) {
          yield* s.setHostState("h1", state)
          const err = yield* refusedBy(ext("x1", "h1"), "host_not_ready")
          expect(err.reason).toContain(`is ${state}`)
        }
        expect((yield* s.reserve(ext("c1", "h1", 512, { ownerKind: "capture" }))).ownerKind).toBe("capture")
        yield* s.setHostState("h1", "ready")
        expect((yield* s.reserve(ext("x1", "h1"))).hostId).toBe("h1")
      }),
    ),
    kase(
      "a reservation's hostId, ownerId or description with a NUL or a lone surrogate is refused by name, and a far expiry past 2^53 - 1",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        expect((yield* expectFailure(s.reserve(ext("x1", "h1\u0000")), "InvalidInput")).field).toBe("hostId")
        expect((yield* expectFailure(s.reserve(ext("x1", "\ud800")), "InvalidInput")).field).toBe("hostId")
        expect((yield* expectFailure(s.reserve(ext("x1", "h1", 512, { ownerId: "o\udfff" })), "InvalidInput")).field).toBe("ownerId")
        expect((yield* expectFailure(s.reserve(ext("x1", "h1", 512, { description: "d\ud800" })), "InvalidInput")).field).toBe("description")
        expect((yield* expectFailure(s.reserve(ext("x1", "h1", 512, { expiresAt: 1e21 })), "InvalidInput")).field).toBe("expiresAt")
        yield* expectUnchanged(before, "refused reservations")
        expect((yield* s.metrics()).reserveFailures).toBe(0)
      }),
    ),
    kase(
      "an unmeasured host admits reservations unless requireMeasured is set",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("u")
        expect((yield* s.reserve(ext("x1", "u", 1_000_000))).hostId).toBe("u")
      }),
    ),
    kase(
      "requireMeasured refuses an unmeasured host as host_unmeasured",
      Effect.gen(function* () {
        yield* addHost("u")
        yield* refusedBy(ext("x1", "u"), "host_unmeasured")
      }),
      { requireMeasured: true },
    ),
    kase(
      "reserve on a host at maxEntriesPerNode is refused as entries_full",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        yield* s.reserve(ext("x1", "h1"))
        yield* s.reserve(ext("x2", "h1"))
        yield* refusedBy(ext("x3", "h1"), "entries_full")
      }),
      { maxEntriesPerNode: 2 },
    ),
    kase(
      "the entries cap is checked before capacity",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 1024)
        yield* s.reserve(ext("x1", "h1", 1024))
        yield* refusedBy(ext("x2", "h1", 4096), "entries_full")
      }),
      { maxEntriesPerNode: 1 },
    ),
    kase(
      "reserve beyond RAM capacity is refused as capacity_exceeded with the figures",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* s.reserve(ext("x1", "h1", 3000))
        const err = yield* refusedBy(ext("x2", "h1", 1097), "capacity_exceeded")
        expect(err.reason).toContain("reserved=3000")
        expect(err.reason).toContain("capacity=4096")
        expect(err.reason).toContain("asked=1097")
        expect((yield* s.reserve(ext("x3", "h1", 1096))).memMib).toBe(1096)
      }),
    ),
    kase(
      "reserve beyond the CPU budget is refused as capacity_exceeded",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536, 1)
        yield* s.reserve(ext("x1", "h1", 100, { vcpus: 3 }))
        const err = yield* refusedBy(ext("x2", "h1", 100, { vcpus: 2 }), "capacity_exceeded")
        expect(err.reason).toContain("capacity=4")
      }),
    ),
    kase(
      "every refusal but the duplicate counts in reserveFailures",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 1024)
        yield* addHost("u")
        yield* s.reserve(ext("x1", "h1", 1024))
        const attempts: ReserveInput[] = [
          ext(null, "h1"),
          ext("a", null),
          ext("b", "h1", 0),
          ext("x1", "h1"),
          ext("c", "nope"),
          ext("d", "u"),
          ext("e", "h1", 1),
        ]
        for (const a of attempts) yield* Effect.result(s.reserve(a))
        expect((yield* s.metrics()).reserveFailures).toBe(6)
      }),
      { requireMeasured: true },
    ),
    kase(
      "an unknown ownerKind is InvalidInput naming ownerKind",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        const err = yield* expectFailure(
          s.reserve({ ...ext("x1", "h1"), ownerKind: "tenant" as unknown as "external" }),
          "InvalidInput",
        )
        expect(err.field).toBe("ownerKind")
        yield* expectUnchanged(before, "a bad ownerKind")
      }),
    ),
    kase(
      "release removes an external or capture entry and gives its room back",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1", 700))
        yield* s.reserve({ ...ext("c1", "h1", 300), ownerKind: "capture", ownerId: "job-1" })
        expect((yield* s.release("x1")).id).toBe("x1")
        expect((yield* s.release("c1")).id).toBe("c1")
        expect(yield* reservationsNow(s)).toStrictEqual([])
        expect((yield* s.getHost("h1")).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
        yield* expectFailure(s.getReservation("x1"), "NotFound")
      }),
    ),
    kase(
      "release of an unknown id is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        const err = yield* expectFailure(s.release("nope"), "NotFound")
        expect(err).toMatchObject({ entity: "reservation", id: "nope" })
      }),
    ),
    kase(
      "release refuses a session's or a move's reservation as owned",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const x = yield* sessionIn("s1", "moving")
        const move = yield* s.openMove("s1")
        const before = yield* snapshot
        expect((yield* expectFailure(s.release(x.reservationId as string), "Refused")).check).toBe("owned")
        expect((yield* expectFailure(s.release(move?.reservationId as string), "Refused")).check).toBe("owned")
        yield* expectUnchanged(before, "releasing an owned reservation")
      }),
    ),
    kase(
      "heartbeat renews lastHeartbeatAt; an unknown id is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        yield* TestClock.adjust(90_000)
        const r = yield* s.heartbeat("x1")
        expect(r).toMatchObject({ createdAt: 0, lastHeartbeatAt: 90_000 })
        yield* expectFailure(s.heartbeat("nope"), "NotFound")
      }),
    ),
    kase(
      "heartbeatHost renews session, move and capture entries on the host but not external ones",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* sessionIn("s1", "running")
        yield* sessionIn("s2", "parked")
        yield* s.beginMove({ sessionId: "s1", targetHostId: "h2", maxDowntimeMs: 600 })
        yield* s.reserve(ext("x1", "h1"))
        yield* s.reserve({ ...ext("c1", "h2"), ownerKind: "capture", ownerId: "job" })
        yield* TestClock.adjust(60_000)
        expect(yield* s.heartbeatHost("h1")).toBe(2)
        expect(yield* s.heartbeatHost("h2")).toBe(2)
        const beats = (yield* reservationsNow(s)).map((r) => [r.ownerKind, r.lastHeartbeatAt])
        expect(beats.filter(([k]) => k === "external")).toStrictEqual([["external", 0]])
        expect(beats.filter(([k]) => k !== "external").every(([, t]) => t === 60_000)).toBe(true)
        yield* expectFailure(s.heartbeatHost("nope"), "NotFound")
      }),
    ),
    kase(
      "a heartbeat never moves an entry's heartbeat back (a late write, a replica whose clock is behind)",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "running")
        yield* s.reserve(ext("x1", "h1"))
        yield* TestClock.setTime(90_000)
        expect((yield* s.heartbeat("x1")).lastHeartbeatAt).toBe(90_000)
        expect(yield* s.heartbeatHost("h1")).toBe(1)
        // A beat stamped 60 s earlier lands after them: it renews nothing backwards.
        yield* TestClock.setTime(30_000)
        expect((yield* s.heartbeat("x1")).lastHeartbeatAt).toBe(90_000)
        yield* s.heartbeatHost("h1")
        expect((yield* reservationsNow(s)).map((r) => r.lastHeartbeatAt)).toStrictEqual([90_000, 90_000])
        // A later beat still renews.
        yield* TestClock.setTime(120_000)
        expect((yield* s.heartbeat("x1")).lastHeartbeatAt).toBe(120_000)
      }),
    ),
    kase(
      "an entry is stale only once its heartbeat is older than the stale window",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        yield* TestClock.adjust(staleWindowMs)
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
        expect((yield* hostSummaryOf(s, "h1")).staleEntries).toBe(0)
        yield* TestClock.adjust(1)
        expect((yield* hostSummaryOf(s, "h1")).staleEntries).toBe(1)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual(["x1"])
        expect(result.lostSessions).toStrictEqual([])
        expect(yield* reservationsNow(s)).toStrictEqual([])
      }),
    ),
    kase(
      "a heartbeat keeps an entry from going stale",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        yield* TestClock.adjust(staleWindowMs - 1)
        yield* s.heartbeat("x1")
        yield* TestClock.adjust(staleWindowMs)
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
      }),
    ),
    kase(
      "the stale window follows the limits",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1"))
        yield* TestClock.adjust(5001)
        expect((yield* s.reclaim()).reclaimed.map((r) => r.id)).toStrictEqual(["x1"])
      }),
      { heartbeatStaleWindowMs: 5000 },
    ),
    kase(
      "an entry past its expiresAt is reclaimed even with a fresh heartbeat",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1", 512, { expiresAt: 10_000 }))
        yield* TestClock.adjust(10_000)
        yield* s.heartbeat("x1")
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
        yield* TestClock.adjust(1)
        yield* s.heartbeat("x1")
        expect((yield* s.reclaim()).reclaimed.map((r) => r.id)).toStrictEqual(["x1"])
      }),
    ),
    kase(
      "reclaim with stale false (the failover grace) takes only expired entries: a stale one and its session stay; the default then takes them, the session lost",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* sessionIn("s1", "running")
        yield* s.reserve(ext("x-exp", "h1", 512, { expiresAt: 10_000 }))
        yield* s.reserve(ext("x-stale", "h1"))
        // Everything is stale now; x-exp is also past its expiresAt, with a fresh heartbeat.
        yield* TestClock.adjust(staleWindowMs + 1)
        yield* s.heartbeat("x-exp")
        const only = yield* s.reclaim({ stale: false })
        expect(only.reclaimed.map((r) => r.id)).toStrictEqual(["x-exp"])
        expect(only.lostSessions).toStrictEqual([])
        expect((yield* reservationsNow(s)).map((r) => r.id).sort()).toStrictEqual([x.reservationId, "x-stale"].sort())
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", reservationId: x.reservationId })
        expect((yield* hostSummaryOf(s, "h1")).staleEntries).toBe(2)
        // Asked again: nothing more (the stale ones are judged again, not lost track of).
        expect(yield* s.reclaim({ stale: false })).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
        // `stale: true` is the default: expired and stale.
        const all = yield* s.reclaim({ stale: true })
        expect(all.reclaimed.map((r) => r.id)).toStrictEqual([x.reservationId, "x-stale"].sort())
        expect(all.lostSessions).toStrictEqual(["s1"])
        expect(yield* s.getSession("s1")).toMatchObject({ state: "lost", hostId: null, reservationId: null })
        expect(yield* reservationsNow(s)).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "reclaim with stale false counts an expired entry as reclaimed; a session whose reservation went stale is lost only by the default",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s-stale", "running")
        yield* s.reserve(ext("x-exp", "h1", 512, { expiresAt: 10_000 }))
        yield* TestClock.adjust(10_001)
        // Expired and, with no heartbeat, not yet stale: stale false and the default agree.
        const only = yield* s.reclaim({ stale: false })
        expect(only.reclaimed.map((r) => r.id)).toStrictEqual(["x-exp"])
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 512 })
        yield* TestClock.adjust(staleWindowMs)
        expect(yield* s.reclaim({ stale: false })).toStrictEqual({ reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] })
        expect((yield* s.reclaim()).lostSessions).toStrictEqual(["s-stale"])
        yield* expectInvariants
      }),
    ),
    kase(
      "a heartbeat in the future (clock skew) is not stale",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* TestClock.setTime(600_000)
        yield* s.reserve(ext("x1", "h1"))
        // This replica's clock is 10 minutes behind the one that stamped the heartbeat.
        yield* TestClock.setTime(0)
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
        expect((yield* hostSummaryOf(s, "h1")).staleEntries).toBe(0)
        yield* TestClock.setTime(600_000 + staleWindowMs + 1)
        expect((yield* s.reclaim()).reclaimed.map((r) => r.id)).toStrictEqual(["x1"])
      }),
    ),
    kase(
      "a reclaimed session reservation makes its session lost, holding nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* sessionIn("s1", "running")
        yield* TestClock.adjust(staleWindowMs + 1)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([x.reservationId])
        expect(result.lostSessions).toStrictEqual(["s1"])
        expect(yield* s.getSession("s1")).toMatchObject({ state: "lost", hostId: null, reservationId: null })
        expect((yield* s.getHost("h1")).headroom.reserved.memMib).toBe(0)
        yield* expectInvariants
      }),
    ),
    kase(
      "a lost session can only end",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "lost")
        yield* expectFailure(s.markRunning("s1"), "IllegalTransition")
        yield* expectFailure(s.resume("s1"), "IllegalTransition")
        expect((yield* s.endSession("s1")).session.state).toBe("ended")
      }),
    ),
    kase(
      "reclaim answers its entries sorted by id and its lost sessions sorted",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        yield* sessionIn("s-b", "parked")
        yield* sessionIn("s-a", "descending")
        yield* sessionIn("s-c", "pending")
        yield* s.reserve(ext("x-z", "h1"))
        yield* s.reserve(ext("x-a", "h1"))
        const ids = (yield* reservationsNow(s)).map((r) => r.id)
        yield* TestClock.adjust(staleWindowMs + 1)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([...ids].sort())
        expect(result.lostSessions).toStrictEqual(["s-a", "s-b", "s-c"])
        expect((yield* s.listSessions({ state: "lost" })).length).toBe(3)
        expect((yield* s.reclaim()).reclaimed).toStrictEqual([])
      }),
    ),
    kase(
      "reclaiming a moving session's reservation makes it lost and aborts its move",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const x = yield* sessionIn("s1", "moving")
        const move = (yield* s.openMove("s1"))!
        yield* TestClock.adjust(staleWindowMs + 1)
        yield* s.heartbeat(move.reservationId)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([x.reservationId])
        expect(result.lostSessions).toStrictEqual(["s1"])
        expect((yield* s.getMove(move.id)).state).toBe("aborted")
        expect(yield* s.openMove("s1")).toBeNull()
        expect(yield* reservationsNow(s)).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "reclaiming a move's target reservation aborts the move and the session runs on the source",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        const x = yield* sessionIn("s1", "moving")
        const move = (yield* s.openMove("s1"))!
        yield* TestClock.adjust(staleWindowMs + 1)
        yield* s.heartbeat(x.reservationId as string)
        const result = yield* s.reclaim()
        expect(result.reclaimed.map((r) => r.id)).toStrictEqual([move.reservationId])
        expect(result.lostSessions).toStrictEqual([])
        expect((yield* s.getMove(move.id)).state).toBe("aborted")
        expect(yield* s.getSession("s1")).toMatchObject({ state: "running", hostId: x.hostId, reservationId: x.reservationId })
        yield* expectInvariants
      }),
    ),
    kase(
      "a host's summary reports capacity, reserved RAM and VRAM, active and stale entries and utilization",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.reserve(ext("x1", "h1", 2048, { vramMib: 100 }))
        yield* TestClock.adjust(staleWindowMs)
        yield* s.reserve(ext("x2", "h1", 2048))
        yield* TestClock.adjust(1)
        expect(yield* hostSummaryOf(s, "h1")).toStrictEqual({
          hostId: "h1",
          totalMib: 8192,
          reservedMib: 4096,
          reservedVramMib: 100,
          activeEntries: 1,
          staleEntries: 1,
          utilizationPct: 50,
        })
        expect((yield* s.clusterSummary()).hosts.some((h) => h.hostId === "nope")).toBe(false)
      }),
    ),
    kase(
      "the summary of an unmeasured host has no capacity and no utilization",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("u")
        yield* s.reserve(ext("x1", "u", 300))
        expect(yield* hostSummaryOf(s, "u")).toMatchObject({ totalMib: null, reservedMib: 300, utilizationPct: null })
      }),
    ),
    kase(
      "clusterSummary sums every host and lists them sorted by id",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("b", 4096)
        yield* addHost("a", 2048)
        yield* addHost("u")
        yield* s.reserve(ext("x1", "a", 1024))
        yield* s.reserve(ext("x2", "b", 1024, { vramMib: 10 }))
        yield* s.reserve(ext("x3", "u", 500))
        const c = yield* s.clusterSummary()
        expect(c.hosts.map((h) => h.hostId)).toStrictEqual(["a", "b", "u"])
        expect(c).toMatchObject({ totalMib: 6144, reservedMib: 2548, reservedVramMib: 10, activeEntries: 3, staleEntries: 0 })
        // Utilization over hosts with a capacity only: 2048 / 6144.
        expect(c.utilizationPct).toBeCloseTo((2048 / 6144) * 100, 9)
      }),
    ),
    kase(
      "metrics add reserved, released and reclaimed RAM cumulatively",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        yield* addHost("h2", 65536)
        yield* placed("s1", { memMib: 1000, vcpus: 1 })
        yield* s.reserve(ext("x1", "h1", 200))
        yield* s.reserve(ext("x2", "h1", 30))
        yield* s.release("x1")
        yield* s.endSession("s1")
        yield* sessionIn("s2", "running", { memMib: 4000, vcpus: 1 })
        expect(yield* s.metrics()).toStrictEqual({
          totalReservedMib: 1000 + 200 + 30 + 4000,
          totalReleasedMib: 200 + 1000,
          totalReclaimedMib: 0,
          reserveFailures: 0,
          activeEntries: 2,
        })
        yield* TestClock.adjust(staleWindowMs + 1)
        yield* s.reclaim()
        expect(yield* s.metrics()).toMatchObject({ totalReclaimedMib: 30 + 4000, activeEntries: 0, totalReleasedMib: 1200 })
      }),
    ),
    kase(
      "a committed move releases its source entry into totalReleasedMib",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* sessionIn("s1", "moving", { memMib: 2000, vcpus: 1 })
        const move = (yield* s.openMove("s1"))!
        yield* commitAfterFinal(move.id, { downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 })
        expect(yield* s.metrics()).toMatchObject({ totalReservedMib: 4000, totalReleasedMib: 2000, activeEntries: 1 })
      }),
    ),
    kase(
      "reset empties the store and its metrics",
      Effect.gen(function* () {
        const s = yield* store
        yield* expectInvariants
        expect(yield* s.metrics()).toStrictEqual({
          totalReservedMib: 0,
          totalReleasedMib: 0,
          totalReclaimedMib: 0,
          reserveFailures: 0,
          activeEntries: 0,
        })
        expect(yield* hostsNow(s)).toStrictEqual([])
        expect(yield* s.listSessions()).toStrictEqual([])
        expect(yield* reservationsNow(s)).toStrictEqual([])
        expect(s.limits().maxEntriesPerNode).toBe(7)
      }),
      { maxEntriesPerNode: 7 },
    ),
  ],
}
