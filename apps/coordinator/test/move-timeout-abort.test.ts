/* eslint-disable @typescript-eslint/no-explicit-any -- test bodies are read loosely; each assertion states the shape it expects */
// A move no agent takes up is aborted by its waiter at ENGRAM_MOVE_TIMEOUT_MS, and that abort is
// announced even when the operator's `POST /v1/sessions/{id}/move` leaves (or the coordinator
// shuts down) after the abort committed and before its notices went out. Before, the waiter's
// abort, re-read and notices ran in the request's fiber unprotected: cut there, the abort stood
// unannounced and the source's cached assignments listed the move pending for ever (its agent
// would start a move the store had aborted). The store here commits the abort, then holds its
// answer until the client has gone. Real HTTP, a real coordinator.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer } from "effect"
import { afterAll, beforeAll, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "move-timeout-abort-admin-token-0123456789"
let c: RunningCoordinator
let armed = false
let committed: () => void = () => undefined
const release = Deferred.makeUnsafe<void>()

beforeAll(async () => {
  const gated = Layer.effect(
    Store,
    Effect.map(Store, (store) =>
      Store.of({
        ...store,
        // The abort commits; its answer comes back late (a database's reply on a busy pool).
        abortMove: (id, reason, options) =>
          Effect.tap(store.abortMove(id, reason, options), () => (armed ? Effect.andThen(Effect.sync(() => committed()), Deferred.await(release)) : Effect.void)),
      }),
    ),
  ).pipe(Layer.provide(StoreSim.layer()))
  // The source's assignments must be read (and cached) with the move pending before the timeout's
  // abort commits: seconds of margin for that read on a loaded machine.
  c = await startCoordinator({ store: gated, reaper: false, logLevel: "Error", config: { port: 0, adminToken, moveTimeoutMs: 5000 } })
})
afterAll(() => c?.stop())

it("a timed-out move's abort is announced though the move's client left while the abort was answered", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h1 = (await admin.post("/v1/hosts", { id: "h1" })).body
  await admin.post("/v1/hosts", { id: "h2" })
  for (const h of ["h1", "h2"]) await admin.put(`/v1/hosts/${h}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8, peerUrl: `http://${h}:7000` })
  const agent = client(c.url, h1.token)
  expect((await admin.post("/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["h1"] })).body.hostId).toBe("h1")
  await agent.post("/v1/sessions/s1/started")
  armed = true
  const abortCommitted = new Promise<void>((r) => (committed = r))
  const leave = new AbortController()
  const sent = fetch(`${c.url}/v1/sessions/s1/move`, {
    method: "POST",
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ targetHostId: "h2", maxDowntimeMs: 600 }),
    signal: leave.signal,
  }).catch((e: unknown) => e)
  // The source's assignments list the pending move (and are kept in the coordinator's cache).
  let moves: any[] = []
  for (let i = 0; i < 200 && moves.length === 0; i++) {
    moves = (await agent.get("/v1/hosts/h1/assignments")).body.moves
    if (moves.length === 0) await new Promise((r) => setTimeout(r, 10))
  }
  expect(moves).toHaveLength(1)
  const moveId = moves[0].id
  await abortCommitted
  leave.abort()
  await sent
  // The coordinator sees the client gone (its request's fiber is interrupted) before the abort's
  // answer comes back. Were it slower than this, the old code would pass too; the fix never fails.
  await new Promise((r) => setTimeout(r, 300))
  Deferred.doneUnsafe(release, Effect.void)
  expect((await admin.get(`/v1/moves/${moveId}`)).body).toMatchObject({ state: "aborted", abortReason: "timeout" })
  // The source's assignments hear the abort (before, they listed the move pending for ever).
  let listed: string[] = [moveId]
  for (let i = 0; i < 100 && listed.includes(moveId); i++) {
    await new Promise((r) => setTimeout(r, 50))
    listed = (await agent.get("/v1/hosts/h1/assignments")).body.moves.map((m: any) => m.id)
  }
  expect(listed).not.toContain(moveId)
})
