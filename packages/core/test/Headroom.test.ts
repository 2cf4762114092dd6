import { describe, expect, it } from "vitest"
import { Headroom, Limits } from "../src/index.js"

const h = (allocatableMib: number | null, cpuBudget: number | null, memMib = 0, vcpus = 0) => ({
  allocatableMib,
  cpuBudget,
  reserved: { memMib, vcpus },
})

describe("Headroom", () => {
  it("free RAM is allocatable less reserved, and may be negative", () => {
    expect(Headroom.freeMib(h(8192, 16, 6144, 4))).toBe(2048)
    expect(Headroom.freeMib(h(4096, 16, 6144, 4))).toBe(-2048)
    expect(Headroom.freeVcpus(h(4096, 16, 0, 20))).toBe(-4)
  })

  it("an unmeasured host has no free figure", () => {
    expect(Headroom.freeMib(h(null, null))).toBeNull()
    expect(Headroom.freeVcpus(h(null, null))).toBeNull()
  })

  it("fits when both dimensions have room, exactly full included", () => {
    expect(Headroom.fits(h(8192, 8, 4096, 4), { memMib: 4096, vcpus: 4 })).toBe(true)
    expect(Headroom.fits(h(8192, 8, 4096, 4), { memMib: 4097, vcpus: 4 })).toBe(false)
    expect(Headroom.fits(h(8192, 8, 4096, 4), { memMib: 4096, vcpus: 5 })).toBe(false)
  })

  it("unmeasured RAM does not gate placement", () => {
    expect(Headroom.fits(h(null, 8, 1_000_000, 0), { memMib: 1_000_000, vcpus: 1 })).toBe(true)
    expect(Headroom.fits(h(0, 8), { memMib: 512, vcpus: 1 })).toBe(true)
  })

  it("a host without reported cores has no CPU gate", () => {
    expect(Headroom.fits(h(8192, null, 0, 500), { memMib: 512, vcpus: 64 })).toBe(true)
    expect(Headroom.fits(h(8192, 0), { memMib: 512, vcpus: 64 })).toBe(true)
  })

  it("a parked VM keeps its reservation, so its RAM is not free", () => {
    // Two 4 GiB parks on an 8 GiB host: nothing else fits until one descends.
    const full = h(8192, 32, 8192, 4)
    expect(Headroom.fits(full, { memMib: 1, vcpus: 0 })).toBe(false)
    expect(Headroom.shortfall(full, { memMib: 1, vcpus: 0 })).toBe("ram")
  })

  it("fromReport subtracts the system reserve before the ratio", () => {
    const limits = { ...Limits.defaults, memOvercommitRatio: 1.5, systemReserveMib: 1024 }
    const got = Headroom.fromReport({ allocatableMib: 9216, totalVcpus: 4 }, Headroom.zero, limits)
    expect(got.allocatableMib).toBe((9216 - 1024) * 1.5)
    expect(got.cpuBudget).toBe(16)
  })

  it("fromReport applies the defaults: 1024 MiB reserve, ratio 1, 4x CPU", () => {
    const got = Headroom.fromReport({ allocatableMib: 16384, totalVcpus: 3 }, { memMib: 100, vcpus: 1 })
    expect(got).toEqual({ allocatableMib: 15360, cpuBudget: 12, reserved: { memMib: 100, vcpus: 1 } })
  })

  it("cpu budget floors the overcommitted cores and is null without cores", () => {
    expect(Headroom.cpuBudgetOf(3, { ...Limits.defaults, cpuOvercommit: 1.5 })).toBe(4)
    expect(Headroom.cpuBudgetOf(null)).toBeNull()
    expect(Headroom.cpuBudgetOf(0)).toBeNull()
  })

  it("a host with cores whose budget floors to 0 (one vCPU at cpuOvercommit 0.5) is full, never ungated", () => {
    const limits = { ...Limits.defaults, cpuOvercommit: 0.5 }
    const one = Headroom.fromReport({ allocatableMib: 65_536, totalVcpus: 1 }, { memMib: 1024, vcpus: 0 }, limits)
    expect(Headroom.gatesCpu(one)).toBe(true)
    // Before, the budget was 0, which reads as "CPU does not gate": 64 vCPUs fitted.
    expect(Headroom.fits(one, { memMib: 1024, vcpus: 1 })).toBe(false)
    expect(Headroom.shortfall(one, { memMib: 1024, vcpus: 64 })).toBe("cpu")
    // Two cores at 0.5 give one vCPU, as before.
    expect(Headroom.cpuBudgetOf(2, limits)).toBe(1)
  })

  it("ratio 0 means no RAM cap on a measured host", () => {
    const got = Headroom.fromReport({ allocatableMib: 4096, totalVcpus: 2 }, Headroom.zero, { ...Limits.defaults, memOvercommitRatio: 0 })
    expect(got.allocatableMib).toBeNull()
    expect(Headroom.isMeasuredReport({ allocatableMib: 4096, totalVcpus: 2 })).toBe(true)
    expect(Headroom.fits(got, { memMib: 1 << 30, vcpus: 1 })).toBe(true)
  })

  it("a report that does not exceed the reserve leaves a measured host full, never ungated", () => {
    const got = Headroom.fromReport({ allocatableMib: 1000, totalVcpus: 2 }, Headroom.zero)
    expect(Headroom.gatesRam(got)).toBe(true)
    expect(Headroom.fits(got, { memMib: 1, vcpus: 0 })).toBe(false)
  })

  it("a report of null RAM is unmeasured and does not gate", () => {
    expect(Headroom.fromReport({ allocatableMib: null, totalVcpus: 2 }, Headroom.zero).allocatableMib).toBeNull()
    expect(Headroom.isMeasuredReport({ allocatableMib: null, totalVcpus: 2 })).toBe(false)
  })

  it("an explicit allocatableMib of 0 is measured and full, never ungated (SPEC §12)", () => {
    const got = Headroom.fromReport({ allocatableMib: 0, totalVcpus: 2 }, Headroom.zero)
    expect(Headroom.isMeasuredReport({ allocatableMib: 0, totalVcpus: 2 })).toBe(true)
    expect(Headroom.gatesRam(got)).toBe(true)
    expect(Headroom.fits(got, { memMib: 1, vcpus: 1 })).toBe(false)
    // With no system reserve too: 0 is full, not "not reported".
    const bare = Headroom.fromReport({ allocatableMib: 0, totalVcpus: 2 }, Headroom.zero, { ...Limits.defaults, systemReserveMib: 0 })
    expect(Headroom.fits(bare, { memMib: 1, vcpus: 1 })).toBe(false)
  })

  it("over-reserved only when measured and reserved beyond capacity", () => {
    expect(Headroom.isOverReserved(h(4096, 8, 4097))).toBe(true)
    expect(Headroom.isOverReserved(h(4096, 8, 4096))).toBe(false)
    expect(Headroom.isOverReserved(h(null, 8, 1e9))).toBe(false)
  })
})

