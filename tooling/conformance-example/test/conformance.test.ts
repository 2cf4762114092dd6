// The whole conformance suite against this backend: one runner file, as the guide says.
import { runStoreConformance } from "@engram/store-conformance"
import { JournalStore } from "../src/index.js"

runStoreConformance("journal-store", JournalStore.layerTesting())
