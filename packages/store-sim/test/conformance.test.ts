// The shared conformance suite against the in-memory store: one runner file per backend.
import { runStoreConformance } from "@engram/store-conformance"
import { StoreSim } from "../src/index.js"

runStoreConformance("store-sim", StoreSim.layerTesting())
