// A session wait refused by the long-poll caps (429) reads nothing from the store. Before, the
// handler read the session (the caller's right to it) before the caps were asked: every refused
// wait of a runaway client still cost a store read. And an admin's wait reads its session once.
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
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

describe("a session wait beyond the long-poll caps", () => {
  it("is a 429 that reads nothing from the store", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/sessions", { id: "held", memMib: 64, vcpus: 1 })).status).toBe(202)
    const open = admin.get("/v1/sessions/held/wait?state=running&timeoutMs=3000")
    await vi.waitFor(async () => expect(await c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))).toBe(1), { timeout: 30_000, interval: 20 })
    const before = reads
    const refused = await Promise.all(Array.from({ length: 20 }, () => admin.get("/v1/sessions/held/wait?state=running&timeoutMs=3000")))
    expect(refused.map((r) => r.status)).toEqual(Array.from({ length: 20 }, () => 429))
    expect(reads - before).toBe(0)
    expect((await open).status).toBe(408)
  })

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
