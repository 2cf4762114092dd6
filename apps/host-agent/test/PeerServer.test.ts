import { createServer, maxHeaderSize, request } from "node:http"
import { connect } from "node:net"
import { assert, describe, it } from "@effect/vitest"
import { SimRuntime, SimWire } from "@engram/runtime"
import { Effect } from "effect"
import { CoordinatorError } from "../src/Coordinator.js"
import { makeMoveTarget, type ResendCheck } from "../src/MoveTarget.js"
import { imageToken, moveToken, newImageBearer, statusToken } from "../src/MoveToken.js"
import * as PeerLink from "../src/PeerLink.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"
import { freePort } from "./support/E2e.js"

const SECRET = "peer-server-test-secret"
const fast = { commitMs: 5, captureFixedMs: 1, startMs: 0 }

const serveTargetWith = (check?: ResendCheck) =>
  Effect.gen(function* () {
    const runtime = yield* SimRuntime.make(fast, SimWire.tcp())
    const residents = yield* makeResidents("t", null, () => Effect.void)
    const target = yield* makeMoveTarget("t", runtime, residents, check)
    const port = yield* PeerServer.serve({ hostId: "t", secret: SECRET, target, status: Effect.succeed({ ok: true }) }, { port: 0, host: "127.0.0.1" })
    return { port, target, runtime, residents }
  })
