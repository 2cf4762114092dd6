import { request } from "node:http"
import { assert, describe, it } from "@effect/vitest"
import { SimRuntime, SimWire } from "@engram/runtime"
import { Effect } from "effect"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { moveToken, statusToken } from "../src/MoveToken.js"
import * as PeerLink from "../src/PeerLink.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"
import { freePort } from "./support/E2e.js"

const SECRET = "peer-server-test-secret"
const fast = { commitMs: 5, captureFixedMs: 1, startMs: 0 }

const serveTarget = Effect.gen(function* () {
  const runtime = yield* SimRuntime.make(fast, SimWire.tcp())
  const residents = yield* makeResidents("t", null, () => Effect.void)
  const target = yield* makeMoveTarget("t", runtime, residents)
  const port = yield* PeerServer.serve({ hostId: "t", secret: SECRET, target, status: Effect.succeed({ ok: true }) }, { port: 0, host: "127.0.0.1" })
  return { port, target, runtime }
})

const header = { moveId: "m1", sessionId: "s1", sourceHostId: "src", targetHostId: "t", memMib: 64, vcpus: 1 }

describe("the peer server", () => {
  it.live("prepares a move's incoming VM with its move token, the source's runtime streams to it, and the commit runs it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target, runtime } = yield* serveTarget
        const source = yield* SimRuntime.make(fast, SimWire.tcp())
        yield* source.start({ vmId: "s1", memMib: 64, vcpus: 1 })
        const link = PeerLink.http(() => `http://127.0.0.1:${port}`, SECRET)
        const endpoint = yield* link.prepare(header)
        assert.strictEqual(endpoint.runtime, "sim")
        assert.match(endpoint.uri, /^tcp:127\.0\.0\.1:\d+$/)
        assert.deepStrictEqual(yield* target.incoming, [{ moveId: "m1", vmId: "s1" }])
        // A repeated prepare (a lost answer) is the same incoming VM.
        assert.deepStrictEqual(yield* link.prepare(header), endpoint)
        const at = yield* source.migrate("s1", { moveId: "m1", endpoint, budget: { maxDowntimeMs: 5000, commitAllowanceMs: 50, maxPreCopyRounds: 4 }, onRound: () => Effect.void })
        assert.strictEqual(at._tag, "AtSwitchover")
        if (at._tag !== "AtSwitchover") return
        yield* at.switchover
        // The answer says how long the guest had run there (the target's bookkeeping after the resume).
        const committed = yield* link.commit(header)
        assert.isTrue(Number.isFinite(committed.resumedForMs) && committed.resumedForMs >= 0, JSON.stringify(committed))
        assert.deepStrictEqual((yield* runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
        assert.deepStrictEqual(yield* target.incoming, [])
        // A repeated commit (a lost answer) succeeds: the guest runs here (already: 0).
        assert.deepStrictEqual(yield* link.commit(header), { resumedForMs: 0 })
      }),
    ))

  it.live("a commit the target cannot make is refused (409): nothing of the move is left there", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target, runtime } = yield* serveTarget
        const link = PeerLink.http(() => `http://127.0.0.1:${port}`, SECRET)
        yield* link.prepare(header)
        // No stream ever came: the target's runtime cannot commit it.
        const refused = yield* link.commit(header).pipe(Effect.flip)
        assert.isTrue(refused.refused, refused.message)
        assert.deepStrictEqual(yield* runtime.list, [])
        assert.deepStrictEqual(yield* target.incoming, [])
        // An unreachable target is not a refusal: what it did is unknown.
        const closed = yield* Effect.promise(freePort)
        const gone = yield* PeerLink.http(() => `http://127.0.0.1:${closed}`, SECRET).commit(header).pipe(Effect.flip)
        assert.isFalse(gone.refused)
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
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", { ...header, moveId: "m2" }), header), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", { ...header, targetHostId: "other" }), header), 401)
        assert.strictEqual(yield* post(moveToken("another-fleet-secret", "abort", header), header), 401)
        // The token is bound to the session and its size: one seen for this move opens no other session, nor another size.
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", header), { ...header, sessionId: "s2" }), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", header), { ...header, memMib: 128 }), 401)
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", header), header), 200)
        assert.strictEqual(yield* post(moveToken(SECRET, "abort", header), { nonsense: true }), 400)
        const status = (token: string) =>
          Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/status`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status))
        assert.strictEqual(yield* status(moveToken(SECRET, "abort", header)), 401)
        assert.strictEqual(yield* status(statusToken(SECRET, "t")), 200)
        assert.deepStrictEqual(yield* target.incoming, [])
      }),
    ))
})

describe("the peer server's input rules", () => {
  it.live("a header whose ids or size break their rules is refused (400 naming the field), even under a valid token; nothing is prepared", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const prepare = (body: typeof header) =>
          Effect.promise(async () => {
            const r = await fetch(`http://127.0.0.1:${port}/v1/peer/moves/${encodeURIComponent(body.moveId)}/prepare`, {
              method: "POST",
              headers: { authorization: `Bearer ${moveToken(SECRET, "prepare", body)}`, "content-type": "application/json" },
              body: JSON.stringify(body),
            })
            return { status: r.status, body: (await r.json()) as Record<string, unknown> }
          })
        // `..` or an empty id would name the runtime's state directory's parent or itself.
        for (const [field, value, rule] of [
          ["sessionId", "..", "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."],
          ["sessionId", "", "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."],
          ["sessionId", "a/b", "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."],
          ["sourceHostId", "s\u0000rc", "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."],
          ["memMib", -5, "must be an integer > 0"],
          ["memMib", 0.5, "must be an integer > 0"],
          ["vcpus", 0, "must be an integer > 0"],
        ] as const) {
          const answer = yield* prepare({ ...header, [field]: value })
          assert.strictEqual(answer.status, 400, `${field}=${JSON.stringify(value)}`)
          assert.deepStrictEqual(answer.body, { error: "InvalidInput", field, rule, in: "body" })
        }
        assert.deepStrictEqual(yield* target.incoming, [])
        assert.strictEqual((yield* prepare(header)).status, 200)
      }),
    ))

  it.live("an image request for an id that is not one is refused (400 naming it) before any token is judged; an unknown route is a JSON 404", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveTarget
        // The path as written (fetch would resolve `%2e%2e` away before sending it).
        const get = (path: string) =>
          Effect.promise(
            () =>
              new Promise<{ status: number; body: Record<string, unknown> }>((resolve, reject) => {
                const req = request({ host: "127.0.0.1", port, path, headers: { authorization: "Bearer x" } }, (res) => {
                  let text = ""
                  res.on("data", (c: Buffer) => (text += c.toString()))
                  res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }))
                })
                req.on("error", reject)
                req.end()
              }),
          )
        assert.deepStrictEqual(yield* get("/v1/peer/images/%2e%2e?for=h2"), { status: 400, body: { error: "InvalidInput", field: "id", rule: "must be 1-100 characters of [A-Za-z0-9._-], and not . or ..", in: "path" } })
        assert.strictEqual((yield* get("/v1/peer/images/s1?for=h2")).status, 401)
        assert.deepStrictEqual(yield* get("/nothing?x=1"), { status: 404, body: { error: "NotFound", message: "no peer endpoint GET /nothing" } })
      }),
    ))
})

describe("the peer server's limits", () => {
  it.live("a body over its 64 KiB limit is not read past it: refused (400) before any credential is judged; nothing of the move is prepared", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const big = JSON.stringify({ ...header, pad: "x".repeat(PeerServer.peerMaxBodyBytes) })
        const r = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/moves/m1/prepare`, { method: "POST", headers: { "content-type": "application/json" }, body: big }))
        assert.strictEqual(r.status, 400)
        assert.deepInclude(yield* Effect.promise(() => r.json() as Promise<object>), { error: "BadRequest", message: `body does not match (a move's header, at most ${PeerServer.peerMaxBodyBytes} bytes)` })
        assert.deepStrictEqual(yield* target.incoming, [])
        // A header of ordinary size without a token is judged as before: 401.
        const small = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/moves/m1/prepare`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(header) }))
        assert.strictEqual(small.status, 401)
      }),
    ))
})
