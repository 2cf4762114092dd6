/**
 * @engram/store-conformance: the shared conformance suite of `@engram/store`. Run it against
 * any backend with `runStoreConformance(name, layer)` from a vitest test file.
 */
export { caseNames, groups, runStoreConformance } from "./runStoreConformance.js"
export type { ConformanceOptions } from "./runStoreConformance.js"
export * as Harness from "./Harness.js"
