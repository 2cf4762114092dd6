/**
 * The source's link to a move's target agent: prepare the incoming VM (its answer is the
 * runtime endpoint the source's runtime streams the VM to), ask for the commit, or abort.
 * Over HTTP to the target's peer server (bearer: the move token of the operation, or during a
 * rolling upgrade the move's old token for a target older than this agent; the target proves
 * itself in its prepare answer), or in memory between agents of one process (clock-driven tests).
 *
 * What it decides: which failures are the target's answer (`refused`: a 409 from the target,
 * which acted on its side) and which leave the target's state unknown (unreachable, timed out,
 * any other status; a 503 whose body says `notResumed` is the target's "not yet", which resumed
 * nothing); where a move's target is reached; and whether a prepare answer proves the
 * target holds the peer secret (`proofProblem`), without which nothing is streamed to it.
 */
import { Duration, Effect, Schema } from "effect"
import { FetchHttpClient, HttpBody, HttpClient, HttpClientRequest } from "effect/http"
import { Move as CoreMove, Names } from "@engram/core"
import type { IncomingEndpoint } from "@engram/runtime"
import { Env } from "@engram/process"
import * as BoundedRead from "./BoundedRead.js"
import { type MoveOp, moveToken, oldMoveToken, prepareProof, tokensEqual } from "./MoveToken.js"
import { type Committed, type MoveHeader, type MoveTarget, PeerError } from "./MoveTarget.js"

