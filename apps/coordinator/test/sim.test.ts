// The end-to-end suite on the in-memory store (fast), plus the cases only a wrapped store can show.
import { Limits } from "@engram/core"
import { describe as describeEffect, it as itEffect } from "@effect/vitest"
import { Coordinator, CoordinatorInfo, startCoordinator } from "@engram/coordinator"
import type { CoordinatorConfigInput } from "@engram/coordinator"
import { Changes, makeLocalChanges, Store } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Context, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { failingFleetLayer } from "./support/failing.js"
import type { FleetSwitch } from "./support/failing.js"
import { client, uid } from "./support/http.js"
import { moveParties } from "./support/moveParties.js"
import { apiSuite } from "./suite.js"

const adminToken = "sim-admin-token-0123456789"

apiSuite("StoreSim", {
  coordinator: async (o) => ({
    store: StoreSim.layer(),
    reaper: false,
    logLevel: "Warn",
    // The suite drives passes by hand right after start: no failover grace (grace.test.ts has its own).
    config: { port: 0, adminToken, reclaimGraceMs: 0, ...(o?.moveTimeoutMs === undefined ? {} : { moveTimeoutMs: o.moveTimeoutMs }) },
  }),
})

describe("a failed fleet read holds every park (over HTTP)", () => {
  const sw: FleetSwitch = { failFleet: false }
  let c: Awaited<ReturnType<typeof startCoordinator>>
  beforeAll(async () => {
    c = await startCoordinator({ store: failingFleetLayer(StoreSim.layer(), sw), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  it("the pass ends at once, no park descends, the failure is counted; the next good read yields", async () => {
    const admin = client(c.url, adminToken)
    const hid = uid("h")
    const token = (await admin.post("/v1/hosts", { id: hid })).body.token as string
    await admin.put(`/v1/hosts/${hid}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 4 })
    const agent = client(c.url, token)
    await admin.post("/v1/sessions", { id: "p1", memMib: 1536, vcpus: 1 })
    await agent.post("/v1/sessions/p1/started")
    expect((await agent.post("/v1/sessions/p1/idle")).body.state).toBe("parked")
    expect((await admin.post("/v1/sessions", { id: "q1", memMib: 1024, vcpus: 1 })).status).toBe(202)

    sw.failFleet = true
    expect(await c.reaperPass()).toEqual({ _tag: "Held", reason: "fleet read failed (test)" })
    expect(await c.reaperPass()).toMatchObject({ _tag: "Held" })
    expect((await admin.get("/v1/sessions/p1")).body.state).toBe("parked")
    const metrics = (await admin.get("/metrics")).body as string
    expect(metrics).toContain("engram_reaper_fleet_read_failures_total 2")
    expect(metrics).toContain("engram_store_up 0")
    // The API answers 503 with Retry-After where it needs the fleet read.
    const fleet = await admin.get("/v1/fleet")
    expect(fleet.status).toBe(503)
    expect(fleet.headers.get("retry-after")).toBe("1")
    expect(fleet.body).toMatchObject({ error: "Unavailable", retryAfterMs: 1000 })

    sw.failFleet = false
    expect(await c.reaperPass()).toMatchObject({ _tag: "Done", descents: [{ sessionId: "p1", reason: "demand" }] })
  })
})

describe("a store without the optional reads of moves (latestMove, markResendOwed)", () => {
  let c: Awaited<ReturnType<typeof startCoordinator>>
  // A user's own backend, older than both: the coordinator reads the session's history for its
  // latest move, and keeps no resend mark.
  const older = Layer.effect(
    Store,
    Effect.map(Store, (s) => {
      const { latestMove: _latestMove, markResendOwed: _markResendOwed, ...rest } = s
      return Store.of(rest)
    }),
  ).pipe(Layer.provide(StoreSim.layer()))
  beforeAll(async () => {
    c = await startCoordinator({ store: older, reaper: false, logLevel: "Error", config: { port: 0, adminToken, reclaimGraceMs: 0 } })
  })
  afterAll(() => c?.stop())

  it("a move's source and target read its session as on any store; the resend mark is refused with a 400 naming owed", async () => {
    await moveParties(c.url, client(c.url, adminToken), { resendMark: false })
  })
})

describe("two coordinators on one store (replicas)", () => {
  const shared = StoreSim.make().store
  let a: Awaited<ReturnType<typeof startCoordinator>>
  let b: Awaited<ReturnType<typeof startCoordinator>>
  beforeAll(async () => {
    const store = Layer.succeed(Store, shared)
    // One store, one stream of change notices (replicas on PostgreSQL share ChangesPg).
    const changes = Layer.succeed(Changes, makeLocalChanges())
    a = await startCoordinator({ store, changes, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
    b = await startCoordinator({ store, changes, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(async () => {
    await a?.stop()
    await b?.stop()
  })

  it("a host registered through one replica authenticates on the other on the very next request", async () => {
    // An unknown token on b first: a per-process cache would now hold off its next refresh.
    expect((await client(b.url, "nobody-holds-this-token-0123").get(`/v1/hosts/${uid("h")}`)).status).toBe(401)
    const hid = uid("h")
    const created = await client(a.url, adminToken).post("/v1/hosts", { id: hid })
    expect(created.status).toBe(201)
    const onB = client(b.url, created.body.token as string)
    expect((await onB.get(`/v1/hosts/${hid}`)).status).toBe(200)
    expect((await onB.get(`/v1/hosts/${hid}/assignments`)).body).toMatchObject({ hostId: hid, sessions: [], moves: [] })
    // Still its own host only, and an admin operation stays 403.
    expect((await onB.get("/v1/hosts")).status).toBe(403)
    // A token that is a prefix or extension of a real one is nobody's.
    expect((await client(b.url, `${created.body.token as string}x`).get(`/v1/hosts/${hid}`)).status).toBe(401)
  })

  it("a wait on one replica is woken by a change made through the other, and a rotated token stops on both", async () => {
    const hid = uid("h")
    const token = (await client(a.url, adminToken).post("/v1/hosts", { id: hid })).body.token as string
    await client(a.url, adminToken).put(`/v1/hosts/${hid}/report`, { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })
    const sid = uid("s")
    await client(a.url, adminToken).post("/v1/sessions", { id: sid, memMib: 256, vcpus: 1, affinity: [hid] })
    const waiting = client(b.url, adminToken).get(`/v1/sessions/${sid}/wait?state=running&timeoutMs=30000`)
    expect((await client(a.url, token).post(`/v1/sessions/${sid}/started`)).status).toBe(200)
    const woke = await waiting
    expect([woke.status, woke.body.state]).toEqual([200, "running"])
    const rotated = (await client(a.url, adminToken).post(`/v1/hosts/${hid}/token`)).body.token as string
    expect((await client(b.url, token).get(`/v1/hosts/${hid}`)).status).toBe(401)
    expect((await client(b.url, rotated).get(`/v1/hosts/${hid}`)).status).toBe(200)
  })
})

// The stale window of the start-up cases. They run on a TestClock, the coordinator's start with
// them: the reservations go stale while no coordinator runs (the clock moved past the window), and
// the host's report just before the start is still inside it when the starting coordinator drains
// (a host silent past the window takes nothing), however long the start takes on a loaded machine.
const startWindowMs = 3000

/** A coordinator over `store` on the test's clock, for the test's scope; its URL. */
const startedOn = (store: StoreShape, config: CoordinatorConfigInput) =>
  Effect.map(
    Layer.build(Coordinator.layer({ store: Layer.succeed(Store, store), reaper: false, config: { port: 0, adminToken, ...config } }).pipe(Layer.provide(Coordinator.loggerLayer("Error")))),
    (context) => Context.get(context, CoordinatorInfo).url,
  )
/** An HTTP call from the test (real time passes for it; the TestClock does not). */
const http = <A>(request: () => Promise<A>) => Effect.promise(request)

describeEffect("reconcile at start-up (SPEC §3)", () => {
  itEffect.effect("a starting coordinator reclaims what went stale while none ran and drains the queue, with the reaper loop off", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(Date.now())
      const limits = Limits.make({ heartbeatStaleWindowMs: startWindowMs })
      if (limits._tag === "Invalid") throw new Error("bad test limits")
      const store = StoreSim.make({ limits: limits.limits }).store
      yield* store.registerHost({ id: "rh" })
      // Capacity after policy 1024 MiB: s1 takes all of it, q1 waits.
      yield* store.reportHost("rh", { totalMib: 4096, allocatableMib: 2048, totalVcpus: 4 })
      yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 } })
      yield* store.markRunning("s1")
      const q = yield* store.createSession({ id: "q1", budget: { memMib: 512, vcpus: 1 } })
      if (q._tag !== "Queued") throw new Error(`q1 should queue, got ${q._tag}`)
      // No coordinator runs while s1's reservation goes stale (no heartbeat).
      yield* TestClock.adjust(startWindowMs + 300)
      // Its agent reports again (through a replica starting meanwhile): a host silent for a stale window takes nothing until it does.
      yield* store.reportHost("rh", { totalMib: 4096, allocatableMib: 2048, totalVcpus: 4 })
      // The seed's rule: no failover grace (with one, the start-up reconcile reclaims nothing: below).
      const url = yield* startedOn(store, { reclaimGraceMs: 0 })
      const admin = client(url, adminToken)
      // Already done when the coordinator answers its first request: no reaper pass ran.
      expect((yield* http(() => admin.get("/v1/sessions/s1"))).body).toMatchObject({ state: "lost" })
      expect((yield* http(() => admin.get("/v1/sessions/q1"))).body).toMatchObject({ state: "pending", hostId: "rh" })
      const metrics = (yield* http(() => admin.get("/metrics"))).body as string
      expect(metrics).toContain("engram_reaper_reclaimed_total 1")
      expect(metrics).toMatch(/^engram_sessions_lost_total 1$/m)
      // Every state but ended, 0 included, as the store counts them now.
      for (const [state, n] of Object.entries({ queued: 0, pending: 1, running: 0, parked: 0, descending: 0, descended: 0, moving: 0, lost: 1 }))
        expect(metrics).toMatch(new RegExp(`^engram_sessions\\{state="${state}"\\} ${n}$`, "m"))
      expect(metrics).not.toContain('engram_sessions{state="ended"}')
      expect(metrics).toContain('engram_placements_total{outcome="placed",source="drain"} 1')
      expect(metrics).not.toMatch(/^engram_reaper_passes_total\{/m)
    }).pipe(Effect.scoped),
  )
})

describeEffect("reconcile at start-up with the failover grace (ENGRAM_RECLAIM_GRACE_MS)", () => {
  itEffect.effect("a starting coordinator reclaims nothing that went stale while none ran (no host could heartbeat), and still drains the queue", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(Date.now())
      const limits = Limits.make({ heartbeatStaleWindowMs: startWindowMs })
      if (limits._tag === "Invalid") throw new Error("bad test limits")
      const store = StoreSim.make({ limits: limits.limits }).store
      for (const id of ["gh", "gq"]) {
        yield* store.registerHost({ id })
        yield* store.reportHost(id, { totalMib: 4096, allocatableMib: 2048, totalVcpus: 4 })
      }
      yield* store.createSession({ id: "gs1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["gh"] })
      yield* store.markRunning("gs1")
      // Queued behind an affinity to a host that had no room, which then reports room: the drain places it.
      yield* store.createSession({ id: "gs2", budget: { memMib: 1024, vcpus: 1 }, affinity: ["gq"] })
      yield* store.markRunning("gs2")
      const q = yield* store.createSession({ id: "gq1", budget: { memMib: 512, vcpus: 1 }, affinity: ["gq"] })
      if (q._tag !== "Queued") throw new Error(`gq1 should queue, got ${q._tag}`)
      yield* store.reportHost("gq", { totalMib: 8192, allocatableMib: 4096, totalVcpus: 4 })
      // No coordinator runs while the reservations go stale (no heartbeat).
      yield* TestClock.adjust(startWindowMs + 300)
      // gq's agent reports again (through a replica starting meanwhile): a host silent for a stale window takes nothing until it does.
      yield* store.reportHost("gq", { totalMib: 8192, allocatableMib: 4096, totalVcpus: 4 })
      const url = yield* startedOn(store, { reclaimGraceMs: 60_000 })
      const admin = client(url, adminToken)
      expect((yield* http(() => admin.get("/v1/sessions/gs1"))).body).toMatchObject({ state: "running" })
      expect((yield* http(() => admin.get("/v1/sessions/gs2"))).body).toMatchObject({ state: "running" })
      expect((yield* http(() => admin.get("/v1/sessions/gq1"))).body).toMatchObject({ state: "pending", hostId: "gq" })
      const metrics = (yield* http(() => admin.get("/metrics"))).body as string
      expect(metrics).not.toMatch(/^engram_reaper_reclaimed_total [1-9]/m)
    }).pipe(Effect.scoped),
  )
})

describe("the move timeout's abort is the store's atomic decision", () => {
  // Another replica records the source's final round after this waiter's last read of the
  // move and before its abort: the window a read-then-abort left open across replicas.
  const racing = Layer.effect(
    Store,
    Effect.gen(function* () {
      const inner = yield* Store
      return Store.of({
        ...inner,
        abortMove: (id, reason, options) =>
          reason === "timeout"
            ? inner
                .recordRound(id, { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 })
                .pipe(Effect.orDie, Effect.andThen(inner.abortMove(id, reason, options)))
            : inner.abortMove(id, reason, options),
      })
      }),
  ).pipe(Layer.provide(StoreSim.layer()))
  let c: Awaited<ReturnType<typeof startCoordinator>>
  beforeAll(async () => {
      c = await startCoordinator({ store: racing, reaper: false, logLevel: "Error", config: { port: 0, adminToken, moveTimeoutMs: 300 } })
  })
  afterAll(() => c?.stop())

  it("a final round that lands just before the timeout's abort wins: 503 MoveCommitPending, the move stays pending", async () => {
      const admin = client(c.url, adminToken)
      const hosts: { id: string; token: string }[] = []
      for (const id of [uid("src"), uid("dst")]) {
      const token = (await admin.post("/v1/hosts", { id })).body.token as string
      await admin.put(`/v1/hosts/${id}/report`, { totalMib: 4096, allocatableMib: 3072, totalVcpus: 4 })
      hosts.push({ id, token })
      }
      const [src, dst] = hosts as [{ id: string; token: string }, { id: string; token: string }]
      await admin.post("/v1/sessions", { id: "mv1", memMib: 256, vcpus: 1, affinity: [src.id] })
      await client(c.url, src.token).post("/v1/sessions/mv1/started")
      const done = await admin.post("/v1/sessions/mv1/move", { targetHostId: dst.id, maxDowntimeMs: 600 })
      expect(done.status).toBe(503)
      expect(done.body).toMatchObject({ error: "MoveCommitPending" })
      expect((await admin.get(`/v1/moves/${done.body.moveId as string}`)).body).toMatchObject({ state: "pending", abortReason: null })
      // The source's assignments still carry the move, and its commit lands.
      const assigned = await client(c.url, src.token).get(`/v1/hosts/${src.id}/assignments`)
      expect(assigned.body.moves.map((m: { id: string }) => m.id)).toEqual([done.body.moveId])
      const committed = await client(c.url, src.token).post(`/v1/moves/${done.body.moveId as string}/commit`, { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 400 })
      expect(committed.status).toBe(200)
      expect((await admin.get("/v1/sessions/mv1")).body).toMatchObject({ state: "running", hostId: dst.id })
      expect((await client(c.url, dst.token).get(`/v1/hosts/${dst.id}/assignments`)).body.moves).toEqual([])
  })
})
