import { describe, expect, it } from "vitest"
import { Ledger, Plan, Session } from "../src/index.js"

const t = 1000
const created = (id: string, hostId: string, version: number): Plan.Plan => {
  const answer = Session.step(null, { _tag: "create", id, budget: { memMib: 1024, vcpus: 1 }, affinity: [], placement: { hostId, version, reservationId: `r-${id}` } }, t)
  if (answer._tag !== "Plan") throw new Error("expected a plan")
  return answer
}
const releaseOn = (hostId: string): Plan.Plan => Plan.make(t, { ledger: [Plan.release({ id: "x", hostId, memMib: 512, vcpus: 0 }, "released")] })

describe("plans", () => {
  it("a group of placements on hosts they rely on, and releases elsewhere, can be applied together", () => {
    expect(Plan.checkGroup([created("a", "h1", 3), created("b", "h1", 3), created("c", "h2", 0), releaseOn("h3")])).toBeNull()
  })

  it("a group where a host one plan relies on is changed by a plan that does not rely on it is refused", () => {
    expect(Plan.checkGroup([created("a", "h1", 3), releaseOn("h1")])).toBe("host h1 is relied on by one plan and changed by another that does not rely on it")
  })

  it("a plan that reserves on a host it does not rely on is refused", () => {
    const entry = Ledger.entryOf({ id: "e", hostId: "h2", ownerKind: "external", ownerId: "ops", memMib: 1, vcpus: 0 }, t)
    expect(Plan.checkGroup([Plan.make(t, { ledger: [{ _tag: "Reserve", entry }], host: { hostId: "h1", version: 0 } })])).toBe(
      "a plan reserves on host h2 without relying on it",
    )
    expect(Plan.checkGroup([Plan.make(t, { ledger: [{ _tag: "Reserve", entry }] })])).toBe("a plan reserves on host h2 without relying on it")
  })

  it("a plan that relies on a host and releases on another is refused (left out for its host, it could not take back the other's sums)", () => {
    const release = Plan.release({ id: "x", hostId: "h2", memMib: 512, vcpus: 0 }, "released")
    expect(Plan.checkGroup([Plan.make(t, { ledger: [release], host: { hostId: "h1", version: 0 } })])).toBe("a plan relies on host h1 and releases on host h2")
    // On the host it relies on, or relying on none, a release is fine.
    expect(Plan.checkGroup([Plan.make(t, { ledger: [Plan.release({ id: "y", hostId: "h1", memMib: 512, vcpus: 0 }, "released")], host: { hostId: "h1", version: 0 } })])).toBeNull()
    expect(Plan.checkGroup([Plan.make(t, { ledger: [release] })])).toBeNull()
  })

  it("what an applied plan changed: its sessions, the hosts of its entries, sessions and moves, its moves", () => {
    const p = created("a", "h1", 3)
    expect(Plan.changes(p)).toStrictEqual({ sessionIds: ["a"], hostIds: ["h1"], moveIds: [] })
    expect(Plan.hostsChanged(releaseOn("h3"))).toStrictEqual(["h3"])
    expect(Plan.sessionOf(p)?.state).toBe("pending")
    expect(Plan.moveOf(p)).toBeNull()
  })
})
