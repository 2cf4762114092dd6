// The shared conformance suite against a real PostgreSQL, with new sessions placed by the
// locking path only (the fallback of the optimistic placement) (@engram/test-pg: one server per
// run, a fresh database for this file). Each group builds its own store on that database;
// every case starts from StoreTesting.reset.
import { runStoreConformance } from "@engram/store-conformance"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect, Layer } from "effect"
import { afterAll } from "vitest"
import { StorePg } from "../src/index.js"

let database: Promise<TestDatabase> | undefined
const url = Effect.promise(() => (database ??= freshDatabase())).pipe(Effect.map((db) => db.url))

afterAll(async () => {
  if (database !== undefined) await (await database).drop()
})

// A variant of a plain store (pg.conformance, pglite.conformance): every case, but the property
// cases run 15 times here against 50 there (each run is a random sequence the plain store's
// runs already draw from; what differs here meets every operation within the first runs).
runStoreConformance(
  "store-pg (PostgreSQL, locking placement path only)",
  Layer.unwrap(Effect.map(url, (u) => StorePg.layerTesting({ url: u, poolSize: 16, optimisticPlacementAttempts: 0 }))),
  { numRuns: 15 },
)
