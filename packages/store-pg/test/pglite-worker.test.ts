// PGlite in a worker thread (`Pglite.open({ worker: true })`): what the conformance suite does not
// show — rows and errors cross the thread as they are, a data directory survives the thread, and
// a thread that is gone answers Unavailable; and an abandoned engine (worker or not) writes nothing more.
import { describe, expect, it } from "@effect/vitest"
import { createHash } from "node:crypto"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { sql } from "drizzle-orm"
import { Effect, Exit } from "effect"
import type { PGlite } from "@electric-sql/pglite"
import { classify } from "../src/Db.js"
import * as Pglite from "../src/Pglite.js"

describe("PGlite in a worker thread", () => {
  it("answers rows, keeps a data directory across threads, names a unique violation, and is Unavailable once closed", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-pglite-worker-"))
    try {
      const first = await Pglite.startWorker({ dataDir: dir })
      const db = Pglite.makeDb(first.client as PGlite)
      await Effect.runPromise(db.pool.query(sql`create table t (id text primary key, n bigint)`))
      await Effect.runPromise(db.pool.query(sql`insert into t values (${"a"}, ${1})`))
      // A unique violation keeps its SQLSTATE and constraint across the thread.
      const dup = await first.client.query("insert into t values ('a', 2)").then(
        () => undefined,
        (e: unknown) => e,
      )
      expect(classify(dup)).toMatchObject({ _tag: "Fail", error: { _tag: "UniqueViolation", constraint: "t_pkey" } })
      await first.close()
      // Closed: every call is Unavailable, nothing hangs.
      const after = await Effect.runPromiseExit(db.pool.query(sql`select 1`))
      expect(Exit.isFailure(after) && JSON.stringify(after.cause)).toContain("Unavailable")

      // A new thread on the same directory finds the row (and the migrations applied once).
      const second = await Pglite.startWorker({ dataDir: dir })
      const rows = await Effect.runPromise(Pglite.makeDb(second.client as PGlite).pool.query<{ id: string; n: string }>(sql`select id, n::text from t`))
      expect(rows).toStrictEqual([{ id: "a", n: "1" }])
      await second.close()
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("a thread that ends while open is said once (onWorkerExit), its statements answer Unavailable; a close is not such an end", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-pglite-worker-"))
    try {
      const ended: string[] = []
      const w = await Pglite.startWorker({ dataDir: dir, onWorkerExit: (why) => ended.push(why) })
      const db = Pglite.makeDb(w.client as PGlite)
      expect(await Effect.runPromise(db.pool.query<{ n: number }>(sql`select 1 as n`))).toStrictEqual([{ n: 1 }])
      // The thread ends as a crash would end it, from outside the database.
      await w.thread.terminate()
      expect(ended).toHaveLength(1)
      expect(ended[0]).toMatch(/^the PGlite worker thread ended: exit code/)
      const after = await Effect.runPromiseExit(db.pool.query(sql`select 1`))
      expect(Exit.isFailure(after) && JSON.stringify(after.cause)).toContain("Unavailable")
      await w.close()
      expect(ended).toHaveLength(1)

      // A close, and the thread's end that follows it, are not said.
      const closed: string[] = []
      const again = await Pglite.startWorker({ dataDir: dir, onWorkerExit: (why) => closed.push(why) })
      await again.close()
      expect(closed).toStrictEqual([])
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

})

describe("PGlite abandoned (Pglite.ConnectOptions.abandon)", () => {
  /** Every file under `dir` and a hash of its bytes: what a close or a statement wrote shows. */
  const contents = (dir: string): Record<string, string> =>
    Object.fromEntries(
      readdirSync(dir, { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile())
        .map((e) => {
          const path = join(e.parentPath, e.name)
          return [path.slice(dir.length), createHash("sha256").update(readFileSync(path)).digest("hex")]
        })
        .sort(([a], [b]) => (a! < b! ? -1 : 1)),
    )

  for (const worker of [true, false]) {
    it(`(its data directory taken over by another process) ${worker ? "in a worker thread" : "in this thread"}: it writes nothing more, not even its close's checkpoint, and every statement answers Unavailable; onWorkerExit is not told`, async () => {
      const dir = mkdtempSync(join(tmpdir(), "engram-pglite-abandon-"))
      try {
        const ended: string[] = []
        const run = (abandon: AbortController | null) =>
          Effect.runPromise(
            Effect.scoped(
              Effect.gen(function* () {
                const db = yield* Pglite.open({ dataDir: dir, worker, abandon: abandon?.signal, onWorkerExit: (why) => ended.push(why) })
                yield* db.pool.query(sql`create table if not exists t (n bigint)`)
                yield* db.pool.query(sql`insert into t select generate_series(1, 1000)`)
                if (abandon === null) return { before: contents(dir), refused: null }
                abandon.abort("the lock names another coordinator")
                const before = contents(dir)
                const refused = yield* Effect.exit(db.pool.query(sql`insert into t values (0)`))
                return { before, refused }
              }),
            ),
          )
        // Not abandoned, the close writes the directory (its checkpoint): what the other case must not do.
        const kept = await run(null)
        expect(contents(dir)).not.toStrictEqual(kept.before)
        const dropped = await run(new AbortController())
        expect(Exit.isFailure(dropped.refused!) && JSON.stringify(dropped.refused.cause)).toContain("Unavailable")
        expect(Exit.isFailure(dropped.refused!) && JSON.stringify(dropped.refused.cause)).toContain("the lock names another coordinator")
        expect(contents(dir)).toStrictEqual(dropped.before)
        expect(ended).toStrictEqual([])
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    })
  }
})
