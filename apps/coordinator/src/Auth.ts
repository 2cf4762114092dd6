/**
 * Credentials: the admin token and the hosts' own tokens. Tokens are 32 random bytes
 * (base64url); only their SHA-256 is kept (the store holds the hosts'). A presented token is
 * hashed; the admin's hash is compared with `timingSafeEqual`, and a host is found by
 * `Store.hostByTokenHash` on every request (no cache, so a host registered through any
 * replica authenticates at once). Tokens never reach a log line.
 */
import { Store } from "@engram/store"
import { Context, Effect, Layer, Redacted } from "effect"
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { BearerAuth, CurrentPrincipal, Forbidden, ServiceUnavailable, Unauthorized } from "./Api.js"
import type { Principal } from "./Api.js"

/** A new random token: 32 bytes, base64url. */
export const newToken = (): string => randomBytes(32).toString("base64url")

/** The SHA-256 of a token, hex. */
export const hashToken = (token: string): string => createHash("sha256").update(token, "utf8").digest("hex")

/** Constant-time comparison of two hex hashes. */
export const sameHash = (a: string, b: string): boolean => {
  const ba = Buffer.from(a, "hex")
  const bb = Buffer.from(b, "hex")
  return ba.length === bb.length && ba.length > 0 && timingSafeEqual(ba, bb)
}

/**
 * The admin token: the configured one, else `<dataDir>/admin-token`, generated (mode 0600)
 * on first start. Answers the token and, when a file is used, its path.
 */
export const resolveAdminToken = (configured: string | null, dataDir: string): Effect.Effect<{ readonly token: string; readonly file: string | null; readonly generated: boolean }> =>
  Effect.sync(() => {
    if (configured !== null) return { token: configured, file: null, generated: false }
    const file = resolve(join(dataDir, "admin-token"))
    if (existsSync(file)) {
      const token = readFileSync(file, "utf8").trim()
      if (token.length >= 16) return { token, file, generated: false }
    }
    mkdirSync(dataDir, { recursive: true })
    const token = newToken()
    writeFileSync(file, `${token}\n`, { mode: 0o600 })
    chmodSync(file, 0o600)
    return { token, file, generated: true }
  })

/** The admin token's hash, decided at start. */
export class AdminToken extends Context.Service<
  AdminToken,
  { readonly tokenHash: string; readonly token: string; readonly file: string | null }
>()("@engram/coordinator/AdminToken") {}

/**
 * The bearer middleware: admin token → `Admin`; a host's token → `Host(hostId)`; anything
 * else → 401. The host is looked up in the store by the token's hash on every request.
 */
export const BearerAuthLive: Layer.Layer<BearerAuth, never, AdminToken | Store> = Layer.effect(
  BearerAuth,
  Effect.gen(function* () {
    const admin = yield* AdminToken
    const store = yield* Store
    return BearerAuth.of({
      bearer: (httpEffect, { credential }) =>
        Effect.gen(function* () {
          const token = Redacted.value(credential)
          if (token === "") return yield* new Unauthorized({ error: "Unauthorized", message: "missing bearer token" })
          const hash = hashToken(token)
          let principal: Principal | null = null
          // The admin token is a secret we compare against: constant time.
          if (sameHash(hash, admin.tokenHash)) principal = { _tag: "Admin" }
          else {
            // A host is found by an indexed equality lookup on the SHA-256 of the presented
            // token, which is not constant-time. That leaks nothing useful: its timing could at
            // most reveal part of a stored *hash*, and a hash does not authenticate. Only the
            // token does, and getting it back from its hash means a SHA-256 preimage of 32
            // random bytes.
            const host = yield* store.hostByTokenHash(hash).pipe(
              Effect.catchTag("Unavailable", (e) =>
                Effect.fail(new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs })),
              ),
            )
            if (host !== null) principal = { _tag: "Host", hostId: host.id }
          }
          if (principal === null) return yield* new Unauthorized({ error: "Unauthorized", message: "invalid bearer token" })
          return yield* Effect.provideService(httpEffect, CurrentPrincipal, principal)
        }),
    })
  }),
)

/** Admin only. */
export const requireAdmin = Effect.gen(function* () {
  const p = yield* CurrentPrincipal
  if (p._tag !== "Admin") return yield* new Forbidden({ error: "Forbidden", message: "this operation needs the admin token" })
})

/**
 * The admin, or the agent of one of `hostIds` (a session's host, a move's source…). A host
 * token for any other host is refused with 403.
 */
export const requireHostOrAdmin = (...hostIds: readonly (string | null)[]) =>
  Effect.gen(function* () {
    const p = yield* CurrentPrincipal
    if (p._tag === "Admin") return
    if (hostIds.includes(p.hostId)) return
    return yield* new Forbidden({ error: "Forbidden", message: `the token of host ${p.hostId} does not act for this resource` })
  })
