/**
 * Credentials: the admin token, the hosts' own tokens and the metrics scrape token. Tokens are
 * 32 random bytes (base64url); only their SHA-256 is kept (the store holds the hosts'). A
 * presented token is hashed; the admin's and the scrape token's hashes are compared with
 * `timingSafeEqual`, and a host is found by `Store.hostByTokenHash`, kept in memory until a
 * notice of its credential (`Credentials`); a token that found no host (revoked, or never
 * issued) is kept too, for a while, so that repeating it costs no store read. Tokens never
 * reach a log line. This module
 * implements the API's security middlewares (`BearerAuth`, `AdminOnly`, `ScrapeAuth`), the
 * per-resource check `requireHostOrAdmin`, and the revocation of a credential's open requests.
 */
import { AdminOnly, BearerAuth, CurrentPrincipal, Forbidden, ScrapeAuth, ServiceUnavailable, Unauthorized } from "@engram/api"
import type { Principal } from "@engram/api"
import { Changes, Store } from "@engram/store"
import type { Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer, Redacted } from "effect"
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { HttpServerRequest } from "effect/http"
import { credentialTopic } from "./Notifier.js"
import * as Parking from "./Parking.js"
import { addTo, removeFrom } from "./SetsByKey.js"

/** A new random token: 32 bytes, base64url. */
export const newToken = (): string => randomBytes(32).toString("base64url")

/** The SHA-256 of a token, hex. */
export const hashToken = (token: string): string => createHash("sha256").update(token, "utf8").digest("hex")

/**
 * The admin token's fingerprint kept with the lease in PostgreSQL, so replicas can tell they
 * were given different tokens: a SHA-256 apart from `hashToken` (domain-separated), so what the
 * database holds is not the hash the admin is authenticated by.
 */
export const adminTokenFingerprint = (token: string): string =>
  createHash("sha256").update("engram admin token fingerprint\0", "utf8").update(token, "utf8").digest("hex")

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
    /** The token's fingerprint kept with the lease (`adminTokenFingerprint`), computed once. */
    readonly fingerprint: string
    /** The SHA-256 of `ENGRAM_METRICS_TOKEN`; null when none is set. */
    readonly metricsTokenHash: string | null
  }
>()("@engram/coordinator/AdminToken") {}

const unauthorized = (message: string) => new Unauthorized({ error: "Unauthorized", message })

/** A request's credential: who it is, and the SHA-256 of its token (never the token). */
export interface Credential {
  readonly tokenHash: string
  readonly principal: Principal
  /**
   * `Credentials.notices()` when the request's authentication began: a long-poll admitted after
   * more credential notices (a rotation or removal may have come between) checks its credential
   * again before it waits (`LongPolls`).
   */
  readonly noticesAt: number
}

/** The credential of the current request, provided by `BearerAuth` (read with `Effect.serviceOption`). */
export class CurrentCredential extends Context.Service<CurrentCredential, Credential>()("@engram/coordinator/CurrentCredential") {}

export interface CredentialsShape {
  /** Who holds the token of this hash: the admin, a host, or nobody (null). */
  readonly principalOf: (tokenHash: string) => Effect.Effect<Principal | null, ServiceUnavailable>
  /**
   * Which of `held` (host credentials: a token's hash and the host it acts for) still act, as the
   * set of their hashes: what `principalOf` of each would answer, in one store read
   * (`Store.hostTokenHashes`) of the hosts whose credential the copy does not hold, kept by the
   * copy as `principalOf` keeps what it reads. The caller bounds how many hosts one call holds
   * (the sweep after a possible miss asks 500 a call). Absent when the store has no such read:
   * the caller asks `principalOf` of each token.
   */
  readonly actingHosts?: ((held: readonly HeldHost[]) => Effect.Effect<ReadonlySet<string>, ServiceUnavailable>) | undefined
  /** How many host credentials are kept in memory. */
  readonly cached: () => number
  /** How many tokens that found no host (their hashes) are kept in memory, answered 401 without a read. */
  readonly unknownCached: () => number
  /** How many credential notices (and possible misses) this replica has heard so far. */
  readonly notices: () => number
}

