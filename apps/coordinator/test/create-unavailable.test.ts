// A create whose store call fails (the database down, or a call that timed out after it may
// have committed): the 503 names the session id the coordinator chose when the client gave
// none, so a retry with that id is answered as a repeat, not made twice.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store, Unavailable } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "create-unavailable-admin-token-0123456789"
let c: RunningCoordinator

beforeAll(async () => {
  const failing = Layer.effect(
    Store,
    Effect.gen(function* () {
      const store = yield* Store
      return Store.of({ ...store, createSession: () => Effect.fail(new Unavailable({ reason: "the database did not answer within 15000 ms", retryAfterMs: 1000, kind: "timed_out" })) })
    }),
  ).pipe(Layer.provide(StoreSim.layer()))
  c = await startCoordinator({ store: failing, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

describe("a create the store could not answer", () => {
  it("without an id: the 503 names the id chosen, to retry with; with one: the message is the store's alone", async () => {
    const admin = client(c.url, adminToken)
    const chosen = await admin.post("/v1/sessions", { memMib: 512, vcpus: 1 })
    expect(chosen.status).toBe(503)
    const id = /this create's session id was ([0-9a-f-]{36}): retry with "id": "\1"/.exec(String(chosen.body.message))?.[1]
    expect(id, String(chosen.body.message)).toBeDefined()
    const given = await admin.post("/v1/sessions", { id: "s-given", memMib: 512, vcpus: 1 })
    expect(given.status).toBe(503)
    expect(String(given.body.message)).not.toContain("this create's session id")
  })
})
