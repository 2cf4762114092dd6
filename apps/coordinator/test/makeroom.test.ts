// Moves for starving sessions in the coordinator's reaper pass (ENGRAM_MAKE_ROOM_MOVES), on each
// real store (the in-memory one, PGlite, PostgreSQL) under a TestClock: no sleeps, the
// starvation limit passed by hand, the agents' rounds and commits made through the store as
// their HTTP calls make them.
import { assert, describe, it } from "@effect/vitest"
import { Limits, ParkPolicy } from "@engram/core"
import { Config, Metrics, Notifier, reaperPass, Settings } from "@engram/coordinator"
import type { PassReport } from "@engram/coordinator"
import { Changes, Store, StoreTesting } from "@engram/store"
import { Unavailable } from "@engram/store"
import { StorePg } from "@engram/store-pg"
import { StoreSim } from "@engram/store-sim"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Context, Effect, Layer, ManagedRuntime } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"

const GiB = 1024

// Heartbeats are not the point here: a day-long stale window keeps reservations alive while the clock jumps.
const longLived = (() => {
  const r = Limits.make({ heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 })
  if (r._tag === "Invalid") throw new Error("bad test limits")
  return r.limits
})()

// One store of each database for the file, emptied before each case with the long-lived limits
// (StoreTesting.reset, as the conformance suite does): a PGlite opened per case cost a WASM initdb
// and the migrations each time (15 to 60 s a case on a busy CI machine).
let database: Promise<TestDatabase> | undefined
const pglite = ManagedRuntime.make(StorePg.layerPgliteTesting({ limits: longLived }))
const postgres = ManagedRuntime.make(
  Layer.unwrap(Effect.promise(() => (database ??= freshDatabase())).pipe(Effect.map((db) => StorePg.layerTesting({ url: db.url, limits: longLived })))),
)
afterAll(async () => {
  await pglite.dispose()
  await postgres.dispose()
  if (database !== undefined) await (await database).drop()
})

/** The shared store of `runtime`, empty and deciding with the long-lived limits, as a new replica's. */
const emptied = (runtime: ManagedRuntime.ManagedRuntime<Store | StoreTesting, Unavailable>): Layer.Layer<Store, Unavailable> =>
  Layer.effect(
    Store,
    Effect.gen(function* () {
      const context = yield* runtime.contextEffect
      yield* Context.get(context, StoreTesting).reset(longLived)
      // A copy: the reaper keeps its memory of refused moves per store object, as per replica.
      return Store.of({ ...Context.get(context, Store) })
    }),
  )

/** Each backend, an empty store per test. */
const backends: readonly (readonly [string, () => Layer.Layer<Store, Unavailable>])[] = [
  ["in-memory", () => StoreSim.layer({ limits: longLived })],
  ["PGlite", () => emptied(pglite)],
  ["PostgreSQL", () => emptied(postgres)],
]

/** The coordinator's settings from these variables over the defaults. */
const settings = (variables: Record<string, string>) => {
  const parsed = Config.parse(variables)
  if (parsed._tag === "Invalid") throw new Error(`bad test settings: ${JSON.stringify(parsed.issues)}`)
  return Layer.succeed(Settings, Settings.of({ config: parsed.config, backend: "custom" }))
}
const on = (perPass?: number) => settings({ ENGRAM_MAKE_ROOM_MOVES: "1", ...(perPass === undefined ? {} : { ENGRAM_MAKE_ROOM_MOVES_PER_PASS: String(perPass) }) })

const services = (store: Layer.Layer<Store, Unavailable>) => Layer.mergeAll(Metrics.layer, Notifier.layer.pipe(Layer.provide(Changes.local))).pipe(Layer.provideMerge(store))

