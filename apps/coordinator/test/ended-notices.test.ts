/* eslint-disable @typescript-eslint/no-explicit-any -- test bodies are read loosely; each assertion states the shape it expects */
// A session the reaper ends or loses tells every host and move the end changed, as the API's
// `DELETE /v1/sessions/{id}` does (one rule: `Notifier.endedTopics`). Before, a TTL's end in a
// pass told only the session's host before the end (none for a descended session) and the
// session: the host holding a descended session's image kept listing it in its `imageSessions`
// (its agent never deleted the image), and a moving session's aborted move was told neither to
// its target (which kept the move pending) nor to the operator's `POST /v1/sessions/{id}/move`
// (which waited out ENGRAM_MOVE_TIMEOUT_MS). A reclaim that made a session lost had the same
// gaps: its closed move (the target's reservation released, not reclaimed) and its image's host.
// The TTL cases run over real HTTP on a real coordinator; the reclaim cases drive the pass under
// a TestClock and listen to the notices it publishes.
import { assert, describe as describeEffect, it as itEffect } from "@effect/vitest"
import { LongPolls, Metrics, Notifier, reaperPass, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "ended-notices-admin-token-0123456789"

describe("a TTL's end in a reaper pass (real HTTP)", () => {
  let c: RunningCoordinator
  beforeAll(async () => {
    // A move waits up to a minute for its outcome: a waiter that is not told shows as a test timeout.
    c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, moveTimeoutMs: 60_000 } })
  })
  afterAll(() => c?.stop())

  it("wakes the host holding a descended session's image, whose assignments then no longer list it", { timeout: 60_000 }, async () => {
    const admin = client(c.url, adminToken)
    const h = (await admin.post("/v1/hosts", { id: "img1" })).body
    expect((await admin.put("/v1/hosts/img1/report", { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 })).status).toBe(200)
    const agent = client(c.url, h.token)
    expect((await admin.post("/v1/sessions", { id: "d1", memMib: 1024, vcpus: 1, affinity: ["img1"] })).body.hostId).toBe("img1")
    await agent.post("/v1/sessions/d1/started")
    // A queued session with no room makes the idle one descend rather than park.
    expect((await admin.post("/v1/sessions", { id: "dq1", memMib: 1536, vcpus: 1, affinity: ["img1"] })).status).toBe(202)
    expect((await agent.post("/v1/sessions/d1/idle")).body.state).toBe("descending")
    await admin.del("/v1/sessions/dq1")
    expect((await agent.post("/v1/sessions/d1/descended")).body).toMatchObject({ state: "descended", hostId: null })
    const before = (await agent.get("/v1/hosts/img1/assignments")).body
    expect(before.imageSessions).toContain("d1")
    expect((await admin.put("/v1/sessions/d1/ttl", { ttlMs: 1 })).status).toBe(200)
    // Past the 1 ms TTL (a lower bound on the wall clock, which drives the store).
    await new Promise((r) => setTimeout(r, 20))
    // The agent's long-poll, open while the pass ends the session: it must answer with the image gone.
    const poll = agent.get(`/v1/hosts/img1/assignments?waitMs=20000&since=${encodeURIComponent(before.version)}`)
    // Open (the coordinator counts it) before the pass runs, however long the request takes to arrive.
    const openPolls = () => c.run(Effect.map(Effect.service(LongPolls), (l) => l.open()))
    for (let i = 0; i < 2000 && (await openPolls()) === 0; i++) await new Promise((r) => setTimeout(r, 10))
    expect(await openPolls()).toBe(1)
    const report = await c.reaperPass()
    expect(report._tag === "Done" ? report.expired.map((x) => [x.sessionId, x.imageHostId]) : null).toEqual([["d1", "img1"]])
    expect((await admin.get("/v1/sessions/d1")).body.state).toBe("ended")
    const after = await poll
    expect(after.status).toBe(200)
    expect(after.body.imageSessions).not.toContain("d1")
  })

  it("answers the operator's move request (aborted) and drops the move from its target's assignments", { timeout: 60_000 }, async () => {
    const admin = client(c.url, adminToken)
    const h1 = (await admin.post("/v1/hosts", { id: "src1" })).body
    const h2 = (await admin.post("/v1/hosts", { id: "dst1" })).body
    for (const h of ["src1", "dst1"]) await admin.put(`/v1/hosts/${h}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8, peerUrl: `http://${h}:7000` })
    const a1 = client(c.url, h1.token)
    const a2 = client(c.url, h2.token)
    expect((await admin.post("/v1/sessions", { id: "m1", memMib: 512, vcpus: 1, affinity: ["src1"] })).body.hostId).toBe("src1")
    await a1.post("/v1/sessions/m1/started")
    const move = admin.post("/v1/sessions/m1/move", { targetHostId: "dst1", maxDowntimeMs: 600 })
    let moves: any[] = []
    for (let i = 0; i < 200 && moves.length === 0; i++) {
      moves = (await a2.get("/v1/hosts/dst1/assignments")).body.moves
      if (moves.length === 0) await new Promise((r) => setTimeout(r, 25))
    }
    expect(moves.map((m) => m.sessionId)).toEqual(["m1"])
    expect((await admin.put("/v1/sessions/m1/ttl", { ttlMs: 1 })).status).toBe(200)
    await new Promise((r) => setTimeout(r, 20))
    const report = await c.reaperPass()
    expect(report._tag === "Done" ? report.expired.map((x) => [x.sessionId, x.openMove?.id, x.openMove?.targetHostId]) : null).toEqual([["m1", moves[0].id, "dst1"]])
    // The target's cached assignments heard the end: the move is gone from them.
    expect((await a2.get("/v1/hosts/dst1/assignments")).body.moves).toEqual([])
    // The waiter heard it too (it would otherwise wait out the minute's move timeout).
    const answered = await move
    expect(answered.body.error).toBe("MoveAborted")
  })
})