/** A host credential to check (`Credentials.actingHosts`): the SHA-256 of its token and the host it acts for. */
export interface HeldHost {
  readonly tokenHash: string
  readonly hostId: string
}

/** The most host credentials kept in memory (the oldest go first beyond it). */
export const maxCachedCredentials = 100_000

/**
 * The most tokens that found no host kept in memory (the oldest go first beyond it): revoked
 * tokens of decommissioned agents that keep calling, and garbage bearers repeated.
 */
export const maxUnknownCredentials = 10_000

/**
 * How long a token that found no host is refused without a store read (ms, on the Effect
 * clock): each such token costs at most one read per this time on each replica. Past it the
 * token is read again. Any credential notice (a host registered, a token rotated, a host
 * removed) drops every such entry at once, so a token is never refused by memory after its
 * issuance was heard; the time bounds what a notice never heard could leave.
 */
export const unknownCredentialTtlMs = 60_000

/**
 * The credentials of this coordinator. A host is found by its token's hash in the store
 * (`Store.hostByTokenHash`) and kept in memory until a notice of its credential (a rotation, a
 * removal: `credential:<hostId>`, through any replica) or a possible miss drops it, so an agent's
 * requests cost no store read for their credential. A token that finds no host is kept as
 * unknown (at most `maxUnknownCredentials`, each for `unknownCredentialTtlMs`) until then too, or
 * until any credential notice: a registration and a rotation send one, so a token issued anywhere
 * authenticates at once even if its hash was kept as unknown. The copies are used only while the
 * backend's notices are live; a lookup that a credential notice overtook is not kept.
 */
