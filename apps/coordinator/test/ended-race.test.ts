/* eslint-disable @typescript-eslint/no-explicit-any -- test bodies are read loosely; each assertion states the shape it expects */
// An end tells the target of a move begun just before it. Both ways a session ends (the API's
// `DELETE /v1/sessions/{id}` and its TTL in a reaper pass) once read the session and its open
// move before calling the store's `endSession`, and told the hosts of that read: a move begun
// between the read and the end was aborted by the end but never told to its target, whose agent
// kept the move in its assignments (and the operator's move request waited out its timeout). They
// now tell what the store's end answers (`EndResult`: the session as the end found it, the move
// it closed). The store here lets a test act between the caller's reads and the end itself.
import { assert, describe as describeEffect, it as itEffect } from "@effect/vitest"
import { Metrics, Notifier, reaperPass, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Changes, Store, Topic } from "@engram/store"
import type { Move, StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

/** What runs inside `endSession` before the store's own end (null: nothing). */
let beforeEnd: ((store: StoreShape, id: string) => Effect.Effect<void>) | null = null

/** The in-memory store, whose `endSession` runs `beforeEnd` first: another caller's write between a read and the end. */
const racing = Layer.effect(
  Store,
  Effect.map(Store, (store) =>
    Store.of({
      ...store,
      endSession: (id, options) => Effect.andThen(Effect.suspend(() => beforeEnd?.(store, id) ?? Effect.void), store.endSession(id, options)),
    }),
  ),
).pipe(Layer.provide(StoreSim.layer()))

describeEffect("a TTL's end in a reaper pass", () => {
  const services = Layer.mergeAll(Metrics.layer, Notifier.layer).pipe(Layer.provideMerge(Changes.local), Layer.provideMerge(racing))
  const listen = Effect.gen(function* () {
    const heard: string[] = []
    yield* (yield* Changes).subscribe({ changed: (topics) => void heard.push(...topics), missed: () => undefined })
    return heard
  })
  const measured = (id: string) =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* store.registerHost({ id })
      yield* store.reportHost(id, { totalMib: 8192, allocatableMib: 6144, totalVcpus: 8, peerUrl: `http://${id}:7000` })
    })

  itEffect.effect("tells the target and the waiters of a move begun after the pass read the session as running", () =>
    Effect.gen(function* () {
      const store = yield* Store
      const heard = yield* listen
      yield* measured("src")
      yield* measured("dst")
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["src"], ttlMs: 1000 })
      yield* store.markRunning("s1")
      yield* TestClock.adjust(1000)
      // The pass's read of due lifetimes finds s1 running; the move begins before its end.
      let begun: Move | null = null
      beforeEnd = (s, id) =>
        Effect.orDie(s.beginMove({ sessionId: id, targetHostId: "dst", maxDowntimeMs: 600 })).pipe(
          Effect.map((m) => {
            begun = m
            beforeEnd = null
          }),
        )
      const pass = yield* reaperPass
      const move = begun as Move | null
      assert.isNotNull(move)
      if (move === null) return
      assert.deepStrictEqual(pass._tag === "Done" ? pass.expired.map((x) => [x.sessionId, x.hostId, x.openMove?.id, x.openMove?.targetHostId]) : null, [["s1", "src", move.id, "dst"]])
      assert.strictEqual((yield* store.getMove(move.id)).state, "aborted")
      for (const t of [Topic.host("src"), Topic.host("dst"), Topic.move(move.id), Topic.session("s1")]) assert.include(heard, t)
    }).pipe(
      Effect.ensuring(Effect.sync(() => (beforeEnd = null))),
      Effect.scoped,
      Effect.provide(services),
    ))
})

describe("the API's end (real HTTP)", () => {
  const adminToken = "ended-race-admin-token-0123456789ab"
  let c: RunningCoordinator
  beforeAll(async () => {
    // A move waits up to a minute for its outcome: a waiter that is not told shows as a test timeout.
    c = await startCoordinator({ store: racing, reaper: false, logLevel: "Error", config: { port: 0, adminToken, moveTimeoutMs: 60_000 } })
  })
  afterAll(() => c?.stop())

  it("tells the target and the operator's request of a move begun after the end read the session", { timeout: 60_000 }, async () => {
    const admin = client(c.url, adminToken)
    const h1 = (await admin.post("/v1/hosts", { id: "src1" })).body
    const h2 = (await admin.post("/v1/hosts", { id: "dst1" })).body
    for (const h of ["src1", "dst1"]) expect((await admin.put(`/v1/hosts/${h}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8, peerUrl: `http://${h}:7000` })).status).toBe(200)
    const source = client(c.url, h1.token)
    const target = client(c.url, h2.token)
    expect((await admin.post("/v1/sessions", { id: "m1", memMib: 512, vcpus: 1, affinity: ["src1"] })).body.hostId).toBe("src1")
    expect((await source.post("/v1/sessions/m1/started")).status).toBe(200)

    // The end stops inside the store's `endSession`, after the handler's own reads.
    const entered = Deferred.makeUnsafe<void>()
    const gate = Deferred.makeUnsafe<void>()
    beforeEnd = () =>
      Effect.andThen(Deferred.succeed(entered, undefined), Deferred.await(gate)).pipe(
        Effect.ensuring(Effect.sync(() => (beforeEnd = null))),
      )
    const ended = admin.del("/v1/sessions/m1")
    await Effect.runPromise(Deferred.await(entered))

    // Meanwhile an operator moves the session: its target's agent, long-polling, is told of the move.
    const first = (await target.get("/v1/hosts/dst1/assignments?waitMs=0")).body
    expect(first.moves).toEqual([])
    const move = admin.post("/v1/sessions/m1/move", { targetHostId: "dst1", maxDowntimeMs: 600 })
    const told = await target.get(`/v1/hosts/dst1/assignments?waitMs=20000&since=${encodeURIComponent(first.version)}`)
    expect(told.body.moves.map((m: any) => m.sessionId)).toEqual(["m1"])

    // The end goes on and aborts that move.
    Deferred.doneUnsafe(gate, Effect.void)
    const answer = await ended
    expect(answer.status).toBe(200)
    expect(answer.body).toMatchObject({ id: "m1", state: "ended" })
    // The target's assignments heard the end: the move is gone from them (they were kept until a notice of the host).
    expect((await target.get("/v1/hosts/dst1/assignments?waitMs=0")).body.moves).toEqual([])
    // And the operator's request heard it (it would otherwise wait out the minute's move timeout).
    expect((await move).body.error).toBe("MoveAborted")
  })
})
