/**
 * The agent's small HTTP server for its peers: a move's target answers prepare (the endpoint
 * its runtime waits on for the VM), commit and abort here; `GET /v1/peer/status` shows what is
 * resident and incoming. Every request carries a bearer: the move token of its operation for
 * move routes (a move's old token too while `oldMoveTokens`), the status token for the status
 * (MoveToken.ts); a prepare's answer carries the target's proof that it
 * holds the peer secret (`prepareProof`). Image requests (`ImageFetch`) carry a bearer good for
 * one request, to the listing or to one file by name, within `imageBearerWindowMs` of its issue
 * (its nonce is refused a second time); the listing names this agent's own peer URL under its
 * proof, where the fetcher takes the files. A target's refusal is a 409 `PeerError`; for a
 * commit it means the guest does not run here (MoveTarget.ts).
 *
 * Input is strict, by the coordinator's API's rules (`@engram/api`'s `StrictJson`), before any
 * credential is judged (a move's token is bound to its header, so the header is read first): a
 * move's body is `application/json` (its charset, when named, read as the coordinator reads it:
 * `StrictJson.charsetOf`, UTF-8), valid UTF-8, the header's keys only, each once and of its
 * type, at most `peerMaxBodyBytes` (past it a 413, read no further); a route takes only its own
 * query parameters (`for` on image routes, none elsewhere), each once, and a GET no body. A
 * refusal is `400 {error: "InvalidInput", field, rule, in}` (a body of another content type
 * `415 {error: "UnsupportedMediaType", message, contentType}`, as the coordinator's) and changes
 * nothing; what Node's parser refuses (headers past its limit: 431) is answered in JSON too
 * (`StrictJson.answerClientError`).
 */
import { createServer, maxHeaderSize } from "node:http"
import { ByteSize, Clock, Context, Effect, Layer, Schema } from "effect"
import { HttpIncomingMessage, HttpRouter, HttpServer, HttpServerRequest, HttpServerResponse } from "effect/http"
import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { StrictJson } from "@engram/api"
import { Names } from "@engram/core"
import type { ImageStore } from "@engram/runtime"
import * as ImageFetch from "./ImageFetch.js"
import * as ImageNonceFile from "./ImageNonceFile.js"
import { imageBearerOf, imageBearerWindowMs, imageProof, type ImageRoute, type MoveOp, moveToken, oldMoveToken, prepareProof, statusToken, tokensEqual } from "./MoveToken.js"
import type { MoveHeader, MoveTarget } from "./MoveTarget.js"

/** A move's header as its routes take it (decoded strictly: these keys only, each once). */
const Header = Schema.Struct({
  moveId: Schema.String,
  sessionId: Schema.String,
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  memMib: Schema.Number,
  vcpus: Schema.Number,
})

const json = (status: number, body: unknown, headers: Record<string, string> = {}) => HttpServerResponse.jsonUnsafe(body, { status, headers })

/** A 400 naming the field and its rule (the coordinator's API's shape). */
const invalid = (p: StrictJson.InputProblem) => json(400, { error: "InvalidInput", field: p.field, rule: p.rule, in: p.in })

/** A body past `peerMaxBodyBytes`: not read further; the connection closes (the rest of it may still be on the way). */
const tooLarge = () =>
  json(413, { error: "PayloadTooLarge", message: `the request body is larger than ${peerMaxBodyBytes} bytes (a move's header is a few hundred)`, limitBytes: peerMaxBodyBytes }, { connection: "close" })

/** What a move's body of another content type is told (a 415, the coordinator's API's shape: `StrictJson.unsupportedMediaType`). */
export const contentTypeMessage = "send a move's header as JSON: `content-type: application/json` (a charset, when named, utf-8)"

/**
 * What a route takes besides its path: its query parameters (each once), and for a GET no body.
 * The refusal to answer, or undefined.
 */
const strayInput = (req: HttpServerRequest.HttpServerRequest, query: ReadonlySet<string>): HttpServerResponse.HttpServerResponse | undefined => {
  const problem = StrictJson.queryProblem(req.url, query)
  if (problem !== undefined) return invalid(problem)
  if (req.method === "GET" && StrictJson.declaresBody(req.headers)) return invalid({ field: "body", rule: StrictJson.noBodyRule, in: "body" })
  return undefined
}

