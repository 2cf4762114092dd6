import { existsSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs"
import { createServer, type Server } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Scope, Exit, Logger } from "effect"
import { startHostAgent } from "../src/Host.js"
import { moveToken } from "../src/MoveToken.js"
import { makeFakeCoordinator, type FakeCoordinator } from "./support/FakeCoordinator.js"

const measure = () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })

/** Starts an agent in its own scope (closing it is the agent stopping); `runtime`: its VM runtime (a simulated one by default). */
const start = (coordinator: FakeCoordinator, stateFile: string, hostId = "h", runtime?: Parameters<typeof startHostAgent>[0]["runtime"]) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const agent = yield* startHostAgent({
      hostId,
      coordinator: coordinator.client(hostId),
      peerSecret: "restart-test-secret-0123",
      peers: () => undefined,
      stateFile,
      measure,
      sim: { startMs: 5 },
      config: { retryDelayMs: 20, pollWaitMs: 0 },
      ...(runtime === undefined ? {} : { runtime }),
    }).pipe(Scope.provide(scope))
    return { agent, stop: Scope.close(scope, Exit.void) }
  })

const waitUntil = (what: string, f: Effect.Effect<boolean>, tries = 200) =>
  Effect.gen(function* () {
    for (let i = 0; i < tries; i++) {
      if (yield* f) return
      yield* Effect.sleep(20)
    }
    assert.fail(`timed out waiting for ${what}`)
  })

/** An agent (host "h") running sessions s1 and s2, both started and in its state file (a fresh one under a `prefix` directory). */
const twoRunning = (prefix: string) =>
  Effect.gen(function* () {
    const coordinator = yield* makeFakeCoordinator
    const stateFile = join(mkdtempSync(join(tmpdir(), prefix)), "state.json")
    yield* coordinator.addSession("s1", "h", 512)
    yield* coordinator.addSession("s2", "h", 256)
    const first = yield* start(coordinator, stateFile)
    yield* waitUntil("both running", Effect.map(coordinator.get, (s) => s.sessions.get("s1")?.state === "running" && s.sessions.get("s2")?.state === "running"))
    yield* waitUntil("both persisted", Effect.map(first.agent.residents.all, (v) => v.length === 2))
    return { coordinator, stateFile, first }
  })

describe("a restarted agent reconciles what is resident with the coordinator", () => {
  it.live("VMs in the state file are adopted, not started again; what the coordinator dropped is destroyed", () =>
    Effect.gen(function* () {
      const { coordinator, stateFile, first } = yield* twoRunning("engram-restart-")
      yield* first.stop

      // While the agent is down: s2 ends.
      yield* coordinator.setState("s2", "ended")
      const second = yield* start(coordinator, stateFile)
      assert.deepStrictEqual((yield* second.agent.runtime.list).map((v) => v.vmId).sort(), ["s1", "s2"], "adopted from the state file")
      yield* waitUntil("s2 destroyed", Effect.map(second.agent.runtime.list, (vms) => vms.length === 1))
      assert.deepStrictEqual((yield* second.agent.residents.all).map((v) => [v.vmId, v.reservationId]), [["s1", "res-s1"]])
      const calls = (yield* coordinator.get).calls
      assert.deepStrictEqual(calls.filter((c) => c.startsWith("started")).sort(), ["started s1", "started s2"], "each acknowledged exactly once")
      yield* second.stop
    }))

  it.live("VMs that did not survive the agent's absence are said as lost, and a session the coordinator has running or parked here boots fresh with an error naming it", () =>
    Effect.gen(function* () {
      const { coordinator, stateFile, first } = yield* twoRunning("engram-restart-lost-")
      yield* coordinator.setState("s2", "parked")
      yield* waitUntil("s2 parked", Effect.map(first.agent.runtime.list, (vms) => vms.find((v) => v.vmId === "s2")?.status === "paused"))
      yield* first.stop

      // The host rebooted while the agent was down: its runtime finds none of its VMs.
      const sim = yield* SimRuntime.make({ startMs: 5 })
      const logged: unknown[] = []
      const capture = Logger.make<unknown, void>(({ logLevel, message }) => void logged.push([logLevel, ...(Array.isArray(message) ? message : [message])]))
      const second = yield* start(coordinator, stateFile, "h", { ...sim, recover: () => Effect.succeed([]) }).pipe(Effect.provide(Logger.layer([capture])))
      yield* waitUntil("s1 running and s2 parked again", Effect.map(second.agent.runtime.list, (vms) => vms.find((v) => v.vmId === "s1")?.status === "running" && vms.find((v) => v.vmId === "s2")?.status === "paused"))
      const errors = logged.filter((l) => (l as unknown[])[0] === "Error") as unknown[][]
      assert.deepInclude(errors.map((l) => l[2]), { hostId: "h", lost: ["s1", "s2"] })
      const gone = errors.filter((l) => String(l[1]).startsWith("session's guest is gone")).map((l) => l[2] as { readonly hostId: string; readonly sessionId: string; readonly state: string })
      assert.deepStrictEqual(
        gone.sort((a, b) => a.sessionId.localeCompare(b.sessionId)),
        [
          { hostId: "h", sessionId: "s1", state: "running" },
          { hostId: "h", sessionId: "s2", state: "parked" },
        ],
      )
      yield* second.stop
    }))

  it.live("a corrupt state file is quarantined and the coordinator's view rebuilds the host", () =>
    Effect.gen(function* () {
      const coordinator = yield* makeFakeCoordinator
      const dir = mkdtempSync(join(tmpdir(), "engram-restart-"))
      const stateFile = join(dir, "state.json")
      writeFileSync(stateFile, "{ not json")
      yield* coordinator.addSession("s1", "h", 512)
      yield* coordinator.setState("s1", "running")
      const agent = yield* start(coordinator, stateFile)
      assert.isTrue(readdirSync(dir).some((f) => f.startsWith("state.json.corrupt-")), "quarantined beside the file")
      // The coordinator says s1 runs here; nothing resident: the agent brings it back.
      yield* waitUntil("s1 resident", Effect.map(agent.agent.runtime.list, (vms) => vms.some((v) => v.vmId === "s1" && v.status === "running")))
      assert.isTrue(existsSync(stateFile), "a fresh state file is written")
      yield* agent.stop
    }))
})

