/**
 * @engram/coordinator: the engram coordinator service. Start it with `startCoordinator`
 * (in-process) or `Coordinator.layer` (as a Layer), or run `src/main.ts` (`pnpm start`). Its
 * HTTP API is `@engram/api`'s `EngramApi`, from which a typed client is derived.
 */
export * as Assignments from "./Assignments.js"
export * as Auth from "./Auth.js"
export * as Config from "./Config.js"
export type { CoordinatorConfig, CoordinatorConfigInput, ConfigIssue } from "./Config.js"
export * as Coordinator from "./Coordinator.js"
export { CoordinatorInfo, startCoordinator } from "./Coordinator.js"
export type { CoordinatorOptions, RunningCoordinator } from "./Coordinator.js"
export * as DataDirLock from "./DataDirLock.js"
export * as HttpEdge from "./HttpEdge.js"
export * as HttpErrors from "./HttpErrors.js"
export { Leader } from "./Leader.js"
export { LongPolls } from "./LongPolls.js"
export { Metrics } from "./Metrics.js"
export { MoveWaiter } from "./MoveWaiter.js"
export { SessionWaiter } from "./SessionWaiter.js"
export type { MoveOutcome } from "./MoveWaiter.js"
export { earlyMs, maxEarlyMs, Notifier, slotMs } from "./Notifier.js"
export { drainQueue, parkRule, reaperPass, ReaperLoop, reconcile, ReconcileAtStart } from "./Reaper.js"
export type { PassReport, ReconcileReport } from "./Reaper.js"
export { Drainer } from "./Drainer.js"
export { Settings } from "./Settings.js"
