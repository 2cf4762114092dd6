import { describe, expect, it } from "vitest"
import { Downtime, Headroom, Limits, ParkGate, ParkPolicy, Placement } from "../src/index.js"

// The README's example, with the figures it shows.
describe("the README example", () => {
  it("gives the figures the README shows", () => {
    const h1 = Headroom.fromReport({ allocatableMib: 17_408, totalVcpus: 8 }, { memMib: 12_288, vcpus: 6 })
    expect(Headroom.freeMib(h1)).toBe(4096)
    expect(Headroom.fits(h1, { memMib: 4096, vcpus: 2 })).toBe(true)
    const hosts = [
      { id: "h1", headroom: h1 },
      { id: "h2", headroom: Headroom.fromReport({ allocatableMib: 33_792, totalVcpus: 16 }, Headroom.zero) },
    ]
    expect(Placement.rank(hosts, { budget: { memMib: 2048, vcpus: 1 } })).toEqual(["h1", "h2"])
    expect(Placement.noFit(hosts, { budget: { memMib: 65_536, vcpus: 1 } })[0]?.reason).toBe("ram_full")
    const fleet = {
      hosts: [{ ...hosts[0]!, descentsRunning: 0, parks: [{ sessionId: "p1", parkedAt: 0, budget: { memMib: 4096, vcpus: 2 } }] }],
      queue: [{ sessionId: "q1", budget: { memMib: 8192, vcpus: 2 }, queuedAt: 10 }],
    }
    const decision = ParkGate.evaluate(fleet, 1000)
    expect(decision.yields).toEqual([{ hostId: "h1", sessionId: "p1", reason: "demand" }])
    expect(ParkPolicy.mayPark(ParkPolicy.defaultRule, ParkPolicy.idleViewOf(fleet, "h1"))).toBe(false)
    expect(Downtime.check({ lastDeltaWireBytes: 85 << 20, rateBytesPerMs: 1 << 20, maxDowntimeMs: 600 })).toEqual({ _tag: "Fits", estimateMs: 485 })
    expect(Limits.defaults.commitAllowanceMs).toBe(400)
    const hour = 60 * 60 * 1000
    const at = (atMs: number, ...commitsMs: number[]) => commitsMs.map((commitMs) => ({ commitMs, atMs }))
    expect(Downtime.recentAllowance({ pair: at(0, 900), target: at(hour, 60, 65, 70, 70, 80), fleet: [] }, hour + 1)).toEqual({ allowanceMs: 80, source: "target", samples: 5 })
    expect(Downtime.recentAllowance({ pair: [], target: at(hour, 70), fleet: [] }, hour + 1)).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
  })
})
