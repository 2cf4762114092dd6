// The locking host choice (`Locks.pickAndLock`) never waits on a host while it holds one it
// rejected. It locks hosts in rank order (skipping held ones); a host that fails its re-check
// under the lock (a lost race: the cache said it fits, the row says no longer) is released before
// the choice goes on. It used to stay locked: a choice that then waited for a held host (h1) while
// holding the rejected one (h2) closed a circle with any transaction that locks hosts in id order
// (a queue drain, a move's commit, a group of creates), one the server broke after
// `deadlock_timeout` by failing one side: a stall of a second under exactly the contention where
// races happen.
import { Limits } from "@engram/core"
import type { Placement } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { migrate } from "../src/index.js"
import { readHostRows, toCandidate } from "../src/HostRows.js"
import { pickAndLock } from "../src/Locks.js"
import { makeDb } from "../src/PostgresJs.js"

const now = 1_000_000
const req: Placement.Request = { budget: { memMib: 512, vcpus: 1 }, affinity: [], now }
const limits = Limits.defaults

/** The outcome of a row lock from another connection: the ids locked, or the error's SQLSTATE. */
const outcome = (p: Promise<readonly Record<string, unknown>[]>): Promise<string[] | string> =>
  p.then(
    (rows) => rows.map((r) => r["id"] as string),
    (e: { code?: string; message?: string }) => `${e.code}: ${e.message}`,
  )

/** Two ready hosts with room (h1, h2); the picker's view of them (its host cache), read now; then h2 filled behind its back. */
const setUp = async (url: string, sql: postgres.Sql) => {
  await migrate(url)
  for (const id of ["h1", "h2"])
    await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
      values (${id}, 'ready', 65536, 65536, 64, ${now}, 0, 0, 0, 0)`
  const pool = postgres(url, { max: 4, onnotice: () => undefined, connection: { application_name: "picker" } })
  const db = makeDb(pool)
  const known = (await Effect.runPromise(readHostRows(db.pool, { columns: "room" }))).map((r) => toCandidate(r, limits))
  expect(known.map((c) => c.id).sort()).toStrictEqual(["h1", "h2"])
  // Another replica fills h2: the picker's cache still says it has room.
  await sql`update hosts set reserved_mem_mib = 65536, version = nextval('hosts_version_seq') where id = 'h2'`
  return { pool, db, known }
}

/** `run` on a fresh database set up as `setUp` does, with a connection of its own (`sql`); everything closed after. */
const withPicker = async (run: (o: { readonly sql: postgres.Sql } & Omit<Awaited<ReturnType<typeof setUp>>, "pool">) => Promise<void>): Promise<void> => {
  const pgdb = await freshDatabase()
  const sql = postgres(pgdb.url, { max: 4, onnotice: () => undefined })
  try {
    const { pool, db, known } = await setUp(pgdb.url, sql)
    try {
      await run({ sql, db, known })
    } finally {
      await pool.end()
    }
  } finally {
    await sql.end()
    await pgdb.drop()
  }
}

describe("the locking host choice", () => {
  it("releases a host that failed its re-check before it waits for a held one: no deadlock with an id-order locker", () =>
    withPicker(async ({ sql, db, known }) => {
      // B (a drain, a commit: an id-order locker) holds h1.
      const b = await sql.reserve()
      await b`begin`
      await b`select id from hosts where id = 'h1' for no key update`
      // A chooses: h1 is held, so it locks h2, which no longer fits; h1 is all that is left, so it waits for it.
      const picking = Effect.runPromise(
        db.transaction((tx) =>
          Effect.gen(function* () {
            const picked = yield* pickAndLock(tx, req, limits, known)
            // Under A's locks, from outside: the host it chose is held, the one it rejected is not.
            const probes = yield* Effect.promise(() =>
              Promise.all(["h1", "h2"].map((id) => outcome(sql.begin((p) => p`select id from hosts where id = ${id} for no key update nowait`)))),
            )
            return { picked, probes }
          }),
        ),
      )
      picking.catch(() => undefined)
      let waiting = false
      // A waits for a lock (polled, bounded: 60 s)...
      for (let k = 0; k < 600 && !waiting; k++) {
        const rows = await sql`select wait_event_type from pg_stat_activity where application_name = 'picker' and state = 'active'`
        waiting = rows.some((r) => r["wait_event_type"] === "Lock")
        if (!waiting) await new Promise((r) => setTimeout(r, 100))
      }
      // ...and B, still holding h1, takes h2 in id order: it is free (A released it), so no circle.
      const bTakesH2 = await outcome(b`select id from hosts where id = 'h2' for no key update`)
      await b`commit`.catch(() => undefined)
      b.release()
      const { picked, probes } = await picking
      expect(waiting).toBe(true)
      expect(bTakesH2).toStrictEqual(["h2"])
      expect(db.conflicts().deadlocks).toBe(0)
      expect(picked).toMatchObject({ _tag: "Chosen", hostId: "h1" })
      expect(probes[0]).toMatch(/^55P03/)
      expect(probes[1]).toStrictEqual(["h2"])
    }), 120_000)

  it("holds no host it rejected when nothing fits", () =>
    withPicker(async ({ sql, db, known }) => {
      const onlyH2 = known.filter((c) => c.id === "h2")
      const { picked, probe } = await Effect.runPromise(
        db.transaction((tx) =>
          Effect.gen(function* () {
            const picked = yield* pickAndLock(tx, req, limits, onlyH2)
            const probe = yield* Effect.promise(() => outcome(sql.begin((p) => p`select id from hosts where id = 'h2' for no key update nowait`)))
            return { picked, probe }
          }),
        ),
      )
      expect(picked._tag).toBe("NoFit")
      expect(probe).toStrictEqual(["h2"])
    }), 120_000)
})
