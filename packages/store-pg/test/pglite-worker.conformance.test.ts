// The shared conformance suite against PGlite in a worker thread (`worker: true`): the same
// store, each statement a message to the thread that runs PGlite's engine. One instance shared
// by every group of this file, as for PGlite in this thread.
import { runStoreConformance } from "@engram/store-conformance"
import { Layer, ManagedRuntime } from "effect"
import { afterAll } from "vitest"
import { StorePg } from "../src/index.js"

const runtime = ManagedRuntime.make(StorePg.layerPgliteTesting({ worker: true }))

afterAll(() => runtime.dispose())

runStoreConformance("store-pg (PGlite in a worker thread)", Layer.effectContext(runtime.contextEffect), { timeoutMs: 120_000 })
