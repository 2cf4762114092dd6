/**
 * Agent-to-agent credentials. Agents of one fleet share a peer secret; the bearer a source
 * presents to a target for a move is `HMAC-SHA256(secret, move id, source, target)`, so a
 * token leaked from one move authorizes that move's rounds only, between those two hosts, and
 * the target checks it without asking the coordinator. Host tokens never travel between agents.
 */
import { createHmac, timingSafeEqual } from "node:crypto"

const mac = (secret: string, parts: readonly string[]) => createHmac("sha256", secret).update(parts.join("\0")).digest("hex")

/** The bearer for one move's rounds, commit and abort. */
export const moveToken = (secret: string, moveId: string, sourceHostId: string, targetHostId: string): string =>
  mac(secret, ["engram-move/v1", moveId, sourceHostId, targetHostId])

/** The bearer for a host agent's status endpoint (operators and tests). */
export const statusToken = (secret: string, hostId: string): string => mac(secret, ["engram-status/v1", hostId])

/** Constant-time comparison of two tokens. */
export const tokensEqual = (a: string, b: string): boolean => {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}
