/**
 * Placement (SPEC §2): candidates, best fit, affinity, unmeasured hosts as a last resort,
 * the entries cap, the CPU gate, the no-fit details of a queued create, and a host whose agent
 * went silent (no report for longer than the stale window) taking nothing new.
 */
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, expectInvariants, kase, peerUrlOf, placed, queued, queueNow, reportFor, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const small = { memMib: 1024, vcpus: 1 }

export const placement: Group = {
  name: "placement",
  cases: [
    kase(
      "placement reserves the session's budget on its host for the session",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* placed("s1", { memMib: 2048, vcpus: 2 })
        expect(x).toMatchObject({ id: "s1", state: "pending", hostId: "h1", queuedAt: null, parkedAt: null, createdAt: 0 })
        const r = yield* s.getReservation(x.reservationId as string)
        expect(r).toMatchObject({ hostId: "h1", ownerKind: "session", ownerId: "s1", memMib: 2048, vcpus: 2, createdAt: 0, lastHeartbeatAt: 0 })
        expect((yield* s.getHost("h1")).headroom.reserved).toStrictEqual({ memMib: 2048, vcpus: 2 })
      }),
    ),
    kase(
      "best fit places on the host with the smallest free RAM that still fits",
      Effect.gen(function* () {
        yield* addHost("roomy", 16384)
        yield* addHost("snug", 4096)
        yield* addHost("tiny", 1024)
        expect((yield* placed("s1", { memMib: 2048, vcpus: 1 })).hostId).toBe("snug")
        expect((yield* placed("s2", { memMib: 2048, vcpus: 1 })).hostId).toBe("snug")
        expect((yield* placed("s3", { memMib: 2048, vcpus: 1 })).hostId).toBe("roomy")
        expect((yield* placed("s4", { memMib: 1024, vcpus: 1 })).hostId).toBe("tiny")
      }),
    ),
    kase(
      "best-fit ties go to fewer free vCPUs, then to the lower host id",
      Effect.gen(function* () {
        yield* addHost("b", 4096, 4)
        yield* addHost("c", 4096, 2)
        yield* addHost("a", 4096, 8)
        expect((yield* placed("s1", small)).hostId).toBe("c")
        yield* addHost("d", 3072, 2)
        yield* addHost("e", 3072, 2)
        // c now has 3072 free and 7 free vCPUs; d and e 3072 and 8: c first, then d over e.
        expect((yield* placed("s2", small)).hostId).toBe("c")
        expect((yield* placed("s3", { memMib: 3072, vcpus: 1 })).hostId).toBe("d")
      }),
    ),
    kase(
      "affinity hosts rank first, in the request's order of preference",
      Effect.gen(function* () {
        yield* addHost("h1", 2048)
        yield* addHost("h2", 8192)
        yield* addHost("h3", 16384)
        expect((yield* placed("s1", small, ["h3", "h2"])).hostId).toBe("h3")
        expect((yield* placed("s2", small, ["h2", "h3"])).hostId).toBe("h2")
        expect((yield* placed("s3", small, ["nope"])).hostId).toBe("h1")
      }),
    ),
    kase(
      "an affinity host without room is passed over for the best fit of the rest",
      Effect.gen(function* () {
        yield* addHost("full", 1024)
        yield* addHost("big", 16384)
        yield* addHost("mid", 4096)
        yield* placed("filler", { memMib: 1024, vcpus: 1 }, ["full"])
        expect((yield* placed("s1", small, ["full"])).hostId).toBe("mid")
      }),
    ),
    kase(
      "an unmeasured host is a last resort after every measured host",
      Effect.gen(function* () {
        yield* addHost("a-unmeasured")
        yield* addHost("z-measured", 2048)
        expect((yield* placed("s1", small)).hostId).toBe("z-measured")
        expect((yield* placed("s2", small)).hostId).toBe("z-measured")
        expect((yield* placed("s3", small)).hostId).toBe("a-unmeasured")
      }),
    ),
    kase(
      "an unmeasured host in the affinity list still ranks after measured hosts",
      Effect.gen(function* () {
        yield* addHost("u")
        yield* addHost("m", 8192)
        expect((yield* placed("s1", small, ["u"])).hostId).toBe("m")
      }),
    ),
    kase(
      "an unmeasured host takes any budget: its RAM does not gate",
      Effect.gen(function* () {
        yield* addHost("u", undefined)
        expect((yield* placed("s1", { memMib: 500_000, vcpus: 100 })).hostId).toBe("u")
      }),
    ),
    kase(
      "requireMeasured keeps sessions off unmeasured hosts",
      Effect.gen(function* () {
        yield* addHost("u")
        const q = yield* queued("s1", small)
        expect(q.noFit).toStrictEqual([{ hostId: "u", reason: "unmeasured", freeMib: null, freeVcpus: null }])
      }),
      { requireMeasured: true },
    ),
    kase(
      "a host without reported cores has no CPU gate",
      Effect.gen(function* () {
        yield* addHost("h1", 8192, null)
        expect((yield* placed("s1", { memMib: 1024, vcpus: 512 })).hostId).toBe("h1")
        expect((yield* placed("s2", { memMib: 1024, vcpus: 512 })).hostId).toBe("h1")
      }),
    ),
    kase(
      "a host with reported cores gates vCPUs at its CPU budget",
      Effect.gen(function* () {
        yield* addHost("h1", 65536, 2)
        yield* placed("s1", { memMib: 1024, vcpus: 6 })
        yield* placed("s2", { memMib: 1024, vcpus: 2 })
        const q = yield* queued("s3", { memMib: 1024, vcpus: 1 })
        expect(q.noFit).toStrictEqual([{ hostId: "h1", reason: "cpu_full", freeMib: 65536 - 2048, freeVcpus: 0 }])
      }),
    ),
    kase(
      "a session that exactly fills a host's capacity fits; one more MiB does not",
      Effect.gen(function* () {
        yield* addHost("h1", 3072)
        yield* placed("s1", { memMib: 3072, vcpus: 1 })
        const q = yield* queued("s2", { memMib: 1, vcpus: 1 })
        expect(q.noFit[0]).toMatchObject({ reason: "ram_full", freeMib: 0 })
      }),
    ),
    kase(
      "a cordoned host takes no new placements",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.setHostState("h1", "cordoned")
        const q = yield* queued("s1", small)
        expect(q.noFit[0]?.reason).toBe("cordoned")
      }),
    ),
    kase(
      "a draining host takes no new placements",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 65536)
        yield* s.setHostState("h2", "draining")
        expect((yield* placed("s1", small)).hostId).toBe("h1")
        expect((yield* placed("s2", { memMib: 7168, vcpus: 1 })).hostId).toBe("h1")
        const q = yield* queued("s3", small)
        expect(q.noFit.map((d) => [d.hostId, d.reason])).toStrictEqual([
          ["h1", "ram_full"],
          ["h2", "draining"],
        ])
      }),
    ),
    kase(
      "a host made ready again takes placements again",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* s.setHostState("h1", "cordoned")
        yield* queued("s1", small)
        yield* s.setHostState("h1", "ready")
        expect((yield* placed("s2", small)).hostId).toBe("h1")
      }),
    ),
    kase(
      "a host at maxEntriesPerNode takes no new placement",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        yield* placed("s1", small)
        yield* s.reserve({ id: "x1", hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 10, vcpus: 0 })
        const q = yield* queued("s2", small)
        expect(q.noFit[0]?.reason).toBe("entries_full")
      }),
      { maxEntriesPerNode: 2 },
    ),
    kase(
      "the 9th create is queued when two hosts are fully reserved",
      Effect.gen(function* () {
        yield* addHost("h1", 8192, 8)
        yield* addHost("h2", 8192, 8)
        for (let i = 1; i <= 8; i++) yield* placed(`s${i}`, { memMib: 2048, vcpus: 2 })
        const q = yield* queued("s9", { memMib: 2048, vcpus: 2 })
        expect(q.position).toBe(1)
        expect(q.session).toMatchObject({ state: "queued", hostId: null, reservationId: null, queuedAt: 0 })
        expect(q.noFit).toStrictEqual([
          { hostId: "h1", reason: "ram_full", freeMib: 0, freeVcpus: 24 },
          { hostId: "h2", reason: "ram_full", freeMib: 0, freeVcpus: 24 },
        ])
        yield* expectInvariants
      }),
    ),
    kase(
      "no-fit details name one reason per host, sorted by host id, with its free RAM and vCPUs",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("f-unmeasured")
        yield* addHost("a-ram", 1024, 8)
        yield* addHost("b-cpu", 65536, 1)
        yield* addHost("c-cordoned", 65536, 8)
        yield* addHost("d-draining", 65536, 8)
        yield* addHost("e-entries", 65536, 8)
        yield* s.setHostState("c-cordoned", "cordoned")
        yield* s.setHostState("d-draining", "draining")
        yield* s.reserve({ id: "x1", hostId: "e-entries", ownerKind: "external", ownerId: "ops", memMib: 1, vcpus: 0 })
        const q = yield* queued("s1", { memMib: 2048, vcpus: 8 })
        expect(q.noFit).toStrictEqual([
          { hostId: "a-ram", reason: "ram_full", freeMib: 1024, freeVcpus: 32 },
          { hostId: "b-cpu", reason: "cpu_full", freeMib: 65536, freeVcpus: 4 },
          { hostId: "c-cordoned", reason: "cordoned", freeMib: 65536, freeVcpus: 32 },
          { hostId: "d-draining", reason: "draining", freeMib: 65536, freeVcpus: 32 },
          { hostId: "e-entries", reason: "entries_full", freeMib: 65535, freeVcpus: 32 },
          { hostId: "f-unmeasured", reason: "unmeasured", freeMib: null, freeVcpus: null },
        ])
      }),
      { requireMeasured: true, maxEntriesPerNode: 1 },
    ),
    kase(
      "a create with no hosts at all is queued with empty no-fit details",
      Effect.gen(function* () {
        const q = yield* queued("s1", small)
        expect(q.position).toBe(1)
        expect(q.noFit).toStrictEqual([])
      }),
    ),
    kase(
      "a host whose agent went silent (no report for longer than the stale window) takes no create, no drain and no move: a create lands on a host that reported, or queues with the reason silent; its next report ends the silence and the queue drains onto it",
      Effect.gen(function* () {
        const s = yield* store
        const window = s.limits().heartbeatStaleWindowMs
        const reportOf = (id: string) => ({ ...reportFor(8192, 8, s.limits()), peerUrl: peerUrlOf(id) })
        yield* addHost("a", 8192)
        // a holds something: it ranks first (best fit) among the hosts that fit.
        yield* placed("a0", small)
        yield* TestClock.setTime(window + 1)
        yield* addHost("b", 8192)
        // a last reported a window and 1 ms ago: silent. b reported now.
        expect((yield* placed("s1", small)).hostId).toBe("b")
        // An explicit move target that is silent is refused with the reason.
        yield* s.markRunning("s1")
        const refused = yield* expectFailure(s.beginMove({ sessionId: "s1", targetHostId: "a", maxDowntimeMs: 600 }), "Refused")
        expect(refused.reason).toBe("host a cannot take the session: silent")
        // With b cordoned nothing takes a create: it queues, a's reason silent.
        yield* s.setHostState("b", "cordoned")
        const q = yield* queued("q", small)
        expect(q.noFit.map((d) => [d.hostId, d.reason])).toStrictEqual([
          ["a", "silent"],
          ["b", "cordoned"],
        ])
        expect((yield* s.drainQueue()).placed).toStrictEqual([])
        // a reports again: the report says it ended a silence, and the queue drains onto a.
        expect((yield* s.reportHost("a", reportOf("a"))).wasSilent).toBe(true)
        expect((yield* s.reportHost("a", reportOf("a"))).wasSilent).toBe(false)
        expect((yield* s.drainQueue()).placed).toStrictEqual([{ sessionId: "q", hostId: "a" }])
        yield* expectInvariants
      }),
    ),
    kase(
      "silence is judged by the store's own stale window on every path: with a window of 5 minutes, a host that reported 130 s ago (past the default 2 minutes) still takes placements",
      Effect.gen(function* () {
        yield* addHost("a", 8192)
        // a holds something: it ranks first (best fit) among the hosts that fit.
        yield* placed("a0", small)
        yield* TestClock.setTime(130_000)
        yield* addHost("b", 8192)
        expect((yield* placed("s1", small)).hostId).toBe("a")
        yield* expectInvariants
      }),
      { heartbeatStaleWindowMs: 300_000 },
    ),
    kase(
      "the walkthrough: an agent killed, its host's stale reservations reclaimed, the same pass's drain places nothing on that host; its agent's return does",
      Effect.gen(function* () {
        const s = yield* store
        const window = s.limits().heartbeatStaleWindowMs
        const reportOf = (id: string) => ({ ...reportFor(4096, 8, s.limits()), peerUrl: peerUrlOf(id) })
        yield* addHost("dead", 4096)
        yield* addHost("live", 4096)
        for (const i of [1, 2, 3, 4]) expect((yield* placed(`d${i}`, small)).hostId).toBe("dead")
        const live: string[] = []
        for (const i of [1, 2, 3, 4]) {
          const x = yield* placed(`l${i}`, small)
          expect(x.hostId).toBe("live")
          live.push(x.reservationId as string)
        }
        yield* queued("q1", small)
        yield* queued("q2", small)
        // dead's agent is killed: from now on only live reports and heartbeats.
        yield* TestClock.setTime(window + 1)
        for (const id of live) yield* s.heartbeat(id)
        yield* s.reportHost("live", reportOf("live"))
        const reclaimed = yield* s.reclaim()
        expect([...reclaimed.lostSessions].sort()).toStrictEqual(["d1", "d2", "d3", "d4"])
        // dead looks empty and ready, but its agent is silent: the drain places nothing there.
        expect((yield* s.drainQueue()).placed).toStrictEqual([])
        expect((yield* queueNow(s)).map((x) => x.id)).toStrictEqual(["q1", "q2"])
        expect((yield* s.queueStanding("q1"))?.noFit.map((d) => [d.hostId, d.reason])).toStrictEqual([
          ["dead", "silent"],
          ["live", "ram_full"],
        ])
        // Its agent comes back: the queue drains onto it.
        expect((yield* s.reportHost("dead", reportOf("dead"))).wasSilent).toBe(true)
        expect((yield* s.drainQueue()).placed).toStrictEqual([
          { sessionId: "q1", hostId: "dead" },
          { sessionId: "q2", hostId: "dead" },
        ])
        yield* expectInvariants
      }),
    ),
  ],
}
