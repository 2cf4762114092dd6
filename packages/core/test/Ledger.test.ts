import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Headroom, Ledger, Limits } from "../src/index.js"

const hostView = (allocatableMib: number | null, reservedMib = 0, entries = 0, measured = allocatableMib !== null): Ledger.HostView => ({
  measured,
  headroom: { allocatableMib, cpuBudget: 16, reserved: { memMib: reservedMib, vcpus: 0 } },
  entries,
})
const ok = { id: "r1", hostId: "h1", memMib: 1024, vcpus: 1 }
const checkOf = (a: Ledger.Admission) => (a._tag === "Refuse" ? a.check : "admit")

describe("Ledger.admit", () => {
  it("an external reservation lands only on a ready host; a capture may land on a draining one (SPEC §12)", () => {
    for (const state of ["cordoned", "draining"] as const) {
      const host = { ...hostView(4096), state }
      const refused = Ledger.admit({ ...ok, ownerKind: "external" }, { duplicate: false, host })
      expect(refused).toMatchObject({ _tag: "Refuse", check: "host_not_ready", countsAsFailure: true })
      expect(refused._tag === "Refuse" && refused.message).toContain(`is ${state}`)
      expect(Ledger.admit({ ...ok, ownerKind: "capture" }, { duplicate: false, host })).toEqual({ _tag: "Admit" })
    }
    expect(Ledger.admit({ ...ok, ownerKind: "external" }, { duplicate: false, host: { ...hostView(4096), state: "ready" } })).toEqual({ _tag: "Admit" })
    // Checked after the unknown host and before the entries cap.
    expect(checkOf(Ledger.admit({ ...ok, ownerKind: "external" }, { duplicate: false, host: undefined }))).toBe("host_unknown")
    const full = { ...hostView(1000, 1000, 32), state: "cordoned" as const }
    expect(checkOf(Ledger.admit({ ...ok, ownerKind: "external" }, { duplicate: false, host: full }))).toBe("host_not_ready")
  })

  it("a host may be removed only once it holds no reservation and no session", () => {
    expect(Ledger.refuseHostRemoval("h1", { entries: 0, sessions: 0 })).toBeNull()
    expect(Ledger.refuseHostRemoval("h1", { entries: 2, sessions: 1 })).toEqual({
      check: "host_in_use",
      message: "host h1 holds 2 reservations and 1 sessions: end or move them first",
    })
    expect(Ledger.refuseHostRemoval("h1", { entries: 0, sessions: 1 })?.check).toBe("host_in_use")
  })

  it("admits a reservation that fits", () => {
    expect(Ledger.admit(ok, { duplicate: false, host: hostView(4096) })).toEqual({ _tag: "Admit" })
  })

  it("runs the checks in SPEC order: id, host, memMib, duplicate, unknown host, unmeasured, entries, capacity", () => {
    const strict = { ...Limits.defaults, requireMeasured: true, maxEntriesPerNode: 1 }
    // Each request breaks this check and every later one: the earliest must be named.
    expect(checkOf(Ledger.admit({ ...ok, id: "", hostId: "", memMib: 0 }, { duplicate: true, host: undefined }, strict))).toBe("id_missing")
    expect(checkOf(Ledger.admit({ ...ok, hostId: null, memMib: 0 }, { duplicate: true, host: undefined }, strict))).toBe("host_missing")
    expect(checkOf(Ledger.admit({ ...ok, memMib: 0 }, { duplicate: true, host: undefined }, strict))).toBe("mem_not_positive")
    expect(checkOf(Ledger.admit({ ...ok, memMib: -5 }, { duplicate: true, host: undefined }, strict))).toBe("mem_not_positive")
    expect(checkOf(Ledger.admit(ok, { duplicate: true, host: undefined }, strict))).toBe("duplicate")
    expect(checkOf(Ledger.admit(ok, { duplicate: false, host: undefined }, strict))).toBe("host_unknown")
    expect(checkOf(Ledger.admit(ok, { duplicate: false, host: hostView(null, 0, 1) }, strict))).toBe("host_unmeasured")
    expect(checkOf(Ledger.admit(ok, { duplicate: false, host: hostView(1000, 1000, 1) }, strict))).toBe("entries_full")
    expect(checkOf(Ledger.admit(ok, { duplicate: false, host: hostView(1000, 1000, 0) }, strict))).toBe("capacity_exceeded")
  })

  it("a duplicate id is a conflict that does not count as a failure", () => {
    const a = Ledger.admit(ok, { duplicate: true, host: hostView(4096) })
    expect(a._tag === "Refuse" && !a.countsAsFailure).toBe(true)
    const b = Ledger.admit(ok, { duplicate: false, host: undefined })
    expect(b._tag === "Refuse" && b.countsAsFailure).toBe(true)
  })

  it("unmeasured hosts are admitted unless requireMeasured", () => {
    expect(Ledger.admit({ ...ok, memMib: 1e6 }, { duplicate: false, host: hostView(null) })._tag).toBe("Admit")
  })

  it("the capacity refusal carries reserved, capacity and asked", () => {
    const a = Ledger.admit({ ...ok, memMib: 2048 }, { duplicate: false, host: hostView(4096, 3072) })
    expect(a._tag === "Refuse" && a.message).toContain("reserved=3072, capacity=4096, asked=2048")
  })

  it("the CPU budget is part of capacity", () => {
    const a = Ledger.admit({ ...ok, vcpus: 17 }, { duplicate: false, host: hostView(4096) })
    expect(a._tag === "Refuse" && a.check === "capacity_exceeded" && a.message).toContain("CPU")
  })
})