const noQuery: ReadonlySet<string> = new Set()
const imageQuery: ReadonlySet<string> = new Set(["for"])

/**
 * A move's header as the body of a move route: no query parameter, `application/json`, at most
 * `peerMaxBodyBytes` (a declared length over it is refused before a byte is read), then
 * `StrictJson.decodeBody` (UTF-8, JSON, no repeated key, the header's keys only, each of its
 * type). The header, or the refusal to answer.
 */
const moveBody = (req: HttpServerRequest.HttpServerRequest) =>
  Effect.gen(function* () {
    const stray = strayInput(req, noQuery)
    if (stray !== undefined) return { _tag: "Bad" as const, response: stray }
    // As the coordinator's API: another media type (or none) is a 415, JSON in another charset a 400 naming it.
    const contentType = req.headers["content-type"]
    if (!StrictJson.isJson(contentType)) return { _tag: "Bad" as const, response: json(415, StrictJson.unsupportedMediaType(contentType, contentTypeMessage)) }
    const charset = StrictJson.charsetProblem(contentType)
    if (charset !== undefined) return { _tag: "Bad" as const, response: invalid(charset) }
    const declared = Number(req.headers["content-length"] ?? "0")
    if (Number.isFinite(declared) && declared > peerMaxBodyBytes) return { _tag: "Bad" as const, response: tooLarge() }
    // Past `MaxBodySize` (set on the server) the read stops: a 413, the rest never buffered.
    const read = yield* Effect.result(req.arrayBuffer)
    if (read._tag === "Failure") {
      const reason = read.failure.reason
      const over = reason._tag === "RequestParseError" && reason.reason === "BodyTooLarge"
      return { _tag: "Bad" as const, response: over ? tooLarge() : invalid({ field: "body", rule: "must be a readable request body", in: "body" }) }
    }
    const decoded = StrictJson.decodeBody(Header, read.success)
    return decoded._tag === "Failure" ? { _tag: "Bad" as const, response: invalid(decoded.failure) } : { _tag: "Ok" as const, header: decoded.success }
  })

export interface PeerServerDeps {
  readonly hostId: string
  readonly secret: string
  readonly target: MoveTarget
  readonly status: Effect.Effect<unknown>
  /** The image store whose descent images peers may fetch (`ImageFetch`); omitted: none served. */
  readonly images?: ImageStore.ImageStore | undefined
  /**
   * The peer URL this agent advertises (`Host`'s, known once the server listens): the listing
   * names it under its proof, and the fetcher takes the files from it, not from the address it
   * asked for the listing (a relay). Omitted or null: none named (only a fetcher told this host's
   * URL by its operator, `ENGRAM_PEERS`, then takes the files).
   */
  readonly peerUrl?: Effect.Effect<string | null> | undefined
  /** How long a connection may be idle both ways before it is closed, ms; default `peerIdleTimeoutMs`. */
  readonly idleTimeoutMs?: number | undefined
  /**
   * Where the nonces of the image bearers this host took are kept across restarts
   * (`ImageNonceFile`; `Host` puts it in the image directory); omitted: in memory only, so a
   * bearer seen before a restart could be replayed once after it.
   */
  readonly nonceFile?: string | undefined
  /**
   * Whether a move's old token (`MoveToken.oldMoveToken`, one for every operation: a source agent
   * older than this one) is taken besides the operation's own (`ENGRAM_AGENT_OLD_MOVE_TOKENS`);
   * default true, for a rolling upgrade.
   */
  readonly oldMoveTokens?: boolean | undefined
}

const bearer = (req: HttpServerRequest.HttpServerRequest) => {
  const h = req.headers["authorization"] ?? ""
  return h.startsWith("Bearer ") ? h.slice(7) : ""
}

/**
 * The first field of a move's header that breaks its rule, or null: ids follow the id rule (they
 * name directories and files here: never `..`, `.` or empty), the size whole figures above zero
 * (core's `Names`, the rules of the coordinator's API).
 */
