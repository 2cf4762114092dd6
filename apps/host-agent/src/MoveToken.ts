/**
 * Agent-to-agent credentials. Agents of one fleet share a peer secret; the bearer a source
 * presents to a target for a move is `HMAC-SHA256(secret, move id, source, target)`, so a
 * token leaked from one move authorizes that move's rounds only, between those two hosts, and
 * the target checks it without asking the coordinator. The target proves itself in turn: its
 * answer to a prepare carries `HMAC-SHA256(secret, move id, source, target, endpoint)` under a
 * label of its own, so an address that is not a fleet agent's (a peer URL a stolen host token
 * reported) gets no guest RAM. Host tokens never travel between agents.
 */
import { createHmac, timingSafeEqual } from "node:crypto"

const mac = (secret: string, parts: readonly string[]) => createHmac("sha256", secret).update(parts.join("\0")).digest("hex")

/** The bearer for one move's rounds, commit and abort. */
export const moveToken = (secret: string, moveId: string, sourceHostId: string, targetHostId: string): string =>
  mac(secret, ["engram-move/v1", moveId, sourceHostId, targetHostId])

/**
 * The target's proof, in its answer to a prepare, that it holds the peer secret: bound to the
 * move, both hosts and the data-plane endpoint it answers (where the source streams the guest).
 */
export const prepareProof = (secret: string, moveId: string, sourceHostId: string, targetHostId: string, endpoint: { readonly runtime: string; readonly uri: string }): string =>
  mac(secret, ["engram-move-target/v1", moveId, sourceHostId, targetHostId, endpoint.runtime, endpoint.uri])

/**
 * The bearer for fetching one session's descent image from the host holding it
 * (`GET /v1/peer/images/{session}`), by the host its resume was placed on: bound to the session
 * and both hosts, so a token leaked from one fetch opens no other session's image.
 */
export const imageToken = (secret: string, sessionId: string, imageHostId: string, requesterHostId: string): string =>
  mac(secret, ["engram-image/v1", sessionId, imageHostId, requesterHostId])

/**
 * The image host's proof, in its listing of a session's image files, that it holds the peer
 * secret: bound to the session, both hosts and the files it lists (names and sizes), so an
 * address that is not a fleet agent's (a peer URL a stolen host token reported) cannot hand a
 * host a guest's memory to restore.
 */
export const imageProof = (secret: string, sessionId: string, imageHostId: string, requesterHostId: string, files: readonly { readonly name: string; readonly bytes: number }[]): string =>
  mac(secret, ["engram-image-host/v1", sessionId, imageHostId, requesterHostId, JSON.stringify(files.map((f) => [f.name, f.bytes]))])

/** The bearer for a host agent's status endpoint (operators and tests). */
export const statusToken = (secret: string, hostId: string): string => mac(secret, ["engram-status/v1", hostId])

/** Constant-time comparison of two tokens. */
export const tokensEqual = (a: string, b: string): boolean => {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}
