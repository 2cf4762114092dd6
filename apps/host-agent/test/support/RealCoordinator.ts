// What the tests against a real coordinator in this process (`startCoordinator`) share: a host's
// agent client over HTTP with its requests timed on the real clock (the test's own runs on a
// TestClock), and the coordinator's store for a test's admin steps.
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { Store, type StoreShape } from "@engram/store"
import { Clock, Effect, Layer, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { StoreSim } from "@engram/store-sim"
import { assert } from "@effect/vitest"
import { afterEach, beforeEach } from "vitest"
import { type CoordinatorShape, makeHttp } from "../../src/Coordinator.js"
import { adminCall } from "./Admin.js"

const liveClock = Effect.runSync(Clock.clockWith(Effect.succeed))
const live = <A, E>(eff: Effect.Effect<A, E>) => Effect.provideService(eff, Clock.Clock, liveClock)

/** Host `hostId`'s coordinator client at `url`: the agent's own (`makeHttp`), its requests timed on the real clock. */
export const realClient = (url: string, hostId: string, hostToken: string) =>
  Effect.gen(function* () {
    const c = yield* makeHttp({ url, hostId, hostToken: Redacted.make(hostToken) }).pipe(Effect.provide(FetchHttpClient.layer))
    return {
      report: (r, active) => live(c.report(r, active)),
      heartbeat: live(c.heartbeat),
      assignments: (o) => live(c.assignments(o)),
      started: (id) => live(c.started(id)),
      descended: (id, options) => live(c.descended(id, options)),
      round: (id, round) => live(c.round(id, round)),
      commit: (id, phases, guard) => live(c.commit(id, phases, guard)),
      abort: (id, reason, estimateMs) => live(c.abort(id, reason, estimateMs)),
      reportRunning: (id, reason) => live(c.reportRunning(id, reason)),
      resendOwed: (id: string, owed: boolean, seenClears?: number) => live(c.resendOwed(id, owed, seenClears)),
      guestLost: (id, reason) => live(c.guestLost(id, reason)),
      getMove: (id) => live(c.getMove(id)),
      getSession: (id) => live(c.getSession(id)),
    } satisfies CoordinatorShape
  })

/** `f` on the coordinator's store (a test's admin steps). */
export const onStore =
  (coordinator: () => RunningCoordinator) =>
  <A, E>(f: (s: StoreShape) => Effect.Effect<A, E>) =>
    Effect.promise(() =>
      coordinator().run(
        Effect.gen(function* () {
          return yield* f(yield* Store)
        }),
      ),
    )

/**
 * `inner` with its clock ahead of the real one by what the test has `advance`d: a store's time
 * (its reports' stamps, its silence judgements) moves on when the test says, not after a real
 * wait whose margin a loaded machine eats (a coordinator running on the real clock in-process).
 */
export const skewedStore = <E>(inner: Layer.Layer<Store, E>) => {
  let aheadMs = 0
  const skewed: Clock.Clock = {
    monotonicTimeNanosUnsafe: () => liveClock.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: liveClock.monotonicTimeNanos,
    sleep: (duration) => liveClock.sleep(duration),
    currentTimeMillisUnsafe: () => liveClock.currentTimeMillisUnsafe() + aheadMs,
    currentTimeMillis: Effect.sync(() => liveClock.currentTimeMillisUnsafe() + aheadMs),
    currentTimeNanosUnsafe: () => liveClock.currentTimeNanosUnsafe() + BigInt(aheadMs) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => liveClock.currentTimeNanosUnsafe() + BigInt(aheadMs) * 1_000_000n),
  }
  const layer = Layer.effect(
    Store,
    Effect.map(Store, (store) => {
      const out: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(store))
        out[name] =
          typeof value === "function" && name !== "limits"
            ? (...args: unknown[]) => {
                const r = (value as (...a: unknown[]) => unknown).apply(store, args)
                return Effect.isEffect(r) ? Effect.provideService(r, Clock.Clock, skewed) : r
              }
            : value
      return out as unknown as StoreShape
    }),
  ).pipe(Layer.provide(inner))
  return { layer, advance: (ms: number) => void (aheadMs += ms) }
}

/**
 * A real coordinator in this process for each test of the file (StoreSim on `skewedStore`, reaper
 * off), hosts `a` and `b` registered and reported (`measure`): what the tests of a move between
 * them over a real coordinator share. Its stale window is long (60 s), so a stall of the machine
 * between a source's report and a reclaim never makes the source look silent; `pastWindow` moves
 * the store's clock past it, nothing waited out in real time.
 */
export const twoHostCoordinator = (adminToken: string) => {
  const windowMs = 60_000
  const limits = { ...Limits.defaults, heartbeatStaleWindowMs: windowMs }
  const measure = { totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }
  let running: RunningCoordinator | undefined
  let clock: ReturnType<typeof skewedStore> | undefined
  const tokens: Record<string, string> = {}
  const url = () => running!.url
  const admin = adminCall(url, adminToken)
  beforeEach(async () => {
    clock = skewedStore(StoreSim.layer({ limits }))
    running = await startCoordinator({ store: clock.layer, reaper: false, logLevel: "None", config: { port: 0, adminToken, moveTimeoutMs: 600_000, limits } })
    for (const id of ["a", "b"]) {
      tokens[id] = (await admin("POST", "/v1/hosts", { id })).body.token as string
      assert.strictEqual((await admin("PUT", `/v1/hosts/${id}/report`, measure)).status, 200)
    }
  })
  afterEach(() => running?.stop())
  return {
    measure,
    tokens,
    admin,
    url,
    /** `f` on the coordinator's store (a test's admin steps). */
    store: onStore(() => running!),
    /** The store's clock moved past the stale window: only hosts that report from now on are heard. */
    pastWindow: () => clock!.advance(windowMs + 500),
  }
}
