/**
 * A source streams a guest only to a target that proves it holds the fleet's peer secret: a
 * host token alone lets its holder report any peer URL for that host, and the coordinator gives
 * it to the sources of moves there. A prepare answered without the proof, or with a wrong one, at
 * a URL from the coordinator ends the move before anything is streamed: the source aborts it
 * naming the failed proof and the guest runs on. Real HTTP and a real data-plane listener that
 * counts who connects; the honest path is `peers-e2e.test.ts`.
 */
import { createServer as createHttpServer } from "node:http"
import { createServer as createTcpServer } from "node:net"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { startHostAgent } from "../src/Host.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"

const secret = "peer-proof-secret-0123456789"
const measure = () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })

const listening = (server: { listen: (port: number, host: string, cb: () => void) => unknown; address: () => unknown; close: (cb: () => void) => unknown }) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<number>((resolve) =>
          server.listen(0, "127.0.0.1", () => {
            const a = server.address()
            resolve(typeof a === "object" && a !== null && "port" in a ? (a.port as number) : 0)
          }),
        ),
    ),
    () => Effect.promise(() => new Promise<void>((r) => server.close(() => r()))),
  )

/**
 * An impostor at a peer URL: answers every peer request 200, a prepare with the endpoint of a
 * data-plane listener of its own (which counts connections) and `proof` (undefined: no key).
 */
const impostor = (proof: string | undefined) =>
  Effect.gen(function* () {
    const dataPlane = { connections: 0 }
    const tcp = createTcpServer((socket) => {
      dataPlane.connections++
      socket.destroy()
    })
    const tcpPort = yield* listening(tcp)
    const asked: string[] = []
    const http = createHttpServer((req, res) => {
      asked.push(req.url ?? "")
      res.setHeader("content-type", "application/json")
      const endpoint = { runtime: "sim", uri: `tcp:127.0.0.1:${tcpPort}` }
      res.end(JSON.stringify(req.url?.endsWith("/prepare") === true ? { endpoint, ...(proof === undefined ? {} : { proof }) } : { ok: true, resumedForMs: 0 }))
    })
    const port = yield* listening(http)
    return { url: `http://127.0.0.1:${port}`, asked, dataPlane }
  })

const waitUntil = (what: string, f: Effect.Effect<boolean>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 1000; i++) {
      if (yield* f) return
      yield* Effect.sleep(20)
    }
    assert.fail(`timed out waiting for ${what}`)
  })

/** A move from `a` to `b` whose source knows `b` only by the peer URL the coordinator sends with it (`url`). */
const moveToImpostor = (proof: string | undefined) =>
  Effect.scoped(
    Effect.gen(function* () {
      const evil = yield* impostor(proof)
      const coordinator = yield* makeFakeCoordinator
      const client = coordinator.client("a")
      // The coordinator gives the URL host b reported (here: its token's thief's) with the move.
      const telling = { ...client, assignments: (o: Parameters<typeof client.assignments>[0]) => Effect.map(client.assignments(o), (a) => ({ ...a, moves: a.moves.map((m) => ({ ...m, targetPeerUrl: evil.url })) })) }
      yield* coordinator.addSession("s1", "a", 512)
      const scope = yield* Scope.make()
      const agent = yield* startHostAgent({
        hostId: "a",
        coordinator: telling,
        peerSecret: secret,
        peers: () => undefined,
        measure,
        sim: { startMs: 5 },
        config: { retryDelayMs: 20, pollWaitMs: 0 },
      }).pipe(Scope.provide(scope))
      yield* waitUntil("s1 running", Effect.map(coordinator.get, (s) => s.sessions.get("s1")?.state === "running"))
      yield* coordinator.beginMove("m1", "s1", "b", 10_000)
      yield* waitUntil("the move ended", Effect.map(coordinator.get, (s) => s.moves.get("m1")?.state !== "pending"))
      const state = yield* coordinator.get
      const vms = yield* agent.runtime.list
      yield* Scope.close(scope, Exit.void)
      return { move: state.moves.get("m1")!, vms, evil }
    }),
  )

describe("a source streams a guest only to a target that proves it holds the peer secret", () => {
  it.live("a prepare answered without a proof at a URL from the coordinator: the move is aborted naming it, nothing streamed, the guest runs on", () =>
    Effect.gen(function* () {
      const { move, vms, evil } = yield* moveToImpostor(undefined)
      assert.strictEqual(move.state, "aborted")
      assert.include(move.abortReason, "without a proof that it holds the peer secret")
      assert.strictEqual(evil.dataPlane.connections, 0, "nothing streamed")
      assert.isFalse(evil.asked.some((p) => p.endsWith("/commit")), "no commit asked")
      assert.deepStrictEqual(vms.map((v) => [v.vmId, v.status]), [["s1", "running"]])
    }), 60_000)

  it.live("a prepare answered with a wrong proof: the same", () =>
    Effect.gen(function* () {
      const { move, vms, evil } = yield* moveToImpostor("0".repeat(64))
      assert.strictEqual(move.state, "aborted")
      assert.include(move.abortReason, "wrong proof")
      assert.strictEqual(evil.dataPlane.connections, 0, "nothing streamed")
      assert.isFalse(evil.asked.some((p) => p.endsWith("/commit")), "no commit asked")
      assert.deepStrictEqual(vms.map((v) => [v.vmId, v.status]), [["s1", "running"]])
    }), 60_000)
})