export const headerProblem = (h: MoveHeader): { readonly field: string; readonly rule: string } | null => {
  for (const field of ["moveId", "sessionId", "sourceHostId", "targetHostId"] as const) if (!Names.isId(h[field])) return { field, rule: Names.idRule }
  for (const field of ["memMib", "vcpus"] as const) if (!Names.isPositiveInteger(h[field])) return { field, rule: Names.positiveIntegerRule }
  return null
}

/**
 * Reads the body as a move's header (`moveBody`: 400 naming the field and rule, 413), checks the
 * move token against the route's operation, the path's move id and the header it is bound to
 * (401), then each field's rule (400 naming the field): a header whose fields break their rules
 * is never acted on, whoever sends it. The move's old token (one for every operation) passes too
 * while `deps.oldMoveTokens` is on, said in the log.
 */
const authorizedMove = (deps: PeerServerDeps, op: MoveOp) =>
  Effect.gen(function* () {
    const req = yield* HttpServerRequest.HttpServerRequest
    const { id } = yield* HttpRouter.params
    const body = yield* moveBody(req)
    if (body._tag === "Bad") return body
    if (id === undefined) return { _tag: "Bad" as const, response: invalid({ field: "id", rule: Names.idRule, in: "path" }) }
    const h = body.header
    const bound = { ...h, moveId: id, targetHostId: deps.hostId }
    const presented = bearer(req)
    const current = tokensEqual(presented, moveToken(deps.secret, op, bound))
    const old = !current && deps.oldMoveTokens !== false && tokensEqual(presented, oldMoveToken(deps.secret, bound))
    if (h.moveId !== id || h.targetHostId !== deps.hostId || !(current || old)) {
      return { _tag: "Bad" as const, response: json(401, { error: "Unauthorized", message: "invalid move token" }) }
    }
    if (old) {
      yield* Effect.logInfo("move: a source agent older than this one presented the move's old token (one for every operation); taken while ENGRAM_AGENT_OLD_MOVE_TOKENS is on", {
        hostId: deps.hostId,
        moveId: id,
        op,
        sourceHostId: h.sourceHostId,
      })
    }
    const problem = headerProblem(h)
    if (problem !== null) return { _tag: "Bad" as const, response: invalid({ ...problem, in: "body" }) }
    return { _tag: "Ok" as const, body: h }
  })

/**
 * The session of an image request whose bearer is `MoveToken.imageToken` for it, this host, the
 * requesting host (`?for=`) and this route (the listing, or the file named in the path), its HMAC
 * compared in constant time, issued within `MoveToken.imageBearerWindowMs` of this host's clock
 * (the Effect `Clock`) and its nonce not taken before (`nonces`); else the 401 to answer. The
 * listing's nonce is answered with it (its proof is bound to it).
 */
const authorizedImage = (deps: PeerServerDeps, nonces: ImageNonceFile.NonceGate, opens: (name: string | undefined) => ImageRoute | undefined) =>
  Effect.gen(function* () {
    const req = yield* HttpServerRequest.HttpServerRequest
    const { id, name } = yield* HttpRouter.params
    // A session's id names its image's directory here: never `..`, `.` or empty.
    if (id !== undefined && !Names.isId(id)) return { _tag: "Bad" as const, response: invalid({ field: "id", rule: Names.idRule, in: "path" }) }
    const stray = strayInput(req, imageQuery)
    if (stray !== undefined) return { _tag: "Bad" as const, response: stray }
    const requester = new URL(req.url, "http://peer").searchParams.get("for")
    const route = opens(name)
    const b = id === undefined || requester === null || requester === "" || route === undefined ? undefined : imageBearerOf(deps.secret, bearer(req), id, deps.hostId, requester, route)
    if (id === undefined || requester === null || b === undefined) return { _tag: "Bad" as const, response: json(401, { error: "Unauthorized", message: "invalid image token" }) }
    const judged = yield* nonces.admit(b, yield* Clock.currentTimeMillis)
    if (judged === "predates") return { _tag: "Bad" as const, response: json(401, { error: "Unauthorized", message: "image token issued before this image host's agent started, and its record of the tokens used before is lost" }) }
    if (judged === "unrecorded") return { _tag: "Bad" as const, response: json(503, { error: "Unavailable", message: "this image host could not record the image token's use; try again" }) }
    if (judged === "expired") return { _tag: "Bad" as const, response: json(401, { error: "Unauthorized", message: `image token expired (issued more than ${imageBearerWindowMs / 60_000} minutes from this host's clock)` }) }
    if (judged === "replayed") return { _tag: "Bad" as const, response: json(401, { error: "Unauthorized", message: "image token already used" }) }
    return { _tag: "Ok" as const, sessionId: id, requester, nonce: b.nonce }
  })

