/**
 * Hosts: registration, reports, states, listing, and headroom per SPEC §1 (the system
 * reserve subtracted before the overcommit ratio, the CPU budget, and the ungated dimensions).
 */
import { Headroom } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { addHost, expectFailure, expectUnchanged, kase, placed, queued, sessionIn, snapshot, store } from "../Harness.js"
import type { Group } from "../Harness.js"

export const hosts: Group = {
  name: "hosts",
  cases: [
    kase(
      "hostByTokenHash finds the host that holds a credential hash, and nothing for another",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1", tokenHash: "hash-one" })
        yield* s.registerHost({ id: "h2", tokenHash: "hash-two" })
        yield* s.registerHost({ id: "h3" })
        expect((yield* s.hostByTokenHash("hash-two"))?.id).toBe("h2")
        expect((yield* s.hostByTokenHash("hash-one"))?.id).toBe("h1")
        expect(yield* s.hostByTokenHash("hash-three")).toBeNull()
        expect(yield* s.hostByTokenHash("")).toBeNull()
      }),
    ),
    kase(
      "a registered host is ready and unmeasured with nothing reserved",
      Effect.gen(function* () {
        const s = yield* store
        const h = yield* s.registerHost({ id: "h1", labels: { zone: "a" } })
        expect(h).toMatchObject({ id: "h1", state: "ready", report: null, reportedAt: null, createdAt: 0, labels: { zone: "a" } })
        const view = yield* s.getHost("h1")
        expect(view.measured).toBe(false)
        expect(view.headroom).toStrictEqual({ allocatableMib: null, cpuBudget: null, reserved: { memMib: 0, vcpus: 0 } })
        expect([view.entries, view.parks, view.descentsRunning]).toStrictEqual([0, 0, 0])
      }),
    ),
    kase(
      "registering an existing host id is a Conflict on the host",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const before = yield* snapshot
        const err = yield* expectFailure(s.registerHost({ id: "h1" }), "Conflict")
        expect(err.entity).toBe("host")
        yield* expectUnchanged(before, "a duplicate registerHost")
      }),
    ),
    kase(
      "a host id breaking the id rule is refused naming the field id",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["", "a b", "h/1", "x".repeat(129)]) {
          const err = yield* expectFailure(s.registerHost({ id }), "InvalidInput")
          expect(err.field).toBe("id")
        }
        yield* s.registerHost({ id: `A-z.0:_${"x".repeat(121)}` })
        expect((yield* s.listHosts()).length).toBe(1)
      }),
    ),
    kase(
      "headroom subtracts the system reserve of 1024 MiB from the reported RAM",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const view = yield* s.reportHost("h1", { totalMib: 16384, allocatableMib: 9216, totalVcpus: 4 })
        expect(view.measured).toBe(true)
        expect(view.headroom.allocatableMib).toBe(8192)
        expect(view.reportedAt).toBe(0)
        expect(view.report).toStrictEqual({ totalMib: 16384, allocatableMib: 9216, totalVcpus: 4 })
      }),
    ),
    kase(
      "the RAM overcommit ratio applies after the system reserve",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const view = yield* s.reportHost("h1", { totalMib: null, allocatableMib: 9216, totalVcpus: null })
        // (9216 − 1024) × 1.5, not 9216 × 1.5 − 1024
        expect(view.headroom.allocatableMib).toBe(12288)
      }),
      { memOvercommitRatio: 1.5 },
    ),
    kase(
      "a custom system reserve is subtracted instead of 1024",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const view = yield* s.reportHost("h1", { totalMib: null, allocatableMib: 9216, totalVcpus: null })
        expect(view.headroom.allocatableMib).toBe(9216 - 2048)
      }),
      { systemReserveMib: 2048 },
    ),
    kase(
      "the CPU budget is floor(totalVcpus × cpuOvercommit)",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        expect((yield* s.reportHost("h1", { totalMib: null, allocatableMib: null, totalVcpus: 3 })).headroom.cpuBudget).toBe(12)
      }),
    ),
    kase(
      "a fractional cpuOvercommit rounds the CPU budget down",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        expect((yield* s.reportHost("h1", { totalMib: null, allocatableMib: null, totalVcpus: 3 })).headroom.cpuBudget).toBe(4)
      }),
      { cpuOvercommit: 1.5 },
    ),
    kase(
      "a memOvercommitRatio of 0 leaves a measured host without a RAM cap",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const view = yield* s.reportHost("h1", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 64 })
        expect(view.measured).toBe(true)
        expect(view.headroom.allocatableMib).toBeNull()
        const x = yield* placed("big", { memMib: 1_000_000, vcpus: 1 })
        expect(x.hostId).toBe("h1")
      }),
      { memOvercommitRatio: 0 },
    ),
    kase(
      "a report that does not exceed the system reserve leaves the host measured and full",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const view = yield* s.reportHost("h1", { totalMib: 1000, allocatableMib: 1000, totalVcpus: 4 })
        expect(view.measured).toBe(true)
        expect(Headroom.gatesRam(view.headroom)).toBe(true)
        expect(Headroom.fits(view.headroom, { memMib: 1, vcpus: 1 })).toBe(false)
        const q = yield* queued("s1", { memMib: 1, vcpus: 1 })
        expect(q.noFit.map((d) => d.reason)).toStrictEqual(["ram_full"])
      }),
    ),
    kase(
      "a host report can be replaced by a later report",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096, 2)
        const view = yield* s.reportHost("h1", { totalMib: null, allocatableMib: 2048, totalVcpus: null })
        expect(view.headroom).toStrictEqual({ allocatableMib: 1024, cpuBudget: null, reserved: { memMib: 0, vcpus: 0 } })
      }),
    ),
    kase(
      "reportHost on an unknown host is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        const err = yield* expectFailure(s.reportHost("nope", { totalMib: null, allocatableMib: 4096, totalVcpus: 2 }), "NotFound")
        expect(err.entity).toBe("host")
      }),
    ),
    kase(
      "a report with a negative, non-finite or fractional-core figure is refused naming the figure",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const before = yield* snapshot
        const bad = [
          [{ totalMib: -1, allocatableMib: 4096, totalVcpus: 2 }, "totalMib"],
          [{ totalMib: null, allocatableMib: Number.NaN, totalVcpus: 2 }, "allocatableMib"],
          [{ totalMib: null, allocatableMib: Number.POSITIVE_INFINITY, totalVcpus: 2 }, "allocatableMib"],
          [{ totalMib: null, allocatableMib: 4096, totalVcpus: -2 }, "totalVcpus"],
          [{ totalMib: null, allocatableMib: 4096, totalVcpus: 2.5 }, "totalVcpus"],
        ] as const
        for (const [report, field] of bad) {
          const err = yield* expectFailure(s.reportHost("h1", report), "InvalidInput")
          expect(err.field).toBe(field)
        }
        yield* expectUnchanged(before, "a bad report")
      }),
    ),
    kase(
      "setHostState cordons, drains and makes a host ready again",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        expect((yield* s.setHostState("h1", "cordoned")).state).toBe("cordoned")
        expect((yield* s.getHost("h1")).state).toBe("cordoned")
        expect((yield* s.setHostState("h1", "draining")).state).toBe("draining")
        expect((yield* s.setHostState("h1", "ready")).state).toBe("ready")
      }),
    ),
    kase(
      "setHostState on an unknown host is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        yield* expectFailure(s.setHostState("nope", "cordoned"), "NotFound")
      }),
    ),
    kase(
      "getHost of an unknown id is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        const err = yield* expectFailure(s.getHost("nope"), "NotFound")
        expect([err.entity, err.id]).toStrictEqual(["host", "nope"])
      }),
    ),
    kase(
      "listHosts answers every host sorted by id",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["c", "a", "b10", "b2"]) yield* s.registerHost({ id })
        expect((yield* s.listHosts()).map((h) => h.id)).toStrictEqual(["a", "b10", "b2", "c"])
      }),
    ),
    kase(
      "hostTokenHash answers the stored hash, or null when none was given",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1", tokenHash: "sha256:abc" })
        yield* s.registerHost({ id: "h2" })
        expect(yield* s.hostTokenHash("h1")).toBe("sha256:abc")
        expect(yield* s.hostTokenHash("h2")).toBeNull()
        yield* expectFailure(s.hostTokenHash("nope"), "NotFound")
      }),
    ),
    kase(
      "the host view counts entries, parks and descents running",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 16384)
        yield* sessionIn("p1", "parked")
        yield* sessionIn("p2", "parked")
        yield* sessionIn("d1", "descending")
        yield* sessionIn("r1", "running")
        const view = yield* s.getHost("h1")
        expect([view.entries, view.parks, view.descentsRunning]).toStrictEqual([4, 2, 1])
        expect(view.headroom.reserved).toStrictEqual({ memMib: 4096, vcpus: 4 })
      }),
    ),
    kase(
      "headroom counts the reservations of every owner kind",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 16384)
        yield* addHost("h2", 16384)
        yield* sessionIn("s1", "running", { memMib: 1000, vcpus: 1 })
        yield* s.reserve({ id: "x1", hostId: "h1", ownerKind: "external", ownerId: "ops", memMib: 200, vcpus: 2 })
        yield* s.reserve({ id: "c1", hostId: "h1", ownerKind: "capture", ownerId: "job", memMib: 30, vcpus: 0 })
        // s1 sits on h1 (best fit among equals: lower id); a move to h2 reserves there.
        yield* s.beginMove({ sessionId: "s1", targetHostId: "h2", maxDowntimeMs: 600 })
        expect((yield* s.getHost("h1")).headroom.reserved).toStrictEqual({ memMib: 1230, vcpus: 3 })
        expect((yield* s.getHost("h2")).headroom.reserved).toStrictEqual({ memMib: 1000, vcpus: 1 })
        expect((yield* s.getHost("h1")).entries).toBe(3)
      }),
    ),
  ],
}
