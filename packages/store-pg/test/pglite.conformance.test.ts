// The shared conformance suite against PGlite (embedded PostgreSQL, in memory). PGlite takes
// a few seconds to start, so every group of this file shares one instance, built once.
import { runStoreConformance } from "@engram/store-conformance"
import { Layer, ManagedRuntime } from "effect"
import { afterAll } from "vitest"
import { StorePg } from "../src/index.js"

const runtime = ManagedRuntime.make(StorePg.layerPgliteTesting())

afterAll(() => runtime.dispose())

// The first group's layer starts PGlite and migrates it: on a loaded machine that alone can
// pass the default 30 s, so this file gives its hooks (and cases) 2 minutes.
runStoreConformance("store-pg (PGlite)", Layer.effectContext(runtime.contextEffect), { timeoutMs: 120_000 })
