/**
 * Hosts: registration, reports, states, listing, and headroom per SPEC §1 (the system
 * reserve subtracted before the overcommit ratio, the CPU budget, and the ungated dimensions).
 */
import { Headroom } from "@engram/core"
import { expect } from "@effect/vitest"
import { reportReorderMs, reportReorderSlackMs, Validate } from "@engram/store"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, expectInvariants, expectUnchanged, hostsNow, hostSummaryOf, kase, placed, queued, registered, reportFor, sessionIn, snapshot, store } from "../Harness.js"
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
      "hostTokenHashes reads the credential hash of many hosts at once: the one each holds now (rotated), none for a removed, unknown or credential-less host",
      Effect.gen(function* () {
        const s = yield* store
        // Optional in the interface (the coordinator falls back to hostByTokenHash): a store without
        // it switches this case off (`skip`, with its reason) rather than passing it unread.
        const read = s.hostTokenHashes
        if (read === undefined) return expect.fail("the store has no hostTokenHashes (optional): skip this case, stating why")
        yield* s.registerHost({ id: "h1", tokenHash: "hash-one" })
        yield* s.registerHost({ id: "h2", tokenHash: "hash-two" })
        yield* s.registerHost({ id: "h3" })
        yield* s.registerHost({ id: "h4", tokenHash: "hash-four" })
        yield* s.setHostTokenHash("h2", "hash-two-rotated")
        yield* s.removeHost("h4")
        const got = yield* read(["h1", "h2", "h3", "h4", "nope", "h1"])
        expect(new Map([...got].sort(([a], [b]) => (a < b ? -1 : 1)))).toStrictEqual(new Map([["h1", "hash-one"], ["h2", "hash-two-rotated"]]))
        // What hostByTokenHash finds for each answered hash.
        for (const [id, hash] of got) expect((yield* s.hostByTokenHash(hash))?.id).toBe(id)
        expect(yield* s.hostByTokenHash("hash-two")).toBeNull()
        expect((yield* read([])).size).toBe(0)
        expect((yield* read(["nope"])).size).toBe(0)
        // More hosts than one of the coordinator's reads asks (500): each group answers its own.
        const many = Array.from({ length: 520 }, (_, i) => `g${String(i).padStart(3, "0")}`)
        for (const id of many) yield* s.registerHost({ id, tokenHash: `hash-${id}` })
        yield* s.setHostTokenHash("g510", "hash-g510-rotated")
        const first = yield* read(many.slice(0, 500))
        const second = yield* read([...many.slice(500), "h1", "nope"])
        expect(first.size).toBe(500)
        expect(second.size).toBe(21)
        for (const id of many) expect((first.get(id) ?? second.get(id)) ?? null).toBe(id === "g510" ? "hash-g510-rotated" : `hash-${id}`)
        expect(second.get("h1")).toBe("hash-one")
      }),
    ),
    kase(
      "a report older than the one a host holds (it waited in a replica that stalled) is not written and changes nothing; a newer one is",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        yield* TestClock.setTime(10_000)
        const newer = { totalMib: 16384, allocatableMib: 15360, totalVcpus: 8, peerUrl: "http://10.0.0.1:7100" }
        yield* s.reportHost("h1", newer)
        const held = yield* s.getHost("h1")
        // The agent's earlier report, stamped more than `reportReorderSlackMs` before the newer one
        // (it waited in a stalled replica), lands after it.
        yield* TestClock.setTime(10_000 - reportReorderSlackMs - 1)
        const older = yield* s.reportHost("h1", { totalMib: 8192, allocatableMib: 7168, totalVcpus: 4, peerUrl: "http://10.0.0.9:7100" })
        expect(older).toMatchObject({ peerUrlChanged: false, figuresChanged: false, wasSilent: false, reportedAt: 10_000, peerUrl: newer.peerUrl })
        expect(yield* s.getHost("h1")).toStrictEqual(held)
        // One within the slack (two replicas at nearly the same time) is written, judged against it.
        yield* TestClock.setTime(10_000 - reportReorderSlackMs)
        expect(yield* s.reportHost("h1", newer)).toMatchObject({ figuresChanged: false, peerUrlChanged: false, reportedAt: 10_000 - reportReorderSlackMs })
        // A report of the same time or later is written as ever.
        yield* TestClock.setTime(11_000)
        const later = yield* s.reportHost("h1", { ...newer, allocatableMib: 14336 })
        expect(later).toMatchObject({ figuresChanged: true, peerUrlChanged: false, reportedAt: 11_000 })
        expect((yield* s.getHost("h1")).report?.allocatableMib).toBe(14336)
        // Older by more than any report waits (`reportReorderMs`): a clock stepped back, written.
        yield* TestClock.setTime(11_000 + reportReorderMs)
        yield* s.reportHost("h1", newer)
        yield* TestClock.setTime(10_000)
        const stepped = yield* s.reportHost("h1", { ...newer, allocatableMib: 13312 })
        expect(stepped).toMatchObject({ figuresChanged: true, reportedAt: 10_000 })
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
      "a report whose allocatableMib exceeds its totalMib is refused naming allocatableMib, and changes nothing: the host keeps its last report",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        yield* s.registerHost({ id: "h2" })
        yield* s.reportHost("h2", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 })
        const before = yield* snapshot
        for (const id of ["h1", "h2"]) {
          const err = yield* expectFailure(s.reportHost(id, { totalMib: 1024, allocatableMib: 500_000, totalVcpus: 4 }), "InvalidInput")
          expect([err.field, err.rule]).toStrictEqual(["allocatableMib", "must be <= totalMib (1024)"])
        }
        yield* expectUnchanged(before, "a report with allocatableMib > totalMib")
        // So a budget no host can hold stays queued rather than placed on the inflated figure.
        yield* queued("big", { memMib: 400_000, vcpus: 1 })
        // The boundary and the unmeasured halves are reports like any other.
        expect((yield* s.reportHost("h1", { totalMib: 2048, allocatableMib: 2048, totalVcpus: 2 })).measured).toBe(true)
        yield* s.reportHost("h1", { totalMib: null, allocatableMib: 3000, totalVcpus: 2 })
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
        for (const id of ["", "a b", "h/1", "h:1", ".", "..", "x".repeat(101)]) {
          const err = yield* expectFailure(s.registerHost({ id }), "InvalidInput")
          expect(err.field).toBe("id")
        }
        yield* s.registerHost({ id: `A-z.0_${"x".repeat(94)}` })
        expect((yield* hostsNow(s)).length).toBe(1)
      }),
    ),
    kase(
      "registration is not readiness: a host that has not reported takes no create, and names unmeasured in the no-fit details",
      Effect.gen(function* () {
        const s = yield* store
        yield* registered("fresh")
        const q = yield* queued("s1", { memMib: 512, vcpus: 1 })
        expect(q.noFit).toStrictEqual([{ hostId: "fresh", reason: "unmeasured", freeMib: null, freeVcpus: null }])
        expect((yield* s.getHost("fresh")).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
        // Its first report opens it: even one without RAM figures (unmeasured, not gated).
        yield* s.reportHost("fresh", { totalMib: null, allocatableMib: null, totalVcpus: null })
        expect(yield* s.drainQueue()).toStrictEqual({ placed: [{ sessionId: "s1", hostId: "fresh" }], unapplied: [], remaining: 0 })
      }),
    ),
    kase(
      "a host registered while sessions are queued takes none of them before its first report; then it takes what fits",
      Effect.gen(function* () {
        const s = yield* store
        for (let i = 0; i < 40; i++) yield* queued(`q${String(i).padStart(2, "0")}`, { memMib: 256, vcpus: 1 })
        yield* registered("late")
        expect(yield* s.drainQueue()).toStrictEqual({ placed: [], unapplied: [], remaining: 40 })
        expect((yield* s.getHost("late")).entries).toBe(0)
        // Capacity for 8 of them (2048 MiB), CPU budget for 32.
        yield* s.reportHost("late", reportFor(2048, 8, s.limits()))
        const drained = yield* s.drainQueue()
        expect(drained.placed.length).toBe(8)
        expect(drained.remaining).toBe(32)
        yield* expectInvariants
      }),
    ),
    kase(
      "a host that has not reported is no move target and no resume's host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("src", 8192)
        yield* sessionIn("m1", "running")
        yield* sessionIn("d1", "descended")
        yield* s.setHostState("src", "cordoned")
        yield* registered("fresh")
        const before = yield* snapshot
        expect((yield* expectFailure(s.beginMove({ sessionId: "m1", targetHostId: "fresh", maxDowntimeMs: 600 }), "Refused")).check).toBe("no_fit")
        expect((yield* expectFailure(s.beginMove({ sessionId: "m1", maxDowntimeMs: 600 }), "Refused")).check).toBe("no_fit")
        yield* expectUnchanged(before, "a move to a host that never reported")
        expect((yield* s.resume("d1"))._tag).toBe("Queued")
      }),
    ),
    kase(
      "an explicit allocatableMib of 0 is a measured, full host: it takes nothing, and is never read as ungated",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "zero" })
        const view = yield* s.reportHost("zero", { totalMib: 0, allocatableMib: 0, totalVcpus: 64 })
        expect(view.measured).toBe(true)
        expect(view.headroom.allocatableMib).not.toBeNull()
        const q = yield* queued("s1", { memMib: 1, vcpus: 1 })
        // The no-fit details show its room as 0 (core's `Headroom.shownFreeMib`), not the smallest positive capacity that keeps it gated.
        expect(q.noFit).toStrictEqual([{ hostId: "zero", reason: "ram_full", freeMib: 0, freeVcpus: 256 }])
        expect((yield* hostSummaryOf(s, "zero")).totalMib).toBe(0)
      }),
      { systemReserveMib: 0 },
    ),
    kase(
      "a host is removed only once it holds nothing: a reservation or a session on it is Refused host_in_use",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 8192)
        yield* sessionIn("s1", "running")
        yield* s.reserve({ id: "x1", hostId: "h2", ownerKind: "external", ownerId: "ops", memMib: 64, vcpus: 0 })
        const before = yield* snapshot
        for (const id of ["h1", "h2"]) {
          const err = yield* expectFailure(s.removeHost(id), "Refused")
          expect(err.check).toBe("host_in_use")
          expect(err.reason).toContain(`host ${id} holds 1 reservations`)
        }
        yield* expectUnchanged(before, "a refused host removal")
        yield* s.endSession("s1")
        yield* s.release("x1")
        expect((yield* s.removeHost("h1")).id).toBe("h1")
        yield* expectFailure(s.getHost("h1"), "NotFound")
        expect((yield* hostsNow(s)).map((h) => h.id)).toStrictEqual(["h2"])
        yield* expectFailure(s.removeHost("h1"), "NotFound")
        // Its id is free again, and the session's history still reads.
        yield* s.registerHost({ id: "h1" })
        expect((yield* s.sessionEvents("s1")).items.length).toBeGreaterThan(0)
        yield* expectInvariants
      }),
    ),
    kase(
      "a removed host takes no placement, and its descended sessions resume elsewhere",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("old", 8192)
        yield* sessionIn("d1", "descended")
        yield* s.removeHost("old")
        expect((yield* queued("s2", { memMib: 512, vcpus: 1 })).noFit).toStrictEqual([])
        yield* addHost("new", 8192)
        expect(yield* s.resume("d1")).toMatchObject({ _tag: "Placed", session: { hostId: "new", state: "pending" } })
      }),
    ),
    kase(
      "setHostTokenHash replaces a host's credential hash: the old one finds nobody from then on",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1", tokenHash: "old-hash" })
        expect((yield* s.setHostTokenHash("h1", "new-hash")).id).toBe("h1")
        expect(yield* s.hostByTokenHash("old-hash")).toBeNull()
        expect((yield* s.hostByTokenHash("new-hash"))?.id).toBe("h1")
        yield* expectFailure(s.setHostTokenHash("nope", "x"), "NotFound")
      }),
    ),
    kase(
      "a credential hash another host holds is refused, by registerHost and by setHostTokenHash alike (Conflict naming tokenHash), and nothing changes",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1", tokenHash: "hash-one" })
        yield* s.registerHost({ id: "h2", tokenHash: "hash-two" })
        const before = yield* snapshot
        const registered = yield* expectFailure(s.registerHost({ id: "h3", tokenHash: "hash-one" }), "Conflict")
        expect([registered.entity, registered.id]).toStrictEqual(["host", "h3"])
        expect(registered.reason).toContain("tokenHash")
        const rotated = yield* expectFailure(s.setHostTokenHash("h2", "hash-one"), "Conflict")
        expect([rotated.entity, rotated.id]).toStrictEqual(["host", "h2"])
        expect(rotated.reason).toContain("tokenHash")
        yield* expectUnchanged(before, "a hash issued twice")
        expect((yield* s.hostByTokenHash("hash-one"))?.id).toBe("h1")
        expect((yield* s.hostByTokenHash("hash-two"))?.id).toBe("h2")
        // A host's own hash again is no change; a hash given up by a rotation or a removal is free.
        expect((yield* s.setHostTokenHash("h1", "hash-one")).id).toBe("h1")
        yield* s.setHostTokenHash("h2", "hash-two-rotated")
        expect((yield* s.registerHost({ id: "h3", tokenHash: "hash-two" })).id).toBe("h3")
        yield* s.removeHost("h1")
        expect((yield* s.setHostTokenHash("h3", "hash-one")).id).toBe("h3")
        expect((yield* s.hostByTokenHash("hash-one"))?.id).toBe("h3")
        expect(yield* s.hostByTokenHash("hash-two")).toBeNull()
        // Hosts without a credential are many: no hash is no conflict.
        yield* s.registerHost({ id: "h4" })
        yield* s.registerHost({ id: "h5" })
      }),
    ),
    kase(
      "labels with a NUL or a lone surrogate are refused naming labels, and nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        for (const labels of [{ zone: "a\u0000" }, { "\ud800": "a" }, { zone: "x\udc00" }]) {
          expect((yield* expectFailure(s.registerHost({ id: "h1", labels }), "InvalidInput")).field).toBe("labels")
        }
        expect(yield* hostsNow(s)).toStrictEqual([])
        yield* s.registerHost({ id: "h1", labels: { zone: "ünïcode 😀" } })
        expect((yield* s.getHost("h1")).labels).toStrictEqual({ zone: "ünïcode 😀" })
      }),
    ),
    kase(
      "labels past their rules (more than 64, an empty or 101-character key, a value over 1,000 characters, a control character) are refused naming the label, and nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        const many = Object.fromEntries(Array.from({ length: Validate.maxLabels + 1 }, (_, i) => [`k${i}`, "v"]))
        const cases: [Record<string, string>, string][] = [
          [many, "labels"],
          [{ "": "a" }, "labels."],
          [{ ["k".repeat(101)]: "a" }, `labels.${"k".repeat(101)}`],
          [{ zone: "v".repeat(1001) }, "labels.zone"],
          [{ zone: "a\nforged log line" }, "labels.zone"],
          [{ "zo\u001bne": "a" }, "labels.zo\u001bne"],
        ]
        for (const [labels, field] of cases) expect((yield* expectFailure(s.registerHost({ id: "h1", labels }), "InvalidInput")).field).toBe(field)
        expect(yield* hostsNow(s)).toStrictEqual([])
        const most = Object.fromEntries(Array.from({ length: Validate.maxLabels }, (_, i) => [`k${i}`.padEnd(100, "x"), "v".repeat(1000)]))
        yield* s.registerHost({ id: "h1", labels: most })
        expect((yield* s.getHost("h1")).labels).toStrictEqual(most)
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
        expect(view.report).toStrictEqual({ totalMib: 16384, allocatableMib: 9216, totalVcpus: 4, templates: [] })
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
      "a report's peerUrl is stored, returned on every read, replaced by the next report and cleared by one without it",
      Effect.gen(function* () {
        const s = yield* store
        expect((yield* s.registerHost({ id: "h1" })).peerUrl).toBeNull()
        yield* s.registerHost({ id: "h2" })
        expect((yield* s.getHost("h1")).peerUrl).toBeNull()
        const figures = { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 }
        expect((yield* s.reportHost("h1", { ...figures, peerUrl: "http://10.0.0.1:7100" })).peerUrl).toBe("http://10.0.0.1:7100")
        expect((yield* s.getHost("h1")).peerUrl).toBe("http://10.0.0.1:7100")
        expect((yield* s.getHost("h2")).peerUrl).toBeNull()
        expect((yield* s.pageHosts()).items.map((h) => [h.id, h.peerUrl])).toStrictEqual([["h1", "http://10.0.0.1:7100"], ["h2", null]])
        // The stored report is the figures and templates: the URL is the host's own field.
        expect((yield* s.getHost("h1")).report).toStrictEqual({ ...figures, templates: [] })
        // A restarted agent advertises its new URL (kept as sent: a path prefix, IPv6, https).
        for (const url of ["https://[fd00::1]:8443/engram/", "http://agent-1.internal:7100"]) {
          yield* s.reportHost("h1", { ...figures, peerUrl: url })
          expect((yield* s.getHost("h1")).peerUrl).toBe(url)
        }
        // One that advertises none (null, or an older agent that does not send it) clears it.
        yield* s.reportHost("h1", { ...figures, peerUrl: null })
        expect((yield* s.getHost("h1")).peerUrl).toBeNull()
        yield* s.reportHost("h1", { ...figures, peerUrl: "http://10.0.0.2:7100" })
        yield* s.reportHost("h1", figures)
        expect((yield* s.getHost("h1")).peerUrl).toBeNull()
      }),
    ),
    kase(
      "reportHost answers what the report changed against the stored host: a first report changes both, the same report again nothing, a new peer URL both, new figures or templates the figures",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        yield* s.registerHost({ id: "h2" })
        const changes = (r: { peerUrlChanged: boolean; figuresChanged: boolean }) => [r.peerUrlChanged, r.figuresChanged]
        const figures = { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 }
        const u = "http://10.0.0.1:7100"
        // A first report changes both, even one without a peer URL or a figure (the host had no report).
        expect(changes(yield* s.reportHost("h2", { totalMib: null, allocatableMib: null, totalVcpus: null }))).toStrictEqual([true, true])
        expect(changes(yield* s.reportHost("h2", { totalMib: null, allocatableMib: null, totalVcpus: null, templates: [], peerUrl: null }))).toStrictEqual([false, false])
        const first = yield* s.reportHost("h1", { ...figures, peerUrl: u })
        expect(changes(first)).toStrictEqual([true, true])
        expect(first.peerUrl).toBe(u)
        expect(changes(yield* s.reportHost("h1", { ...figures, peerUrl: u }))).toStrictEqual([false, false])
        // New figures, the same URL: the figures only.
        expect(changes(yield* s.reportHost("h1", { ...figures, allocatableMib: 3072, peerUrl: u }))).toStrictEqual([false, true])
        expect(changes(yield* s.reportHost("h1", { ...figures, allocatableMib: 3072, peerUrl: u }))).toStrictEqual([false, false])
        expect(changes(yield* s.reportHost("h1", { ...figures, totalMib: null, allocatableMib: 3072, peerUrl: u }))).toStrictEqual([false, true])
        expect(changes(yield* s.reportHost("h1", { ...figures, totalMib: null, allocatableMib: 3072, totalVcpus: 8, peerUrl: u }))).toStrictEqual([false, true])
        const held = { ...figures, peerUrl: u }
        expect(changes(yield* s.reportHost("h1", held))).toStrictEqual([false, true])
        // Templates are figures: one added, one resized, their order, and none again.
        const small = { name: "small", memMib: 512, vcpus: 1 }
        const big = { name: "big", memMib: 2048, vcpus: 2 }
        for (const templates of [[small], [small, big], [big, small], [{ ...big, memMib: 4096 }, small], []]) {
          expect(changes(yield* s.reportHost("h1", { ...held, templates })), JSON.stringify(templates)).toStrictEqual([false, true])
          expect(changes(yield* s.reportHost("h1", { ...held, templates })), JSON.stringify(templates)).toStrictEqual([false, false])
        }
        // A URL, none, the URL again, another and back (u → v → u): each a change of both.
        const v = "http://10.0.0.9:7100"
        for (const peerUrl of [null, u, v, u, v]) {
          const r = yield* s.reportHost("h1", { ...figures, peerUrl })
          expect([r.peerUrl, ...changes(r)], String(peerUrl)).toStrictEqual([peerUrl, true, true])
        }
        // An older agent that sends no URL clears it: a change; the same again is none.
        expect(changes(yield* s.reportHost("h1", figures))).toStrictEqual([true, true])
        expect(changes(yield* s.reportHost("h1", { ...figures, peerUrl: null }))).toStrictEqual([false, false])
        // A refused report writes nothing, so the next report is judged against the one before it.
        yield* s.reportHost("h1", { ...figures, peerUrl: u })
        yield* expectFailure(s.reportHost("h1", { ...figures, peerUrl: "http://0.0.0.0:7100" }), "InvalidInput")
        expect(changes(yield* s.reportHost("h1", { ...figures, peerUrl: u }))).toStrictEqual([false, false])
        // Another host's report is its own: h2 is unchanged by h1's.
        expect(changes(yield* s.reportHost("h2", { totalMib: null, allocatableMib: null, totalVcpus: null }))).toStrictEqual([false, false])
      }),
    ),
    kase(
      "a report with a bad peerUrl is refused naming peerUrl and its rule, and changes nothing: the host keeps its last URL",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1" })
        const figures = { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 }
        yield* s.reportHost("h1", { ...figures, peerUrl: "http://10.0.0.1:7100" })
        const before = yield* snapshot
        const bad: unknown[] = [
          "",
          "10.0.0.1:7100",
          "ftp://10.0.0.1/",
          "http://user:pw@10.0.0.1:7100",
          "http://10.0.0.1:7100/?token=x",
          "http://10.0.0.1:7100/#x",
          " http://10.0.0.1:7100",
          "http://10.0.0.1:7100/a b",
          "http://10.0.0.1:7100/\u0000",
          `http://h/${"x".repeat(Validate.maxPeerUrlLength)}`,
          // A wildcard host: no peer can reach a listener's wildcard.
          "http://0.0.0.0:7100",
          "http://[::]:7100",
          "http://0:7100",
          42,
        ]
        for (const peerUrl of bad) {
          const err = yield* expectFailure(s.reportHost("h1", { ...figures, totalMib: 8192, peerUrl: peerUrl as string }), "InvalidInput")
          expect([err.field, err.rule], JSON.stringify(peerUrl)).toStrictEqual(["peerUrl", Validate.peerUrlRule])
        }
        yield* expectUnchanged(before, "a report with a bad peerUrl")
        expect((yield* s.getHost("h1")).peerUrl).toBe("http://10.0.0.1:7100")
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
      "the hosts page through every host sorted by id",
      Effect.gen(function* () {
        const s = yield* store
        for (const id of ["c", "a", "b10", "b2"]) yield* s.registerHost({ id })
        expect((yield* hostsNow(s)).map((h) => h.id)).toStrictEqual(["a", "b10", "b2", "c"])
      }),
    ),
    kase(
      "a host registered with a credential hash is found by it; one registered without is found by none",
      Effect.gen(function* () {
        const s = yield* store
        yield* s.registerHost({ id: "h1", tokenHash: "sha256:abc" })
        yield* s.registerHost({ id: "h2" })
        expect((yield* s.hostByTokenHash("sha256:abc"))?.id).toBe("h1")
        expect(yield* s.hostByTokenHash("sha256:abd")).toBeNull()
        expect(yield* s.hostByTokenHash("")).toBeNull()
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
