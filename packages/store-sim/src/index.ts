/**
 * @engram/store-sim: the in-memory engram store. Deterministic, with its time from the
 * Effect Clock; the engine of the fleet simulator and the quickest backend for tests.
 */
export * as StoreSim from "./StoreSim.js"
