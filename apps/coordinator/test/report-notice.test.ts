// A host report sends the fleet's room notice (and starts a drain) only when the store says it
// changed the host's figures (`ReportedHost.figuresChanged`): an agent re-reporting the same
// figures every interval costs no notice (each one a transaction of its own on PostgreSQL).
import { assert, describe as describeEffect, it as itEffect } from "@effect/vitest"
import { Coordinator, CoordinatorInfo, Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { Topic } from "@engram/store"
import { Context, Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout as delay } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "report-notice-admin-token-0123456789"

/** Whether a fleet notice arrives at `c` while `act` runs (the waiter is registered before it starts). */
const noticed = async (c: RunningCoordinator, act: () => Promise<unknown>, waitMs: number): Promise<boolean> => {
  const woken = c.run(Effect.flatMap(Effect.service(Notifier), (n) => n.wait([Topic.fleet], waitMs)))
  await act()
  return woken
}

describe("report notices", () => {
  let dir: string
  let c: RunningCoordinator
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "engram-report-notice-"))
    c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, dataDir: dir, adminToken } })
  })
  afterAll(async () => {
    await c?.stop()
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true })
  })


  it("the first report and a changed one notify; the same figures again do not", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "rn-h1" })).status).toBe(201)
    const report = (allocatableMib: number) => async () => {
      const r = await admin.put("/v1/hosts/rn-h1/report", { totalMib: 16384, allocatableMib, totalVcpus: 8 })
      expect(r.status).toBe(200)
      expect(r.body.report.allocatableMib).toBe(allocatableMib)
    }
    expect(await noticed(c, report(12288), 20_000)).toBe(true)
    // Nothing else notifies the fleet here (no reaper): a notice within a second would be this report's.
    expect(await noticed(c, report(12288), 1000)).toBe(false)
    expect(await noticed(c, report(8192), 20_000)).toBe(true)
  })
})

describeEffect("a silent host's report (TestClock)", () => {
  // The coordinator runs whole (HTTP, PGlite under its data directory) on the test's clock: the
  // host falls silent when the clock passes the stale window, and no window passes again unless
  // the test moves the clock, however slow the machine (the store's batching waits real time).
  const windowMs = 3000

  itEffect.effect("a create queues with the reason silent; the host's next report (the same figures) ends the silence, notifies and drains the queue onto it", () =>
    Effect.gen(function* () {
      // Real-looking times (the data directory's lock is touched at the clock's now).
      yield* TestClock.setTime(Date.now())
      const dir = mkdtempSync(join(tmpdir(), "engram-report-silent-"))
      // Added first, run last: after the coordinator's scope has closed.
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
      const context = yield* Layer.build(
        Coordinator.layer({
          reaper: false,
          config: { port: 0, dataDir: dir, adminToken, limits: { ...Limits.defaults, heartbeatStaleWindowMs: windowMs } },
        }).pipe(Layer.provide(Coordinator.loggerLayer("Error"))),
      )
      const admin = client(Context.get(context, CoordinatorInfo).url, adminToken)
      const notifier = Context.get(context, Notifier)
      const http = <A>(request: () => Promise<A>) => Effect.promise(request)
      const report = () => http(() => admin.put("/v1/hosts/rs-h1/report", { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 }))

      assert.strictEqual((yield* http(() => admin.post("/v1/hosts", { id: "rs-h1" }))).status, 201)
      assert.strictEqual((yield* report()).status, 200)
      // The agent falls silent: the clock passes the window with no report.
      yield* TestClock.adjust(windowMs + 1)
      const q = yield* http(() => admin.post("/v1/sessions", { id: "rs-q", memMib: 1024, vcpus: 1 }))
      assert.strictEqual(q.status, 202, JSON.stringify(q.body))
      assert.deepStrictEqual(q.body.noFit, [{ hostId: "rs-h1", reason: "silent", freeMib: 11264, freeVcpus: 32 }])
      // The same figures again: no change but the silence's end, which notifies the fleet and
      // wakes the drain. The waiter is registered before the report is sent; on the test's clock
      // its own deadline never comes, so a report that sends no notice answers false after a
      // generous real bound.
      const woken = yield* Effect.forkChild(notifier.wait([Topic.fleet], 60_000))
      yield* Effect.yieldNow
      assert.strictEqual((yield* report()).status, 200)
      const noticed = yield* Effect.raceFirst(Fiber.join(woken), Effect.as(Effect.promise((signal) => delay(20_000, undefined, { signal })), false))
      assert.isTrue(noticed, "the report that ended the silence sent no fleet notice")
      // The report answers after the drain it started (`Drainer.roomAppeared`); polled all the
      // same, up to a generous real bound, with the clock standing still (the host stays fresh).
      let session = (yield* http(() => admin.get("/v1/sessions/rs-q"))).body
      for (let i = 0; i < 200 && session.state !== "pending"; i++) {
        yield* Effect.promise(() => delay(50))
        session = (yield* http(() => admin.get("/v1/sessions/rs-q"))).body
      }
      assert.deepInclude(session, { state: "pending", hostId: "rs-h1" })
    }).pipe(Effect.scoped),
  )
})
