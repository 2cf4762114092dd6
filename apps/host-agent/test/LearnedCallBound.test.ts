/**
 * The bound of a coordinator call follows the cadence the agent learns. An agent at its own
 * 120 s stale window (a 40 s heartbeat interval: each call bounded by 30 s with several URLs,
 * `Failover.callTimeoutFor`) against a coordinator whose window is 15 s heartbeats every 5 s once
 * it learns that window; its calls are then bounded by 5 s, and say so
 * (`engram-agent-call-timeout-ms`). Before, the bound stayed the start's 30 s: once its replica
 * hung (accepting connections, never answering) every heartbeat waited 30 s on it, twice the
 * coordinator's window, and the host was reclaimed before the agent moved to the next replica.
 *
 * Over real HTTP: a proxy (replica 1) in front of a real coordinator (replica 2, its own URL),
 * which the test switches to hang. Time is the TestClock's.
 */
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { assert, describe } from "@effect/vitest"
import { Errors as ApiErrors } from "@engram/api"
import { startCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { SimRuntime } from "@engram/runtime"
import { StoreSim } from "@engram/store-sim"
import { Clock, Effect, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { type CoordinatorShape, makeHttp } from "../src/Coordinator.js"
import * as Failover from "../src/Failover.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { adminCall } from "./support/Admin.js"
import { capture as captureLogs } from "./support/Logs.js"
import { effect, noImages } from "./support/PatientClock.js"
import { forwardTo } from "./support/Forward.js"

const adminToken = "learned-bound-admin-token-0123456789"
const windowMs = 15_000
const realMs = (ms: number) => Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

/**
 * A proxy in front of `upstream` that passes every request on, or (`hang`) takes it and never
 * answers; `stated`: the bound each request stated, in order; `parked`: requests held unanswered now.
 */
const switchableProxy = (upstream: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const state = { hang: false, parked: 0, hungPaths: [] as string[], stated: [] as string[] }
      const server: Server = createServer((req, res) => {
        state.stated.push(String(req.headers[ApiErrors.agentCallTimeoutHeader]))
        if (state.hang) {
          state.parked++
          state.hungPaths.push(req.url ?? "")
          res.on("close", () => state.parked--)
          return
        }
        forwardTo(upstream, req, res)
      })
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
      return { server, state, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
    }),
    ({ server }) =>
      Effect.promise(() => {
        server.closeAllConnections()
        return new Promise<void>((resolve) => server.close(() => resolve()))
      }),
  )

describe("the call bound follows the learned heartbeat cadence", () => {
  effect("own window 120 s (30 s bound), the coordinator's 15 s: after learning it a heartbeat hung on a frozen replica is given up within 5 s and answered by the next, within the window", () =>
    Effect.gen(function* () {
      const coordinator = yield* Effect.acquireRelease(
        Effect.promise(() =>
          startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken, limits: { ...Limits.defaults, heartbeatStaleWindowMs: windowMs } } }),
        ),
        (c) => Effect.promise(() => c.stop()),
      )
      const hostToken = (yield* Effect.promise(() => adminCall(() => coordinator.url, adminToken)("POST", "/v1/hosts", { id: "a" }))).body["token"] as string
      const proxy = yield* switchableProxy(coordinator.url)
      const config = { ...defaultAgentConfig("a"), pollWaitMs: 0 }
      const urls = [proxy.url, coordinator.url]
      // As `httpCoordinator` makes it: the bound of the agent's own interval (40 s: 30 s).
      const startBoundMs = Failover.callTimeoutFor(urls.length, config.heartbeatIntervalMs)
      assert.strictEqual(startBoundMs, 30_000)
      const http = yield* makeHttp({ url: urls, hostId: "a", hostToken: Redacted.make(hostToken), callTimeoutMs: startBoundMs }).pipe(Effect.provide(FetchHttpClient.layer))
      // The calls open (real HTTP, or held by the hung proxy), and each heartbeat: sent and answered (the TestClock's).
      let open = 0
      const beats: { sentMs: number; answeredMs?: number; ok?: boolean }[] = []
      const counted = <A, E>(eff: Effect.Effect<A, E>) =>
        Effect.suspend(() => {
          open++
          return eff.pipe(Effect.ensuring(Effect.sync(() => open--)))
        })
      const client: CoordinatorShape = {
        ...http,
        report: (r, active) => counted(http.report(r, active)),
        assignments: (o) => counted(http.assignments(o)),
        heartbeat: Effect.flatMap(Clock.currentTimeMillis, (sentMs) => {
          const beat: (typeof beats)[number] = { sentMs }
          beats.push(beat)
          return counted(http.heartbeat).pipe(
            Effect.onExit((exit) => Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => Object.assign(beat, { answeredMs: t, ok: exit._tag === "Success" })))),
          )
        }),
      }
      const runtime = yield* SimRuntime.make({ startMs: 50 })
      const residents = yield* makeResidents("a", null, () => Effect.void)
      const { layer: capture, lines: warnings } = captureLogs("Warn")
      const agent = yield* makeAgent(config, {
        coordinator: client,
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images: noImages,
        link: PeerLink.inMemory(new Map()),
        target: yield* makeMoveTarget("a", runtime, residents),
      })
      yield* Effect.forkChild(agent.run.pipe(Effect.provide(capture)))
      /** Once every call open is answered (real HTTP) or held by the hung proxy (at most ~3 s of real time: a call may sleep on the clock). */
      const settled = Effect.gen(function* () {
        for (let j = 0; j < 1500 && open > proxy.state.parked; j++) yield* realMs(2)
        yield* realMs(5)
      })
      /** Steps the TestClock a second at a time, each step once the calls have settled, until `done`. */
      const stepUntil = (what: string, done: () => boolean, steps: number) =>
        Effect.gen(function* () {
          yield* settled
          for (let i = 0; i < steps && !done(); i++) {
            yield* TestClock.adjust("1 second")
            yield* settled
          }
          assert.isTrue(done(), `${what}: not within ${steps} s`)
        })

      // The first poll's answer carries the coordinator's window; a heartbeat is sent after it.
      const learned = () => warnings.findIndex((w) => w.message.startsWith(`the coordinator's heartbeat stale window (${windowMs} ms) is shorter`))
      yield* stepUntil("the coordinator's window learned", () => learned() >= 0, 30)
      const beatsLearned = beats.length
      yield* stepUntil("a heartbeat after the window was learned", () => beats.length > beatsLearned && beats.at(-1)!.ok === true, 30)
      const statedBefore = proxy.state.stated.length

      // Replica 1 freezes: it takes connections and never answers.
      proxy.state.hang = true
      const frozeMs = yield* Clock.currentTimeMillis
      const beatsBefore = beats.length
      const after = () => beats.slice(beatsBefore)
      yield* stepUntil("a heartbeat answered after the freeze", () => after().some((b) => b.ok === true), 60)
      const first = after()[0]!
      assert.isTrue(proxy.state.hungPaths.some((p) => p.endsWith("/heartbeat")), "the first heartbeat after the freeze reached the frozen replica")
      assert.isTrue(first.ok, "the first heartbeat after the freeze was answered by the next replica")
      // Its try on the frozen replica was given up at the learned bound (5 s), not the start's (30 s).
      assert.isAtMost(first.answeredMs! - first.sentMs, 5_000 + 1_000, `the heartbeat took ${first.answeredMs! - first.sentMs} ms`)
      // Within the coordinator's window: the host is not reclaimed meanwhile.
      assert.isBelow(first.answeredMs! - frozeMs, windowMs, `answered ${first.answeredMs! - frozeMs} ms after the freeze`)
      const moved = warnings.filter((w) => w.message === "coordinator replica unreachable; the agent moves to the next")
      assert.deepStrictEqual(
        moved.map((w) => [w.fields["from"], w.fields["to"]]),
        [[proxy.url, coordinator.url]],
      )
      // Each call states its bound: the start's first, the learned one from then on.
      assert.strictEqual(proxy.state.stated[0], "30000", "the first call states the start's bound")
      assert.deepStrictEqual(new Set(proxy.state.stated.slice(statedBefore)), new Set(["5000"]), "the calls after the window was learned state its bound")
      assert.include(warnings[learned()]!.message, "heartbeating every 5000 ms at most, each coordinator call bounded by 5000 ms")
    }),
    120_000,
  )
})
