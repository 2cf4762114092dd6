/**
 * Agent-to-agent credentials. Agents of one fleet share a peer secret; the bearer a source
 * presents to a target for one operation of a move (prepare, commit or abort) is
 * `HMAC-SHA256(secret, operation, move id, source, target, session, size)`, so a token leaked
 * from one request authorizes only that operation of that move, of that session at that size,
 * between those two hosts (a prepare's token seen on the wire aborts nothing), and the target
 * checks it without asking the coordinator. The old token (`oldMoveToken`, one for all three
 * operations) is taken and sent only during a rolling upgrade (`ENGRAM_AGENT_OLD_MOVE_TOKENS`). The target proves itself in turn: its
 * answer to a prepare carries `HMAC-SHA256(secret, move id, source, target, endpoint)` under a
 * label of its own, so an address that is not a fleet agent's (a peer URL a stolen host token
 * reported) gets no guest RAM. Host tokens never travel between agents. Image bearers
 * (`imageToken`) carry an issue time, a nonce and the route they open besides: each is good for
 * one request, to the listing or to one file, within `imageBearerWindowMs` of its issue.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto"
import type { MoveHeader } from "./MoveTarget.js"

const mac = (secret: string, parts: readonly string[]) => createHmac("sha256", secret).update(parts.join("\0")).digest("hex")

/** A move's operation on its target, each authorized by its own token. */
export type MoveOp = "prepare" | "commit" | "abort"

/**
 * The bearer for one operation of a move: bound to the operation and to the move's header (the
 * move, both hosts, the session and its size), so a token seen on the wire for one request
 * authorizes no other operation (a prepare's no abort after the commit), no other move, no other
 * session, nor the same one at another size, on its target (v2 bound no operation; v1 bound the
 * move and the hosts only).
 */
export const moveToken = (secret: string, op: MoveOp, h: MoveHeader): string =>
  mac(secret, ["engram-move/v3", op, h.moveId, h.sourceHostId, h.targetHostId, h.sessionId, String(h.memMib), String(h.vcpus)])

/**
 * The move token of agents before `moveToken` bound the operation (v2): one bearer for the move's
 * prepare, commit and abort. A target takes it, and a source sends it when a target refuses the
 * new one (401: an agent older than this one), only while `ENGRAM_AGENT_OLD_MOVE_TOKENS` is on
 * (the default, for a rolling upgrade); off once every agent of the fleet runs this version.
 */
export const oldMoveToken = (secret: string, h: MoveHeader): string =>
  mac(secret, ["engram-move/v2", h.moveId, h.sourceHostId, h.targetHostId, h.sessionId, String(h.memMib), String(h.vcpus)])

/**
 * The target's proof, in its answer to a prepare, that it holds the peer secret: bound to the
 * move, both hosts and the data-plane endpoint it answers (where the source streams the guest).
 */
export const prepareProof = (secret: string, moveId: string, sourceHostId: string, targetHostId: string, endpoint: { readonly runtime: string; readonly uri: string }): string =>
  mac(secret, ["engram-move-target/v1", moveId, sourceHostId, targetHostId, endpoint.runtime, endpoint.uri])

/**
 * How long an image bearer is good for: the image host takes one whose issue time is within this
 * of its own clock, either way (so the hosts' clocks may differ by up to this much, which a
 * bearer's life loses on one side), and refuses its nonce a second time while it could be.
 */
export const imageBearerWindowMs = 15 * 60_000

/** One image bearer's parts: when it was issued (epoch ms, the fetching host's clock) and its random nonce (hex). */
export interface ImageBearer {
  readonly issuedAtMs: number
  readonly nonce: string
}

/**
 * What one image bearer opens on the image host: the listing (`GET /v1/peer/images/{session}`)
 * or one file of it by name (`…/files/{name}`); a bearer opens nothing else.
 */
export type ImageRoute = { readonly _tag: "Listing" } | { readonly _tag: "File"; readonly name: string }

const routePart = (r: ImageRoute): string => (r._tag === "Listing" ? "listing" : `files/${r.name}`)

