// A host token rotated while this replica missed the notice (its LISTEN connection was coming
// back, or the replica that rotated it left uncleanly) still ends the host's open long-polls with
// 401 (SPEC §13: a revocation reaches open requests), once the replica learns it may have missed
// notices. Before, a possible miss only dropped the credentials' copy: an open poll of the
// revoked token waited its full time and answered the revoked token with data. Now a miss checks
// every open host poll's credential. The notices here are this process's own, with the
// credential notices held back while `dropCredentials` is set and the miss told by the test (as
// `ChangesPg` tells it after a reconnect). Real HTTP, a real coordinator.
import { LongPolls, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Changes, makeHub } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "revoke-after-miss-admin-token-0123456789"
const hub = makeHub()
let dropCredentials = false
const changes = Layer.succeed(
  Changes,
  Changes.of({
    publish: (topics) => Effect.sync(() => hub.deliver([...new Set(topics)].filter((t) => !(dropCredentials && t.startsWith("credential:"))))),
    subscribe: hub.subscribe,
    live: () => true,
  }),
)
let c: RunningCoordinator

beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), changes, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

const open = () => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))
/** Waits (real time, the coordinator is real) until `n` long-polls are open. */
const openAre = async (n: number) => {
  for (let i = 0; i < 2000 && (await open()) !== n; i++) await new Promise((r) => setTimeout(r, 10))
  expect(await open()).toBe(n)
}

it("a wait whose host token was rotated during a miss of notices answers 401 once the miss is known", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h = (await admin.post("/v1/hosts", { id: "h1" })).body
  await admin.put("/v1/hosts/h1/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
  const agent = client(c.url, h.token)
  expect((await admin.post("/v1/sessions", { id: "s1", memMib: 512, vcpus: 1 })).body.hostId).toBe("h1")
  const wait = agent.get("/v1/sessions/s1/wait?state=ended&timeoutMs=20000")
  await openAre(1)
  dropCredentials = true
  try {
    expect((await admin.post("/v1/hosts/h1/token")).status).toBe(200)
  } finally {
    dropCredentials = false
  }
  // The notice never came: the poll is still open.
  expect(await open()).toBe(1)
  hub.miss()
  const answer = await wait
  expect(answer.status).toBe(401)
  expect(answer.body.error).toBe("Unauthorized")
})

it("a miss of notices leaves the open polls of tokens that still act alone", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h = (await admin.post("/v1/hosts", { id: "h2" })).body
  await admin.put("/v1/hosts/h2/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
  const agent = client(c.url, h.token)
  expect((await admin.post("/v1/sessions", { id: "s2", memMib: 512, vcpus: 1, affinity: ["h2"] })).body.hostId).toBe("h2")
  const wait = agent.get("/v1/sessions/s2/wait?state=ended&timeoutMs=20000")
  await openAre(1)
  hub.miss()
  // The check reads the store and finds the token acting: the poll stays open (a wrong 401 would
  // close it) and answers the end.
  await new Promise((r) => setTimeout(r, 200))
  expect(await open()).toBe(1)
  expect((await admin.del("/v1/sessions/s2")).status).toBe(200)
  const answer = await wait
  expect(answer.status).toBe(200)
  expect(answer.body.state).toBe("ended")
})