const serveTarget = serveTargetWith()

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
        // Said over the wire: no guest of the move ran here (the source keeps its copy on that word), on every later ask too.
        assert.isTrue(refused.noStream, refused.message)
        assert.isTrue((yield* link.commit(header).pipe(Effect.flip)).noStream)
        assert.deepStrictEqual(yield* runtime.list, [])
        assert.deepStrictEqual(yield* target.incoming, [])
        // A commit of a move never prepared here says nothing of a stream.
        assert.isUndefined((yield* link.commit({ ...header, moveId: "m2" }).pipe(Effect.flip)).noStream)
        // An unreachable target is not a refusal: what it did is unknown.
        const closed = yield* Effect.promise(freePort)
        const gone = yield* PeerLink.http(() => `http://127.0.0.1:${closed}`, SECRET).commit(header).pipe(Effect.flip)
        assert.isFalse(gone.refused)
      }),
    ))

  it.live("a stream sent again that the target cannot resume yet (the coordinator unanswered) is its \"not yet\" (503) saying that it resumed nothing; an older target's 503 without the word is no answer", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const unanswered = (op: string) => Effect.fail(new CoordinatorError({ op, status: null, message: "connection refused" }))
        const { port, target, residents } = yield* serveTargetWith({ resendOwed: () => unanswered("resendOwed"), getSession: () => unanswered("getSession") })
        // The move's first stream never completed here: the next one is a stream sent again.
        yield* residents.noteUnfinished({ sessionId: "s1", moveId: "m1", notedAt: 0 })
        const source = yield* SimRuntime.make(fast, SimWire.tcp())
        yield* source.start({ vmId: "s1", memMib: 64, vcpus: 1 })
        const link = PeerLink.http(() => `http://127.0.0.1:${port}`, SECRET)
        const endpoint = yield* link.prepare(header)
        const at = yield* source.migrate("s1", { moveId: "m1", endpoint, budget: { maxDowntimeMs: 5000, commitAllowanceMs: 50, maxPreCopyRounds: 4 }, onRound: () => Effect.void })
        assert.strictEqual(at._tag, "AtSwitchover")
        if (at._tag !== "AtSwitchover") return
        yield* at.switchover
        const notYet = yield* link.commit(header).pipe(Effect.flip)
        assert.isFalse(notYet.refused, notYet.message)
        assert.isTrue(notYet.notResumed, notYet.message)
        assert.deepStrictEqual(yield* target.incoming, [{ moveId: "m1", vmId: "s1" }], "nothing resumed: the incoming VM kept, paused")
        // A target older than the word answers its 503 without it: no answer, as before.
        const older = createServer((_req, res) => {
          res.statusCode = 503
          res.setHeader("content-type", "application/json")
          res.end(JSON.stringify({ error: "Unavailable", op: "commit", message: "not yet" }))
        })
        yield* Effect.acquireRelease(
          Effect.promise(() => new Promise<void>((resolve) => older.listen(0, "127.0.0.1", resolve))),
          () => Effect.promise(() => new Promise<void>((resolve) => older.close(() => resolve()))),
        )
        const address = older.address()
        const olderPort = typeof address === "object" && address !== null ? address.port : 0
        const silent = yield* PeerLink.http(() => `http://127.0.0.1:${olderPort}`, SECRET).commit(header).pipe(Effect.flip)
        assert.isFalse(silent.refused)
        assert.isUndefined(silent.notResumed)
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
  it.live("a body over its 64 KiB limit is not read past it: refused (413 JSON naming the limit) before any credential is judged; nothing of the move is prepared", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const big = JSON.stringify({ ...header, pad: "x".repeat(PeerServer.peerMaxBodyBytes) })
        const r = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/moves/m1/prepare`, { method: "POST", headers: { "content-type": "application/json" }, body: big }))
        assert.strictEqual(r.status, 413)
        assert.deepStrictEqual(yield* Effect.promise(() => r.json() as Promise<object>), {
          error: "PayloadTooLarge",
          message: `the request body is larger than ${PeerServer.peerMaxBodyBytes} bytes (a move's header is a few hundred)`,
          limitBytes: PeerServer.peerMaxBodyBytes,
        })
        assert.deepStrictEqual(yield* target.incoming, [])
        // A header of ordinary size without a token is judged as before: 401.
        const small = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/v1/peer/moves/m1/prepare`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(header) }))
        assert.strictEqual(small.status, 401)
      }),
    ))
})

/** One raw request (the body's bytes and the URL as written), its status and JSON answer. */
const raw = (port: number, o: { readonly method: string; readonly path: string; readonly headers?: Record<string, string>; readonly body?: string | Buffer; readonly chunked?: boolean }) =>
  Effect.promise(
    () =>
      new Promise<{ status: number; body: unknown }>((resolve, reject) => {
        const req = request({ host: "127.0.0.1", port, method: o.method, path: o.path, headers: o.headers }, (res) => {
          const chunks: Buffer[] = []
          res.on("data", (c: Buffer) => chunks.push(c))
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8")
            resolve({ status: res.statusCode ?? 0, body: text === "" ? null : (JSON.parse(text) as unknown) })
          })
        })
        req.on("error", reject)
        if (o.body !== undefined && o.chunked === true) req.write(o.body)
        req.end(o.chunked === true ? undefined : o.body)
      }),
  )

describe("the peer server's strict input", () => {
  const known = "is not a key of this object (known: moveId, sessionId, sourceHostId, targetHostId, memMib, vcpus)"

  it.live("a move's body with an unknown key, a repeated key, a wrong type, bytes that are not UTF-8 or JSON in another charset is refused under a valid token (400 naming the field and rule); nothing is prepared", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const token = moveToken(SECRET, "prepare", header)
        const prepare = (body: string | Buffer, contentType = "application/json", path = "/v1/peer/moves/m1/prepare") =>
          raw(port, { method: "POST", path, headers: { authorization: `Bearer ${token}`, "content-type": contentType }, body })
        const text = JSON.stringify(header)
        const cases: readonly (readonly [string, Effect.Effect<{ status: number; body: unknown }>, unknown])[] = [
          ["an unknown key", prepare(JSON.stringify({ ...header, evil: 1 })), { field: "evil", rule: known, in: "body" }],
          // `JSON.parse` keeps the last: the header the token is bound to, though its first value is refused.
          ["a repeated key", prepare(`{"memMib":"x",${text.slice(1)}`), { field: "memMib", rule: "is given more than once in one object (each key at most once)", in: "body" }],
          ["a repeated key in a later place", prepare(`${text.slice(0, -1)},"vcpus":1}`), { field: "vcpus", rule: "is given more than once in one object (each key at most once)", in: "body" }],
          ["a size as a string", prepare(JSON.stringify({ ...header, memMib: "64" })), { field: "memMib", rule: "Expected number", in: "body" }],
          ["a missing key", prepare(JSON.stringify({ ...header, vcpus: undefined })), { field: "vcpus", rule: "is required", in: "body" }],
          ["not an object", prepare("[1]"), { field: "body", rule: "Expected object", in: "body" }],
          ["not JSON", prepare("moveId=m1"), { field: "body", rule: "must be JSON", in: "body" }],
          ["bytes that are not UTF-8", prepare(Buffer.concat([Buffer.from(text.slice(0, -1)), Buffer.from(',"x":"\xff'), Buffer.from([0xff]), Buffer.from('"}')])), { field: "body", rule: "must be valid UTF-8", in: "body" }],
          ["JSON in another charset", prepare(text, "application/json; charset=latin1"), { field: "content-type", rule: "a body's charset must be utf-8 (it is read as UTF-8), not latin1", in: "headers" }],
          ["a query parameter", prepare(text, "application/json", "/v1/peer/moves/m1/prepare?x=1"), { field: "x", rule: "is not a query parameter of this endpoint (it takes none)", in: "query" }],
        ]
        for (const [what, call, problem] of cases) {
          const answer = yield* call
          assert.deepStrictEqual(answer, { status: 400, body: { error: "InvalidInput", ...(problem as object) } }, what)
        }
        assert.deepStrictEqual(yield* target.incoming, [])
        // The same header, sent as the API takes it, is prepared (a charset of utf-8 named or not).
        assert.strictEqual((yield* prepare(text, "application/json; charset=utf-8")).status, 200)
        assert.deepStrictEqual(yield* target.incoming, [{ moveId: "m1", vmId: "s1" }])
      }),
    ))

  it.live("a move's body of another content type, or of none, is a 415 in the coordinator's API's shape (UnsupportedMediaType, its content type as given); nothing is prepared", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const token = moveToken(SECRET, "prepare", header)
        const body = JSON.stringify(header)
        for (const contentType of ["text/plain", "application/x-www-form-urlencoded", "application/jsonx", undefined]) {
          const headers: Record<string, string> = { authorization: `Bearer ${token}`, ...(contentType === undefined ? {} : { "content-type": contentType }) }
          assert.deepStrictEqual(
            yield* raw(port, { method: "POST", path: "/v1/peer/moves/m1/prepare", headers, body }),
            { status: 415, body: { error: "UnsupportedMediaType", message: PeerServer.contentTypeMessage, contentType: contentType ?? "" } },
            String(contentType),
          )
        }
        assert.deepStrictEqual(yield* target.incoming, [])
      }),
    ))

  it.live("headers past Node's limit are a JSON 431 naming the limit (the coordinator's answer), not a bare status line; the server serves on", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveTarget
        const text = yield* Effect.promise(
          () =>
            new Promise<string>((resolve, reject) => {
              const chunks: Buffer[] = []
              const socket = connect(port, "127.0.0.1", () => socket.write(`GET /v1/peer/status HTTP/1.1\r\nhost: x\r\nx-big: ${"y".repeat(20_000)}\r\n\r\n`))
              socket.on("data", (c: Buffer) => chunks.push(c))
              socket.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
              socket.on("error", reject)
            }),
        )
        const [head = "", body = ""] = text.split("\r\n\r\n")
        assert.match(head, /^HTTP\/1\.1 431 /)
        assert.include(head, "content-type: application/json")
        assert.deepStrictEqual(JSON.parse(body), { error: "HeadersTooLarge", message: `the request line and headers are larger than ${maxHeaderSize} bytes`, limitBytes: maxHeaderSize })
        assert.strictEqual((yield* raw(port, { method: "GET", path: "/v1/peer/status", headers: { authorization: `Bearer ${statusToken(SECRET, "t")}` } })).status, 200)
      }),
    ))

  it.live("a move's content type is read as the coordinator's API reads it (StrictJson.charsetOf): an empty charset or a trailing `;` is taken, another charset refused", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const token = moveToken(SECRET, "prepare", header)
        const prepare = (contentType: string) =>
          raw(port, { method: "POST", path: "/v1/peer/moves/m1/prepare", headers: { authorization: `Bearer ${token}`, "content-type": contentType }, body: JSON.stringify(header) })
        for (const [refused, charset] of [['application/json; charset="latin1"', "latin1"], ["application/json;charset=utf-16; x=1", "utf-16"]] as const) {
          assert.deepStrictEqual(
            yield* prepare(refused),
            { status: 400, body: { error: "InvalidInput", field: "content-type", rule: `a body's charset must be utf-8 (it is read as UTF-8), not ${charset}`, in: "headers" } },
            refused,
          )
        }
        assert.deepStrictEqual(yield* target.incoming, [])
        // The coordinator takes these (its tests pin it); the peer server refused them before.
        for (const taken of ["application/json; charset=utf-8;", 'application/json; charset=""', 'Application/JSON; charset="UTF8"']) {
          assert.strictEqual((yield* prepare(taken)).status, 200, taken)
        }
        assert.deepStrictEqual(yield* target.incoming, [{ moveId: "m1", vmId: "s1" }])
      }),
    ))

  it.live("a streamed (chunked) body over the limit is cut at it: 413 JSON; nothing is aborted", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, target } = yield* serveTarget
        const prepared = yield* raw(port, { method: "POST", path: "/v1/peer/moves/m1/prepare", headers: { authorization: `Bearer ${moveToken(SECRET, "prepare", header)}`, "content-type": "application/json" }, body: JSON.stringify(header) })
        assert.strictEqual(prepared.status, 200)
        const big = JSON.stringify({ ...header, pad: "x".repeat(70 * 1024) })
        const answer = yield* raw(port, { method: "POST", path: "/v1/peer/moves/m1/abort", headers: { authorization: `Bearer ${moveToken(SECRET, "abort", header)}`, "content-type": "application/json", "transfer-encoding": "chunked" }, body: big, chunked: true })
        assert.strictEqual(answer.status, 413)
        assert.deepInclude(answer.body as object, { error: "PayloadTooLarge", limitBytes: PeerServer.peerMaxBodyBytes })
        assert.deepStrictEqual(yield* target.incoming, [{ moveId: "m1", vmId: "s1" }])
      }),
    ))

  it.live("the status and image routes take only their own query parameters, each once, and no body; a refused image request leaves its bearer unused", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveTarget
        const status = { authorization: `Bearer ${statusToken(SECRET, "t")}` }
        assert.deepStrictEqual(yield* raw(port, { method: "GET", path: "/v1/peer/status?x=1", headers: status }), {
          status: 400,
          body: { error: "InvalidInput", field: "x", rule: "is not a query parameter of this endpoint (it takes none)", in: "query" },
        })
        assert.deepStrictEqual(yield* raw(port, { method: "GET", path: "/v1/peer/status", headers: { ...status, "content-type": "application/json", "content-length": "2" }, body: "{}" }), {
          status: 400,
          body: { error: "InvalidInput", field: "body", rule: "must be empty: this endpoint takes no body", in: "body" },
        })
        assert.strictEqual((yield* raw(port, { method: "GET", path: "/v1/peer/status", headers: status })).status, 200)
        // A listing's bearer for host a, sent with `for` twice: refused before its nonce is taken.
        const listing = { authorization: `Bearer ${imageToken(SECRET, "s1", "t", "a", { _tag: "Listing" }, newImageBearer(Date.now()))}` }
        assert.deepStrictEqual(yield* raw(port, { method: "GET", path: "/v1/peer/images/s1?for=a&for=b", headers: listing }), {
          status: 400,
          body: { error: "InvalidInput", field: "for", rule: "is given more than once (each query parameter at most once)", in: "query" },
        })
        assert.deepStrictEqual(yield* raw(port, { method: "GET", path: "/v1/peer/images/s1?for=a&x=1", headers: listing }), {
          status: 400,
          body: { error: "InvalidInput", field: "x", rule: "is not a query parameter of this endpoint (known: for)", in: "query" },
        })
        // The bearer is still good once: this host serves no images, so its answer is a 404 (not `already used`).
        assert.strictEqual((yield* raw(port, { method: "GET", path: "/v1/peer/images/s1?for=a", headers: listing })).status, 404)
      }),
    ))
})
