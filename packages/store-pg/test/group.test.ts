// Group placement on PostgreSQL and PGlite (what the shared suite cannot see): concurrent
// creates share one statement (several on one host bump its version once, on PostgreSQL), a create the
// database refuses inside a batch fails alone while the others of its batch are placed, and a
// store placing creates one by one (`placementBatchSize: 1`) answers the same.
import { Limits } from "@engram/core"
import type { PlaceOutcome, StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect, Exit } from "effect"
import postgres from "@engram/postgres"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"
import type { StorePair } from "../src/StorePg.js"
import { openUrl } from "./open.js"

const limits: Limits.Limits = { ...Limits.defaults, maxEntriesPerNode: 256 }

/** A trigger that refuses some ids as the database would: a unique violation, or another error. */
const refuseSql = `
  create function refuse_some() returns trigger language plpgsql as $$
  begin
    if new.id like 'dup-%' then raise exception 'a concurrent create' using errcode = 'unique_violation'; end if;
    if new.id like 'boom-%' then raise exception 'refused by the database'; end if;
    return new;
  end $$;
  create trigger refuse_some before insert on sessions for each row execute function refuse_some();`

const open = (url: string, options: Partial<StorePg.PgOptions> = {}) => openUrl(url, { limits, ...options })

const hostVersion = async (url: string, id: string): Promise<number> => {
  const sql = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    const rows = await sql<{ version: string }[]>`select version::text as version from hosts where id = ${id}`
    return Number(rows[0]?.version)
  } finally {
    await sql.end()
  }
}

const createAll = (s: StoreShape, ids: readonly string[]) =>
  Effect.runPromise(
    Effect.all(
      ids.map((id) => Effect.exit(s.createSession({ id, budget: { memMib: 512, vcpus: 1 } }))),
      { concurrency: "unbounded" },
    ),
  )

describe("group placement on PostgreSQL", () => {
  let db: TestDatabase
  let store: { pair: StorePair; close: () => Promise<void> }
  beforeAll(async () => {
    db = await freshDatabase()
    store = await open(db.url)
    await Effect.runPromise(
      Effect.andThen(store.pair.store.registerHost({ id: "h1" }), store.pair.store.reportHost("h1", { totalMib: null, allocatableMib: 262144, totalVcpus: 64 })),
    )
  })
  afterAll(async () => {
    await store?.close()
    await db?.drop()
  })

  it("40 creates at once on one host share statements: its version moves by far less than 40", async () => {
    const before = await hostVersion(db.url, "h1")
    const ids = Array.from({ length: 40 }, (_, i) => `g${i}`)
    const exits = await createAll(store.pair.store, ids)
    for (const e of exits) expect(Exit.isSuccess(e) ? e.value._tag : "failed").toBe("Placed")
    const bumps = (await hostVersion(db.url, "h1")) - before
    // One statement per batch bumps the version once; one by one would be 40.
    expect(bumps).toBeGreaterThanOrEqual(1)
    expect(bumps).toBeLessThanOrEqual(4)
    expect(await Effect.runPromise(store.pair.sumsDrift)).toStrictEqual([])
  })

  it("a create the database refuses fails alone; every other create of its batch is placed", async () => {
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      await sql.unsafe(refuseSql)
    } finally {
      await sql.end()
    }
    const good = Array.from({ length: 30 }, (_, i) => `ok-${i}`)
    const exits = await createAll(store.pair.store, [...good.slice(0, 15), "dup-1", "boom-1", ...good.slice(15)])
    const byId = new Map([...good.slice(0, 15), "dup-1", "boom-1", ...good.slice(15)].map((id, i) => [id, exits[i] as Exit.Exit<PlaceOutcome, unknown>]))
    for (const id of good) {
      const e = byId.get(id) as Exit.Exit<PlaceOutcome, unknown>
      expect(Exit.isSuccess(e) ? e.value._tag : `failed: ${String(e.cause)}`, id).toBe("Placed")
    }
    expect(Exit.isFailure(byId.get("dup-1") as Exit.Exit<PlaceOutcome, unknown>)).toBe(true)
    expect(Exit.isFailure(byId.get("boom-1") as Exit.Exit<PlaceOutcome, unknown>)).toBe(true)
    const ids = (await Effect.runPromise(store.pair.store.listSessions())).map((s) => s.id)
    expect(ids.filter((id) => id.startsWith("dup-") || id.startsWith("boom-"))).toStrictEqual([])
    expect(ids.filter((id) => id.startsWith("ok-")).sort()).toStrictEqual([...good].sort())
    expect(await Effect.runPromise(store.pair.sumsDrift)).toStrictEqual([])
  })

  it("placing one by one (placementBatchSize 1) answers as the batches do", async () => {
    const one = await open(db.url, { placementBatchSize: 1 })
    try {
      const before = await hostVersion(db.url, "h1")
      const ids = Array.from({ length: 12 }, (_, i) => `single-${i}`)
      const exits = await createAll(one.pair.store, [...ids, "boom-2"])
      for (const e of exits.slice(0, 12)) expect(Exit.isSuccess(e) ? e.value._tag : "failed").toBe("Placed")
      expect(Exit.isFailure(exits[12] as Exit.Exit<PlaceOutcome, unknown>)).toBe(true)
      // Every placement its own statement.
      expect((await hostVersion(db.url, "h1")) - before).toBe(12)
    } finally {
      await one.close()
    }
  })
})

describe("group placement on PGlite", () => {
  it("60 creates at once are placed without over-commit, and the sums stay equal to the ledger", async () => {
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const pair = yield* StorePg.openPglite({ limits })
          const s = pair.store
          yield* s.registerHost({ id: "h1" })
          yield* s.reportHost("h1", { totalMib: null, allocatableMib: 65536, totalVcpus: 16 })
          yield* s.registerHost({ id: "h2" })
          yield* s.reportHost("h2", { totalMib: null, allocatableMib: 8192, totalVcpus: 4 })
          const outcomes = yield* Effect.all(
            Array.from({ length: 60 }, (_, i) => s.createSession({ id: `p${i}`, budget: { memMib: 1024, vcpus: 1 } })),
            { concurrency: "unbounded" },
          )
          // 72 GiB of room for 60 GiB of creates: every one placed, none over-committed.
          expect(outcomes.filter((o) => o._tag === "Placed")).toHaveLength(60)
          const h1 = yield* s.getHost("h1")
          const h2 = yield* s.getHost("h2")
          expect(h1.headroom.reserved.memMib + h2.headroom.reserved.memMib).toBe(60 * 1024)
          expect(h2.headroom.reserved.memMib).toBeLessThanOrEqual(8192)
          expect(h1.entries + h2.entries).toBe(60)
          expect(yield* pair.sumsDrift).toStrictEqual([])
        }),
      ),
    )
  })
})
