// A leader on a link slower than its query timeout (walkthrough: 2 s each way on the leader's
// link to PostgreSQL): its renewals reach the server and commit while it gives up waiting for them. It must stop renewing once past its renew deadline, or the
// row it keeps changing holds every other replica off and nobody leads. Real time with short
// lease times: the test asserts the order of events and a bound in ticks, never how long they took.
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import * as Lease from "../src/Lease.js"
import * as PostgresJs from "../src/PostgresJs.js"

const times = { leaseDurationMs: 6_000, renewDeadlineMs: 4_000 }
const queryTimeoutMs = 1_500
const tickMs = 100

describe("a lease on PostgreSQL whose holder's link is slower than its query timeout", () => {
  it("the holder stops renewing at its deadline, so another replica takes over (not nobody leading)", async () => {
    const database = await freshDatabase()
    const { proxy, url: viaProxy } = await startProxyFor(database.url)
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            // As Lease.layer opens it: one connection, the query timeout as the server's statement_timeout.
            const dbA = yield* PostgresJs.open({ url: viaProxy, poolSize: 1, connectTimeoutSec: 2, statementTimeoutMs: queryTimeoutMs })
            const dbB = yield* PostgresJs.open({ url: database.url, poolSize: 2, migrate: false })
            const a = yield* Lease.make(dbA, { ...times, holder: "a", queryTimeoutMs })
            const b = yield* Lease.make(dbB, { ...times, holder: "b", queryTimeoutMs })
            expect(yield* a.tick).toBe(true)
            expect(yield* b.tick).toBe(false)

            // A's link: 1 s each way, so every answer comes after A's 1.5 s query timeout.
            proxy.delay(1_000)
            let aStoppedAt: number | null = null
            let bTookAt: number | null = null
            // 100 ticks, each at least A's 1.5 s query timeout: over 25 lease durations of real time.
            for (let i = 0; bTookAt === null; i++) {
              if (i > 100) throw new Error("no replica took over within 100 ticks: the holder's late renewals keep the lease alive while it does not lead")
              const [aLeads, bLeads] = yield* Effect.all([a.tick, b.tick], { concurrency: 2 })
              const now = Date.now()
              if (aStoppedAt === null && !aLeads && !a.isLeader()) aStoppedAt = now
              if (aStoppedAt !== null) expect(a.isLeader(), "the stopped holder never leads again while cut off").toBe(false)
              if (bLeads) bTookAt = now
              else yield* Effect.sleep(tickMs)
            }
            expect(aStoppedAt).not.toBeNull()
            expect(aStoppedAt!).toBeLessThanOrEqual(bTookAt)
            expect(b.fence()?.epoch).toBeGreaterThan(1)

            // Healed: A does not lead, B goes on.
            proxy.delay(0)
            expect(yield* a.tick).toBe(false)
            expect(a.isLeader()).toBe(false)
            expect(yield* b.tick).toBe(true)
          }),
        ),
      )
    } finally {
      await proxy.close()
      await database.drop()
    }
  }, 400_000)

  it("a holder cut off past its deadline by refused connections (nothing sent that can land later) renews at once when the database answers again, before anyone takes over", async () => {
    // A long lease against a short deadline: once A is back, it must not wait a whole lease as a
    // newcomer would (the other replica, which saw the last renewal, would take over first).
    const long = { leaseDurationMs: 60_000, renewDeadlineMs: 2_000 }
    // Generous: a refused connection fails at once, and a query that timed out here (a reconnect
    // slowed by a busy machine) would give the lease up, which is the other test's case, not this one's.
    const refusedQueryTimeoutMs = 5_000
    const database = await freshDatabase()
    const { proxy, url: viaProxy } = await startProxyFor(database.url)
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const dbA = yield* PostgresJs.open({ url: viaProxy, poolSize: 1, connectTimeoutSec: 2, statementTimeoutMs: refusedQueryTimeoutMs })
            const dbB = yield* PostgresJs.open({ url: database.url, poolSize: 2, migrate: false })
            const a = yield* Lease.make(dbA, { ...long, holder: "a", queryTimeoutMs: refusedQueryTimeoutMs })
            const b = yield* Lease.make(dbB, { ...long, holder: "b", queryTimeoutMs: refusedQueryTimeoutMs })
            expect(yield* a.tick).toBe(true)
            expect(yield* b.tick).toBe(false)

            // Refused: every connection reset, new ones reset on arrival. A ticks on past its deadline.
            proxy.refuse(true)
            proxy.cut()
            const cutAt = Date.now()
            while (Date.now() - cutAt <= long.renewDeadlineMs + 500) {
              const [aLeads, bLeads] = yield* Effect.all([a.tick, b.tick], { concurrency: 2 })
              expect(bLeads).toBe(false)
              if (Date.now() - cutAt > long.renewDeadlineMs) expect(aLeads).toBe(false)
              yield* Effect.sleep(tickMs)
            }
            expect(a.isLeader()).toBe(false)

            // Back: A renews its row at once (the same epoch); B, which saw the last renewal, never takes over.
            proxy.refuse(false)
            for (let i = 0; ; i++) {
              if (i > 200) throw new Error("A did not lead again within 200 ticks of the database answering")
              const [aLeads, bLeads] = yield* Effect.all([a.tick, b.tick], { concurrency: 2 })
              expect(bLeads, "the other replica took over: the holder waited as a newcomer").toBe(false)
              if (aLeads) break
              yield* Effect.sleep(tickMs)
            }
            expect(a.fence()).toStrictEqual({ name: "reaper", epoch: 1 })
          }),
        ),
      )
    } finally {
      await proxy.close()
      await database.drop()
    }
  }, 400_000)
})
