/**
 * Pages: every list pages by a stable key — sessions and moves oldest first
 * (`[createdAt, id]`), hosts and reservations by id, the queue first in first out — with an
 * opaque cursor. Following the cursors yields every item once, in the list's order; a cursor
 * keeps its place while items come and go; a cursor that is not one of the list's is refused
 * naming `cursor`, a bad limit naming `limit`, a filter with a NUL naming the filter.
 */
import type { Page, PageRequest, StoreError } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import type { Effect as Fx } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, hostsNow, kase, placed, queued, reservationsNow, sessionIn, store } from "../Harness.js"
import type { Group } from "../Harness.js"

/** Every item of a list, `limit` at a time, and how many pages it took. */
const follow = <A, E, R>(read: (page: PageRequest) => Fx.Effect<Page<A>, E, R>, limit: number) =>
  Effect.gen(function* () {
    const all: A[] = []
    let cursor: string | undefined
    let pages = 0
    for (;;) {
      const page = yield* read({ limit, cursor })
      pages++
      expect(page.items.length).toBeLessThanOrEqual(limit)
      all.push(...page.items)
      if (page.nextCursor === null) break
      cursor = page.nextCursor
      if (pages > 1000) return expect.fail("the cursors never end")
    }
    return { all, pages }
  })

const ids = (xs: readonly { readonly id: string }[]) => xs.map((x) => x.id)