export interface PeerLink {
  readonly prepare: (header: MoveHeader) => Effect.Effect<IncomingEndpoint, PeerError>
  readonly commit: (header: MoveHeader) => Effect.Effect<Committed, PeerError>
  readonly abort: (header: MoveHeader) => Effect.Effect<void, PeerError>
  /**
   * Learns where a target's agent serves its peers (a move's `targetPeerUrl` from the
   * coordinator; null: it advertises none). A link that needs no address has none.
   */
  readonly learn?: (hostId: string, url: string | null) => Effect.Effect<void>
  /** The URL a move's target is reached at now (the source records it with the outcome it owes); undefined: none. */
  readonly addressOf?: (header: MoveHeader) => string | undefined
  /**
   * Reaches one move's target at `url` from now on (where a restarted source's owed move went,
   * from its state file); the operator's `ENGRAM_PEERS` entry still wins.
   */
  readonly pin?: (moveId: string, url: string) => Effect.Effect<void>
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

/**
 * The answer of `POST /v1/peer/moves/{id}/prepare`. `proof`: the target's (`MoveToken.prepareProof`);
 * absent from target agents older than it.
 */
export const PrepareAnswer = Schema.Struct({ endpoint: Schema.Struct({ runtime: Schema.String, uri: Schema.String }), proof: Schema.optionalKey(Schema.String) })

/** The bound of a target's answer, bytes (`BoundedRead.peerAnswerMaxBytes`, 64 KiB; a real one holds a few hundred): past it the answer is not read. */
export const peerAnswerMaxBytes = BoundedRead.peerAnswerMaxBytes

/**
 * What a target's "not yet" (its 503's body, read whole) says: that it resumed nothing
 * (`PeerError.notResumed`). Anything else (an older target, a proxy's 503): no answer.
 */
const notResumedOf = (text: string, over: boolean): { notResumed?: true } => {
  if (over) return {}
  try {
    const body: unknown = JSON.parse(text)
    return typeof body === "object" && body !== null && (body as { readonly notResumed?: unknown }).notResumed === true ? { notResumed: true } : {}
  } catch {
    return {}
  }
}

/**
 * What a target's refusal (its 409's body, read whole) says: that the move's stream never
 * completed there (`PeerError.noStream`), and that it checks the session's placement before it
 * resumes a stream sent again (`checksPlacement`, only with `noStream`).
 */
const noStreamOf = (text: string, over: boolean): { noStream?: true; checksPlacement?: true } => {
  if (over) return {}
  try {
    const body: unknown = JSON.parse(text)
    if (typeof body !== "object" || body === null || (body as { readonly noStream?: unknown }).noStream !== true) return {}
    return (body as { readonly checksPlacement?: unknown }).checksPlacement === true ? { noStream: true, checksPlacement: true } : { noStream: true }
  } catch {
    return {}
  }
}

/** A move's header as it is sent: exactly its six keys, whatever else the object given carries. */
const wireHeader = (h: MoveHeader): MoveHeader => ({ moveId: h.moveId, sessionId: h.sessionId, sourceHostId: h.sourceHostId, targetHostId: h.targetHostId, memMib: h.memMib, vcpus: h.vcpus })

/** How many moves' target addresses a link keeps (the oldest go first); a move's rounds are over long before. */
const pinnedMovesMax = 1024

/** Sets `key` in `m` as its newest entry, the oldest going past `pinnedMovesMax`. */
const remember = <V>(m: Map<string, V>, key: string, value: V) => {
  m.delete(key)
  m.set(key, value)
  for (const oldest of m.keys()) {
    if (m.size <= pinnedMovesMax) break
    m.delete(oldest)
  }
}

/** How an HTTP link calls targets. */
export interface HttpLinkOptions {
  /** Each call's bound, ms; default 60 000. */
  readonly timeoutMs?: number
  /**
   * Whether a target that refuses the operation's token (401: an agent older than this one, which
   * checks only the move's old token, `MoveToken.oldMoveToken`) is asked once more with the old
   * one (`ENGRAM_AGENT_OLD_MOVE_TOKENS`); default true, for a rolling upgrade. Off, no old token
   * is ever sent.
   */
  readonly oldMoveTokens?: boolean
}

/**
 * A link over HTTP. A target's address is `peers`' (the operator's `ENGRAM_PEERS`: an override),
 * else the one its move was prepared at (or `pin`ned), else the one the coordinator gave with a
 * move to it (`learn`); with none the call fails (`no address for peer`) without a request.
 *
 * The source streams the guest only to a target that proves it holds the peer secret: its
 * prepare answer's `proof` (`MoveToken.prepareProof`) is checked in constant time. It is required
 * at an address from the coordinator (a host token alone can report one); at the operator's own
 * `ENGRAM_PEERS` entry an answer without one (an older target agent) is taken, a wrong one never.
 * The move's later calls (commit, abort) go where it was prepared: a URL the coordinator changes
 * meanwhile does not receive them.
 *
 * Each call's bearer is the move token of its operation (`MoveToken.moveToken`). While
 * `oldMoveTokens` is on, a 401 (the target did not act) is followed by one more try with the
 * move's old token: a target agent older than this one checks only that. A move whose target took
 * the old one sends it first from then on (no second request in the guest's pause).
 *
 * Each answer is read up to `peerAnswerMaxBytes` and no further (`BoundedRead`): a prepare answered
 * with more fails before its proof is judged (nothing streamed); a commit's 2xx past it is the
 * target's word that it committed (its figure taken as 0); a refusal's message is left unread.
 */
export const http = (peers: (hostId: string) => string | undefined, secret: string, options: HttpLinkOptions = {}): PeerLink => {
  const timeoutMs = options.timeoutMs ?? 60_000
  const oldMoveTokens = options.oldMoveTokens !== false
  const learned = new Map<string, string>()
  const pinned = new Map<string, string>()
  const pinMove = (moveId: string, url: string) => remember(pinned, moveId, url)
  /** The moves whose target took only the old token (an agent older than this one). */
  const oldTargets = new Map<string, true>()
  /** Where `h`'s target is reached, and whether the operator named it (`ENGRAM_PEERS`). */
  const addressOf = (h: MoveHeader) => {
    const own = peers(h.targetHostId)
    if (own !== undefined) return { base: own, operators: true }
    const base = pinned.get(h.moveId) ?? learned.get(h.targetHostId)
    return base === undefined ? undefined : { base, operators: false }
  }
  const call = (op: MoveOp, h: MoveHeader) =>
    Effect.gen(function* () {
      const address = addressOf(h)
      if (address === undefined) return yield* new PeerError({ op, moveId: h.moveId, message: `no address for peer ${h.targetHostId}`, refused: false })
      const { base } = address
      const client = yield* HttpClient.HttpClient
      const send = (token: string) =>
        Effect.gen(function* () {
          const req = HttpClientRequest.post(`${base.replace(/\/+$/, "")}/v1/peer/moves/${encodeURIComponent(h.moveId)}/${op}`).pipe(
            HttpClientRequest.bearerToken(token),
            // The header's six keys only: the target refuses any other (`PeerServer`).
            HttpClientRequest.setBody(HttpBody.jsonUnsafe(wireHeader(h))),
          )
          const res = yield* client.execute(req)
          // Read before the target proved anything: at most `peerAnswerMaxBytes`, never the rest.
          const bytes = yield* BoundedRead.streamAtMost(res.stream, peerAnswerMaxBytes, res.headers["content-length"]).pipe(Effect.orElseSucceed(() => new Uint8Array(0)))
          return { status: res.status, text: bytes === undefined ? "" : new TextDecoder().decode(bytes), over: bytes === undefined }
        })
      const own = moveToken(secret, op, h)
      const old = oldMoveToken(secret, h)
      const tokens = !oldMoveTokens ? [own] : oldTargets.has(h.moveId) ? [old, own] : [own, old]
      let res = yield* send(tokens[0]!)
      // A 401 is a target that did not act: one older than this agent takes only the move's old token.
      if (res.status === 401 && tokens[1] !== undefined) {
        res = yield* send(tokens[1])
        if (res.status !== 401 && tokens[1] === old) {
          remember(oldTargets, h.moveId, true)
          yield* Effect.logInfo("move: the target took only the move's old token (an agent older than this one); sent while ENGRAM_AGENT_OLD_MOVE_TOKENS is on", { moveId: h.moveId, target: h.targetHostId, op })
        }
        if (res.status !== 401 && tokens[1] === own) oldTargets.delete(h.moveId)
      }
      const { text, over } = res
      if (res.status < 200 || res.status >= 300) {
        // 409 is the target's own refusal (PeerServer); anything else says nothing of its state.
        const said = over ? `an answer over ${peerAnswerMaxBytes} bytes, not read` : text.slice(0, 200)
        return yield* new PeerError({ op, moveId: h.moveId, message: `peer answered ${res.status}: ${said}`, refused: res.status === 409, ...(res.status === 409 ? noStreamOf(text, over) : res.status === 503 ? notResumedOf(text, over) : {}) })
      }
      return { text, over, ...address }
    }).pipe(
      Effect.timeout(Duration.millis(timeoutMs)),
      Effect.catchTag("TimeoutError", () => Effect.fail(new PeerError({ op, moveId: h.moveId, message: "peer timed out", refused: false }))),
      Effect.catchTag("HttpClientError", (e) => Effect.fail(new PeerError({ op, moveId: h.moveId, message: e.message, refused: false }))),
      Effect.provide(FetchHttpClient.layer),
    )
  return {
    prepare: (h) =>
      call("prepare", h).pipe(
        Effect.flatMap(({ text, over, base, operators }) =>
          over
            ? Effect.fail(new PeerError({ op: "prepare", moveId: h.moveId, message: `the target at ${base} answered the prepare with more than ${peerAnswerMaxBytes} bytes (a prepare's answer is a few hundred); not read further, nothing was streamed to it`, refused: false }))
            : Effect.try({ try: () => JSON.parse(text) as unknown, catch: () => "not JSON" }).pipe(
            Effect.flatMap(Schema.decodeUnknownEffect(PrepareAnswer)),
            Effect.mapError(() => new PeerError({ op: "prepare", moveId: h.moveId, message: `peer answered no endpoint: ${text.slice(0, 200)}`, refused: false })),
            Effect.flatMap((a) => {
              const problem = proofProblem(secret, h, a, operators)
              if (problem !== undefined) {
                return Effect.fail(new PeerError({ op: "prepare", moveId: h.moveId, message: `the target at ${base} ${problem}; nothing was streamed to it`, refused: false }))
              }
              pinMove(h.moveId, base)
              return Effect.succeed(a.endpoint)
            }),
          ),
        ),
      ),
    commit: (h) =>
      call("commit", h).pipe(
        Effect.map(({ text }): Committed => {
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
    abort: (h) => Effect.asVoid(call("abort", h)),
    learn: (hostId, url) =>
      Effect.sync(() => {
        if (url === null) learned.delete(hostId)
        else learned.set(hostId, url)
      }),
    addressOf: (h) => addressOf(h)?.base,
    pin: (moveId, url) => Effect.sync(() => pinMove(moveId, url)),
  }
}

/**
 * Why a prepare answer does not prove the target holds the peer secret (`MoveToken.prepareProof`
 * over the move, both hosts and the endpoint), or undefined. Without a proof it passes only at the
 * operator's own address (`operators`: an `ENGRAM_PEERS` entry; an older target agent sends none).
 */
export const proofProblem = (secret: string, h: MoveHeader, answer: typeof PrepareAnswer.Type, operators: boolean): string | undefined => {
  if (answer.proof === undefined) {
    return operators ? undefined : "answered the prepare without a proof that it holds the peer secret (required at a peer URL from the coordinator; an ENGRAM_PEERS entry takes a target too old to send one)"
  }
  const expected = prepareProof(secret, h.moveId, h.sourceHostId, h.targetHostId, answer.endpoint)
  return tokensEqual(answer.proof, expected) ? undefined : "answered the prepare with a wrong proof (not made with this fleet's peer secret for this move and endpoint)"
}

/** The hosts a listener on every interface binds to: no peer can reach this host there (core's). */
const wildcardHosts = CoreMove.wildcardHosts

/** The rule of an advertised peer URL (`ENGRAM_AGENT_PEER_URL`, a program's `peerUrl`): core's `Move.peerUrlRule`. */
export const peerUrlRule = `must be ${CoreMove.peerUrlRule}`

/**
 * Why `url` cannot be advertised as this agent's peer URL (`peerUrlRule`), or undefined: core's
 * `Move.isPeerUrl` (a wildcard host such as 0.0.0.0 refused with the rest), the coordinator's
 * store's rule too (`@engram/store`'s `Validate.peerUrl`), so what the agent starts with the
 * store accepts.
 */
export const peerUrlProblem = (url: string): string | undefined => (CoreMove.isPeerUrl(url) ? undefined : peerUrlRule)

/**
 * The host of the peer URL an agent derives: where its peer server listens (`ENGRAM_AGENT_HOST`),
 * unless that is a wildcard: then the address peers reach the host at (`ENGRAM_AGENT_ADVERTISE_HOST`,
 * which names the data plane's address too), else the wildcard (which makes none).
 */
export const peerHostOf = (listenHost: string, advertiseHost: string | undefined): string =>
  wildcardHosts.has(listenHost) ? (advertiseHost ?? listenHost) : listenHost

/** The host of a URL as a bare host (an IPv6 address without its brackets); undefined for none. */
const bareHostOf = (url: string): string | undefined => {
  const host = URL.canParse(url) ? new URL(url).hostname : ""
  return host === "" ? undefined : host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host
}

/**
 * The address a move's source is told to stream a guest to on this host: `advertiseHost`
 * (`ENGRAM_AGENT_ADVERTISE_HOST`) when given; else where the data plane listens
 * (`ENGRAM_AGENT_MIGRATION_HOST`) unless that is a wildcard; else the host of the peer URL this
 * agent advertises (`peerUrl`: peers reach this host there already, so they reach its data plane
 * there too). Before, a data plane on `0.0.0.0` with only `ENGRAM_AGENT_PEER_URL` (or an
 * `ENGRAM_PEERS` entry) set told sources `tcp:0.0.0.0:<port>`, which each source dialled on
 * itself: every move to the host failed, though it advertised a peer URL and so was picked as a
 * target. The wildcard stays when nothing names a host (the agent advertises no peer URL then,
 * said at start, and is no move's target).
 */
export const migrationAdvertiseHostOf = (listenHost: string, advertiseHost: string | undefined, peerUrl: string | null | undefined): string => {
  if (advertiseHost !== undefined) return advertiseHost
  if (!wildcardHosts.has(listenHost)) return listenHost
  const peerHost = peerUrl == null ? undefined : bareHostOf(peerUrl)
  return peerHost === undefined || wildcardHosts.has(peerHost) ? listenHost : peerHost
}

/**
 * The peer URL an agent advertises when told none: `http://<host>:<port>` of its peer server
 * (`host`: `peerHostOf`; an IPv6 address in brackets). None (null) when `host` is a wildcard:
 * the agent cannot know which of its addresses peers reach.
 */
export const derivedPeerUrl = (host: string, port: number): string | null => {
  if (wildcardHosts.has(host) || host === "") return null
  return `http://${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${port}`
}

/** Whether `host` is one host (core's `Names.isHost`): the agent writes it into peer URLs, the simulated wire and QEMU's `tcp:` URIs. */
const isOneHost = Names.isHost

/** The rule of a host the agent listens on (`ENGRAM_AGENT_MIGRATION_HOST`; a wildcard such as 0.0.0.0 listens on every interface): core's `Names.hostRule`. */
export const listenHostRule = Names.hostRule

/** Why `host` cannot be listened on (`listenHostRule`), or undefined. */
export const listenHostProblem = (host: string): string | undefined => (isOneHost(host) ? undefined : listenHostRule)

/**
 * The rule of the host peers reach this agent at (`ENGRAM_AGENT_ADVERTISE_HOST`): one host, not a
 * wildcard (core's `Move.wildcardHosts`, however spelt: `0` is 0.0.0.0), since peers must reach it.
 */
export const advertiseHostRule = "must be a host name or IP address peers reach (not 0.0.0.0 or ::; an IPv6 one without brackets), without a scheme, port, path, spaces or control characters"

/**
 * Why `host` cannot be advertised to peers (`advertiseHostRule`), or undefined: one host whose
 * derived peer URL (`derivedPeerUrl`) is one by core's rule (`Move.isPeerUrl`, which refuses a
 * wildcard however spelt), as the derived peer URL and the move's data plane address use it.
 */
export const advertiseHostProblem = (host: string): string | undefined => {
  const url = derivedPeerUrl(host, 1)
  return isOneHost(host) && url !== null && CoreMove.isPeerUrl(url) ? undefined : advertiseHostRule
}

/**
 * This agent's own entry in the operator's peer list (`peers(hostId)`, `ENGRAM_PEERS`) when it may
 * be advertised (`peerUrlProblem`), else undefined: where the fleet's other agents reach this one
 * already. An agent told no peer URL advertises it before deriving one (`Host`), so the hosts of
 * a fleet that moves through `ENGRAM_PEERS` alone stay move targets on wildcard listen hosts.
 */
export const ownPeerUrl = (peers: (hostId: string) => string | undefined, hostId: string): string | undefined => {
  const entry = peers(hostId)
  return entry !== undefined && entry !== "" && peerUrlProblem(entry) === undefined ? entry : undefined
}

/**
 * Why `ENGRAM_PEERS` is refused, or undefined: each comma-separated entry (blank ones aside) is
 * `<host id>=<URL>`, the id by the id rule, the URL absolute `http://` or `https://` (or empty:
 * none), no host named twice. Whether a URL names a host peers reach (`peerUrlRule`) is judged
 * where it is used: this host's own entry is named at start with what it advertises instead.
 */
export const peersProblem = (text: string): string | undefined => {
  const seen = new Set<string>()
  for (const { part, eq, key: id, value: url } of Env.keyValues(text)) {
    if (eq <= 0) return `must be comma-separated <host id>=<peer URL> entries; ${JSON.stringify(Env.shownUrl(part))} is not one`
    if (!Names.isId(id)) return `each entry's host id ${Names.idRule}; ${JSON.stringify(Env.shownUrl(id))} does not`
    if (seen.has(id)) return `names host ${id} twice`
    seen.add(id)
    if (url !== "" && !isHttpUrl(url)) return `host ${id}'s URL must be an absolute http:// or https:// URL; ${JSON.stringify(Env.shownUrl(url))} is not`
  }
  return undefined
}


const isHttpUrl = (url: string): boolean => {
  try {
    const parsed = new URL(url)
    return parsed.protocol === "http:" || parsed.protocol === "https:"
  } catch {
    return false
  }
}

/** Parses `ENGRAM_PEERS` (`host-a=http://10.0.0.1:7100,host-b=http://…`; `peersProblem` judged it). */
export const parsePeers = (text: string): Map<string, string> => new Map(Env.keyValues(text).flatMap((e) => (e.eq > 0 ? [[e.key, e.value] as const] : [])))

/**
 * The start-up warning of an agent that advertises no peer URL (from the environment): told none
 * (`peerUrl` undefined: no `ENGRAM_AGENT_PEER_URL` and no own `ENGRAM_PEERS` entry, `ownPeerUrl`)
 * and its peer URL's host (`host`: `peerHostOf`) a wildcard. The coordinator then has no address
 * to give the sources of moves to this host: its reaper plans no make-room move here, and a move
 * asked for through the API fails unless the source's own `ENGRAM_PEERS` names it. Null when it
 * advertises one.
 */
export const noPeerUrlWarning = (peerUrl: string | undefined, host: string): string | null =>
  peerUrl !== undefined || derivedPeerUrl(host, 0) !== null
    ? null
    : `this agent advertises no peer URL (ENGRAM_AGENT_HOST ${JSON.stringify(host)} is a wildcard, and none of ENGRAM_AGENT_PEER_URL, this host's entry in ENGRAM_PEERS ` +
      "and ENGRAM_AGENT_ADVERTISE_HOST is set): the coordinator's reaper moves no session here to make room, and a move to this host asked for through the API " +
      "fails unless the source's ENGRAM_PEERS names it. Set ENGRAM_AGENT_PEER_URL, this host's entry in ENGRAM_PEERS, or ENGRAM_AGENT_ADVERTISE_HOST " +
      "(the address peers reach this host at)"
