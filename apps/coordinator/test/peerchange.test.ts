// What a host report changed is the store's answer (judged inside its write), not a replica's
// memory: two replicas on one PostgreSQL. A target whose peer URL flips u → v → u through both
// wakes its move's source each time with the new URL (a replica that saw u last must not take
// the second u for "no change"); a restarted coordinator given an unchanged report reads no
// pending moves and drains nothing; a failed pending-moves read leaves the notice owed, told
// at the host's next report even when that one changes nothing.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store, Unavailable } from "@engram/store"
import { ChangesPg, StorePg } from "@engram/store-pg"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { counting } from "./support/counting.js"
import { client } from "./support/http.js"
import type { Client } from "./support/http.js"

const adminToken = "peerchange-admin-token-0123456789"
const figures = { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 }
const u = "http://10.7.0.1:7100"
const v = "http://10.7.0.2:7200"

describe("peer URL and figure changes across replicas on PostgreSQL", () => {
  let db: TestDatabase
  let a: RunningCoordinator
  let b: RunningCoordinator
  // Replica B's pending-moves reads fail while this is set.
  const failMovesOnB = { on: false }
  beforeAll(async () => {
    db = await freshDatabase()
    const config = { port: 0, adminToken }
    const failing = Layer.effect(
      Store,
      Effect.map(Store, (store) =>
        Store.of({
          ...store,
          listMoves: (filter) => (failMovesOnB.on ? Effect.fail(new Unavailable({ reason: "moves read failed (test)", retryAfterMs: 1000 })) : store.listMoves(filter)),
        }),
      ),
    ).pipe(Layer.provide(StorePg.layer({ url: db.url })))
    a = await startCoordinator({ reaper: false, logLevel: "Error", config: { ...config, databaseUrl: db.url } })
    b = await startCoordinator({ reaper: false, logLevel: "Error", config, store: failing, changes: ChangesPg.layer({ url: db.url }) })
  })
  afterAll(async () => {
    await a?.stop()
    await b?.stop()
    await db?.drop()
  })

  const addHost = async (admin: Client, id: string, peerUrl: string | null) => {
    const created = await admin.post("/v1/hosts", { id })
    expect(created.status).toBe(201)
    expect((await admin.put(`/v1/hosts/${id}/report`, { ...figures, peerUrl })).status).toBe(200)
    return { id, token: created.body.token as string }
  }

  /** A session running on `src` with a move to `dst` pending past its intent (it stays pending for its source). */
  const pendingMove = async (admin: Client, src: { id: string; token: string }, dst: { id: string }, sid: string) => {
    expect((await admin.post("/v1/sessions", { id: sid, memMib: 1024, vcpus: 1, affinity: [src.id] })).body.hostId).toBe(src.id)
    const source = client(a.url, src.token)
    expect((await source.post(`/v1/sessions/${sid}/started`)).status).toBe(200)
    const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
    let since = ""
    for (let i = 0; i < 50; i++) {
      const got = await source.get(`/v1/hosts/${src.id}/assignments${since === "" ? "" : `?waitMs=2000&since=${since}`}`)
      const m = got.body.moves.find((x: { sessionId: string }) => x.sessionId === sid) as { id: string } | undefined
      if (m !== undefined) {
        expect((await source.post(`/v1/moves/${m.id}/rounds`, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })).status).toBe(200)
        return { moveId: m.id, answer }
      }
      since = got.body.version as string
    }
    throw new Error("the move never showed up")
  }

  const urlIn = (body: { moves: { id: string; targetPeerUrl?: string | null }[] }, moveId: string) => body.moves.find((x) => x.id === moveId)?.targetPeerUrl

  it("a target's peer URL flipping u → v → u through two replicas wakes the source's long poll with the new URL each time", async () => {
    const admin = client(a.url, adminToken)
    const src = await addHost(admin, "pc-src", u)
    const dst = await addHost(admin, "pc-dst", u)
    const { moveId, answer } = await pendingMove(admin, src, dst, "pc-s1")
    const source = client(a.url, src.token)
    let seen = (await source.get(`/v1/hosts/${src.id}/assignments`)).body
    expect(urlIn(seen, moveId)).toBe(u)
    // Each report through the other replica than the last: A saw u, B sees v, A sees u again.
    for (const [via, url] of [[b, v], [a, u], [b, v], [a, u]] as const) {
      const polling = source.get(`/v1/hosts/${src.id}/assignments?waitMs=15000&since=${seen.version as string}`)
      expect((await client(via.url, dst.token).put(`/v1/hosts/${dst.id}/report`, { ...figures, peerUrl: url })).status).toBe(200)
      const woke = (await polling).body
      expect([urlIn(woke, moveId), woke.version === seen.version], `reported ${url} through ${via === a ? "A" : "B"}`).toStrictEqual([url, false])
      seen = woke
    }
    expect((await source.post(`/v1/moves/${moveId}/abort`, { reason: "test: no move runs here" })).status).toBe(200)
    expect((await answer).status).not.toBe(201)
  })

  it("a failed pending-moves read leaves the notice owed: the host's next report tells the source, though it changes nothing", async () => {
    const admin = client(a.url, adminToken)
    const src = await addHost(admin, "pc-src2", u)
    const dst = await addHost(admin, "pc-dst2", u)
    const { moveId, answer } = await pendingMove(admin, src, dst, "pc-s2")
    const source = client(a.url, src.token)
    const seen = (await source.get(`/v1/hosts/${src.id}/assignments`)).body
    expect(urlIn(seen, moveId)).toBe(u)
    // B writes v but cannot read the moves: the report stands (200), the source is not told yet.
    failMovesOnB.on = true
    expect((await client(b.url, dst.token).put(`/v1/hosts/${dst.id}/report`, { ...figures, peerUrl: v })).status).toBe(200)
    failMovesOnB.on = false
    const polling = source.get(`/v1/hosts/${src.id}/assignments?waitMs=15000&since=${seen.version as string}`)
    // The same report again through B (no change in the store): B still owes the notice and tells it now.
    expect((await client(b.url, dst.token).put(`/v1/hosts/${dst.id}/report`, { ...figures, peerUrl: v })).status).toBe(200)
    const woke = (await polling).body
    expect([urlIn(woke, moveId), woke.version === seen.version]).toStrictEqual([v, false])
    expect((await source.post(`/v1/moves/${moveId}/abort`, { reason: "test: no move runs here" })).status).toBe(200)
    expect((await answer).status).not.toBe(201)
  })

  it("a report written but answered 503 (its outcome unknown): the source is told all the same, though the retry through the other replica changes nothing", async () => {
    const admin = client(a.url, adminToken)
    const src = await addHost(admin, "pc-src3", u)
    const dst = await addHost(admin, "pc-dst3", u)
    const { moveId, answer } = await pendingMove(admin, src, dst, "pc-s3")
    // Replica C: its report writes, then answers Unavailable, as a write that commits after the store's bound does.
    const late = { on: true }
    const lateStore = Layer.effect(
      Store,
      Effect.map(Store, (store) =>
        Store.of({
          ...store,
          reportHost: (id, r) => (late.on ? Effect.andThen(store.reportHost(id, r), Effect.fail(new Unavailable({ reason: "committed after the bound (test)", retryAfterMs: 1000 }))) : store.reportHost(id, r)),
        }),
      ),
    ).pipe(Layer.provide(StorePg.layer({ url: db.url })))
    const c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, adminToken, storeTimeoutMs: 2000 }, store: lateStore, changes: ChangesPg.layer({ url: db.url }) })
    try {
      const source = client(a.url, src.token)
      const seen = (await source.get(`/v1/hosts/${src.id}/assignments`)).body
      expect(urlIn(seen, moveId)).toBe(u)
      const polling = source.get(`/v1/hosts/${src.id}/assignments?waitMs=15000&since=${seen.version as string}`)
      expect((await client(c.url, dst.token).put(`/v1/hosts/${dst.id}/report`, { ...figures, peerUrl: v })).status).toBe(503)
      // The agent's retry through A finds v stored already: no change, no notice from A.
      expect((await client(a.url, dst.token).put(`/v1/hosts/${dst.id}/report`, { ...figures, peerUrl: v })).status).toBe(200)
      // C looks again after twice its store bound and tells the source.
      const woke = (await polling).body
      expect([urlIn(woke, moveId), woke.version === seen.version]).toStrictEqual([v, false])
    } finally {
      late.on = false
      await c.stop()
    }
    expect((await client(a.url, src.token).post(`/v1/moves/${moveId}/abort`, { reason: "test: no move runs here" })).status).toBe(200)
    expect((await answer).status).not.toBe(201)
  })

  it("a restarted coordinator given a report that changes nothing reads no pending moves and drains nothing; a changed one does both", async () => {
    const admin = client(a.url, adminToken)
    const host = await addHost(admin, "pc-restart", u)
    const counted = counting(StorePg.layer({ url: db.url }))
    const c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, adminToken }, store: counted.layer, changes: ChangesPg.layer({ url: db.url }) })
    try {
      const agent = client(c.url, host.token)
      const reads = () => ({ listMoves: counted.counts.byName.get("listMoves") ?? 0, drainQueue: counted.counts.byName.get("drainQueue") ?? 0 })
      const before = reads()
      expect((await agent.put(`/v1/hosts/${host.id}/report`, { ...figures, peerUrl: u })).status).toBe(200)
      expect(reads()).toStrictEqual(before)
      // A new URL: its moves are read (once) and room may have appeared (a drain, the queue not known empty here yet).
      expect((await agent.put(`/v1/hosts/${host.id}/report`, { ...figures, peerUrl: v })).status).toBe(200)
      expect(reads()).toStrictEqual({ listMoves: before.listMoves + 1, drainQueue: before.drainQueue + 1 })
    } finally {
      await c.stop()
    }
  })
})