describe("Limits", () => {
  it("the defaults are SPEC §9", () => {
    expect(Limits.defaults).toEqual({
      cpuOvercommit: 4,
      memOvercommitRatio: 1,
      systemReserveMib: 1024,
      maxEntriesPerNode: 32,
      requireMeasured: false,
      heartbeatStaleWindowMs: 120_000,
      parkHardTtlMs: 28_800_000,
      commitAllowanceMs: 400,
      reaperIntervalMs: 5000,
    })
  })

  it("make names every bad field and its rule, and keeps the good ones", () => {
    const bad = Limits.make({ maxEntriesPerNode: 0, cpuOvercommit: Number.NaN, sytemReserveMib: 5 })
    expect(bad._tag).toBe("Invalid")
    if (bad._tag === "Invalid") {
      expect(bad.issues.map((i) => [i.field, i.rule])).toEqual([
        ["maxEntriesPerNode", "must be an integer from 1 to 100000 (far more VMs than one host runs)"],
        ["cpuOvercommit", "must be a number from 0.001 to 100 (a hundred vCPUs offered per core: far past any workload's share)"],
        ["sytemReserveMib", "is not a known limit"],
      ])
    }
    const good = Limits.make({ maxEntriesPerNode: 8, requireMeasured: true })
    expect(good._tag === "Valid" && good.limits.maxEntriesPerNode === 8 && good.limits.requireMeasured).toBe(true)
  })

  it("a cpuOvercommit below a thousandth (5e-324, a denormal, was taken as a positive ratio: every host full) is refused naming the field and the range; 0.001 is taken; memOvercommitRatio 0 (no RAM cap) and a reserve of 0 still are", () => {
    for (const v of [Number.MIN_VALUE, 1e-300, 0.000999, 0, -1]) {
      const r = Limits.make({ cpuOvercommit: v })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.field, i.rule]), String(v)).toEqual([
        ["cpuOvercommit", "must be a number from 0.001 to 100 (a hundred vCPUs offered per core: far past any workload's share)"],
      ])
    }
    expect(Limits.make({ cpuOvercommit: 0.001, memOvercommitRatio: 0, systemReserveMib: 0 })).toMatchObject({ _tag: "Valid", limits: { cpuOvercommit: 0.001, memOvercommitRatio: 0, systemReserveMib: 0 } })
    expect(Limits.minCpuOvercommit).toBe(0.001)
  })

  it("each timing, count, size and ratio limit has an upper bound, refused past it with the whole range and why; the bound itself is taken", () => {
    const bounded = ["heartbeatStaleWindowMs", "parkHardTtlMs", "commitAllowanceMs", "reaperIntervalMs", "maxEntriesPerNode", "systemReserveMib", "cpuOvercommit", "memOvercommitRatio"] as const
    for (const field of bounded) {
      const { max } = Limits.bounds[field]
      const over = Limits.make({ [field]: 1e15 })
      expect(over._tag === "Invalid" && over.issues.map((i) => [i.field, i.rule])).toEqual([[field, expect.stringMatching(new RegExp(`^must be an? (integer|number) from (0|1|0\\.001) to ${max} \\(.+\\)$`))]])
      const justOver = Limits.make({ [field]: max + 1 })
      expect(justOver._tag, field).toBe("Invalid")
      const edge = Limits.make({ [field]: max })
      expect(edge._tag === "Valid" && edge.limits[field], field).toBe(max)
    }
    expect(Limits.make({ reaperIntervalMs: 1e15 })).toMatchObject({
      issues: [{ field: "reaperIntervalMs", rule: "must be an integer from 1 to 3600000 (an hour: stale reservations, parks and starving sessions wait a pass)" }],
    })
    // RAM reserve and overcommit ratios: a slip of digits was taken (a reserve of 10^15 MiB made every host full, a ratio of 10^15 made RAM and CPU ungated in effect).
    expect(Limits.make({ systemReserveMib: 16 * 1024 * 1024 + 1, cpuOvercommit: 101, memOvercommitRatio: 1e15 })).toMatchObject({
      issues: [
        { field: "systemReserveMib", rule: "must be an integer from 0 to 16777216 (16 TiB: more RAM than one host holds)" },
        { field: "cpuOvercommit", rule: "must be a number from 0.001 to 100 (a hundred vCPUs offered per core: far past any workload's share)" },
        { field: "memOvercommitRatio", rule: "must be a number from 0 to 100 (a hundred times a host's RAM: far past what page sharing and ballooning give back)" },
      ],
    })
    // A year of stale window: the host agent's bound is this one.
    expect(Limits.bounds.heartbeatStaleWindowMs.max).toBe(365 * 24 * 3_600_000)
  })
})