export class Credentials extends Context.Service<Credentials, CredentialsShape>()("@engram/coordinator/Credentials") {
  static readonly layer: Layer.Layer<Credentials, never, AdminToken | Store | Changes> = Layer.effect(
    Credentials,
    Effect.gen(function* () {
      const admin = yield* AdminToken
      const store = yield* Store
      const changes = yield* Changes
      const hosts = new Map<string, string>()
      const hashesOf = new Map<string, Set<string>>()
      // Hashes of tokens that found no host, to the time (Effect clock, ms) they are read again.
      // Oldest first (insertion order): the one dropped beyond the cap.
      const unknown = new Map<string, number>()
      // Bumped by every credential notice: a lookup that began before one is not kept.
      let epoch = 0
      const forget = (hash: string) => {
        const hostId = hosts.get(hash)
        if (hostId === undefined) return
        hosts.delete(hash)
        removeFrom(hashesOf, hostId, hash)
      }
      yield* changes.subscribe({
        changed: (topics) => {
          for (const t of topics) {
            if (!t.startsWith(credentialPrefix)) continue
            epoch++
            for (const hash of hashesOf.get(t.slice(credentialPrefix.length)) ?? []) forget(hash)
            // A credential was issued or revoked: which hash was issued the notice does not say.
            unknown.clear()
          }
        },
        missed: () => {
          epoch++
          hosts.clear()
          hashesOf.clear()
          unknown.clear()
        },
      })
      const keep = (hash: string, hostId: string) => {
        if (hosts.size >= maxCachedCredentials) {
          const oldest = hosts.keys().next()
          if (oldest.done !== true) forget(oldest.value)
        }
        hosts.set(hash, hostId)
        addTo(hashesOf, hostId, hash)
        unknown.delete(hash)
      }
      const keepUnknown = (hash: string, nowMs: number) => {
        unknown.delete(hash)
        if (unknown.size >= maxUnknownCredentials) {
          const oldest = unknown.keys().next()
          if (oldest.done !== true) unknown.delete(oldest.value)
        }
        unknown.set(hash, nowMs + unknownCredentialTtlMs)
      }
      /** Whether `hash` is kept as finding no host at `nowMs` (an entry past its time goes). */
      const knownUnknown = (hash: string, nowMs: number) => {
        const until = unknown.get(hash)
        if (until === undefined) return false
        if (until > nowMs) return true
        unknown.delete(hash)
        return false
      }

      /**
       * Whether a store read begun at `began` (with notices `live` then) may be kept: no credential
       * notice (or miss) came while it was read, so it cannot undo a rotation heard meanwhile.
       */
      const keepable = (live: boolean, began: number) => live && began === epoch && changes.live()

      const principalOf: CredentialsShape["principalOf"] = (hash) =>
        Effect.suspend(() => {
          // The admin token is a secret we compare against: constant time.
          if (sameHash(hash, admin.tokenHash)) return Effect.succeed<Principal | null>({ _tag: "Admin" })
          const live = changes.live()
          const known = live ? hosts.get(hash) : undefined
          if (known !== undefined) return Effect.succeed<Principal | null>({ _tag: "Host", hostId: known })
          // A host is found by an indexed equality lookup on the SHA-256 of the presented token (and
          // in the copies by a Map's), which is not constant-time. That leaks nothing useful: its
          // timing could at most reveal part of a stored *hash*, and a hash does not authenticate.
          // Only the token does, and getting it back from its hash means a SHA-256 preimage of 32
          // random bytes.
          return Effect.flatMap(Clock.currentTimeMillis, (nowMs) => {
            if (live && knownUnknown(hash, nowMs)) return Effect.succeed<Principal | null>(null)
            const began = epoch
            return store.hostByTokenHash(hash).pipe(
              Effect.map((host): Principal | null => {
                const keepIt = keepable(live, began)
                if (host === null) {
                  if (keepIt) keepUnknown(hash, nowMs)
                  return null
                }
                if (keepIt) keep(hash, host.id)
                return { _tag: "Host", hostId: host.id }
              }),
              Effect.catchTag("Unavailable", unavailable),
            )
          })
        })

      const readHashes = store.hostTokenHashes
      const actingHosts: CredentialsShape["actingHosts"] =
        readHashes === undefined
          ? undefined
          : (held) =>
              Effect.flatMap(Clock.currentTimeMillis, (nowMs) => {
                const live = changes.live()
                const acting = new Set<string>()
                const unread: HeldHost[] = []
                for (const h of held) {
                  const known = live ? hosts.get(h.tokenHash) : undefined
                  if (known !== undefined) {
                    if (known === h.hostId) acting.add(h.tokenHash)
                  } else if (!(live && knownUnknown(h.tokenHash, nowMs))) unread.push(h)
                }
                if (unread.length === 0) return Effect.succeed(acting)
                const began = epoch
                return readHashes([...new Set(unread.map((h) => h.hostId))]).pipe(
                  Effect.map((now) => {
                    const keepIt = keepable(live, began)
                    for (const h of unread) {
                      if (now.get(h.hostId) === h.tokenHash) {
                        acting.add(h.tokenHash)
                        if (keepIt) keep(h.tokenHash, h.hostId)
                        // A revoked token: the host it acted for holds another hash, and no other host
                        // holds this one (a hash is issued once, `Store.registerHost`), so it finds no
                        // host: a sweep tried again, or the token's next request, reads it no more.
                      } else if (keepIt) keepUnknown(h.tokenHash, nowMs)
                    }
                    return acting
                  }),
                  Effect.catchTag("Unavailable", unavailable),
                )
              })

      return Credentials.of({ principalOf, ...(actingHosts === undefined ? {} : { actingHosts }), cached: () => hosts.size, unknownCached: () => unknown.size, notices: () => epoch })
    }),
  )
}

const credentialPrefix = credentialTopic("")

const unavailable = (e: Unavailable) => Effect.fail(new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs }))

/** The bearer token of a request, hashed; the empty token when there is none. */
const bearerHash = (credential: Redacted.Redacted<string>): string | null => {
  const token = Redacted.value(credential)
  return token === "" ? null : hashToken(token)
}

