// The shared conformance suite against PGlite in a worker thread (`worker: true`): the same
// store, each statement a message to the thread that runs PGlite's engine. One instance shared
// by every group of this file, as for PGlite in this thread.
import { runStoreConformance } from "@engram/store-conformance"
import { Layer, ManagedRuntime } from "effect"
import { afterAll } from "vitest"
import { StorePg } from "../src/index.js"

const runtime = ManagedRuntime.make(StorePg.layerPgliteTesting({ worker: true }))

afterAll(() => runtime.dispose())

// A variant of a plain store (pg.conformance, pglite.conformance): every case, but the property
// cases run 15 times here against 50 there (each run is a random sequence the plain store's
// runs already draw from; what differs here meets every operation within the first runs).
runStoreConformance("store-pg (PGlite in a worker thread)", Layer.effectContext(runtime.contextEffect), { timeoutMs: 120_000, numRuns: 15 })
