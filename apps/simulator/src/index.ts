/**
 * @engram/simulator: the fleet simulator. It plays a day of traffic (generated or replayed
 * from a trace) against the real decisions of `@engram/core` through `@engram/store-sim` on a
 * simulated clock, under each park policy of `ParkPolicy`, and reports queue waits, warm and
 * cold resumes, descents and over-commits.
 */
export * as Bound from "./Bound.js"
export * as Cli from "./Cli.js"
export * as Load from "./Load.js"
export * as Plot from "./Plot.js"
export * as Report from "./Report.js"
export { Rng } from "./Rng.js"
export * as SimClock from "./SimClock.js"
export * as Simulation from "./Simulation.js"
export * as Stress from "./Stress.js"
export * as Workload from "./Workload.js"