/** `BearerAuth`: the admin's or a host's token, else 401. (Every request but the open ones passes here: no generator.) */
export const BearerAuthLive: Layer.Layer<BearerAuth, never, Credentials> = Layer.effect(
  BearerAuth,
  Effect.gen(function* () {
    const credentials = yield* Credentials
    return BearerAuth.of({
      bearer: (httpEffect, { credential }) => {
        type Out<E> = Effect.Effect<Effect.Success<typeof httpEffect>, Effect.Error<typeof httpEffect> | E, Exclude<Effect.Services<typeof httpEffect>, CurrentPrincipal>>
        // The principal and credential added to the request's context in one step (as provideService does, without its second copy).
        const as = (held: Credential) =>
          Effect.updateContext(httpEffect, (context) => Context.add(Context.add(context, CurrentPrincipal, held.principal), CurrentCredential, held)) as Out<never>
        return Effect.withFiber((fiber): Out<Unauthorized | ServiceUnavailable> => {
          const hash = bearerHash(credential)
          if (hash === null) return Effect.fail(unauthorized("missing bearer token"))
          // A parked long-poll's route run again (`Parking`): the credential it was admitted with.
          const request = Context.getOrUndefined(fiber.context, HttpServerRequest.HttpServerRequest)
          const parked = request === undefined ? undefined : (Parking.admittedOf(request) as Credential | null | undefined)
          if (parked != null && parked.tokenHash === hash) return as(parked)
          const noticesAt = credentials.notices()
          return Effect.flatMap(credentials.principalOf(hash), (principal): Out<Unauthorized> =>
            principal === null ? Effect.fail(unauthorized("invalid bearer token")) : as({ tokenHash: hash, principal, noticesAt }),
          )
        })
      },
    })
  }),
)

/** `AdminOnly`: a host token gets 403 before the handler runs. */
export const AdminOnlyLive: Layer.Layer<AdminOnly> = Layer.succeed(
  AdminOnly,
  AdminOnly.of((httpEffect) =>
    Effect.flatMap(
      Effect.service(CurrentPrincipal),
      (p): Effect.Effect<Effect.Success<typeof httpEffect>, Effect.Error<typeof httpEffect> | Forbidden, Effect.Services<typeof httpEffect>> =>
        p._tag === "Admin" ? httpEffect : Effect.fail(new Forbidden({ error: "Forbidden", message: "this operation needs the admin token" })),
    ),
  ),
)

/** `ScrapeAuth`: the scrape token (constant-time), or any token `BearerAuth` takes. */
export const ScrapeAuthLive: Layer.Layer<ScrapeAuth, never, AdminToken | Credentials> = Layer.effect(
  ScrapeAuth,
  Effect.gen(function* () {
    const admin = yield* AdminToken
    const credentials = yield* Credentials
    return ScrapeAuth.of({
      bearer: (httpEffect, { credential }) =>
        Effect.gen(function* () {
          const hash = bearerHash(credential)
          if (hash === null) return yield* unauthorized("missing bearer token")
          if (admin.metricsTokenHash !== null && sameHash(hash, admin.metricsTokenHash)) return yield* httpEffect
          if ((yield* credentials.principalOf(hash)) === null) return yield* unauthorized("invalid bearer token")
          return yield* httpEffect
        }),
    })
  }),
)

/**
 * A list filtered by `?hostId=`: the admin lists anything, a host token only its own host's
 * (`what`: sessions, moves), with 403 otherwise.
 */
export const requireOwnHostList = (hostId: string | undefined, what: string): Effect.Effect<void, Forbidden, CurrentPrincipal> =>
  Effect.flatMap(Effect.service(CurrentPrincipal), (p) =>
    p._tag === "Host" && hostId !== p.hostId
      ? Effect.fail(new Forbidden({ error: "Forbidden", message: `a host token lists only its own host's ${what} (?hostId=${p.hostId})` }))
      : Effect.void,
  )

/**
 * The admin, or the agent of one of `hostIds` (a session's host, a move's source…). A host
 * token for any other host is refused with 403.
 */
export const requireHostOrAdmin = (...hostIds: readonly (string | null)[]): Effect.Effect<void, Forbidden, CurrentPrincipal> =>
  Effect.flatMap(Effect.service(CurrentPrincipal), (p) =>
    p._tag === "Admin" || hostIds.includes(p.hostId)
      ? Effect.void
      : Effect.fail(new Forbidden({ error: "Forbidden", message: `the token of host ${p.hostId} does not act for this resource` })),
  )
