// A silent partition of the leader (SPEC §13, "Leadership is a lease with fencing"), on a real
// PostgreSQL: the leader's connection goes through a proxy that stalls (packets held, no reset,
// as a partition looks until TCP gives up). The leader cannot renew, stops acting by itself at
// its renew deadline; the other replica takes over only after that, at the next epoch; once the
// partition heals, the old leader's writes are refused in their own transaction and it does not
// lead again. Real time with short lease times: the test asserts the order of events, never how
// long they took.
import { CurrentFence } from "@engram/store"
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import { Effect, Exit } from "effect"
import { describe, expect, it } from "vitest"
import * as Lease from "../src/Lease.js"
import * as PostgresJs from "../src/PostgresJs.js"
import * as StorePg from "../src/StorePg.js"

// Lease times short enough for a test, long enough that a starved 2-core machine (a query or a
// tick late by a second or more) still sees each step: the order is asserted, never the time.
const times = { leaseDurationMs: 6_000, renewDeadlineMs: 4_000 }
const queryTimeoutMs = 1_500
const tickMs = 100

describe("a lease on PostgreSQL through a silent partition", () => {
  it("the partitioned leader stops by itself before the other replica takes over; healed, its writes are refused", async () => {
    const database = await freshDatabase()
    const { proxy, url: viaProxy } = await startProxyFor(database.url)
    try {
      await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            // Replica A reaches the database through the proxy; replica B directly.
            const dbA = yield* PostgresJs.open({ url: viaProxy, poolSize: 2, connectTimeoutSec: 2 })
            const dbB = yield* PostgresJs.open({ url: database.url, poolSize: 2, migrate: false })
            const a = yield* Lease.make(dbA, { ...times, holder: "a", queryTimeoutMs })
            const b = yield* Lease.make(dbB, { ...times, holder: "b", queryTimeoutMs })
            const storeA = StorePg.make(dbA).store
            const storeB = StorePg.make(dbB).store
            yield* storeB.registerHost({ id: "h1", tokenHash: "x" })
            yield* storeB.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })

            expect(yield* a.tick).toBe(true)
            expect(a.fence()).toStrictEqual({ name: "reaper", epoch: 1 })
            expect(yield* b.tick).toBe(false)
            const epochOfA = a.fence()!

            // The partition: A's packets are held, nothing is reset.
            proxy.stall(true)
            let aStoppedAt: number | null = null
            let bTookAt: number | null = null
            for (let i = 0; bTookAt === null; i++) {
              if (i > 1_500) throw new Error("no takeover within 1,500 ticks")
              const [aLeads, bLeads] = yield* Effect.all([a.tick, b.tick], { concurrency: 2 })
              const now = Date.now()
              // While B does not lead, A may still act within its deadline; once A stops it stays stopped.
              if (aStoppedAt === null && !aLeads && !a.isLeader()) aStoppedAt = now
              if (aStoppedAt !== null) expect(a.isLeader(), "a partitioned leader never leads again").toBe(false)
              if (bLeads) bTookAt = now
              else yield* Effect.sleep(tickMs)
            }
            // A stopped by itself first: two leaders never act at once.
            expect(aStoppedAt).not.toBeNull()
            expect(aStoppedAt!).toBeLessThanOrEqual(bTookAt)
            expect(b.fence()).toStrictEqual({ name: "reaper", epoch: 2 })

            // An external reservation expires; reclaiming it is the reaper's write.
            yield* storeB.reserve({ id: "r1", hostId: "h1", ownerKind: "external", ownerId: "x", memMib: 512, vcpus: 1, expiresAt: Date.now() + 200 })
            while (Date.now() <= (yield* storeB.getReservation("r1")).expiresAt!) yield* Effect.sleep(tickMs)

            // Healed: A's reclaim under its old epoch (a pass it began before the partition) is refused whole.
            proxy.stall(false)
            const refused = yield* Effect.exit(storeA.reclaim().pipe(Effect.provideService(CurrentFence, epochOfA)))
            expect(Exit.isFailure(refused)).toBe(true)
            expect(String(refused)).toMatch(/fenced: lease reaper is at epoch 2, this write was made under epoch 1/)
            expect((yield* storeB.getReservation("r1")).id, "the refused pass changed nothing").toBe("r1")
            // B, the leader, reclaims it under its epoch.
            const done = yield* storeB.reclaim().pipe(Effect.provideService(CurrentFence, b.fence()!))
            expect(done.reclaimed.map((r) => r.id)).toStrictEqual(["r1"])
            // A looks again: the lease is B's; A does not lead, B goes on.
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
})
