// A host token rotated while this replica missed the notice (its LISTEN connection was coming
// back, or the replica that rotated it left uncleanly) still ends the host's open long-polls with
// 401 (SPEC §13: a revocation reaches open requests), once the replica learns it may have missed
// notices. Before, a possible miss only dropped the credentials' copy: an open poll of the
// revoked token waited its full time and answered the revoked token with data. Now a miss checks
// every open host poll's credential. The notices here are this process's own, with the
// credential notices held back while `dropCredentials` is set and the miss told by the test (as
// `ChangesPg` tells it after a reconnect). Real HTTP, a real coordinator. Each case runs on a
// store with the grouped read of hosts' token hashes (`hostTokenHashes`: one read per 500 hosts)
// and on one without it (a third party's: one read per token).
import { LongPolls, startCoordinator } from "@engram/coordinator"
import { hashToken, newToken } from "../src/Auth.js"
import { maxGroupedReads } from "../src/GroupedReads.js"
import { missSweepConcurrency } from "../src/LongPolls.js"
import type { RunningCoordinator } from "@engram/coordinator"
import { Changes, makeHub, Store, Unavailable } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "revoke-after-miss-admin-token-0123456789"

describe.each([
  { mode: "grouped reads", grouped: true },
  { mode: "one read per token (a store without hostTokenHashes)", grouped: false },
])("revocation after a miss of notices, $mode", ({ grouped }) => {
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
/** While set, the store fails every read of a credential (as a store that is away); they are counted. */
let tokenReadsFail = false
let failedTokenReads = 0
/** Every read of a credential the store was asked (`hostByTokenHash`, `hostTokenHashes`). */
let tokenReads = 0
/** When set, each grouped read answers, then waits for it before it returns (a read a notice overtakes). */
let holdGroupedRead: { readonly entered: () => void; readonly release: Promise<void> } | null = null
/** The store behind the coordinator's wrapper: a write here publishes no notice (as one missed). */
let inner: StoreShape
const store = Layer.effect(
  Store,
  Effect.map(Store, (s) => {
    inner = s
    const away = () => {
      failedTokenReads++
      return Effect.fail(new Unavailable({ reason: "the store is away (test)", retryAfterMs: 1000 }))
    }
    const { hostTokenHashes, ...rest } = s
    const wrapped: StoreShape = {
      ...rest,
      hostByTokenHash: (hash) =>
        Effect.suspend(() => {
          tokenReads++
          return tokenReadsFail ? away() : s.hostByTokenHash(hash)
        }),
    }
    if (!grouped || hostTokenHashes === undefined) return Store.of(wrapped)
    return Store.of({
      ...wrapped,
      hostTokenHashes: (ids) =>
        Effect.suspend(() => {
          tokenReads++
          if (tokenReadsFail) return away()
          const hold = holdGroupedRead
          return hold === null
            ? hostTokenHashes(ids)
            : Effect.tap(hostTokenHashes(ids), () => Effect.andThen(Effect.sync(hold.entered), Effect.promise(() => hold.release)))
        }),
    })
  }),
).pipe(Layer.provide(StoreSim.layer()))

beforeAll(async () => {
  c = await startCoordinator({ store, changes, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

const open = () => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))
const sweeps = () => c.run(Effect.map(Effect.service(LongPolls), (l) => l.sweeps()))
/** Waits (real time) until more than `done` sweeps after a miss have checked every open poll. */
const sweptPast = async (done: number) => {
  for (let i = 0; i < 2000 && (await sweeps()).done <= done; i++) await new Promise((r) => setTimeout(r, 10))
  expect((await sweeps()).done).toBeGreaterThan(done)
}
/** Waits (real time, the coordinator is real) until `n` long-polls are open. */
const openAre = async (n: number) => {
  for (let i = 0; i < 3000 && (await open()) !== n; i++) await new Promise((r) => setTimeout(r, 10))
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
  const before = (await sweeps()).done
  hub.miss()
  // The check reads the store and finds the token acting: the poll stays open (a wrong 401 would
  // close it) and answers the end.
  await sweptPast(before)
  expect(await open()).toBe(1)
  expect((await admin.del("/v1/sessions/s2")).status).toBe(200)
  const answer = await wait
  expect(answer.status).toBe(200)
  expect(answer.body.state).toBe("ended")
})

it("a miss while the store is away: each try stops at its first failed read, the polls stay open, and the sweep completes once the store answers", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const hosts = Array.from({ length: missSweepConcurrency * 3 }, (_, i) => `away${i}`)
  const waits: Promise<{ readonly status: number }>[] = []
  for (const id of hosts) {
    const h = (await admin.post("/v1/hosts", { id })).body
    await admin.put(`/v1/hosts/${id}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })
    expect((await admin.post("/v1/sessions", { id: `s-${id}`, memMib: 512, vcpus: 1, affinity: [id] })).body.hostId).toBe(id)
    waits.push(client(c.url, h.token).get(`/v1/sessions/s-${id}/wait?state=ended&timeoutMs=20000`))
  }
  await openAre(hosts.length)
  const before = await sweeps()
  tokenReadsFail = true
  try {
    hub.miss()
    for (let i = 0; i < 2000 && (await sweeps()).failed === before.failed; i++) await new Promise((r) => setTimeout(r, 10))
  } finally {
    tokenReadsFail = false
  }
  const during = await sweeps()
  expect(during.failed).toBeGreaterThan(before.failed)
  // Each try read at most one round (its first failure ended it: one grouped read, or
  // `missSweepConcurrency` reads of a token), not one read per poll.
  expect(failedTokenReads).toBeGreaterThan(0)
  expect(failedTokenReads).toBeLessThanOrEqual((grouped ? 1 : missSweepConcurrency) * (during.failed - before.failed + 1))
  expect(await open()).toBe(hosts.length)
  // The store answers again: a later try checks every poll, and each token still acts.
  await sweptPast(before.done)
  expect(await open()).toBe(hosts.length)
  for (const id of hosts) expect((await admin.del(`/v1/sessions/s-${id}`)).status).toBe(200)
  for (const answer of await Promise.all(waits)) expect(answer.status).toBe(200)
})

// Grouped reads only (registered in that mode alone: a store without hostTokenHashes makes none).
if (grouped) it("a grouped read that a rotation's notice overtook keeps nothing in the credentials' copy: the rotated token is refused afterwards", { timeout: 60_000 }, async () => {
  const admin = client(c.url, adminToken)
  const h = (await admin.post("/v1/hosts", { id: "overtaken" })).body
  const agent = client(c.url, h.token)
  const poll = agent.get("/v1/hosts/overtaken/assignments?waitMs=30000")
  await openAre(1)
  const before = (await sweeps()).done
  let entered = () => {}
  const inRead = new Promise<void>((r) => (entered = r))
  let release = () => {}
  holdGroupedRead = { entered: () => entered(), release: new Promise<void>((r) => (release = r)) }
  let rotated: { readonly status: number; readonly body: { readonly token: string } }
  try {
    hub.miss()
    // The sweep's read answered (the token acted then); the rotation's notice comes before the answer is used.
    await inRead
    rotated = await admin.post("/v1/hosts/overtaken/token")
  } finally {
    holdGroupedRead = null
    release()
  }
  expect(rotated.status).toBe(200)
  // The notice's own check ended the open poll.
  expect((await poll).status).toBe(401)
  await sweptPast(before)
  // The overtaken answer installed nothing: the old token is read afresh and refused.
  expect((await agent.get("/v1/hosts/overtaken/assignments")).status).toBe(401)
  expect((await client(c.url, rotated.body.token).get("/v1/hosts/overtaken/assignments")).status).toBe(200)
})

// Last: it ends every open poll (`endAll`).
// Grouped reads only (registered in that mode alone: a store without hostTokenHashes makes none).
if (grouped) it("after a miss, 1,200 open polls of distinct hosts cost at most one credential read per 500 hosts, and the rotated and removed ones answer 401", { timeout: 180_000 }, async () => {
  await openAre(0)
  const n = 1200
  const ids = Array.from({ length: n }, (_, i) => `many${i}`)
  const tokens = ids.map(() => newToken())
  await Effect.runPromise(Effect.forEach(ids, (id, i) => inner.registerHost({ id, tokenHash: hashToken(tokens[i] as string) }), { discard: true }))
  const polls = ids.map((id, i) => client(c.url, tokens[i]).get(`/v1/hosts/${id}/assignments?waitMs=30000`))
  await openAre(n)
  // Written behind the coordinator's back: the notices are missed.
  const rotated = [0, 499, 500, 1000, 1199]
  const removed = [1, 700, 1198]
  await Effect.runPromise(
    Effect.andThen(
      Effect.forEach(rotated, (i) => inner.setHostTokenHash(ids[i] as string, hashToken(newToken())), { discard: true }),
      Effect.forEach(removed, (i) => inner.removeHost(ids[i] as string), { discard: true }),
    ),
  )
  const before = (await sweeps()).done
  tokenReads = 0
  hub.miss()
  await sweptPast(before)
  expect(tokenReads).toBeGreaterThan(0)
  expect(tokenReads).toBeLessThanOrEqual(Math.ceil(n / maxGroupedReads))
  for (const i of [...rotated, ...removed]) expect((await polls[i])?.status).toBe(401)
  await openAre(n - rotated.length - removed.length)
  // The others still act: ended by the coordinator stopping, each answers its wait's own answer.
  await c.run(Effect.flatMap(Effect.service(LongPolls), (l) => l.endAll))
  const revoked = new Set([...rotated, ...removed])
  const answers = await Promise.all(polls.filter((_, i) => !revoked.has(i)))
  expect(answers.every((a) => a.status === 200)).toBe(true)
})
})
