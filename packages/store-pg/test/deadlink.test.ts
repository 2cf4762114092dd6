// A link to PostgreSQL that dies silently (a failover to another machine, a network black hole):
// the old peer never sends a reset, so the driver learns nothing until the kernel gives up on
// its unacknowledged bytes (`tcp_retries2`, about 15 minutes). Before `unanswered_timeout`, the
// connections on such a link kept their statements and took a share of the new ones all that
// time: the store's calls failed (or hung), a transaction interrupted there never finished its
// rollback, and the lease's one connection never renewed. With a statement bound, a connection
// that hears nothing past it (`PostgresJs.unansweredAfterMs`) is dropped and reconnects.
// The proxy black-holes the connections open at the time and lets new ones through. Real
// time with a 1 s statement bound; the test asserts only that every call is answered and that
// calls eventually succeed, each within a generous bound, never how long anything took.
import { Store } from "@engram/store"
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import type { CuttableProxy, TestDatabase } from "@engram/test-pg"
import { sql } from "drizzle-orm"
import { Deferred, Effect, Exit, Fiber, ManagedRuntime } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Lease from "../src/Lease.js"
import * as PostgresJs from "../src/PostgresJs.js"
import { StorePg } from "../src/index.js"

const statementTimeoutMs = 1_000

let db: TestDatabase
let proxy: CuttableProxy
let proxiedUrl: string

beforeAll(async () => {
  db = await freshDatabase()
  const through = await startProxyFor(db.url)
  proxy = through.proxy
  proxiedUrl = through.url
})

afterAll(async () => {
  await proxy.close()
  await db.drop()
})

/** The promise's outcome, or "no answer" once `ms` passed: a hang detector, not a timing check. */
const answered = <A>(p: Promise<A>, ms = 30_000): Promise<{ ok: A } | { error: string } | "no answer"> =>
  Promise.race([
    p.then(
      (ok) => ({ ok }),
      (e: unknown) => ({ error: String(e) }),
    ),
    new Promise<"no answer">((resolve) => setTimeout(() => resolve("no answer"), ms).unref()),
  ])

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

describe("the store when its link to PostgreSQL dies silently", () => {
  it("answers every call, and serves again through fresh connections once the dead ones are dropped", async () => {
    const runtime = ManagedRuntime.make(StorePg.layer({ url: proxiedUrl, poolSize: 3, connectTimeoutSec: 2, statementTimeoutMs }))
    try {
      await runtime.runPromise(
        Store.use((s) =>
          Effect.gen(function* () {
            yield* s.registerHost({ id: "h1" })
            yield* s.reportHost("h1", { totalMib: 1 << 20, allocatableMib: 1 << 20, totalVcpus: 1024 })
          }),
        ),
      )
      let n = 0
      // A create (a transaction) or a list (a pool statement), by turns.
      const call = (i: number): Effect.Effect<void, unknown, Store> =>
        i % 2 === 0
          ? Store.use((s) => s.createSession({ id: `s-${n++}`, budget: { memMib: 64, vcpus: 1 } })).pipe(Effect.asVoid)
          : Store.use((s) => s.listSessions()).pipe(Effect.asVoid)
      // Every connection of the pool in use.
      await Promise.all(Array.from({ length: 12 }, (_, i) => runtime.runPromise(call(i))))

      proxy.blackHole()
      // Calls sent onto the dead connections, unbounded (the coordinator bounds them, the store
      // does not): each must get an answer. Before, they waited for the kernel (minutes).
      const stranded = Array.from({ length: 12 }, (_, i) => answered(runtime.runPromiseExit(call(i))))
      // Calls bounded as the coordinator bounds them, in rounds, until a whole round succeeds.
      let served = false
      for (let round = 0; !served; round++) {
        if (round > 40) throw new Error("the store never served a whole round again after its link died")
        const outcomes = await Promise.all(
          Array.from({ length: 6 }, (_, i) =>
            answered(runtime.runPromiseExit(call(i).pipe(Effect.timeout(2 * statementTimeoutMs)))),
          ),
        )
        expect(outcomes.filter((o) => o === "no answer")).toStrictEqual([])
        served = outcomes.every((o) => o !== "no answer" && "ok" in o && Exit.isSuccess(o.ok))
        if (!served) await pause(200)
      }
      const outcomes = await Promise.all(stranded)
      expect(outcomes.filter((o) => o === "no answer")).toStrictEqual([])
      // The link did die under them: some failed.
      expect(outcomes.some((o) => o !== "no answer" && "ok" in o && Exit.isFailure(o.ok))).toBe(true)
      // Those that failed failed as the store's Unavailable, not a defect.
      for (const o of outcomes) if (o !== "no answer" && "ok" in o && Exit.isFailure(o.ok)) expect(JSON.stringify(o.ok.cause)).toContain("Unavailable")
    } finally {
      await runtime.dispose()
    }
  })
})

describe("a connection of one when its link dies silently", () => {
  it("a transaction interrupted there finishes its rollback and gives the connection back; the next one runs", async () => {
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          // As the lease's connection is opened: one connection, a statement bound.
          const tdb = yield* PostgresJs.open({ url: proxiedUrl, poolSize: 1, connectTimeoutSec: 2, statementTimeoutMs, migrate: false })
          const inside = yield* Deferred.make<void>()
          const holder = yield* Effect.forkDetach(
            tdb.transaction((tx) => tx.query(sql`select 1`).pipe(Effect.andThen(Deferred.succeed(inside, undefined)), Effect.andThen(Effect.never))),
          )
          yield* Deferred.await(inside)
          proxy.blackHole()
          // The caller gives up (its bound): the rollback goes to the dead socket. Before, the
          // interruption waited for it, and the connection stayed reserved, for minutes.
          const interrupted = yield* Effect.promise(() => answered(Effect.runPromise(Fiber.interrupt(holder))))
          expect(interrupted).not.toBe("no answer")
          const next = yield* Effect.promise(() => answered(Effect.runPromise(tdb.transaction((tx) => tx.query<{ two: number }>(sql`select 2 as two`)))))
          expect(next).toEqual({ ok: [{ two: 2 }] })
        }),
      ),
    )
  })

  it("the lease's holder renews again through a fresh connection", async () => {
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          // As Lease.layer opens it (the migrations too: the leases table).
          const leaseDb = yield* PostgresJs.open({ url: proxiedUrl, poolSize: 1, connectTimeoutSec: 2, statementTimeoutMs })
          const a = yield* Lease.make(leaseDb, { leaseDurationMs: 120_000, renewDeadlineMs: 100_000, holder: "a", queryTimeoutMs: statementTimeoutMs })
          expect(yield* a.tick).toBe(true)
          proxy.blackHole()
          // A renewal onto the dead connection fails (its query bound): the lease goes unrenewed
          // for at least that long. A later renewal, through a fresh connection, resets that.
          yield* a.tick
          const afterFailure = a.unrenewedMs()
          expect(afterFailure).toBeGreaterThan(0)
          for (let ticks = 0; a.unrenewedMs() >= afterFailure; ticks++) {
            // Well within the renew deadline (each tick takes at most about the query bound).
            if (ticks > 60) throw new Error("the lease never renewed again after its link died")
            yield* Effect.sleep(100)
            yield* a.tick
          }
          expect(a.isLeader()).toBe(true)
        }),
      ),
    )
  })
})
