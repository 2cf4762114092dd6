// A host removed and registered again under the same id, seen by another replica (two stores on
// one real PostgreSQL). Host versions come from one sequence, so the new row's versions are above
// every version the old row had: the other replica's cache (which keeps a row unless a newer
// version comes) takes the new row, and a plan it decided on the old row is refused.
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import type { Scope } from "effect"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"

let db: TestDatabase
beforeEach(async () => {
  db = await freshDatabase()
})
afterEach(async () => {
  await db.drop()
})

const run = <A>(program: Effect.Effect<A, unknown, Scope.Scope>) => Effect.runPromise(Effect.scoped(program))

const big = { totalMib: 65536, allocatableMib: 65536, totalVcpus: 64 }
// Room for 4096 MiB after the host's reserve.
const small = { totalMib: 5120, allocatableMib: 5120, totalVcpus: 64 }

describe("a host registered again under the same id, and another replica's cache", () => {
  it("a replica that cached the old row places no more than the new row's room (no over-commit)", () =>
    run(
      Effect.gen(function* () {
        // A keeps its fleet read for a minute: it decides on its cache between reads.
        const a = (yield* StorePg.openUrl({ url: db.url, placementReadMaxAgeMs: 60_000 })).store
        const b = (yield* StorePg.openUrl({ url: db.url })).store
        yield* b.registerHost({ id: "h1" })
        for (let i = 0; i < 5; i++) yield* b.reportHost("h1", big)
        yield* a.fleetView()
        yield* b.removeHost("h1")
        yield* b.registerHost({ id: "h1" })
        yield* b.reportHost("h1", small)
        yield* b.createSession({ id: "s1", budget: { memMib: 2048, vcpus: 1 } })
        yield* b.createSession({ id: "s2", budget: { memMib: 2048, vcpus: 1 } })
        // With plain counters (each row from 0) the new row is now at 4, below the 5 A cached:
        // A's read kept the old row, and at the next report the two versions met.
        yield* b.reportHost("h1", small)
        yield* a.fleetView()
        yield* b.reportHost("h1", small)
        // The new row is full: A must not place s3 on it.
        const third = yield* a.createSession({ id: "s3", budget: { memMib: 2048, vcpus: 1 } })
        expect(third._tag).toBe("Queued")
        const h = yield* b.getHost("h1")
        expect(h.headroom.reserved.memMib).toBe(4096)
        expect(h.headroom.reserved.memMib).toBeLessThanOrEqual(h.headroom.allocatableMib ?? 0)
      }),
    ), 120_000)

  it("a host drained, removed and registered again is ready to every replica at once", () =>
    run(
      Effect.gen(function* () {
        // A reads afresh for every create.
        const a = (yield* StorePg.openUrl({ url: db.url })).store
        const b = (yield* StorePg.openUrl({ url: db.url })).store
        yield* b.registerHost({ id: "h1" })
        for (let i = 0; i < 5; i++) yield* b.reportHost("h1", big)
        yield* b.setHostState("h1", "draining")
        expect((yield* a.fleetView()).hosts.map((h) => [h.id, h.state])).toStrictEqual([["h1", "draining"]])
        yield* b.removeHost("h1")
        yield* b.registerHost({ id: "h1" })
        yield* b.reportHost("h1", big)
        const placed = yield* a.createSession({ id: "s1", budget: { memMib: 2048, vcpus: 1 } })
        expect(placed._tag).toBe("Placed")
        expect(placed.session.hostId).toBe("h1")
        expect((yield* a.fleetView()).hosts.map((h) => [h.id, h.state])).toStrictEqual([["h1", "ready"]])
      }),
    ), 120_000)

  it("a bump never lowers a row's version (a row above the sequence, as after an upgrade from plain counters)", async () => {
    await run(
      Effect.gen(function* () {
        const b = (yield* StorePg.openUrl({ url: db.url })).store
        yield* b.registerHost({ id: "h1" })
        yield* b.registerHost({ id: "h2" })
      }),
    )
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      const [fresh] = await sql<{ h1: string; h2: string }[]>`select (select version from hosts where id = 'h1') as h1, (select version from hosts where id = 'h2') as h2`
      // Each registration took its own version from the sequence.
      expect(Number(fresh?.h2)).toBeGreaterThan(Number(fresh?.h1))
      await sql`update hosts set version = 1000000 where id = 'h1'`
      await run(
        Effect.gen(function* () {
          const b = (yield* StorePg.openUrl({ url: db.url })).store
          yield* b.reportHost("h1", big)
          yield* b.setHostState("h1", "cordoned")
        }),
      )
      const [after] = await sql<{ version: string }[]>`select version from hosts where id = 'h1'`
      expect(Number(after?.version)).toBe(1000002)
    } finally {
      await sql.end()
    }
  }, 120_000)
})
