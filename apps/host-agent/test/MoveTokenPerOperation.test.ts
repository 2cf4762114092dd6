/**
 * A move's token is bound to its operation: whoever saw the bearer of a prepare on the wire
 * cannot abort the move with it (after the commit: the guest would be destroyed), nor commit it.
 * Before, one token authorized a move's prepare, commit and abort alike. A rolling upgrade keeps
 * working (`ENGRAM_AGENT_OLD_MOVE_TOKENS`, on by default): a target takes the move's old token
 * from a source older than it, and a source whose new token a target refuses (401: an agent
 * older than it) asks once more with the old one, first from then on for that move. Off, neither
 * takes nor sends an old token. Real HTTP on 127.0.0.1; an older agent is a small server that
 * checks only the old token.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import { assert, describe, it } from "@effect/vitest"
import { SimRuntime, SimWire } from "@engram/runtime"
import { Effect } from "effect"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { moveToken, oldMoveToken, prepareProof } from "../src/MoveToken.js"
import * as PeerLink from "../src/PeerLink.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"

const SECRET = "move-token-per-operation-secret"
const header = { moveId: "m1", sessionId: "s1", sourceHostId: "src", targetHostId: "t", memMib: 64, vcpus: 1 }

/** A listening node HTTP server answering with `handle` (its body read first); closed with the scope. */
const serving = (handle: (req: IncomingMessage, body: string, res: ServerResponse) => void) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ url: string; close: () => Promise<void> }>((resolve) => {
          const server = createServer((req, res) => {
            let body = ""
            req.on("data", (c: Buffer) => (body += c.toString()))
            req.on("end", () => handle(req, body, res))
          })
          server.listen(0, "127.0.0.1", () => {
            const a = server.address()
            const port = typeof a === "object" && a !== null ? a.port : 0
            resolve({ url: `http://127.0.0.1:${port}`, close: () => new Promise<void>((r) => server.close(() => r())) })
          })
        }),
    ),
    (s) => Effect.promise(s.close),
  )

/** This version's target agent (its peer server) on host t. */
const serveTarget = (oldMoveTokens?: boolean) =>
  Effect.gen(function* () {
    const runtime = yield* SimRuntime.make({ commitMs: 5, captureFixedMs: 1, startMs: 0 }, SimWire.tcp())
    const residents = yield* makeResidents("t", null, () => Effect.void)
    const target = yield* makeMoveTarget("t", runtime, residents)
    const port = yield* PeerServer.serve({ hostId: "t", secret: SECRET, target, status: Effect.succeed({}), ...(oldMoveTokens === undefined ? {} : { oldMoveTokens }) }, { port: 0, host: "127.0.0.1" })
    return { url: `http://127.0.0.1:${port}`, target }
  })

/** A relay in front of `to` that keeps each request's path and bearer (what anyone on the wire sees). */
const wiretap = (to: string) =>
  Effect.gen(function* () {
    const seen: { path: string; bearer: string }[] = []
    const relay = yield* serving((req, body, res) => {
      seen.push({ path: req.url ?? "", bearer: (req.headers.authorization ?? "").replace(/^Bearer /, "") })
      void fetch(`${to}${req.url ?? ""}`, { method: req.method ?? "POST", headers: { authorization: req.headers.authorization ?? "", "content-type": "application/json" }, body }).then(async (r) => {
        res.writeHead(r.status, { "content-type": "application/json" })
        res.end(await r.text())
      })
    })
    return { url: relay.url, seen }
  })

/** POSTs `body` to a move route of the target at `url` with `bearer`; answers the status. */
const post = (url: string, op: string, bearer: string, body: unknown = header) =>
  Effect.promise(() =>
    fetch(`${url}/v1/peer/moves/m1/${op}`, { method: "POST", headers: { authorization: `Bearer ${bearer}`, "content-type": "application/json" }, body: JSON.stringify(body) }).then((r) => r.status),
  )

/**
 * A target agent older than this version: it takes only the move's old token (401 otherwise) and
 * answers as it did (a prepare with its endpoint and proof). Keeps the bearers it was shown.
 */