/** A target agent's stand-in over real HTTP: answers every commit (and abort) 200 and remembers what it was asked, with which bearer. */
const standInTarget = Effect.acquireRelease(
  Effect.promise(
    () =>
      new Promise<{ readonly url: string; readonly asked: { path: string; bearer: string }[]; readonly server: Server }>((resolve) => {
        const asked: { path: string; bearer: string }[] = []
        const server = createServer((req, res) => {
          asked.push({ path: req.url ?? "", bearer: (req.headers.authorization ?? "").replace(/^Bearer /, "") })
          res.setHeader("content-type", "application/json")
          res.end(JSON.stringify({ ok: true, resumedForMs: 0 }))
        })
        server.listen(0, "127.0.0.1", () => {
          const a = server.address()
          resolve({ url: `http://127.0.0.1:${typeof a === "object" && a !== null ? a.port : 0}`, asked, server })
        })
      }),
  ),
  (t) => Effect.promise(() => new Promise((r) => t.server.close(r))),
)

describe("a restarted source settles the move outcome it owes", () => {
  it.live("without ENGRAM_PEERS: the target is asked at the peer URL the owed move recorded (the coordinator no longer sends one), and the move commits", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const target = yield* standInTarget
        const coordinator = yield* makeFakeCoordinator
        yield* coordinator.addSession("s1", "a", 512)
        yield* coordinator.setState("s1", "running")
        yield* coordinator.beginMove("m1", "s1", "b", 600)
        // The final round is recorded: the point of no return is behind the move (the fake sends no target peer URL with it).
        yield* coordinator.client("a").round("m1", { kind: "final", wireBytes: 1, apparentBytes: 1, sendMs: 1, captureMs: 1 })
        // What the source wrote before it stopped: its copy paused, the target's commit not confirmed yet.
        const stateFile = join(mkdtempSync(join(tmpdir(), "engram-restart-owed-")), "state.json")
        writeFileSync(
          stateFile,
          JSON.stringify({
            version: 1,
            hostId: "a",
            vms: [{ vmId: "s1", memMib: 512, vcpus: 1, status: "paused", reservationId: "res-s1", moveId: null }],
            pendingCommits: [
              {
                moveId: "m1",
                sessionId: "s1",
                phases: null,
                target: { targetHostId: "b", memMib: 512, vcpus: 1, peerUrl: target.url },
                pause: { pausedAtMs: 0, captureMs: 1, sendMs: 1, sentAtMs: 2 },
                finalRecorded: true,
              },
            ],
          }),
        )
        const { agent, stop } = yield* start(coordinator, stateFile, "a")
        yield* waitUntil("the move committed and the paused copy dropped", Effect.map(Effect.all([coordinator.get, agent.residents.all]), ([s, vms]) => s.moves.get("m1")?.state === "committed" && vms.length === 0), 1000)
        assert.deepStrictEqual(target.asked[0], { path: "/v1/peer/moves/m1/commit", bearer: moveToken("restart-test-secret-0123", "commit", { moveId: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: 512, vcpus: 1 }) })
        assert.deepInclude((yield* coordinator.get).sessions.get("s1"), { state: "running", hostId: "b" })
        yield* stop
      }),
    ), 30_000)
})
