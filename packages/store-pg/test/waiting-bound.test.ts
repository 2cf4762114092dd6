// While PostgreSQL hangs without refusing connections (a table lock held here; a network black
// hole or a frozen server in production), a statement whose caller gave up stays queued in the
// driver: postgres.js cannot take it back. Before, such statements piled up without bound and all
// ran once the database answered again. Now a pool holds at most `maxWaitingPerConnection` such
// statements per connection; past that a statement is refused at once (503 `Unavailable`), never
// queued. Callers that wait (a burst) are not counted.
import { it } from "@effect/vitest"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import { sql } from "drizzle-orm"
import { Effect, Fiber } from "effect"
import { describe, expect } from "vitest"
import * as PostgresJs from "../src/PostgresJs.js"

describe("a pool whose database does not answer", () => {
  it.live("holds at most maxWaitingPerConnection statements per connection whose callers left, refuses the next at once, and takes statements again once they are answered; callers that wait are not counted", () =>
    Effect.gen(function* () {
      const database = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      const db = yield* PostgresJs.open({ url: database.url, poolSize: 1 })
      yield* db.pool.query(sql`create table held (x int)`)
      // Another connection holds the table: every read of it waits.
      const holder = postgres(database.url, { max: 1 })
      const resolvers = () => {
        let resolve = () => {}
        const promise = new Promise<void>((r) => (resolve = r))
        return { promise, resolve: () => resolve() }
      }
      const locked = resolvers()
      const release = resolvers()
      const holding = holder.begin(async (tx) => {
        await tx`lock table held in access exclusive mode`
        locked.resolve()
        await release.promise
      })
      yield* Effect.promise(() => locked.promise)
      try {
        const bound = PostgresJs.maxWaitingPerConnection
        // Callers that wait (a burst, twice the bound) are not refused: they are not abandoned.
        const waiters = yield* Effect.forkChild(Effect.all(Array.from({ length: 2 * bound }, () => db.pool.query(sql`select count(*) from held`)), { concurrency: "unbounded" }))
        // Callers that give up at once: their statements stay with the driver.
        for (let i = 0; i < bound; i++) yield* db.pool.query(sql`select count(*) from held`).pipe(Effect.timeoutOption("20 millis"))
        const refused = yield* Effect.flip(db.pool.query(sql`select 1`).pipe(Effect.timeout("10 seconds")))
        expect(refused._tag).toBe("Unavailable")
        expect(refused.message).toContain(`${bound} statements whose callers gave up are still waiting for the database (at most ${bound})`)
        release.resolve()
        // The waiting callers are answered once the database is.
        expect((yield* Fiber.join(waiters)).length).toBe(2 * bound)
      } finally {
        release.resolve()
        yield* Effect.promise(() => holding)
        yield* Effect.promise(() => holder.end())
      }
      // Answered, they leave the count: the pool takes statements again.
      yield* Effect.gen(function* () {
        for (;;) {
          const r = yield* Effect.result(db.pool.query<{ one: number }>(sql`select 1 as one`))
          if (r._tag === "Success") return r.success
          yield* Effect.sleep("20 millis")
        }
      }).pipe(Effect.timeout("30 seconds"))
    }).pipe(Effect.scoped),
  60_000)
})
