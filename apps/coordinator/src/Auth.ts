/**
 * Credentials: the admin token and the hosts' own tokens. Tokens are 32 random bytes
 * (base64url); only their SHA-256 is kept (the store holds the hosts'), and a presented
 * token is hashed and compared with `timingSafeEqual`. Tokens never reach a log line.
 */
import { Store } from "@engram/store"
import type { Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer, Redacted, Semaphore } from "effect"
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

/**
 * Which host a token hash belongs to. The store keeps one hash per host but has no lookup by
 * hash, so this keeps a cache filled at registration and refreshed from `listHosts` +
 * `hostTokenHash` when an unknown hash shows up (at most one refresh per 250 ms, shared by
 * concurrent callers, so a flood of bad tokens costs one read per window).
 */
export interface HostTokensShape {
  /** Records a host's token hash (at registration). */
  readonly remember: (hostId: string, tokenHash: string) => void
  /** The host whose token hashes to `tokenHash`, or null. */
  readonly hostOf: (tokenHash: string) => Effect.Effect<string | null, Unavailable>
}

export class HostTokens extends Context.Service<HostTokens, HostTokensShape>()("@engram/coordinator/HostTokens") {
  static readonly layer: Layer.Layer<HostTokens, never, Store> = Layer.effect(
    HostTokens,
    Effect.gen(function* () {
      const store = yield* Store
      const byHash = new Map<string, string>()
      const known = new Set<string>()
      const lock = yield* Semaphore.make(1)
      let lastRefreshAt = Number.NEGATIVE_INFINITY

      const remember = (hostId: string, tokenHash: string): void => {
        byHash.set(tokenHash, hostId)
        known.add(hostId)
      }

      const refresh = Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        if (now - lastRefreshAt < 250) return
        lastRefreshAt = now
        const hosts = yield* store.listHosts()
        const unknown = hosts.filter((h) => !known.has(h.id))
        yield* Effect.forEach(
          unknown,
          (h) =>
            store.hostTokenHash(h.id).pipe(
              Effect.map((hash) => {
                if (hash !== null) remember(h.id, hash)
                else known.add(h.id)
              }),
              Effect.catchTag("NotFound", () => Effect.void),
            ),
          { concurrency: 8, discard: true },
        )
      })

      const hostOf = (tokenHash: string): Effect.Effect<string | null, Unavailable> =>
        Effect.gen(function* () {
          const hit = byHash.get(tokenHash)
          if (hit !== undefined) return hit
          yield* lock.withPermits(1)(Effect.suspend(() => (byHash.has(tokenHash) ? Effect.void : refresh)))
          return byHash.get(tokenHash) ?? null
        })

      return HostTokens.of({ remember, hostOf })
    }),
  )
}

/** The admin token's hash, decided at start. */
export class AdminToken extends Context.Service<
  AdminToken,
  { readonly tokenHash: string; readonly token: string; readonly file: string | null }
>()("@engram/coordinator/AdminToken") {}

/** The bearer middleware: admin token → `Admin`; a host's token → `Host(hostId)`; anything else → 401. */
export const BearerAuthLive: Layer.Layer<BearerAuth, never, AdminToken | HostTokens> = Layer.effect(
  BearerAuth,
  Effect.gen(function* () {
    const admin = yield* AdminToken
    const hosts = yield* HostTokens
    return BearerAuth.of({
      bearer: (httpEffect, { credential }) =>
        Effect.gen(function* () {
          const token = Redacted.value(credential)
          if (token === "") return yield* new Unauthorized({ error: "Unauthorized", message: "missing bearer token" })
          const hash = hashToken(token)
          let principal: Principal | null = null
          if (sameHash(hash, admin.tokenHash)) principal = { _tag: "Admin" }
          else {
            const hostId = yield* hosts.hostOf(hash).pipe(
              Effect.catchTag("Unavailable", (e) =>
                Effect.fail(new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs })),
              ),
            )
            if (hostId !== null) principal = { _tag: "Host", hostId }
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