const olderTarget = Effect.gen(function* () {
  const shown: { op: string; bearer: string; status: number }[] = []
  const endpoint = { runtime: "sim", uri: "tcp:127.0.0.1:9" }
  const server = yield* serving((req, _body, res) => {
    const op = (req.url ?? "").split("/").at(-1) ?? ""
    const bearer = (req.headers.authorization ?? "").replace(/^Bearer /, "")
    const ok = bearer === oldMoveToken(SECRET, header)
    shown.push({ op, bearer, status: ok ? 200 : 401 })
    res.writeHead(ok ? 200 : 401, { "content-type": "application/json" })
    if (!ok) return res.end(JSON.stringify({ error: "Unauthorized", message: "invalid move token" }))
    res.end(JSON.stringify(op === "prepare" ? { endpoint, proof: prepareProof(SECRET, "m1", "src", "t", endpoint) } : { ok: true, resumedForMs: 0 }))
  })
  return { url: server.url, shown }
})

describe("a move's token authorizes one operation", () => {
  it.live("the bearer a prepare carried on the wire is refused (401) for the move's abort and commit: the incoming VM stays; the source's own abort takes it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const t = yield* serveTarget()
        const tap = yield* wiretap(t.url)
        const link = PeerLink.http(() => tap.url, SECRET)
        yield* link.prepare(header)
        const seenForPrepare = tap.seen[0]!.bearer
        assert.strictEqual(yield* post(t.url, "abort", seenForPrepare), 401)
        assert.strictEqual(yield* post(t.url, "commit", seenForPrepare), 401)
        assert.deepStrictEqual(yield* t.target.incoming, [{ moveId: "m1", vmId: "s1" }], "nothing was aborted or committed")
        yield* link.abort(header)
        assert.deepStrictEqual(yield* t.target.incoming, [])
        // Between agents of this version the wire carries each operation's own token, one request each.
        assert.deepStrictEqual(tap.seen, [
          { path: "/v1/peer/moves/m1/prepare", bearer: moveToken(SECRET, "prepare", header) },
          { path: "/v1/peer/moves/m1/abort", bearer: moveToken(SECRET, "abort", header) },
        ])
      }),
    ))
})

describe("a rolling upgrade: the move's old token (one for every operation)", () => {
  it.live("a target takes it from an older source while ENGRAM_AGENT_OLD_MOVE_TOKENS is on (the default), and refuses it (401) once off", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const old = oldMoveToken(SECRET, header)
        const upgrading = yield* serveTarget()
        assert.strictEqual(yield* post(upgrading.url, "prepare", old), 200)
        assert.deepStrictEqual(yield* upgrading.target.incoming, [{ moveId: "m1", vmId: "s1" }])
        assert.strictEqual(yield* post(upgrading.url, "abort", old), 200)
        assert.deepStrictEqual(yield* upgrading.target.incoming, [])
        const upgraded = yield* serveTarget(false)
        assert.strictEqual(yield* post(upgraded.url, "prepare", old), 401)
        assert.deepStrictEqual(yield* upgraded.target.incoming, [])
        assert.strictEqual(yield* post(upgraded.url, "prepare", moveToken(SECRET, "prepare", header)), 200)
        assert.strictEqual(yield* post(upgraded.url, "abort", old), 401)
        assert.deepStrictEqual(yield* upgraded.target.incoming, [{ moveId: "m1", vmId: "s1" }])
      }),
    ))

  it.live("a source whose new token an older target refuses asks once more with the old one, and sends that first for the rest of the move (no second request in the pause)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const older = yield* olderTarget
        const link = PeerLink.http((id) => (id === "t" ? older.url : undefined), SECRET)
        yield* link.prepare(header)
        assert.deepStrictEqual(yield* link.commit(header), { resumedForMs: 0 })
        const old = oldMoveToken(SECRET, header)
        assert.deepStrictEqual(older.shown, [
          { op: "prepare", bearer: moveToken(SECRET, "prepare", header), status: 401 },
          { op: "prepare", bearer: old, status: 200 },
          { op: "commit", bearer: old, status: 200 },
        ])
      }),
    ))

  it.live("a source with ENGRAM_AGENT_OLD_MOVE_TOKENS off never sends the old token: an older target's 401 fails the call (not a refusal)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const older = yield* olderTarget
        const link = PeerLink.http((id) => (id === "t" ? older.url : undefined), SECRET, { oldMoveTokens: false })
        const failed = yield* Effect.flip(link.prepare(header))
        assert.isFalse(failed.refused)
        assert.match(failed.message, /401/)
        assert.deepStrictEqual(older.shown, [{ op: "prepare", bearer: moveToken(SECRET, "prepare", header), status: 401 }])
      }),
    ))
})
