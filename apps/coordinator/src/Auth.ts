/**
 * Credentials: the admin token, the hosts' own tokens and the metrics scrape token. Tokens are
 * 32 random bytes (base64url); only their SHA-256 is kept (the store holds the hosts'). A
 * presented token is hashed; the admin's and the scrape token's hashes are compared with
 * `timingSafeEqual`, and a host is found by `Store.hostByTokenHash` on every request (no cache,
 * so a host registered through any replica authenticates at once). Tokens never reach a log
 * line. This module implements the API's security middlewares (`BearerAuth`, `AdminOnly`,
 * `ScrapeAuth`) and the per-resource check `requireHostOrAdmin`.
 */
import { AdminOnly, BearerAuth, CurrentPrincipal, Forbidden, ScrapeAuth, ServiceUnavailable, Unauthorized } from "@engram/api"
import type { Principal } from "@engram/api"
import { Store } from "@engram/store"
import { Context, Effect, Layer, Redacted } from "effect"
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"

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
export const resolveAdminToken = (
  configured: Redacted.Redacted<string> | null,
  dataDir: string,
): Effect.Effect<{ readonly token: string; readonly file: string | null; readonly generated: boolean }> =>
  Effect.sync(() => {
    if (configured !== null) return { token: Redacted.value(configured), file: null, generated: false }
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

/** The admin token (and its hash) and the scrape token's hash, decided at start. */
export class AdminToken extends Context.Service<
  AdminToken,
  {
    readonly tokenHash: string
    readonly token: string
    readonly file: string | null
    /** The SHA-256 of `ENGRAM_METRICS_TOKEN`; null when none is set. */
    readonly metricsTokenHash: string | null
  }
>()("@engram/coordinator/AdminToken") {}

const unauthorized = (message: string) => new Unauthorized({ error: "Unauthorized", message })

/** Admin token → `Admin`; a host's token → `Host(hostId)`; else null. */
const principalOf = (token: string) =>
  Effect.gen(function* () {
    const admin = yield* AdminToken
    const store = yield* Store
    const hash = hashToken(token)
    // The admin token is a secret we compare against: constant time.
    if (sameHash(hash, admin.tokenHash)) return { _tag: "Admin" } as Principal
    // A host is found by an indexed equality lookup on the SHA-256 of the presented token, which
    // is not constant-time. That leaks nothing useful: its timing could at most reveal part of a
    // stored *hash*, and a hash does not authenticate. Only the token does, and getting it back
    // from its hash means a SHA-256 preimage of 32 random bytes.
    const host = yield* store.hostByTokenHash(hash).pipe(
      Effect.catchTag("Unavailable", (e) => Effect.fail(new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs }))),
    )
    return host === null ? null : ({ _tag: "Host", hostId: host.id } as Principal)
  })

/** `BearerAuth`: the admin's or a host's token, else 401. */
export const BearerAuthLive: Layer.Layer<BearerAuth, never, AdminToken | Store> = Layer.effect(
  BearerAuth,
  Effect.gen(function* () {
    const context = yield* Effect.context<AdminToken | Store>()
    return BearerAuth.of({
      bearer: (httpEffect, { credential }) =>
        Effect.gen(function* () {
          const token = Redacted.value(credential)
          if (token === "") return yield* unauthorized("missing bearer token")
          const principal = yield* principalOf(token)
          if (principal === null) return yield* unauthorized("invalid bearer token")
          return yield* Effect.provideService(httpEffect, CurrentPrincipal, principal)
        }).pipe(Effect.provideContext(context)),
    })
  }),
)

/** `AdminOnly`: a host token gets 403 before the handler runs. */
export const AdminOnlyLive: Layer.Layer<AdminOnly> = Layer.succeed(
  AdminOnly,
  AdminOnly.of((httpEffect) =>
    Effect.gen(function* () {
      const p = yield* CurrentPrincipal
      if (p._tag !== "Admin") return yield* new Forbidden({ error: "Forbidden", message: "this operation needs the admin token" })
      return yield* httpEffect
    }),
  ),
)

/** `ScrapeAuth`: the scrape token (constant-time), or any token `BearerAuth` takes. */
export const ScrapeAuthLive: Layer.Layer<ScrapeAuth, never, AdminToken | Store> = Layer.effect(
  ScrapeAuth,
  Effect.gen(function* () {
    const context = yield* Effect.context<AdminToken | Store>()
    return ScrapeAuth.of({
      bearer: (httpEffect, { credential }) =>
        Effect.gen(function* () {
          const token = Redacted.value(credential)
          if (token === "") return yield* unauthorized("missing bearer token")
          const scrape = (yield* AdminToken).metricsTokenHash
          if (scrape !== null && sameHash(hashToken(token), scrape)) return yield* httpEffect
          if ((yield* principalOf(token)) === null) return yield* unauthorized("invalid bearer token")
          return yield* httpEffect
        }).pipe(Effect.provideContext(context)),
    })
  }),
)

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
