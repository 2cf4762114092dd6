/**
 * store-sim bench: placements per second on a 10,000-host fleet, beside the bare cost of
 * `Placement.pick` over the same fleet (the ratio shows what the store adds to the decision).
 */
import { report } from "@engram/bench"
import { Placement } from "@engram/core"
import { Store } from "@engram/store"
import { Effect } from "effect"
import { StoreSim } from "../src/index.js"

const HOSTS = 10_000
const SESSIONS = 20_000

const program = Effect.gen(function* () {
  const store = yield* Store
  for (let i = 0; i < HOSTS; i++) {
    const id = `h${String(i).padStart(5, "0")}`
    yield* store.registerHost({ id })
    yield* store.reportHost(id, { totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 })
  }
  const t0 = performance.now()
  for (let i = 0; i < SESSIONS; i++) {
    yield* store.createSession({ id: `s${i}`, budget: { memMib: 1024 * (1 + (i % 16)), vcpus: 1 + (i % 4) } })
  }
  const placeMs = performance.now() - t0
  const fleet = yield* store.fleetView()
  const t1 = performance.now()
  for (let i = 0; i < 2000; i++) Placement.pick(fleet.hosts, { budget: { memMib: 1024 * (1 + (i % 16)), vcpus: 1 } })
  const pickMs = (performance.now() - t1) / 2000
  const t2 = performance.now()
  for (let i = 0; i < 20; i++) yield* store.fleetView()
  const viewMs = (performance.now() - t2) / 20
  const perSec = SESSIONS / (placeMs / 1000)
  report({ bench: "store-sim", figure: `createSession placements/s, ${HOSTS.toLocaleString("en")} hosts`, value: perSec, unit: "/s" })
  report({
    bench: "store-sim",
    figure: "placement cost vs bare Placement.pick on the same fleet",
    value: placeMs / SESSIONS,
    unit: "ms",
    ratio: placeMs / SESSIONS / pickMs,
    baseline: "Placement.pick",
  })
  report({ bench: "store-sim", figure: `fleetView read, ${HOSTS.toLocaleString("en")} hosts`, value: viewMs, unit: "ms" })
})

await Effect.runPromise(program.pipe(Effect.provide(StoreSim.layer())))
