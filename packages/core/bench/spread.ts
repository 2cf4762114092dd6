/**
 * What the replicas' spread (`Placement.Spread`) costs in packing: the same churn of creates and
 * ends (seeded) placed by one replica, then by three taking turns, each ranking its own share of
 * the hosts first. Every decision sees the fleet as it is (no stale reads): only the ranking
 * differs. Figures: hosts holding anything, hosts still able to take the largest session, and
 * creates refused for room, over the steady state of a fleet kept near 70 % full
 * (`BENCH_SPREAD_FILL`).
 */
import { report } from "@engram/bench"
import { Headroom, Limits, PlacementIndex } from "../src/index.js"
import { rng } from "./rng.js"
import type { Budget, Candidate } from "../src/index.js"

const HOSTS = 200
const HOST_MIB = 65_536
const STEPS = 200_000
const FILL = Number(process.env["BENCH_SPREAD_FILL"] ?? 0.7)
const sizes: readonly Budget[] = [
  { memMib: 512, vcpus: 1 },
  { memMib: 1024, vcpus: 1 },
  { memMib: 2048, vcpus: 2 },
  { memMib: 4096, vcpus: 2 },
  { memMib: 8192, vcpus: 4 },
  { memMib: 16_384, vcpus: 8 },
]
const largest = sizes[sizes.length - 1] as Budget


interface Packing {
  readonly inUse: number
  readonly takeLargest: number
  readonly refused: number
}

const churn = (replicas: number): Packing => {
  const random = rng(11)
  const hosts = new Map<string, Candidate>()
  for (let i = 0; i < HOSTS; i++) {
    const id = `host-${String(i).padStart(4, "0")}`
    hosts.set(id, { id, headroom: { allocatableMib: HOST_MIB, cpuBudget: 128, reserved: Headroom.zero } })
  }
  const index = PlacementIndex.Index.of(hosts.values(), { ...Limits.defaults, maxEntriesPerNode: 1000 })
  const live: { hostId: string; budget: Budget }[] = []
  const change = (hostId: string, budget: Budget, sign: 1 | -1) => {
    const c = hosts.get(hostId) as Candidate
    const next = { ...c, headroom: { ...c.headroom, reserved: sign === 1 ? Headroom.add(c.headroom.reserved, budget) : Headroom.subtract(c.headroom.reserved, budget) } }
    hosts.set(hostId, next)
    index.upsert(next)
  }
  let inUse = 0
  let takeLargest = 0
  let samples = 0
  let refused = 0
  let reservedMib = 0
  for (let step = 0; step < STEPS; step++) {
    // The fleet hovers near `FILL` of its RAM: creates outnumber ends below it, ends above.
    if (live.length === 0 || random() < (reservedMib < FILL * HOSTS * HOST_MIB ? 0.6 : 0.4)) {
      const budget = sizes[Math.floor(random() * sizes.length)] as Budget
      const spread = replicas > 1 ? { replica: step % replicas, replicas } : undefined
      const hostId = index.pick({ budget, spread })
      if (hostId === null) {
        if (step > STEPS / 2) refused++
        continue
      }
      change(hostId, budget, 1)
      reservedMib += budget.memMib
      live.push({ hostId, budget })
    } else {
      const k = Math.floor(random() * live.length)
      const s = live[k] as { hostId: string; budget: Budget }
      live[k] = live[live.length - 1] as { hostId: string; budget: Budget }
      live.pop()
      change(s.hostId, s.budget, -1)
      reservedMib -= s.budget.memMib
    }
    if (step > STEPS / 2 && step % 100 === 0) {
      samples++
      for (const c of hosts.values()) {
        if (c.headroom.reserved.memMib > 0) inUse++
        if (Headroom.fits(c.headroom, largest)) takeLargest++
      }
    }
  }
  return { inUse: inUse / samples, takeLargest: takeLargest / samples, refused }
}

const one = churn(1)
const three = churn(3)
console.log(`spread packing, ${HOSTS} hosts of 64 GiB, ${STEPS} creates and ends: one replica`, one, "three replicas", three)
report({ bench: "core", figure: "spread packing: hosts in use, 3 replicas' shares", value: three.inUse, unit: "hosts", ratio: three.inUse / one.inUse, baseline: `one replica: ${one.inUse.toFixed(1)}` })
report({
  bench: "core",
  figure: "spread packing: hosts able to take a 16 GiB session, 3 replicas' shares",
  value: three.takeLargest,
  unit: "hosts",
  ratio: three.takeLargest / one.takeLargest,
  baseline: `one replica: ${one.takeLargest.toFixed(1)}`,
})
report({ bench: "core", figure: "spread packing: creates refused for room, 3 replicas' shares", value: three.refused, unit: "creates", baseline: `one replica: ${one.refused}` })
