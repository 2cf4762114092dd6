// A session wait refused by the long-poll caps (429) reads nothing from the store. Before, the
// handler read the session (the caller's right to it) before the caps were asked: every refused
// wait of a runaway client still cost a store read. And an admin's wait reads its session once.
import { assert, describe as describeEffect, it as itEffect } from "@effect/vitest"
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Context, Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { answered, clockedCoordinator } from "./support/clocked.js"
import { client } from "./support/http.js"

const adminToken = "wait-cap-reads-admin-token-0123456789"
let reads = 0
/** The in-memory store, counting its session reads. */
const counting = Layer.effect(
  Store,
  Effect.map(Store, (store) => Store.of({ ...store, getSession: (id) => Effect.andThen(Effect.sync(() => void reads++), store.getSession(id)) })),
).pipe(Layer.provide(StoreSim.layer()))

let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: counting, reaper: false, logLevel: "None", config: { port: 0, adminToken, maxWaits: 1 } })
})
afterAll(async () => {
  await c.stop()
})

describeEffect("a session wait beyond the long-poll caps (TestClock)", () => {
  // The coordinator runs whole (HTTP, the counting in-memory store) on the test's clock: the held
  // wait's deadline comes only when the test moves the clock, after the refused waits, however
  // slow the machine.
  itEffect.effect("is a 429 that reads nothing from the store", () =>
    Effect.gen(function* () {
      const { url, context } = yield* clockedCoordinator({ store: counting, reaper: false, config: { port: 0, adminToken, maxWaits: 1 } })
      const admin = client(url, adminToken)
      const longPolls = Context.get(context, LongPolls)
      const http = <A>(request: () => Promise<A>) => Effect.promise(request)
      assert.strictEqual((yield* http(() => admin.post("/v1/sessions", { id: "held", memMib: 64, vcpus: 1 }))).status, 202)
      const open = yield* Effect.forkChild(http(() => admin.get("/v1/sessions/held/wait?state=running&timeoutMs=3000")))
      yield* http(() => vi.waitFor(() => expect(longPolls.open()).toBe(1), { timeout: 30_000, interval: 20 }))
      const before = reads
      const refused = yield* answered("the refused waits", http(() => Promise.all(Array.from({ length: 20 }, () => admin.get("/v1/sessions/held/wait?state=running&timeoutMs=3000")))))
      assert.deepStrictEqual(refused.map((r) => r.status), Array.from({ length: 20 }, () => 429))
      assert.strictEqual(reads - before, 0)
      // The held wait's deadline: only now.
      yield* TestClock.adjust(3000)
      assert.strictEqual((yield* answered("the held wait past its deadline", Fiber.join(open))).status, 408)
    }).pipe(Effect.scoped),
  )
})

describe("a session wait beyond the long-poll caps", () => {
  it("an admin's wait reads its session once (no read of its right first); a host's agent's reads it for its right too; an unknown session is still 404", async () => {
    const admin = client(c.url, adminToken)
    const host = await admin.post("/v1/hosts", { id: "wcr-h1" })
    expect(host.status).toBe(201)
    expect((await admin.put("/v1/hosts/wcr-h1/report", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 })).status).toBe(200)
    expect((await admin.post("/v1/sessions", { id: "placed", memMib: 64, vcpus: 1, affinity: ["wcr-h1"] })).status).toBe(201)
    let before = reads
    expect((await admin.get("/v1/sessions/placed/wait?state=pending&timeoutMs=3000")).status).toBe(200)
    expect(reads - before).toBe(1)
    before = reads
    expect((await client(c.url, host.body.token as string).get("/v1/sessions/placed/wait?state=pending&timeoutMs=3000")).status).toBe(200)
    expect(reads - before).toBe(2)
    const unknown = await admin.get("/v1/sessions/nope/wait?state=running&timeoutMs=3000")
    expect([unknown.status, unknown.body.error]).toEqual([404, "NotFound"])
  })
})
