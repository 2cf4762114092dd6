// A write under a lease (`CurrentFence`) is judged by its own fence, never by another caller's.
// Creates and resumes are gathered into groups (`Batcher`), and a group runs in the context of the
// call that opened it: a create under a stale fence that joined a group opened by an unfenced
// create was placed, and an unfenced create that joined a group opened by a fenced one was refused
// as fenced. A report under a lease was written without its fence check. Now each of them under a
// lease runs alone, behind its own fence. PGlite in memory, a real lease row.
import { it } from "@effect/vitest"
import { CurrentFence } from "@engram/store"
import { sql } from "drizzle-orm"
import type { StoreShape } from "@engram/store"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect } from "vitest"
import * as Lease from "../src/Lease.js"
import * as Pglite from "../src/Pglite.js"
import * as StorePg from "../src/StorePg.js"

// The lease was taken over (epoch 2): a write made under epoch 1 is stale.
const stale = { name: "reaper", epoch: 1 }
const budget = { memMib: 256, vcpus: 1 }

// One PGlite for the file (its start costs seconds); the lease taken over once, each test its own ids.
const scope = Effect.runSync(Scope.make())
let store: StoreShape
beforeAll(async () => {
  store = await Effect.runPromise(
    Effect.gen(function* () {
      const db = yield* Pglite.open()
      const { store } = StorePg.make(db)
      const a = yield* Lease.make(db, { holder: "a" })
      expect(yield* a.tick).toBe(true)
      yield* db.pool.query(sql`update leases set holder = 'b', epoch = 2 where name = 'reaper'`)
      yield* store.registerHost({ id: "h1", tokenHash: "x" })
      yield* store.reportHost("h1", { totalMib: 65_536, allocatableMib: 65_536, totalVcpus: 64 })
      return store
    }).pipe(Scope.provide(scope)),
  )
}, 120_000)
afterAll(() => Effect.runPromise(Scope.close(scope, Exit.void)))
const setup = Effect.sync(() => store)

describe("a write under a lease is judged by its own fence", () => {
  it.effect("a create under a stale fence beside an unfenced one (either first): the stale one is refused and stores nothing, the other is placed", () =>
    Effect.gen(function* () {
      const store = yield* setup
      for (const staleFirst of [false, true]) {
        const plainCreate = Effect.exit(store.createSession({ id: `s-plain-${staleFirst}`, budget }))
        const staleCreate = Effect.exit(store.createSession({ id: `s-stale-${staleFirst}`, budget }).pipe(Effect.provideService(CurrentFence, stale)))
        const [first, second] = yield* Effect.all(staleFirst ? [staleCreate, plainCreate] : [plainCreate, staleCreate], { concurrency: "unbounded" })
        const [staleExit, plainExit] = staleFirst ? [first, second] : [second, first]
        expect(String(staleExit), `stale first: ${staleFirst}`).toMatch(/fenced/)
        expect(Exit.isExit(plainExit) && Exit.isSuccess(plainExit) ? plainExit.value._tag : String(plainExit), `stale first: ${staleFirst}`).toBe("Placed")
        expect(Exit.isFailure(yield* Effect.exit(store.getSession(`s-stale-${staleFirst}`)))).toBe(true)
      }
    }),
  )

  it.effect("a resume under a stale fence is refused and changes nothing, beside an unfenced one that runs", () =>
    Effect.gen(function* () {
      const store = yield* setup
      for (const id of ["r-plain", "r-stale"]) {
        yield* store.createSession({ id, budget })
        yield* store.markRunning(id)
        yield* store.idle(id)
      }
      const before = (yield* store.getSession("r-stale")).state
      const [plain, fenced] = yield* Effect.all(
        [Effect.exit(store.resume("r-plain")), Effect.exit(store.resume("r-stale").pipe(Effect.provideService(CurrentFence, stale)))],
        { concurrency: "unbounded" },
      )
      expect(String(fenced)).toMatch(/fenced/)
      expect(Exit.isSuccess(plain)).toBe(true)
      expect((yield* store.getSession("r-stale")).state).toBe(before)
    }),
  )

  it.effect("a report under a stale fence is refused and writes nothing", () =>
    Effect.gen(function* () {
      const store = yield* setup
      const e = yield* Effect.exit(store.reportHost("h1", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 2 }).pipe(Effect.provideService(CurrentFence, stale)))
      expect(String(e)).toMatch(/fenced/)
      expect((yield* store.getHost("h1")).report?.totalMib).toBe(65_536)
    }),
  )
})
