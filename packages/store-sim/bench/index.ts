/**
 * store-sim bench: placements per second at 10,000 hosts beside the bare decision
 * (`PlacementIndex.choose` + `Session.step` over the same fleet: what the store adds to core's
 * decision), and a scale curve at 1,000, 10,000 and 50,000 hosts of the cost of a placement,
 * a gate pass (the reaper pass's steps: fleet read, reclaim, park gate, queue drain) and a fleet read
 * (`fleetView` + `Fleet.snapshot`, what `/v1/fleet` computes). Every host holds 2 parks; 1,000 sessions wait in the queue, too big for any host's free room.
 * Knob: BENCH_SCALE (comma list of host counts).
 */
import { report } from "@engram/bench"
import { Fleet, Limits, ParkGate, PlacementIndex, Session } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { Effect } from "effect"
import { StoreSim } from "../src/index.js"

const bench = "store-sim"
const scale = (process.env["BENCH_SCALE"] ?? "1000,10000,50000").split(",").map(Number)
// The hosts report once, when the fleet is built: a window of a day keeps them from going silent
// (no placements on a host not heard from within the window) in a run that a loaded machine
// stretches past the default two minutes. Nothing else here depends on the window.
const limits = (() => {
  const r = Limits.make({ heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 })
  if (r._tag === "Invalid") throw new Error("bad bench limits")
  return r.limits
})()
const hostReport = { totalMib: 262_144 + 1024, allocatableMib: 262_144 + 1024, totalVcpus: 64 }
const budgetOf = (i: number) => ({ memMib: 1024 * (1 + (i % 16)), vcpus: 1 + (i % 4) })
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number

/** A store with `hosts` hosts, 2 parks on each (32 GiB of their 256), and 1,000 queued too big to fit now. */
const fleetOf = (hosts: number): StoreShape => {
  const { store } = StoreSim.make({ limits, noFitDetails: false })
  Effect.runSync(
    Effect.gen(function* () {
      for (let i = 0; i < hosts; i++) {
        const id = `h${String(i).padStart(6, "0")}`
        yield* store.registerHost({ id })
        yield* store.reportHost(id, hostReport)
        for (let k = 0; k < 2; k++) {
          const s = `f${i}-${k}`
          yield* store.createSession({ id: s, budget: { memMib: 16_384, vcpus: 4 }, affinity: [id] })
          yield* store.markRunning(s)
          yield* store.idle(s)
        }
      }
      for (let q = 0; q < 1000; q++) yield* store.createSession({ id: `q${q}`, budget: { memMib: 240_000, vcpus: 8 } })
    }),
  )
  return store
}

/** Placements per second of `n` creates, one synchronous run (the store is in memory). */
const createRate = (store: StoreShape, n: number, prefix: string): number => {
  const t0 = performance.now()
  Effect.runSync(
    Effect.gen(function* () {
      for (let i = 0; i < n; i++) yield* store.createSession({ id: `${prefix}${i}`, budget: budgetOf(i) })
    }),
  )
  return n / ((performance.now() - t0) / 1000)
}

/** The bare decision, per second: core's index choice and core's step for each create, no store. */
const decisionRate = (store: StoreShape, n: number): number => {
  const fleet = Effect.runSync(store.fleetView())
  const index = PlacementIndex.Index.of(fleet.hosts, limits)
  const t0 = performance.now()
  for (let i = 0; i < n; i++) {
    const chosen = index.choose({ budget: budgetOf(i), affinity: [] })
    const placement = chosen._tag === "Chosen" ? { hostId: chosen.hostId, version: 0, reservationId: `r${i}` } : null
    Session.step(null, { _tag: "create", id: `d${i}`, budget: budgetOf(i), affinity: [], placement }, 0)
  }
  return n / ((performance.now() - t0) / 1000)
}

const main = async (): Promise<void> => {
  // Placements per second at 10,000 hosts: a first run warms the JIT, then three are measured.
  const store = fleetOf(10_000)
  createRate(store, 20_000, "w")
  decisionRate(store, 20_000)
  const runs = [createRate(store, 20_000, "a"), createRate(store, 20_000, "b"), createRate(store, 20_000, "c")]
  const rate = median(runs)
  const decision = median([decisionRate(store, 20_000), decisionRate(store, 20_000), decisionRate(store, 20_000)])
  report({ bench, figure: "createSession placements/s, 10,000 hosts", value: rate, unit: "/s", ratio: rate / decision, baseline: "bare core decision/s", goal: ">= 200,000/s" })
  report({ bench, figure: "bare core decision (index choice + Session.step), 10,000 hosts", value: decision, unit: "/s" })

  // The scale curve.
  let first: { place: number; pass: number; read: number } | undefined
  for (const hosts of scale) {
    const s = fleetOf(hosts)
    createRate(s, 2000, "warm")
    const placeUs = (1e6 / median([createRate(s, 5000, "x"), createRate(s, 5000, "y"), createRate(s, 5000, "z")]))
    const passMs = median(
      Array.from({ length: 5 }, () => {
        const t0 = performance.now()
        // The reaper pass's steps (SPEC §4.3; the pass itself lives in @engram/reaper, which depends on this package).
        Effect.runSync(
          Effect.gen(function* () {
            const fleet = yield* s.fleetView()
            yield* s.reclaim()
            ParkGate.evaluate(fleet, fleet.readAt, limits)
            yield* s.drainQueue()
          }),
        )
        return performance.now() - t0
      }),
    )
    const readMs = median(
      Array.from({ length: 7 }, () => {
        const t0 = performance.now()
        const fleet = Effect.runSync(s.fleetView())
        Fleet.snapshot(fleet, limits)
        return performance.now() - t0
      }),
    )
    const label = `${hosts.toLocaleString("en")} hosts`
    first ??= { place: placeUs, pass: passMs, read: readMs }
    const growth = (v: number, base: number) => (hosts === scale[0] ? {} : { ratio: v / base, baseline: `${scale[0]?.toLocaleString("en")} hosts` })
    report({ bench, figure: `scale: one placement, ${label}`, value: placeUs, unit: "µs", ...growth(placeUs, first.place) })
    report({ bench, figure: `scale: one gate pass (read, reclaim, ParkGate, drain), ${label}`, value: passMs, unit: "ms", ...growth(passMs, first.pass) })
    report({ bench, figure: `scale: fleet read + Fleet.snapshot, ${label}`, value: readMs, unit: "ms", ...growth(readMs, first.read), ...(hosts === 10_000 ? { goal: "<= 20 ms" } : {}) })
  }
}

await main()
