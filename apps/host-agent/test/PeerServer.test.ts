import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { moveToken, statusToken } from "../src/MoveToken.js"
import * as PeerLink from "../src/PeerLink.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"
import { makeSimRuntime } from "../src/SimRuntime.js"

const SECRET = "peer-server-test-secret"

const serveTarget = Effect.gen(function* () {
  const runtime = yield* makeSimRuntime({ commitMs: 5, captureFixedMs: 1 })
  const residents = yield* makeResidents("t", null, () => Effect.void)
  const target = yield* makeMoveTarget("t", runtime, residents)
  const port = yield* PeerServer.serve({ hostId: "t", secret: SECRET, target, status: Effect.succeed({ ok: true }) }, { port: 0, host: "127.0.0.1" })
  return { port, target, runtime }
})

const header = { moveId: "m1", sessionId: "s1", sourceHostId: "src", targetHostId: "t", memMib: 64, vcpus: 1 }

describe("the peer server", () => {
  it.live("accepts a move's rounds with its move token and commits them into a running VM", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target, runtime } = yield* serveTarget
        const source = yield* makeSimRuntime({ captureFixedMs: 1 })
        yield* source.start({ vmId: "s1", memMib: 64, vcpus: 1 })
        const link = PeerLink.http(() => `http://127.0.0.1:${port}`, SECRET)
        yield* link.send(header, yield* source.fullCapture("s1"))
        yield* link.send(header, yield* source.deltaCapture("s1", "delta"))
        assert.deepStrictEqual((yield* target.staged).map((s) => s.rounds.length), [2])
        yield* link.send(header, yield* source.deltaCapture("s1", "final"))
        yield* link.commit(header)
        assert.deepStrictEqual((yield* runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
        assert.deepStrictEqual(yield* target.staged, [])
      }),
    ))

  it.live("refuses a wrong token, a token of another move, and a token for another target", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const post = (token: string, body: unknown) =>
          Effect.promise(() =>
            fetch(`http://127.0.0.1:${port}/v1/peer/moves/m1/abort`, {
              method: "POST",
              headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
              body: JSON.stringify(body),
            }).then((r) => r.status),
          )
        assert.strictEqual(yield* post("nope", header), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "m2", "src", "t"), header), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "m1", "src", "other"), header), 401)
        assert.strictEqual(yield* post(moveToken("another-fleet-secret", "m1", "src", "t"), header), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "m1", "src", "t"), header), 200)
        assert.strictEqual(yield* post(moveToken(SECRET, "m1", "src", "t"), { nonsense: true }), 400)
        const status = (token: string) =>
          Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/status`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status))
        assert.strictEqual(yield* status(moveToken(SECRET, "m1", "src", "t")), 401)
        assert.strictEqual(yield* status(statusToken(SECRET, "t")), 200)
        assert.deepStrictEqual(yield* target.staged, [])
      }),
    ))
})
