/**
 * @engram/coordinator: the engram coordinator service. Start it with `startCoordinator`
 * (in-process) or `Coordinator.layer` (as a Layer), or run `src/main.ts` (`pnpm start`).
 * `CoordinatorApi` is the HTTP surface, from which a typed client can be derived.
 */
export * from "./Api.js"
export * as Auth from "./Auth.js"
export * as Config from "./Config.js"
export type { CoordinatorConfig, ConfigIssue } from "./Config.js"
export * as Coordinator from "./Coordinator.js"
export { CoordinatorInfo, startCoordinator } from "./Coordinator.js"
export type { CoordinatorOptions, RunningCoordinator } from "./Coordinator.js"
export { Leader } from "./Leader.js"
export { Metrics } from "./Metrics.js"
export { Notifier } from "./Notifier.js"
export { drainQueue, reaperPass, ReaperLoop, reconcile, ReconcileAtStart } from "./Reaper.js"
export type { PassReport, ReconcileReport } from "./Reaper.js"
export { Settings } from "./Settings.js"