describeEffect("a reclaim that makes a session lost", () => {
  /** The coordinator's services on the in-memory store, with the notices they publish kept. */
  const services = Layer.mergeAll(Metrics.layer, Notifier.layer).pipe(Layer.provideMerge(Changes.local), Layer.provideMerge(StoreSim.layer()))
  const listen = Effect.gen(function* () {
    const heard: string[] = []
    yield* (yield* Changes).subscribe({ changed: (topics) => void heard.push(...topics), missed: () => undefined })
    return heard
  })
  const staleMs = 2 * 60 * 1000 + 1
  /** A measured host with `roomMib` of room after policy. */
  const measured = (id: string, roomMib: number) =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id })
      yield* store.reportHost(id, { totalMib: roomMib + 2048, allocatableMib: roomMib + 1024, totalVcpus: 8, peerUrl: `http://${id}:7000` })
    })
  /** The hosts' agents still report and renew the `keep` reservations: only the others go stale. */
  const staleBut = (hosts: readonly string[], keep: readonly string[]) =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* TestClock.adjust(staleMs)
      for (const id of keep) yield* store.heartbeat(id)
      for (const id of hosts) {
        const h = yield* store.getHost(id)
        if (h.report !== null) yield* store.reportHost(id, { ...h.report, peerUrl: h.peerUrl })
      }
    })

  itEffect.effect("while moving tells its move's waiters and its target, whose reservation was released", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const heard = yield* listen
      yield* measured("src", 4096)
      yield* measured("dst", 4096)
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["src"] })
      yield* store.markRunning("s1")
      const move = yield* store.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 })
      yield* staleBut(["src", "dst"], [move.reservationId])
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.lostSessions : null, ["s1"])
      assert.strictEqual((yield* store.getMove(move.id)).state, "aborted")
      for (const t of [Topic.move(move.id), Topic.host("dst"), Topic.host("src"), Topic.session("s1")]) assert.include(heard, t)
    }).pipe(Effect.scoped, Effect.provide(services)))

  itEffect.effect("while restoring from its image elsewhere tells the image's host", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const heard = yield* listen
      yield* measured("img", 8192)
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["img"] })
      yield* store.markRunning("s1")
      yield* store.idle("s1")
      yield* store.beginDescent("s1")
      yield* store.finishDescent("s1")
      // The image's host is full: the restore goes elsewhere, and the image stays listed as img's.
      const fill = yield* store.createSession({ id: "fill", budget: { memMib: 8192, vcpus: 1 }, affinity: ["img"] })
      assert.strictEqual(fill._tag, "Placed")
      yield* measured("c", 1024)
      const back = yield* store.resume("s1")
      assert.deepStrictEqual([back.session.hostId, back.session.imageHostId], ["c", "img"])
      assert.deepStrictEqual((yield* store.hostAssignments("img")).imageSessionIds, ["s1"])
      yield* staleBut(["img", "c"], [fill.session.reservationId as string])
      const pass = yield* reaperPass
      assert.deepStrictEqual(pass._tag === "Done" ? pass.lostSessions : null, ["s1"])
      assert.deepStrictEqual((yield* store.hostAssignments("img")).imageSessionIds, [])
      assert.include(heard, Topic.host("img"))
    }).pipe(Effect.scoped, Effect.provide(services)))
})
