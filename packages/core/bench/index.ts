/**
 * Core bench: one park-gate pass and one placement ranking over a large fleet, and how each
 * grows from 1,000 to 10,000 hosts (a ratio; close to 10 means linear). The queue waited a
 * minute; a second figure is the starvation bound's worst case (every queued session past
 * the limit): it looks for a host for at most 16 of them a pass.
 */
import { report, timeMs } from "@engram/bench"
import { ParkGate, Placement, PlacementIndex } from "../src/index.js"
import { rng } from "./rng.js"
import type { Candidate, FleetHost, FleetView } from "../src/index.js"

const NOW = 2e7


/** `queuedAgo(i)`: how long before NOW the i-th queued session was queued. */
const fleetOf = (hosts: number, parks: number, queued: number, queuedAgo: (i: number) => number = (i) => 60_000 + i): FleetView => {
  const r = rng(hosts)
  const parksPerHost = Math.floor(parks / hosts)
  const out: FleetHost[] = []
  for (let i = 0; i < hosts; i++) {
    const cap = 256 * 1024
    const reserved = Math.floor(cap * (0.7 + r() * 0.35))
    out.push({
      id: `h${String(i).padStart(6, "0")}`,
      headroom: { allocatableMib: cap, cpuBudget: 256, reserved: { memMib: reserved, vcpus: Math.floor(r() * 256) } },
      entries: Math.floor(r() * 32),
      descentsRunning: r() < 0.05 ? 1 : 0,
      parks: Array.from({ length: parksPerHost }, (_, j) => ({
        sessionId: `s${i}-${j}`,
        parkedAt: Math.floor(r() * 1e7),
        budget: { memMib: 4096, vcpus: 2 },
      })),
    })
  }
  const queue = Array.from({ length: queued }, (_, i) => ({
    sessionId: `q${i}`,
    budget: { memMib: 1024 * (1 + Math.floor(r() * 96)), vcpus: 1 + Math.floor(r() * 16) },
    queuedAt: NOW - queuedAgo(i),
  }))
  return { hosts: out, queue }
}

const big = fleetOf(10_000, 200_000, 5_000)
const small = fleetOf(1_000, 20_000, 5_000)
// The starvation bound's worst case: every queued session waited past the limit (7.5 min), so
// the gate looks for a host to hold for each of them.
const starvingSmall = fleetOf(1_000, 20_000, 500, (i) => 3_600_000 + i)
const starvingBig = fleetOf(10_000, 200_000, 5_000, (i) => 3_600_000 + i)

const gateBig = await timeMs(() => ParkGate.evaluate(big, NOW), 11)
const gateSmall = await timeMs(() => ParkGate.evaluate(small, NOW), 11)
const req = { budget: { memMib: 8192, vcpus: 4 } }
const rankBig = await timeMs(() => Placement.rank(big.hosts, req), 11)
const rankSmall = await timeMs(() => Placement.rank(small.hosts, req), 11)
const pickBig = await timeMs(() => Placement.pick(big.hosts, req), 11)
// The index's pick with and without a template, on the same fleet, where one host in ten holds
// the template (a ranking signal: the holders are filed apart, so the search stays O(log n)).
const template = { name: "py", memMib: 8192, vcpus: 4 }
const withTemplates: Candidate[] = big.hosts.map((h, i) => (i % 10 === 0 ? { ...h, templates: [template] } : h))
const index = PlacementIndex.Index.of(withTemplates)
const budgets = Array.from({ length: 1000 }, (_, i) => ({ memMib: 1024 * (1 + (i % 64)), vcpus: 1 + (i % 8) }))
const picks = (t: string | undefined) => () => {
  for (const budget of budgets) index.pick({ budget, template: t })
}
const indexPlain = (await timeMs(picks(undefined), 11)) / budgets.length
const indexTemplate = (await timeMs(picks("py"), 11)) / budgets.length
const churn = await timeMs(() => {
  for (let i = 0; i < 1000; i++) index.upsert(withTemplates[(i * 7) % withTemplates.length] as Candidate)
}, 11)
// A move without a named target (`takesMovesOnly`) on a fleet whose roomiest nine hosts in ten take
// no moves (their agents advertise no peer URL): each block counts its hosts that take moves, so
// the pick passes those blocks at once instead of walking every roomier host.
const byRoom = [...big.hosts].sort((a, b) => a.headroom.reserved.memMib - b.headroom.reserved.memMib)
const roomiest = new Set(byRoom.slice(0, 9_000).map((h) => h.id))
const fewMovers = PlacementIndex.Index.of(big.hosts.map((h): Candidate => (roomiest.has(h.id) ? { ...h, takesMoves: false } : h)))
const movesOnly = (takesMovesOnly: boolean) => () => {
  for (const budget of budgets) fewMovers.pick({ budget, takesMovesOnly })
}
const fewMoversPlain = (await timeMs(movesOnly(false), 11)) / budgets.length
const fewMoversMove = (await timeMs(movesOnly(true), 11)) / budgets.length
const starveSmall = await timeMs(() => ParkGate.evaluate(starvingSmall, NOW), 3, 1)
const starveBig = await timeMs(() => ParkGate.evaluate(starvingBig, NOW), 3, 1)

const d = ParkGate.evaluate(big, NOW)
console.log(`fleet: 10,000 hosts, 200,000 parks, 5,000 queued (${d.withoutRoom} without room, ${d.yields.length} yields)`)
report({ bench: "core", figure: "ParkGate.evaluate, 10,000 hosts / 200k parks / 5k queued", value: gateBig, unit: "ms", goal: "< 50 ms" })
report({ bench: "core", figure: "ParkGate.evaluate growth 1,000 → 10,000 hosts", value: gateBig / gateSmall, unit: "x", goal: "≈ 10 (linear)" })
report({ bench: "core", figure: "Placement.rank, 10,000 hosts", value: rankBig, unit: "ms" })
report({ bench: "core", figure: "Placement.rank growth 1,000 → 10,000 hosts", value: rankBig / rankSmall, unit: "x", goal: "≈ 10 (n log n)" })
report({ bench: "core", figure: "Placement.pick (one linear pass), 10,000 hosts", value: pickBig, unit: "ms", ratio: pickBig / rankBig, baseline: "rank" })
report({ bench: "core", figure: "PlacementIndex.pick, 10,000 hosts, no template", value: indexPlain * 1000, unit: "µs" })
report({
  bench: "core",
  figure: "PlacementIndex.pick, 10,000 hosts, a template 1 host in 10 holds",
  value: indexTemplate * 1000,
  unit: "µs",
  ratio: indexTemplate / indexPlain,
  baseline: "the same picks without a template",
})
report({ bench: "core", figure: "PlacementIndex.upsert, 10,000 hosts (1 in 10 holding a template)", value: churn, unit: "µs" })
report({
  bench: "core",
  figure: "PlacementIndex.pick, no target, 10,000 hosts, the roomiest 90% take no moves",
  value: fewMoversMove * 1000,
  unit: "µs",
  ratio: fewMoversMove / fewMoversPlain,
  baseline: "the same picks of any host",
})
report({ bench: "core", figure: "ParkGate.evaluate, 500 queued all starving, 1,000 hosts / 20k parks", value: starveSmall, unit: "ms" })
report({
  bench: "core",
  figure: "ParkGate.evaluate, 5,000 queued all starving, 10,000 hosts / 200k parks (16 new holds a pass)",
  value: starveBig,
  unit: "ms",
  ratio: starveBig / gateBig,
  baseline: "the same fleet, nobody starving",
})
// What the replicas' spread costs in packing (its own module: a churn, not a timing).
await import("./spread.js")
