/**
 * The source's link to a move's target agent: prepare the incoming VM (its answer is the
 * runtime endpoint the source's runtime streams the VM to), ask for the commit, or abort.
 * Over HTTP to the target's peer server (bearer: the move token), or in memory between agents
 * of one process (clock-driven tests).
 *
 * What it decides: which failures are the target's answer (`refused`: a 409 from the target,
 * which acted on its side) and which leave the target's state unknown (unreachable, timed out,
 * any other status).
 */
import { Duration, Effect, Schema } from "effect"
import { FetchHttpClient, HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import type { IncomingEndpoint } from "@engram/runtime"
import { moveToken } from "./MoveToken.js"
import { type Committed, type MoveHeader, type MoveTarget, PeerError } from "./MoveTarget.js"

export interface PeerLink {
  readonly prepare: (header: MoveHeader) => Effect.Effect<IncomingEndpoint, PeerError>
  readonly commit: (header: MoveHeader) => Effect.Effect<Committed, PeerError>
  readonly abort: (header: MoveHeader) => Effect.Effect<void, PeerError>
}

/** A link to targets living in this process, by host id. */
export const inMemory = (targets: ReadonlyMap<string, MoveTarget>): PeerLink => {
  const find = (op: string, h: MoveHeader) => {
    const t = targets.get(h.targetHostId)
    return t === undefined ? Effect.fail(new PeerError({ op, moveId: h.moveId, message: `no peer ${h.targetHostId}`, refused: false })) : Effect.succeed(t)
  }
  return {
    prepare: (h) => Effect.flatMap(find("prepare", h), (t) => t.prepare(h)),
    commit: (h) => Effect.flatMap(find("commit", h), (t) => t.commit(h)),
    abort: (h) => Effect.flatMap(find("abort", h), (t) => t.abort(h.moveId)),
  }
}

/** The answer of `POST /v1/peer/moves/{id}/commit` (an older target answers no `resumedForMs`: 0). */
export const CommitAnswer = Schema.Struct({ resumedForMs: Schema.optionalKey(Schema.Number) })

/** The answer of `POST /v1/peer/moves/{id}/prepare`. */
export const PrepareAnswer = Schema.Struct({ endpoint: Schema.Struct({ runtime: Schema.String, uri: Schema.String }) })

/** A link over HTTP; `peers` maps a host id to its agent's peer URL. */
export const http = (peers: (hostId: string) => string | undefined, secret: string, timeoutMs = 60_000): PeerLink => {
  const call = (op: string, h: MoveHeader, path: string) =>
    Effect.gen(function* () {
      const base = peers(h.targetHostId)
      if (base === undefined) return yield* new PeerError({ op, moveId: h.moveId, message: `no address for peer ${h.targetHostId}`, refused: false })
      const client = yield* HttpClient.HttpClient
      const req = HttpClientRequest.post(`${base.replace(/\/+$/, "")}/v1/peer/moves/${encodeURIComponent(h.moveId)}/${path}`).pipe(
        HttpClientRequest.bearerToken(moveToken(secret, h.moveId, h.sourceHostId, h.targetHostId)),
        HttpClientRequest.setBody(HttpBody.jsonUnsafe(h)),
      )
      const res = yield* client.execute(req)
      const text = yield* res.text.pipe(Effect.orElseSucceed(() => ""))
      if (res.status < 200 || res.status >= 300) {
        // 409 is the target's own refusal (PeerServer); anything else says nothing of its state.
        return yield* new PeerError({ op, moveId: h.moveId, message: `peer answered ${res.status}: ${text.slice(0, 200)}`, refused: res.status === 409 })
      }
      return text
    }).pipe(
      Effect.timeout(Duration.millis(timeoutMs)),
      Effect.catchTag("TimeoutError", () => Effect.fail(new PeerError({ op, moveId: h.moveId, message: "peer timed out", refused: false }))),
      Effect.catchTag("HttpClientError", (e) => Effect.fail(new PeerError({ op, moveId: h.moveId, message: e.message, refused: false }))),
      Effect.provide(FetchHttpClient.layer),
    )
  return {
    prepare: (h) =>
      call("prepare", h, "prepare").pipe(
        Effect.flatMap((text) =>
          Effect.try({ try: () => JSON.parse(text) as unknown, catch: () => "not JSON" }).pipe(
            Effect.flatMap(Schema.decodeUnknownEffect(PrepareAnswer)),
            Effect.map((a) => a.endpoint),
            Effect.mapError(() => new PeerError({ op: "prepare", moveId: h.moveId, message: `peer answered no endpoint: ${text.slice(0, 200)}`, refused: false })),
          ),
        ),
      ),
    commit: (h) =>
      call("commit", h, "commit").pipe(
        Effect.map((text): Committed => {
          // The target committed (2xx); how long the guest had run there is a refinement only.
          try {
            const r = Schema.decodeUnknownSync(CommitAnswer)(JSON.parse(text))
            const ms = r.resumedForMs ?? 0
            return { resumedForMs: Number.isFinite(ms) && ms > 0 ? ms : 0 }
          } catch {
            return { resumedForMs: 0 }
          }
        }),
      ),
    abort: (h) => Effect.asVoid(call("abort", h, "abort")),
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

/**
 * The start-up warning of an agent whose `ENGRAM_PEERS` names no agent but its own (`peers`
 * parsed, `hostId` this agent's): a move's source finds its target's agent only there, so every
 * move from this host fails, and so does every one to it from an agent set up the same way. Null
 * when it names another agent.
 */
export const noPeersWarning = (hostId: string, peers: ReadonlyMap<string, string>): string | null => {
  if ([...peers.keys()].some((id) => id !== hostId)) return null
  return (
    `ENGRAM_PEERS ${peers.size === 0 ? "is empty" : "names no agent but this one"}: moves to or from this host will fail ` +
    "(a move's source finds its target's agent only in its own ENGRAM_PEERS). Each such move is aborted, and the coordinator's reaper " +
    "does not move its session again for ENGRAM_MAKE_ROOM_COOLDOWN_MS. Set ENGRAM_PEERS (host=url,…) on every agent, " +
    "or turn the reaper's moves off with ENGRAM_MAKE_ROOM_MOVES=0 on the coordinator"
  )
}