/** No image of the session here: the fetcher takes this answer of the listing for the image host's word (`ImageFetch.noImageMessage`). */
const noImage = (sessionId: string) => json(404, { error: "NotFound", message: ImageFetch.noImageMessage(sessionId) })

/**
 * A target's refusal is its 409; a "not yet" (`refused: false`: nothing done, ask again) a 503,
 * which the source takes for no answer, unless it says that the target resumed nothing
 * (`notResumed`: the source then sets the move's resend mark again).
 */
const peerError = (e: {
  readonly op: string
  readonly message: string
  readonly refused: boolean
  readonly noStream?: boolean | undefined
  readonly checksPlacement?: boolean | undefined
  readonly notResumed?: boolean | undefined
}) =>
  Effect.succeed(
    e.refused
      ? json(409, { error: "PeerError", op: e.op, message: e.message, ...(e.noStream === true ? { noStream: true } : {}), ...(e.noStream === true && e.checksPlacement === true ? { checksPlacement: true } : {}) })
      : json(503, { error: "Unavailable", op: e.op, message: e.message, ...(e.notResumed === true ? { notResumed: true } : {}) }),
  )

/** The peer routes. */
export const routes = (deps: PeerServerDeps, nonces: ImageNonceFile.NonceGate = ImageNonceFile.inMemory()) =>
  Layer.mergeAll(
    HttpRouter.add(
      "POST",
      "/v1/peer/moves/:id/prepare",
      Effect.gen(function* () {
        const a = yield* authorizedMove(deps, "prepare")
        if (a._tag === "Bad") return a.response
        const endpoint = yield* deps.target.prepare(a.body)
        // The source streams nothing to a target that cannot prove it holds the peer secret.
        return json(200, { endpoint, proof: prepareProof(deps.secret, a.body.moveId, a.body.sourceHostId, deps.hostId, endpoint) })
      }).pipe(Effect.catchTag("PeerError", peerError)),
    ),
    HttpRouter.add(
      "POST",
      "/v1/peer/moves/:id/commit",
      Effect.gen(function* () {
        const a = yield* authorizedMove(deps, "commit")
        if (a._tag === "Bad") return a.response
        const committed = yield* deps.target.commit(a.body)
        return json(200, { ok: true, resumedForMs: committed.resumedForMs })
      }).pipe(Effect.catchTag("PeerError", peerError)),
    ),
    HttpRouter.add(
      "POST",
      "/v1/peer/moves/:id/abort",
      Effect.gen(function* () {
        const a = yield* authorizedMove(deps, "abort")
        if (a._tag === "Bad") return a.response
        yield* deps.target.abort(a.body.moveId)
        return json(200, { ok: true })
      }),
    ),
    HttpRouter.add(
      "GET",
      "/v1/peer/images/:id",
      Effect.gen(function* () {
        const a = yield* authorizedImage(deps, nonces, () => ({ _tag: "Listing" }))
        if (a._tag === "Bad") return a.response
        // The answer may wait for the image's hashing (minutes for a big one; the fetcher's own
        // bound grows with the image): no idle timeout for this authorized request's connection.
        const raw = NodeHttpServerRequest.toIncomingMessage(yield* HttpServerRequest.HttpServerRequest)
        if ("socket" in raw) raw.socket.setTimeout(0)
        const listed = deps.images === undefined ? undefined : yield* ImageFetch.listing(deps.images, a.sessionId)
        if (listed === undefined) return noImage(a.sessionId)
        // Where the fetcher takes the files: this agent's own URL, under the proof (not a relay's).
        const peerUrl = deps.peerUrl === undefined ? null : yield* deps.peerUrl
        return json(200, { ...listed, peerUrl, proof: imageProof(deps.secret, a.sessionId, deps.hostId, a.requester, a.nonce, peerUrl, listed.files) })
      }),
    ),
    HttpRouter.add(
      "GET",
      "/v1/peer/images/:id/files/:name",
      Effect.gen(function* () {
        const a = yield* authorizedImage(deps, nonces, (name) => (name === undefined ? undefined : { _tag: "File", name }))
        if (a._tag === "Bad") return a.response
        const { name } = yield* HttpRouter.params
        const file = deps.images === undefined || name === undefined ? undefined : yield* ImageFetch.fileStream(deps.images, a.sessionId, name)
        return file === undefined ? noImage(a.sessionId) : HttpServerResponse.stream(file.body, { contentType: "application/octet-stream", contentLength: file.bytes })
      }),
    ),
    // Anything else: a JSON 404 naming the route (the router's own has no body).
    HttpRouter.add("*", "/*", (req) => Effect.succeed(json(404, { error: "NotFound", message: `no peer endpoint ${req.method} ${req.url.split("?")[0]}` }))),
    HttpRouter.add(
      "GET",
      "/v1/peer/status",
      Effect.gen(function* () {
        const req = yield* HttpServerRequest.HttpServerRequest
        const stray = strayInput(req, noQuery)
        if (stray !== undefined) return stray
        if (!tokensEqual(bearer(req), statusToken(deps.secret, deps.hostId))) return json(401, { error: "Unauthorized", message: "invalid status token" })
        return json(200, yield* deps.status)
      }),
    ),
  )

