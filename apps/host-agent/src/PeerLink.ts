/**
 * The source's link to a move's target agent: send a round, ask for the commit, or abort.
 * Over HTTP to the target's peer server (bearer: the move token), or in memory between two
 * agents in one process (clock-driven tests).
 */
import { Duration, Effect } from "effect"
import { FetchHttpClient, HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import { moveToken } from "./MoveToken.js"
import { type MoveHeader, type MoveTarget, PeerError } from "./MoveTarget.js"
import type { Capture } from "./Runtime.js"

export interface PeerLink {
  readonly send: (header: MoveHeader, capture: Capture) => Effect.Effect<void, PeerError>
  readonly commit: (header: MoveHeader) => Effect.Effect<void, PeerError>
  readonly abort: (header: MoveHeader) => Effect.Effect<void, PeerError>
}

/** A link to targets living in this process, by host id. */
export const inMemory = (targets: ReadonlyMap<string, MoveTarget>): PeerLink => {
  const find = (op: string, h: MoveHeader) => {
    const t = targets.get(h.targetHostId)
    return t === undefined ? Effect.fail(new PeerError({ op, moveId: h.moveId, message: `no peer ${h.targetHostId}` })) : Effect.succeed(t)
  }
  return {
    send: (h, c) => Effect.flatMap(find("send", h), (t) => t.receive(h, c)),
    commit: (h) => Effect.flatMap(find("commit", h), (t) => t.commit(h.moveId)),
    abort: (h) => Effect.flatMap(find("abort", h), (t) => t.abort(h.moveId)),
  }
}

/** The JSON body of `POST /v1/peer/moves/{id}/rounds`. */
export interface RoundBody extends MoveHeader {
  readonly kind: Capture["kind"]
  readonly apparentBytes: number
  readonly wireBytes: number
  /** The capture's image, base64. */
  readonly payload: string
}

/** A link over HTTP; `peers` maps a host id to its agent's peer URL. */
export const http = (peers: (hostId: string) => string | undefined, secret: string, timeoutMs = 60_000): PeerLink => {
  const call = (op: string, h: MoveHeader, path: string, body: unknown) =>
    Effect.gen(function* () {
      const base = peers(h.targetHostId)
      if (base === undefined) return yield* new PeerError({ op, moveId: h.moveId, message: `no address for peer ${h.targetHostId}` })
      const client = yield* HttpClient.HttpClient
      const req = HttpClientRequest.post(`${base.replace(/\/+$/, "")}/v1/peer/moves/${encodeURIComponent(h.moveId)}/${path}`).pipe(
        HttpClientRequest.bearerToken(moveToken(secret, h.moveId, h.sourceHostId, h.targetHostId)),
        HttpClientRequest.setBody(HttpBody.jsonUnsafe(body)),
      )
      const res = yield* client.execute(req)
      if (res.status < 200 || res.status >= 300) {
        const text = yield* res.text.pipe(Effect.orElseSucceed(() => ""))
        return yield* new PeerError({ op, moveId: h.moveId, message: `peer answered ${res.status}: ${text.slice(0, 200)}` })
      }
    }).pipe(
      Effect.timeout(Duration.millis(timeoutMs)),
      Effect.catchTag("TimeoutError", () => Effect.fail(new PeerError({ op, moveId: h.moveId, message: "peer timed out" }))),
      Effect.catchTag("HttpClientError", (e) => Effect.fail(new PeerError({ op, moveId: h.moveId, message: e.message }))),
      Effect.provide(FetchHttpClient.layer),
    )
  return {
    send: (h, c) =>
      call("send", h, "rounds", {
        ...h,
        kind: c.kind,
        apparentBytes: c.apparentBytes,
        wireBytes: c.wireBytes,
        payload: Buffer.from(c.payload).toString("base64"),
      } satisfies RoundBody),
    commit: (h) => call("commit", h, "commit", h),
    abort: (h) => call("abort", h, "abort", h),
  }
}

/** Parses `ENGRAM_PEERS` (`host-a=http://10.0.0.1:7100,host-b=http://…`). */
export const parsePeers = (text: string): Map<string, string> => {
  const m = new Map<string, string>()
  for (const part of text.split(",")) {
    const i = part.indexOf("=")
    if (i > 0) m.set(part.slice(0, i).trim(), part.slice(i + 1).trim())
  }
  return m
}