export const pages: Group = {
  name: "pages",
  cases: [
    kase(
      "following the cursors yields every host, session and reservation once, in the list's order",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["h3", "h1", "h5", "h2", "h4"]) yield* addHost(id, 65536)
        for (let i = 0; i < 7; i++) {
          yield* placed(`s${i}`, { memMib: 256, vcpus: 1 })
          if (i % 2 === 0) yield* TestClock.adjust(1)
        }
        const hosts = yield* follow((p) => s.pageHosts(p), 2)
        expect(ids(hosts.all)).toStrictEqual(ids(yield* hostsNow(s)))
        expect(hosts.pages).toBe(3)
        const sessions = yield* follow((p) => s.pageSessions({}, p), 3)
        expect(ids(sessions.all)).toStrictEqual(ids(yield* s.listSessions()))
        const reservations = yield* follow((p) => s.pageReservations({}, p), 4)
        expect(ids(reservations.all)).toStrictEqual(ids(yield* reservationsNow(s)))
        // A page size that divides the list: the last full page says there is no more.
        expect((yield* follow((p) => s.pageHosts(p), 5)).pages).toBe(1)
        expect((yield* s.pageHosts()).items.length).toBe(5)
      }),
    ),
    kase(
      "filters page too: sessions by state and host, reservations by host, moves by host and state",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("a", 8192)
        yield* addHost("b", 65536)
        for (let i = 0; i < 5; i++) yield* sessionIn(`r${i}`, "running", { memMib: 1024, vcpus: 1 })
        yield* sessionIn("p0", "parked", { memMib: 1024, vcpus: 1 })
        const running = yield* follow((p) => s.pageSessions({ state: "running" }, p), 2)
        expect(ids(running.all)).toStrictEqual(ids(yield* s.listSessions({ state: "running" })))
        const onA = yield* follow((p) => s.pageSessions({ hostId: "a" }, p), 2)
        expect(ids(onA.all)).toStrictEqual(ids(yield* s.listSessions({ hostId: "a" })))
        expect(ids((yield* follow((p) => s.pageReservations({ hostId: "b" }, p), 1)).all)).toStrictEqual(
          ids(yield* reservationsNow(s, { hostId: "b" })),
        )
        for (const id of ["r0", "r1", "r2"]) yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
        const m = yield* s.openMove("r0")
        yield* s.abortMove(m!.id, "test")
        const pending = yield* follow((p) => s.pageMoves({ state: "pending" }, p), 1)
        expect(ids(pending.all)).toStrictEqual(ids(yield* s.listMoves({ state: "pending" })))
        expect(pending.all.length).toBe(2)
        const byHost = yield* follow((p) => s.pageMoves({ hostId: "b" }, p), 2)
        expect(ids(byHost.all)).toStrictEqual(ids(yield* s.listMoves({ hostId: "b" })))
      }),
    ),
    kase(
      "a cursor keeps its place: items before it may go, items after it appear on the next page",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        for (let i = 0; i < 4; i++) {
          yield* placed(`s${i}`, { memMib: 256, vcpus: 1 })
          yield* TestClock.adjust(1)
        }
        const first = yield* s.pageSessions({}, { limit: 2 })
        expect(ids(first.items)).toStrictEqual(["s0", "s1"])
        yield* s.endSession("s0")
        yield* placed("s4", { memMib: 256, vcpus: 1 })
        const next = yield* s.pageSessions({}, { limit: 10, cursor: first.nextCursor ?? undefined })
        expect(ids(next.items)).toStrictEqual(["s2", "s3", "s4"])
        expect(next.nextCursor).toBeNull()
        // The queue too: the first in line leaves, the page after the cursor is the same.
        for (const id of ["q1", "q2", "q3"]) {
          yield* queued(id, { memMib: 1 << 20, vcpus: 1 })
          yield* TestClock.adjust(1)
        }
        const q = yield* s.pageQueue({ limit: 1 })
        yield* s.endSession("q1")
        const after = yield* s.pageQueue({ cursor: q.nextCursor ?? undefined })
        expect(after.items.map((e) => [e.session.id, e.standing.position])).toStrictEqual([
          ["q2", 1],
          ["q3", 2],
        ])
      }),
    ),
    kase(
      "a cursor that is not one of the list's is refused naming cursor; a bad limit naming limit; a filter with a NUL or a lone surrogate naming it",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", { memMib: 256, vcpus: 1 })
        yield* placed("s2", { memMib: 256, vcpus: 1 })
        const hostCursor = (yield* s.pageHosts({ limit: 1 })).nextCursor
        const sessionCursor = (yield* s.pageSessions({}, { limit: 1 })).nextCursor ?? undefined
        expect(sessionCursor).toBeDefined()
        for (const cursor of ["garbage", "", "%%%", hostCursor ?? "x", "W10"]) {
          expect((yield* expectFailure(s.pageSessions({}, { cursor }), "InvalidInput")).field, cursor).toBe("cursor")
        }
        expect((yield* expectFailure(s.pageHosts({ cursor: sessionCursor }), "InvalidInput")).field).toBe("cursor")
        expect((yield* expectFailure(s.pageReservations({}, { cursor: sessionCursor }), "InvalidInput")).field).toBe("cursor")
        expect((yield* expectFailure(s.pageMoves({}, { cursor: sessionCursor }), "InvalidInput")).field).toBe("cursor")
        expect((yield* expectFailure(s.pageQueue({ cursor: sessionCursor }), "InvalidInput")).field).toBe("cursor")
        for (const limit of [0, -1, 1001, 2.5]) {
          expect((yield* expectFailure(s.pageSessions({}, { limit }), "InvalidInput")).field).toBe("limit")
        }
        expect((yield* expectFailure(s.pageSessions({ hostId: "h\u0000" }), "InvalidInput")).field).toBe("hostId")
        expect((yield* expectFailure(s.pageReservations({ hostId: "\u0000" }), "InvalidInput")).field).toBe("hostId")
        expect((yield* expectFailure(s.pageMoves({ hostId: "\ud800" }), "InvalidInput")).field).toBe("hostId")
        // An unknown host is no error: its page is empty.
        expect(yield* s.pageSessions({ hostId: "nope" })).toStrictEqual({ items: [], nextCursor: null })
      }),
    ),
    kase(
      "a well-formed cursor with a key no list holds (a fraction, past 2^53, 1e308, a seq past 2^31, a NUL, a lone surrogate) is refused naming cursor on every list",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", { memMib: 256, vcpus: 1 })
        const made = (...parts: unknown[]) => Buffer.from(JSON.stringify(parts)).toString("base64url")
        const times = [1.5, 1e19, -1e19, 1e308, 2 ** 53, Number.MIN_VALUE]
        const texts = ["a\u0000b", "\u0000", "\ud800", "x\udc00"]
        const lists: [string, (cursor: string) => Fx.Effect<void, StoreError>, (string | number)[][]][] = [
          ["sessions", (cursor) => Effect.asVoid(s.pageSessions({}, { cursor })), [...times.map((t) => ["sessions", t, "s1"]), ...texts.map((x) => ["sessions", 0, x])]],
          ["moves", (cursor) => Effect.asVoid(s.pageMoves({}, { cursor })), [...times.map((t) => ["moves", t, "m"]), ...texts.map((x) => ["moves", 0, x])]],
          ["queue", (cursor) => Effect.asVoid(s.pageQueue({ cursor })), [...times.map((t) => ["queue", t, "q"]), ...texts.map((x) => ["queue", 0, x])]],
          ["hosts", (cursor) => Effect.asVoid(s.pageHosts({ cursor })), texts.map((x) => ["hosts", x])],
          ["reservations", (cursor) => Effect.asVoid(s.pageReservations({}, { cursor })), [...texts.map((x) => ["reservations", x]), ["reservations", 7]]],
          ["events", (cursor) => Effect.asVoid(s.sessionEvents("s1", { cursor })), [...times, 2 ** 31, -1].map((n) => ["events", n])],
        ]
        for (const [list, read, keys] of lists) {
          for (const key of keys) {
            const cursor = made(...key)
            const refused = yield* expectFailure(read(cursor), "InvalidInput")
            expect([refused.field, refused.rule], `${list} ${JSON.stringify(key)}`).toStrictEqual(["cursor", `must be a nextCursor of a previous page of ${list}`])
          }
        }
        // The keys a list can hold still page: the largest time and seq a store keeps exactly.
        expect((yield* s.pageSessions({}, { cursor: made("sessions", Number.MAX_SAFE_INTEGER, "s") })).items).toStrictEqual([])
        expect((yield* s.sessionEvents("s1", { cursor: made("events", 2 ** 31 - 1) })).items).toStrictEqual([])
        expect(ids((yield* s.pageHosts({ cursor: made("hosts", "a") })).items)).toStrictEqual(["h1"])
      }),
    ),
  ],
}