/** The most connections the peer server holds at once (moves and image fetches of a few peers). */
export const peerMaxConnections = 1024

/** The largest request body the peer server reads (a move's header is a few hundred bytes). */
export const peerMaxBodyBytes = 64 * 1024

/**
 * How long a peer connection may show no activity either way before it is closed (ms): a caller
 * that stopped reading an image (frozen, its socket open) held the stream, its fiber and the
 * image's open file for good. Above every handler's own wait (a prepare starts QEMU: 30 s) and
 * the callers' bounds (60 s a call, 60 s without a byte of an image); an image's listing, which
 * may wait for its hashing, is exempt once authorized.
 */
export const peerIdleTimeoutMs = 120_000

/** Serves the peer routes on `port` (0 = any) and answers the bound port. Lives in the caller's scope. */
export const serve = (deps: PeerServerDeps, listen: { readonly port: number; readonly host: string }) =>
  Effect.gen(function* () {
    const nonces = deps.nonceFile === undefined ? ImageNonceFile.inMemory() : yield* ImageNonceFile.inFile(deps.nonceFile, deps.hostId)
    const server = () => {
      // Headers within 20 s and a whole request within 60 s: a caller that trickles them (or
      // streams a body to an unauthenticated route) is cut; the body itself is capped below.
      const s = createServer({ headersTimeout: 20_000, requestTimeout: 60_000 })
      // What Node's parser refuses (headers past `maxHeaderSize`: a 431) gets the API's JSON body, not a bare status line.
      s.on("clientError", (error: Error & { readonly code?: string }, socket) => void StrictJson.answerClientError(error, socket, maxHeaderSize))
      s.setTimeout(deps.idleTimeoutMs ?? peerIdleTimeoutMs)
      // A host has a few peers: connections past this are refused at once, before any file
      // descriptor of the agent's own (its VMs', its state file's) runs short.
      s.maxConnections = peerMaxConnections
      return s
    }
    const ctx = yield* Layer.build(
      HttpRouter.serve(routes(deps, nonces), { disableLogger: true }).pipe(
        Layer.provide(Layer.succeed(HttpIncomingMessage.MaxBodySize, ByteSize.bytes(peerMaxBodyBytes))),
        Layer.provideMerge(NodeHttpServer.layer(server, { port: listen.port, host: listen.host })),
      ),
    )
    const address = Context.get(ctx, HttpServer.HttpServer).address
    return "port" in address ? address.port : listen.port
  })
