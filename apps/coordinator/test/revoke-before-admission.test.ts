// A host token revoked between a long-poll's authentication and its admission (`LongPolls.enter`)
// is refused with 401, as one revoked while the poll waits is. Before, the rotation's notice found
// no open poll to end (the poll was still reading its session), the poll was admitted on the
// credential authenticated before the rotation, waited its full time and answered the revoked
// token with the session's state. Each request's credential now carries the count of credential
// notices when its authentication began; a poll admitted after more of them checks its credential
// again. The store here holds the wait's session read until the token is rotated. Real HTTP, a
// real coordinator.
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer } from "effect"
import { afterAll, beforeAll, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "revoke-before-admission-admin-token-0123456789"
let c: RunningCoordinator
/** The next session read waits at `release` after calling `hit`; null: reads pass. */
let gate: { readonly hit: () => void; readonly release: Deferred.Deferred<void> } | null = null

beforeAll(async () => {
  const gated = Layer.effect(
    Store,
    Effect.map(Store, (store) =>
      Store.of({
        ...store,
        getSession: (id) =>
          Effect.suspend(() => {
            const g = gate
            if (g === null) return store.getSession(id)
            gate = null
            g.hit()
            return Effect.andThen(Deferred.await(g.release), store.getSession(id))
          }),
      }),
    ),
  ).pipe(Layer.provide(StoreSim.layer()))
  c = await startCoordinator({ store: gated, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

it("a session wait whose host token is rotated before the wait is admitted answers 401", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h = (await admin.post("/v1/hosts", { id: "h1" })).body
  await admin.put("/v1/hosts/h1/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
  const agent = client(c.url, h.token)
  expect((await admin.post("/v1/sessions", { id: "s1", memMib: 512, vcpus: 1 })).body.hostId).toBe("h1")
  // The token is known (kept in the credentials' copy).
  expect((await agent.get("/v1/hosts/h1")).status).toBe(200)
  const release = Deferred.makeUnsafe<void>()
  const reading = new Promise<void>((hit) => (gate = { hit, release }))
  const wait = agent.get("/v1/sessions/s1/wait?state=ended&timeoutMs=3000")
  // The wait is authenticated and reads its session, not yet admitted as a long-poll.
  await reading
  expect((await admin.post("/v1/hosts/h1/token")).status).toBe(200)
  expect((await agent.get("/v1/hosts/h1")).status).toBe(401)
  Deferred.doneUnsafe(release, Effect.void)
  const answer = await wait
  expect(answer.status).toBe(401)
  expect(answer.body.error).toBe("Unauthorized")
})

it("a credential notice of another host between authentication and admission leaves the wait alone", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h = (await admin.post("/v1/hosts", { id: "h2" })).body
  await admin.post("/v1/hosts", { id: "h3" })
  await admin.put("/v1/hosts/h2/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
  const agent = client(c.url, h.token)
  expect((await admin.post("/v1/sessions", { id: "s2", memMib: 512, vcpus: 1, affinity: ["h2"] })).body.hostId).toBe("h2")
  const release = Deferred.makeUnsafe<void>()
  const reading = new Promise<void>((hit) => (gate = { hit, release }))
  const wait = agent.get("/v1/sessions/s2/wait?state=ended&timeoutMs=20000")
  await reading
  expect((await admin.post("/v1/hosts/h3/token")).status).toBe(200)
  Deferred.doneUnsafe(release, Effect.void)
  // Admitted on its own credential, which still acts: it waits (the coordinator counts it open;
  // a wrong 401 would settle it first), and answers the end.
  let settled = false
  void wait.then(
    () => (settled = true),
    () => (settled = true),
  )
  const open = () => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))
  for (let i = 0; i < 2000 && !settled && (await open()) === 0; i++) await new Promise((r) => setTimeout(r, 10))
  expect((await admin.del("/v1/sessions/s2")).status).toBe(200)
  const answer = await wait
  expect(answer.status).toBe(200)
  expect(answer.body.state).toBe("ended")
})