/** A 64 GiB host's report: capacity after policy = allocatable − 1024 (the system reserve); its agent's peer URL unless `peerUrl` is false. */
const report = (id: string, peerUrl = true) => ({
  totalMib: 64 * GiB + 2048,
  allocatableMib: 64 * GiB + 1024,
  totalVcpus: 64,
  ...(peerUrl ? { peerUrl: `http://${id}.agents.test:7100` } : {}),
})

/**
 * Three 64 GiB hosts full of running 8 GiB sessions: h1 runs five (24 GiB free), h0 and h2 as
 * many as `h0UsedGiB` and `h2UsedGiB` make. Then a 48 GiB session queues (it fits nowhere) and
 * waits past the starvation limit: the gate holds h1 for it (the host with the most free RAM),
 * and no park anywhere can make its room. Every agent advertises a peer URL but those of `noPeerUrl`.
 */
const starvingOnFullHosts = (h0UsedGiB = 48, h2UsedGiB = 40, noPeerUrl: readonly string[] = []) =>
  Effect.gen(function* () {
    const store = yield* Store
    for (const [id, usedGiB] of [["h0", h0UsedGiB], ["h1", 40], ["h2", h2UsedGiB]] as const) {
      yield* store.registerHost({ id })
      yield* store.reportHost(id, report(id, !noPeerUrl.includes(id)))
      for (let k = 0; k < usedGiB / 8; k++) {
        const placed = yield* store.createSession({ id: `${id}-s${k}`, budget: { memMib: 8 * GiB, vcpus: 1 }, affinity: [id] })
        assert.strictEqual(placed._tag === "Placed" ? placed.session.hostId : "queued", id)
        yield* store.markRunning(`${id}-s${k}`)
      }
    }
    const big = yield* store.createSession({ id: "big", budget: { memMib: 48 * GiB, vcpus: 1 } })
    assert.strictEqual(big._tag, "Queued")
    yield* TestClock.adjust(ParkPolicy.defaultOptions.starvationLimitMs + 1000)
  })

/** The open moves as [session, source, target], by session id (begun at one instant, their order is their ids'). */
const openMoves = Effect.gen(function* () {
  const moves = yield* (yield* Store).listMoves({ state: "pending" })
  return moves.map((m) => [m.sessionId, m.sourceHostId, m.targetHostId]).sort((a, b) => String(a[0]).localeCompare(String(b[0])))
})

/** The source agent's last two calls for every open move: the final round, then the commit. */
const commitAll = Effect.gen(function* () {
  const store = yield* Store
  for (const m of yield* store.listMoves({ state: "pending" })) {
    yield* store.recordRound(m.id, { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 })
    yield* store.commitMove(m.id, { downtimeMs: 300, captureMs: 5, sendMs: 10, commitMs: 200 })
  }
})

const movesOf = (report: PassReport) => (report._tag === "Done" ? report.moves.map((m) => [m.planned.sessionId, m.planned.fromHostId, m.planned.toHostId]) : null)
const placedOf = (report: PassReport) => (report._tag === "Done" ? report.placed : null)

