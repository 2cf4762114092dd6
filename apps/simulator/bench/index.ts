/**
 * Simulator bench: a simulated day of 1,000 hosts and 50,000 sessions under the default demand
 * gate (the acceptance: under 60 s of wall time on the 2-core dev machine), reported as
 * simulated events per second, beside the cost of generating the workload.
 */
import { report, timeMs } from "@engram/bench"
import { Simulation, Workload } from "../src/index.js"

const HOSTS = 1000
const SESSIONS = 50_000
const generator = { ...Workload.defaultGenerator, seed: 7, sessions: SESSIONS, hours: 24 }

let workload: Workload.Workload | undefined
const genMs = await timeMs(() => (workload = Workload.generate(generator)), 1, 0)
let result: Simulation.Result | undefined
const cpu0 = process.cpuUsage()
const runMs = await timeMs(() => (result = Simulation.run(workload as Workload.Workload, { policy: "demand", fleet: { hosts: HOSTS } })), 1, 0)
const cpu = process.cpuUsage(cpu0)
const r = result as Simulation.Result

report({ bench: "simulator", figure: `workload generation, ${SESSIONS.toLocaleString("en")} sessions`, value: genMs / 1000, unit: "s" })
report({
  bench: "simulator",
  figure: `simulated day, ${HOSTS.toLocaleString("en")} hosts, demand: wall time`,
  value: runMs / 1000,
  unit: "s",
  ratio: runMs / 60_000,
  baseline: "60 s budget",
  goal: "< 60 s",
})
report({ bench: "simulator", figure: "simulated day: CPU time (user + system)", value: (cpu.user + cpu.system) / 1e6, unit: "s" })
report({ bench: "simulator", figure: `simulated events (${r.passes.toLocaleString("en")} reaper passes)`, value: r.events, unit: "events" })
report({ bench: "simulator", figure: "simulated events per second of wall time", value: r.events / (runMs / 1000), unit: "/s" })
report({ bench: "simulator", figure: "simulated time per wall time", value: r.horizonMs / runMs, unit: "×" })
if (r.overCommits !== 0 || r.ledgerDrift !== 0 || r.storeErrors !== 0) {
  console.error(`invariants broken: overCommits=${r.overCommits} ledgerDrift=${r.ledgerDrift} storeErrors=${r.storeErrors}`)
  process.exitCode = 1
}
