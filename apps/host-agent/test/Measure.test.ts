import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { HostMeter, layerFixed, measureHost, parseCpuList, parseCpuMax, parseMeminfo, parseMemLimit } from "../src/Measure.js"

/** A fixture tree: `{ "proc/meminfo": "…", "sys/fs/cgroup/memory.max": "…" }`. */
const tree = (files: Record<string, string>) => {
  const root = mkdtempSync(join(tmpdir(), "engram-measure-"))
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true })
    writeFileSync(join(root, path), text)
  }
  return { proc: join(root, "proc"), sys: join(root, "sys") }
}
const meminfo = (totalKb: number, availableKb: number) => `MemTotal:       ${totalKb} kB\nMemFree:         1000 kB\nMemAvailable:   ${availableKb} kB\n`
const GiBkB = 1024 * 1024

describe("parsers", () => {
  it("meminfo gives MemTotal and MemAvailable in MiB, null when a field is missing", () => {
    assert.deepStrictEqual(parseMeminfo(meminfo(16 * GiBkB, 12 * GiBkB)), { totalMib: 16384, availableMib: 12288 })
    assert.isNull(parseMeminfo("MemTotal: 100 kB\n"))
    assert.isNull(parseMeminfo("garbage"))
  })
  it("CPU lists, cpu.max and memory limits", () => {
    assert.strictEqual(parseCpuList("0-3,6,8-9\n"), 7)
    assert.isNull(parseCpuList("3-1"))
    assert.isNull(parseCpuList(""))
    assert.strictEqual(parseCpuMax("200000 100000\n"), 2)
    assert.isNull(parseCpuMax("max 100000"))
    assert.strictEqual(parseMemLimit(String(2 * 1024 ** 3)), 2048)
    assert.isNull(parseMemLimit("max"))
    assert.isNull(parseMemLimit("9223372036854771712"))
  })
})

describe("measureHost", () => {
  it.effect("a bare host: allocatable = MemAvailable + the RAM of resident VMs, vCPUs from the online set", () =>
    Effect.gen(function* () {
      const roots = tree({ "proc/meminfo": meminfo(16 * GiBkB, 10 * GiBkB), "sys/devices/system/cpu/online": "0-7\n" })
      assert.deepStrictEqual(yield* measureHost(roots, 2048), { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 })
    }))

  it.effect("a lower cgroup v2 limit and CPU quota win", () =>
    Effect.gen(function* () {
      const roots = tree({
        "proc/meminfo": meminfo(64 * GiBkB, 60 * GiBkB),
        "sys/fs/cgroup/memory.max": String(8 * 1024 ** 3),
        "sys/fs/cgroup/memory.current": String(3 * 1024 ** 3),
        "sys/fs/cgroup/cpuset.cpus.effective": "0-15",
        "sys/fs/cgroup/cpu.max": "400000 100000",
      })
      assert.deepStrictEqual(yield* measureHost(roots, 1024), { totalMib: 8192, allocatableMib: 5120 + 1024, totalVcpus: 4 })
    }))

  it.effect("cgroup v1 limit and CFS quota", () =>
    Effect.gen(function* () {
      const roots = tree({
        "proc/meminfo": meminfo(32 * GiBkB, 30 * GiBkB),
        "sys/fs/cgroup/memory/memory.limit_in_bytes": String(4 * 1024 ** 3),
        "sys/fs/cgroup/memory/memory.usage_in_bytes": String(1024 ** 3),
        "sys/fs/cgroup/cpuset/cpuset.effective_cpus": "0-3",
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "150000",
        "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
      })
      assert.deepStrictEqual(yield* measureHost(roots, 0), { totalMib: 4096, allocatableMib: 3072, totalVcpus: 1 })
    }))

  it.effect("a failed measurement reports the host unmeasured, not a guess", () =>
    Effect.gen(function* () {
      const roots = tree({ "proc/meminfo": "MemTotal: oops\n" })
      assert.deepStrictEqual(yield* measureHost(roots, 512), { totalMib: null, allocatableMib: null, totalVcpus: null })
    }))

  it.effect("a simulated host with resident VMs reserved past its RAM reports no more than it has (the coordinator refuses allocatable > total)", () =>
    Effect.gen(function* () {
      const meter = yield* HostMeter
      assert.deepStrictEqual(yield* meter.measure(1024), { totalMib: 4096, allocatableMib: 3584, totalVcpus: 2 })
      assert.deepStrictEqual(yield* meter.measure(6000), { totalMib: 4096, allocatableMib: 4096, totalVcpus: 2 })
    }).pipe(Effect.provide(layerFixed({ totalMib: 4096, osMib: 512, vcpus: 2 }))))
})