describe("Ledger liveness", () => {
  const e = { lastHeartbeatAt: 1000, expiresAt: null as number | null }
  it("stale only past the window", () => {
    expect(Ledger.isStale(e, 1000 + 120_000)).toBe(false)
    expect(Ledger.isStale(e, 1000 + 120_001)).toBe(true)
  })
  it("a heartbeat in the future (clock skew) is not stale", () => {
    expect(Ledger.isStale({ lastHeartbeatAt: 10_000_000 }, 1000)).toBe(false)
  })
  it("expired once expiresAt has passed", () => {
    expect(Ledger.isExpired({ expiresAt: 5000 }, 5000)).toBe(false)
    expect(Ledger.isExpired({ expiresAt: 5000 }, 5001)).toBe(true)
    expect(Ledger.isExpired({ expiresAt: null }, 1e15)).toBe(false)
  })
  it("reclaimable picks expired and stale entries", () => {
    const entries = [
      { id: "fresh", lastHeartbeatAt: 100_000, expiresAt: null },
      { id: "stale", lastHeartbeatAt: 0, expiresAt: null },
      { id: "expired", lastHeartbeatAt: 100_000, expiresAt: 50_000 },
    ]
    expect(Ledger.reclaimable(entries, 121_000).map((x) => x.id)).toEqual(["stale", "expired"])
  })
  it("property: an entry is reclaimable exactly when now is past its reclaimableAfter", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 1e9 }),
        fc.option(fc.integer({ min: 0, max: 1e9 }), { nil: null }),
        fc.integer({ min: 1, max: 1e8 }),
        fc.integer({ min: 0, max: 2e9 }),
        (lastHeartbeatAt, expiresAt, window, now) => {
          const limits = { ...Limits.defaults, heartbeatStaleWindowMs: window }
          const e = { lastHeartbeatAt, expiresAt }
          expect(Ledger.isReclaimable(e, now, limits)).toBe(now > Ledger.reclaimableAfter(e, limits))
        },
      ),
    )
  })
  it("property: every reclaimable entry passes the cutoffs a store may read the ledger by, with and without stale entries", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 1e9 }),
        fc.option(fc.integer({ min: 0, max: 1e9 }), { nil: null }),
        fc.integer({ min: 1, max: 1e8 }),
        fc.integer({ min: 0, max: 2e9 }),
        fc.boolean(),
        (lastHeartbeatAt, expiresAt, window, now, stale) => {
          const limits = { ...Limits.defaults, heartbeatStaleWindowMs: window }
          const e = { lastHeartbeatAt, expiresAt }
          const c = Ledger.reclaimCutoffs(now, limits, { stale })
          const passes = (expiresAt !== null && expiresAt < c.expiredBefore) || (c.staleBefore !== null && lastHeartbeatAt < c.staleBefore)
          // Exactly: the cutoffs neither drop a reclaimable entry nor let a live one through.
          expect(passes).toBe(Ledger.isReclaimable(e, now, limits, { stale }))
        },
      ),
    )
  })
})

describe("Ledger summaries", () => {
  it("a host summary counts reserved RAM, VRAM, active and stale entries, and utilization", () => {
    const s = Ledger.summarizeHost(
      "h1",
      8192,
      [
        { memMib: 2048, vramMib: 1024, lastHeartbeatAt: 0, expiresAt: null },
        { memMib: 2048, vramMib: null, lastHeartbeatAt: 200_000, expiresAt: null },
      ],
      200_000,
    )
    expect(s).toEqual({ hostId: "h1", totalMib: 8192, reservedMib: 4096, reservedVramMib: 1024, activeEntries: 1, staleEntries: 1, utilizationPct: 50 })
  })

  it("the cluster summary totals every host, sorted by id", () => {
    const a = Ledger.summarizeHost("b", 1000, [{ memMib: 500, vramMib: null, lastHeartbeatAt: 0, expiresAt: null }], 0)
    const b = Ledger.summarizeHost("a", 3000, [{ memMib: 500, vramMib: null, lastHeartbeatAt: 0, expiresAt: null }], 0)
    const c = Ledger.summarizeHost("c", null, [{ memMib: 9999, vramMib: null, lastHeartbeatAt: 0, expiresAt: null }], 0)
    const cl = Ledger.summarizeCluster([a, b, c])
    expect(cl.hosts.map((h) => h.hostId)).toEqual(["a", "b", "c"])
    expect(cl.totalMib).toBe(4000)
    expect(cl.reservedMib).toBe(10999)
    expect(cl.utilizationPct).toBe(25)
    expect(c.utilizationPct).toBeNull()
  })

  it("a host whose reserve swallows its RAM shows 0 capacity", () => {
    const cap = Headroom.ramCapacityOf(512)
    expect(Ledger.summarizeHost("tiny", cap, [], 0).totalMib).toBe(0)
  })
})
