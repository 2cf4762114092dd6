/**
 * A coordinator that flaps (answers one poll in ten) does not keep its agents at the first
 * retry delay: over real HTTP (a proxy in front of a real coordinator that fails 9 polls of 10
 * with a plain 503), the agent's delays after failed polls grow to the cap and stay there while
 * the flapping goes on; once the coordinator has answered every poll for the cap, a new failure
 * starts from the first delay again. Time is the TestClock's, the draws the highest (`Random`
 * fixed), so each delay is its ceiling.
 */
import { createServer, type Server } from "node:http"
import { mkdtempSync } from "node:fs"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { startCoordinator } from "@engram/coordinator"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { StoreSim } from "@engram/store-sim"
import { Clock, Effect, Random, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { type CoordinatorShape, makeHttp } from "../src/Coordinator.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { adminCall } from "./support/Admin.js"
import { effect } from "./support/PatientClock.js"
import { forwardTo } from "./support/Forward.js"

const adminToken = "flapping-admin-token-0123456789"
const highest: Random.Random = { nextDoubleUnsafe: () => 1 - 1e-9, nextIntUnsafe: () => 0 }
const realMs = (ms: number) => Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, ms)))

/** A proxy in front of `upstream`: an assignments poll for which `fails(n)` holds (n from 1) is a plain 503, everything else is passed on. */
const flappingProxy = (upstream: string, fails: (n: number) => boolean) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      let polls = 0
      const server: Server = createServer((req, res) =>
        forwardTo(upstream, req, res, () => {
          if (req.url?.includes("/assignments") !== true || !fails(++polls)) return false
          res.writeHead(503, { "content-type": "text/html" }).end("<h1>upstream busy</h1>")
          return true
        }),
      )
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
      return server
    }),
    (server) => Effect.promise(() => new Promise<void>((resolve) => server.close(() => resolve()))),
  )

describe("a flapping coordinator: the back-off is reset only by a healthy period", () => {
  effect("a coordinator that fails 9 polls of 10: the delays grow to the cap (30 s) and stay there; after 30 s of answers a failure starts from 2 s again", () =>
    Effect.gen(function* () {
      const coordinator = yield* Effect.acquireRelease(
        Effect.promise(() => startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })),
        (c) => Effect.promise(() => c.stop()),
      )
      const hostToken = (yield* Effect.promise(() => adminCall(() => coordinator.url, adminToken)("POST", "/v1/hosts", { id: "a" }))).body["token"] as string
      // "flap": every tenth poll answered; "answer": every one; "down": none.
      let mode: "flap" | "answer" | "down" = "flap"
      const proxy = yield* flappingProxy(coordinator.url, (n) => mode === "down" || (mode === "flap" && n % 10 !== 0))
      const http = yield* makeHttp({ url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/`, hostId: "a", hostToken: Redacted.make(hostToken) }).pipe(
        Effect.provide(FetchHttpClient.layer),
      )
      // Each poll: when it was sent and when its answer came (the TestClock's), and whether it failed.
      const polls: { sentMs: number; answeredMs?: number; failed?: boolean }[] = []
      const client: CoordinatorShape = {
        ...http,
        assignments: (o) =>
          Effect.flatMap(Clock.currentTimeMillis, (sentMs) => {
            const poll: (typeof polls)[number] = { sentMs }
            polls.push(poll)
            return http.assignments(o).pipe(
              Effect.onExit((exit) => Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => Object.assign(poll, { answeredMs: t, failed: exit._tag === "Failure" })))),
            )
          }),
      }
      const runtime = yield* SimRuntime.make({ startMs: 50 })
      const residents = yield* makeResidents("a", null, () => Effect.void)
      // ENGRAM_AGENT_RETRY_MS=1000 (the default): the cap is 30 s. No long-poll wait: an answered poll comes back at once.
      const agent = yield* makeAgent(
        { ...defaultAgentConfig("a"), pollWaitMs: 0 },
        {
          coordinator: client,
          runtime,
          measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
          residents,
          images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-flapping-"))),
          link: PeerLink.inMemory(new Map()),
          target: yield* makeMoveTarget("a", runtime, residents),
        },
      )
      yield* Effect.forkChild(agent.run)
      /** Once every poll sent has its answer (real HTTP), and its fiber went on to its sleep (no I/O between). */
      const settled = Effect.gen(function* () {
        for (let j = 0; j < 5000 && polls.some((p) => p.answeredMs === undefined); j++) yield* realMs(2)
        yield* realMs(5)
      })
      /** Steps the TestClock a second at a time, each step once the polls sent have settled, until `done` (settled too). */
      const stepUntil = (done: () => boolean) =>
        Effect.gen(function* () {
          yield* settled
          for (let i = 0; i < 2000 && !done(); i++) {
            yield* TestClock.adjust("1 second")
            yield* settled
          }
          assert.isTrue(done(), `the clock was stepped 2000 times: ${polls.length} polls`)
        })
      /** The delay after each failed poll among `ps`: from its answer to the next poll's send. */
      const delaysAfterFailures = (from: number, to: number) =>
        polls.slice(from, to).flatMap((p, i) => (p.failed === true && polls[from + i + 1] !== undefined ? [polls[from + i + 1]!.sentMs - p.answeredMs!] : []))

      // Three rounds of ten polls: nine failures and an answer each.
      yield* stepUntil(() => polls.length >= 31)
      assert.deepStrictEqual(polls.slice(0, 30).map((p) => p.failed), Array.from({ length: 30 }, (_, i) => i % 10 !== 9))
      assert.deepStrictEqual(delaysAfterFailures(0, 10), [2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000, 30000], "the first trouble backs off from 2 s")
      // The one answer in ten does not start the back-off again: every later failure waits the cap.
      assert.deepStrictEqual(delaysAfterFailures(10, 31), Array.from({ length: 18 }, () => 30000), "an answer among failures keeps the back-off")

      // The coordinator answers every poll (1 s apart: it holds none) for more than the cap; then it fails again.
      mode = "answer"
      const healthyFrom = polls.length
      yield* stepUntil(() => polls.length > healthyFrom && polls.at(-1)!.sentMs - polls[healthyFrom]!.sentMs > 31_000)
      mode = "down"
      const troubleFrom = polls.length
      yield* stepUntil(() => polls.length >= troubleFrom + 4)
      assert.isTrue(polls.slice(healthyFrom, troubleFrom).every((p) => p.failed === false))
      assert.deepStrictEqual(delaysAfterFailures(troubleFrom, troubleFrom + 4), [2000, 4000, 8000], "a failure after a healthy period starts from the first delay")
    }).pipe(Effect.provideService(Random.Random, highest)), 120_000)
})