/**
 * The bearer of one request for a session's descent image to the host holding it, by the host
 * its resume was placed on: `<issued at ms>.<nonce>.<HMAC over the session, both hosts, what it
 * opens (the listing, or one file by name), the issue time and the nonce>`. Bound to the session,
 * both hosts and its route (a leaked one opens no other session's image, and a listing's bearer
 * no file), good for one request within `imageBearerWindowMs` of its issue (the image host
 * refuses its nonce a second time, and it once the window has passed).
 */
export const imageToken = (secret: string, sessionId: string, imageHostId: string, requesterHostId: string, opens: ImageRoute, b: ImageBearer): string =>
  `${b.issuedAtMs}.${b.nonce}.${mac(secret, ["engram-image/v3", sessionId, imageHostId, requesterHostId, routePart(opens), String(b.issuedAtMs), b.nonce])}`

/** A fresh bearer's parts at `nowMs`: 16 random bytes of nonce. */
export const newImageBearer = (nowMs: number): ImageBearer => ({ issuedAtMs: nowMs, nonce: randomBytes(16).toString("hex") })

/**
 * The parts of `token` when it is `imageToken` for the session, both hosts and the route it is
 * presented to (its HMAC compared in constant time); undefined otherwise. Its age and nonce are
 * `ImageNonces`'s to judge.
 */
export const imageBearerOf = (secret: string, token: string, sessionId: string, imageHostId: string, requesterHostId: string, opens: ImageRoute): ImageBearer | undefined => {
  const m = /^(\d{1,15})\.([0-9a-f]{32})\.[0-9a-f]{64}$/.exec(token)
  if (m === null) return undefined
  const b = { issuedAtMs: Number(m[1]), nonce: m[2]! }
  return tokensEqual(token, imageToken(secret, sessionId, imageHostId, requesterHostId, opens, b)) ? b : undefined
}

/**
 * The nonces of the image bearers an image host took, each kept until its bearer's window has
 * passed (then its age refuses it anyway): bounded by the requests of one window. `admit`
 * judges a bearer whose HMAC holds at `nowMs` (the image host's clock) and records its nonce.
 */
export const imageNonces = (windowMs: number = imageBearerWindowMs) => {
  const seen = new Map<string, number>()
  return {
    admit: (b: ImageBearer, nowMs: number): "ok" | "expired" | "replayed" => {
      for (const [nonce, until] of seen) if (until < nowMs) seen.delete(nonce)
      if (Math.abs(nowMs - b.issuedAtMs) > windowMs) return "expired"
      if (seen.has(b.nonce)) return "replayed"
      seen.set(b.nonce, b.issuedAtMs + windowMs)
      return "ok"
    },
    /** How many nonces are kept. */
    size: () => seen.size,
    /** The nonces kept, each with the end of its bearer's window (what `remember` takes back). */
    entries: (): readonly (readonly [string, number])[] => [...seen.entries()],
    /** Takes back a nonce taken before (by this host's agent before a restart), kept until `untilMs`. */
    remember: (nonce: string, untilMs: number): void => void seen.set(nonce, untilMs),
  }
}
export type ImageNonces = ReturnType<typeof imageNonces>

/**
 * The image host's proof, in its listing of a session's image files, that it holds the peer
 * secret: bound to the session, both hosts, the listing request's nonce, the peer URL the image
 * host serves the files at (the one its agent advertises; "" for none) and the files it lists
 * (names, sizes and SHA-256 of their contents). So an address that is not a fleet agent's (a peer
 * URL a stolen host token reported) can neither make up a listing, nor replay an older one, nor
 * relay a real one and serve other contents (the fetcher checks each file's hash), nor have the
 * files fetched through it (the fetcher takes them from the proven URL).
 */
export const imageProof = (
  secret: string,
  sessionId: string,
  imageHostId: string,
  requesterHostId: string,
  nonce: string,
  peerUrl: string | null,
  files: readonly { readonly name: string; readonly bytes: number; readonly sha256: string }[],
): string => mac(secret, ["engram-image-host/v3", sessionId, imageHostId, requesterHostId, nonce, peerUrl ?? "", JSON.stringify(files.map((f) => [f.name, f.bytes, f.sha256]))])

/** The bearer for a host agent's status endpoint (operators and tests). */
export const statusToken = (secret: string, hostId: string): string => mac(secret, ["engram-status/v1", hostId])

/** Constant-time comparison of two tokens. */
export const tokensEqual = (a: string, b: string): boolean => {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}