for (const [name, store] of backends) {
  // The shared PGlite's first open (a WASM initdb and the migrations) took 60 s of the default
  // 120 s in a CI run beside another (load 30): the PGlite tests' bound.
  describe(`make-room moves in the reaper pass: ${name}`, { timeout: 600_000 }, () => {
    it.effect("on: moves begin off the starving session's held host to where they fit best; once they commit it places there", () =>
      Effect.gen(function* () {
        yield* starvingOnFullHosts()
        const first = yield* reaperPass
        assert.deepStrictEqual(first._tag === "Done" ? first.holds : null, [{ sessionId: "big", hostId: "h1", reason: "starving" }])
        // Gap 24 GiB: the largest until one closes it (ties by id, the last), h0 fitting tightest.
        const planned = [
          ["h1-s4", "h1", "h0"],
          ["h1-s3", "h1", "h0"],
          ["h1-s0", "h1", "h2"],
        ]
        assert.deepStrictEqual(movesOf(first), planned)
        assert.deepStrictEqual(yield* openMoves, [...planned].sort((a, b) => String(a[0]).localeCompare(String(b[0]))))
        assert.strictEqual((yield* (yield* Store).getSession("h1-s4")).state, "moving")
        // While they run, no second move starts for the host or its sessions.
        assert.deepStrictEqual(movesOf(yield* reaperPass), [])
        yield* commitAll
        const after = yield* reaperPass
        assert.deepStrictEqual(placedOf(after), [{ sessionId: "big", hostId: "h1" }])
        assert.deepStrictEqual(movesOf(after), [])
        assert.strictEqual((yield* (yield* Store).getSession("h1-s0")).hostId, "h2")
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("a host whose agent advertises no peer URL is no move's target: the room is made through hosts sources can reach, or waits for one", () =>
      Effect.gen(function* () {
        const store = yield* Store
        // h0 fits tightest but advertises no URL: its sources could not be told where to reach it.
        yield* starvingOnFullHosts(48, 40, ["h0"])
        const reachable = [
          ["h1-s4", "h1", "h2"],
          ["h1-s3", "h1", "h2"],
          ["h1-s0", "h1", "h2"],
        ]
        // h2 advertises none either (an older agent, a wildcard listen host): no move at all.
        yield* store.reportHost("h2", report("h2", false))
        const none = yield* reaperPass
        assert.deepStrictEqual(none._tag === "Done" ? none.holds : null, [{ sessionId: "big", hostId: "h1", reason: "starving" }])
        assert.deepStrictEqual(movesOf(none), [])
        assert.deepStrictEqual(yield* openMoves, [])
        // h2's agent advertises one in its next report: the next pass moves there, none to h0.
        yield* store.reportHost("h2", report("h2"))
        assert.deepStrictEqual(movesOf(yield* reaperPass), reachable)
        assert.deepStrictEqual(yield* openMoves, [...reachable].sort((a, b) => String(a[0]).localeCompare(String(b[0]))))
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("a move no agent takes up within ENGRAM_MOVE_TIMEOUT_MS is aborted by a later pass; one past its intent is left to its source", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* starvingOnFullHosts()
        const first = yield* reaperPass
        const ids = first._tag === "Done" ? first.moves.map((m) => m.moveId) : []
        assert.strictEqual(ids.length, 3)
        // The source of the first recorded its intent: the guest may pause at any moment now.
        yield* store.recordRound(ids[0] as string, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
        yield* TestClock.adjust(Config.defaults().moveTimeoutMs - 1000)
        yield* reaperPass
        assert.deepStrictEqual((yield* openMoves).length, 3)
        yield* TestClock.adjust(2000)
        const late = yield* reaperPass
        const states = yield* Effect.forEach(ids, (id) => Effect.map(store.getMove(id), (m) => [m.state, m.abortReason]))
        assert.deepStrictEqual(states, [
          ["pending", null],
          ["aborted", "timeout"],
          ["aborted", "timeout"],
        ])
        // The aborted moves' sessions run on at their source; no new move while the first runs.
        const second = yield* store.getMove(ids[1] as string)
        assert.deepStrictEqual([(yield* store.getSession(second.sessionId)).state, (yield* store.getSession(second.sessionId)).hostId], ["running", "h1"])
        assert.deepStrictEqual(movesOf(late), [])
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("sessions whose moves the source's guard refused are not moved again within ENGRAM_MAKE_ROOM_COOLDOWN_MS, by this leader or a new one; after it, they are", () =>
      Effect.gen(function* () {
        const store = yield* Store
        const metrics = yield* Metrics
        yield* starvingOnFullHosts()
        const first = yield* reaperPass
        assert.strictEqual(movesOf(first)?.length, 3)
        // Each source's guard refuses its move before any pause, as the agent aborts it.
        for (const m of yield* store.listMoves({ state: "pending" })) yield* store.abortMove(m.id, "ErrMoveDowntime: estimate 1400 ms > 1000 ms", { estimateMs: 1400 })
        yield* TestClock.adjust(60_000)
        assert.deepStrictEqual(movesOf(yield* reaperPass), [])
        assert.deepStrictEqual([metrics.makeRoomMoves.get({ result: "begun" }), metrics.makeRoomMoves.get({ result: "aborted" })], [3, 3])
        // Another replica leads now (its memory, one per store, is empty): it reads the aborted moves from the store.
        const replica = Store.of({ ...store })
        yield* TestClock.adjust(60_000)
        assert.deepStrictEqual(movesOf(yield* reaperPass.pipe(Effect.provideService(Store, replica))), [])
        yield* TestClock.adjust(10 * 60_000 - 120_000)
        assert.strictEqual(movesOf(yield* reaperPass.pipe(Effect.provideService(Store, replica)))?.length, 3)
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("a pair whose learned commit allowance passes the downtime budget takes no move: the plan goes where the guard would let it", () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* starvingOnFullHosts()
        // h1 → h0 committed once with a 1.5 s commit (the pair's allowance now passes the 1 s budget); the session moved back.
        const final = { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 } as const
        const there = yield* store.beginMove({ sessionId: "h1-s4", targetHostId: "h0", maxDowntimeMs: 2000 })
        yield* store.recordRound(there.id, final)
        yield* store.commitMove(there.id, { downtimeMs: 1600, captureMs: 5, sendMs: 10, commitMs: 1500 })
        const back = yield* store.beginMove({ sessionId: "h1-s4", targetHostId: "h1", maxDowntimeMs: 2000 })
        yield* store.recordRound(back.id, final)
        yield* store.commitMove(back.id, { downtimeMs: 300, captureMs: 5, sendMs: 10, commitMs: 200 })
        // Without it: h1-s4 and h1-s3 to h0 (the tightest), h1-s0 to h2.
        assert.deepStrictEqual(movesOf(yield* reaperPass), [
          ["h1-s4", "h1", "h2"],
          ["h1-s3", "h1", "h2"],
          ["h1-s0", "h1", "h2"],
        ])
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    // With make-room moves off too: an API move whose waiter died with its replica would
    // otherwise stay pending, and its session could never idle or move again.
    for (const [mode, moveSettings] of [["on", on], ["off", () => settings({ ENGRAM_MAKE_ROOM_MOVES: "0" })]] as const)
    it.effect(`the leader aborts a pending move twice ENGRAM_MOVE_TIMEOUT_MS old that it did not begin (make-room moves ${mode}); one past its intent is left to its source`, () =>
      Effect.gen(function* () {
        const store = yield* Store
        yield* starvingOnFullHosts()
        // Begun by hand, as a replica that died since (or the API) began them: no memory here has them.
        const a = yield* store.beginMove({ sessionId: "h1-s0", targetHostId: "h2", maxDowntimeMs: 1000 })
        const b = yield* store.beginMove({ sessionId: "h1-s1", targetHostId: "h0", maxDowntimeMs: 1000 })
        yield* store.recordRound(b.id, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
        const timeoutMs = Config.defaults().moveTimeoutMs
        yield* TestClock.adjust(2 * timeoutMs - 1000)
        yield* reaperPass
        assert.deepStrictEqual((yield* openMoves).length, 2)
        yield* TestClock.adjust(2000)
        yield* reaperPass
        const states = yield* Effect.forEach([a.id, b.id], (id) => Effect.map(store.getMove(id), (m) => [m.state, m.abortReason]))
        assert.deepStrictEqual(states, [
          ["aborted", "timeout"],
          ["pending", null],
        ])
        // Not this replica's make-room move: not counted as one.
        assert.strictEqual((yield* Metrics).makeRoomMoves.get({ result: "timeout" }), 0)
      }).pipe(Effect.provide(Layer.merge(services(store()), moveSettings()))),
    )

    it.effect("a planned move the store refuses is counted refused; one it cannot take (down, or fenced) unavailable", () =>
      Effect.gen(function* () {
        const store = yield* Store
        const metrics = yield* Metrics
        yield* starvingOnFullHosts()
        // h0 fills between the plan's fleet read and its first move: the store refuses both moves to it.
        // The third (to h2) meets a store that cannot take it, as a write fenced off by a newer leader.
        let beginning = 0
        const racing = Store.of({
          ...store,
          beginMove: (input) =>
            ++beginning === 1
              ? Effect.flatMap(Effect.orDie(store.createSession({ id: "filler", budget: { memMib: 16 * GiB, vcpus: 1 }, affinity: ["h0"] })), () => store.beginMove(input))
              : beginning === 3
                ? Effect.fail(new Unavailable({ reason: "fenced (test)", retryAfterMs: 1000 }))
                : store.beginMove(input),
        })
        const pass = yield* reaperPass.pipe(Effect.provideService(Store, racing))
        assert.deepStrictEqual(movesOf(pass), [])
        assert.deepStrictEqual(
          ["begun", "refused", "unavailable"].map((result) => metrics.makeRoomMoves.get({ result: result as "begun" })),
          [0, 2, 1],
        )
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("on by default: the coordinator's settings with nothing set begin the same moves", () =>
      Effect.gen(function* () {
        yield* starvingOnFullHosts()
        assert.deepStrictEqual(movesOf(yield* reaperPass.pipe(Effect.provide(settings({})))), [
          ["h1-s4", "h1", "h0"],
          ["h1-s3", "h1", "h0"],
          ["h1-s0", "h1", "h2"],
        ])
      }).pipe(Effect.provide(services(store()))),
    )

    it.effect("off (ENGRAM_MAKE_ROOM_MOVES=0, or a reaper without the coordinator's settings): the same fleet gets no move", () =>
      Effect.gen(function* () {
        yield* starvingOnFullHosts()
        assert.deepStrictEqual(movesOf(yield* reaperPass.pipe(Effect.provide(settings({ ENGRAM_MAKE_ROOM_MOVES: "0" })))), [])
        assert.deepStrictEqual(movesOf(yield* reaperPass), [])
        assert.deepStrictEqual(yield* openMoves, [])
      }).pipe(Effect.provide(services(store()))),
    )

    it.effect("no move while the room is not split: the fleet's free RAM cannot take the queue", () =>
      Effect.gen(function* () {
        // Free: h0 0, h1 24, h2 16 GiB = 40 < 48.
        yield* starvingOnFullHosts(64, 48)
        const pass = yield* reaperPass
        assert.strictEqual(pass._tag === "Done" && pass.holds.some((h) => h.reason === "starving"), true)
        assert.deepStrictEqual(movesOf(pass), [])
        assert.deepStrictEqual(yield* openMoves, [])
      }).pipe(Effect.provide(Layer.merge(services(store()), on()))),
    )

    it.effect("at most ENGRAM_MAKE_ROOM_MOVES_PER_PASS moves a pass: the first now, the rest once they end", () =>
      Effect.gen(function* () {
        yield* starvingOnFullHosts()
        assert.deepStrictEqual(movesOf(yield* reaperPass), [
          ["h1-s4", "h1", "h0"],
          ["h1-s3", "h1", "h0"],
        ])
        assert.deepStrictEqual(movesOf(yield* reaperPass), [])
        yield* commitAll
        // h0 is full now; the 8 GiB still missing on h1 go to h2.
        assert.deepStrictEqual(movesOf(yield* reaperPass), [["h1-s0", "h1", "h2"]])
        yield* commitAll
        assert.deepStrictEqual(placedOf(yield* reaperPass), [{ sessionId: "big", hostId: "h1" }])
      }).pipe(Effect.provide(Layer.merge(services(store()), on(2)))),
    )
  })
}
