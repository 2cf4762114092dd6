/**
 * What every long-poll (an agent's assignments, a wait for a session's state) goes through:
 * the caps on how many are open at once, per credential and in total (beyond them, 429 with
 * `Retry-After`: a host's agent needs one or two, a runaway client would otherwise hold memory
 * and sockets without bound), and revocation (a host token rotated or removed through any
 * replica ends its open long-polls with 401 at once).
 */
import { TooManyRequests, Unauthorized } from "@engram/api"
import { Changes } from "@engram/store"
import { Context, Deferred, Effect, Layer } from "effect"
import type { Credential } from "./Auth.js"
import { Credentials, CurrentCredential } from "./Auth.js"
import { credentialTopic } from "./Notifier.js"
import { Settings } from "./Settings.js"
import { addTo, removeFrom } from "./SetsByKey.js"

/** How long a client refused for too many long-polls should wait before it tries again. */
export const retryAfterMs = 1000

/** The caps on open long-polls. */
export interface Caps {
  /** Per host token (an agent holds one; a second covers its restart). */
  readonly perHostToken: number
  /** Per admin token (every tool and service that uses it shares the cap). */
  readonly perAdminToken: number
  /** In total, on this replica. */
  readonly total: number
}

export interface LongPollsShape {
  /**
   * Runs a long-poll of the current request's credential: 429 beyond the caps, 401 as soon as
   * the credential is revoked (the wait is interrupted), else the wait's own answer.
   */
  readonly run: <A, E, R>(wait: Effect.Effect<A, E, R>) => Effect.Effect<A, E | TooManyRequests | Unauthorized, R>
  /** How many long-polls are open now. */
  readonly open: () => number
}

export class LongPolls extends Context.Service<LongPolls, LongPollsShape>()("@engram/coordinator/LongPolls") {
  static readonly layer: Layer.Layer<LongPolls, never, Settings | Credentials | Changes> = Layer.effect(
    LongPolls,
    Effect.gen(function* () {
      const changes = yield* Changes
      const scope = yield* Effect.scope
      const config = (yield* Settings).config
      const caps: Caps = { perHostToken: config.maxWaitsPerHostToken, perAdminToken: config.maxWaitsPerAdminToken, total: config.maxWaits }
      const credentials = yield* Credentials
      const byCredential = new Map<string, number>()
      let total = 0

      const refuse = (limit: number, whose: string) =>
        new TooManyRequests({
          error: "TooManyWaits",
          message: `${whose} already holds ${limit} open long-polls; retry after one answers`,
          retryAfterMs,
          limit,
        })
      const admit = (c: Credential) =>
        Effect.acquireRelease(
          Effect.suspend(() => {
            const limit = c.principal._tag === "Admin" ? caps.perAdminToken : caps.perHostToken
            const held = byCredential.get(c.tokenHash) ?? 0
            if (held >= limit) return Effect.fail(refuse(limit, c.principal._tag === "Admin" ? "the admin token" : `the token of host ${c.principal.hostId}`))
            if (total >= caps.total) return Effect.fail(refuse(caps.total, "this coordinator"))
            byCredential.set(c.tokenHash, held + 1)
            total++
            return Effect.void
          }),
          () =>
            Effect.sync(() => {
              total--
              const held = (byCredential.get(c.tokenHash) ?? 1) - 1
              if (held <= 0) byCredential.delete(c.tokenHash)
              else byCredential.set(c.tokenHash, held)
            }),
        )

      // The open long-polls of host tokens, by host: a credential notice checks each one's token
      // (after the notice dropped the credential's copy) and ends the revoked ones with 401.
      interface Open {
        readonly credential: Credential
        readonly revoked: Deferred.Deferred<never, Unauthorized>
        /** A credential notice of its host came while it was open (set at once, before the check's store read). */
        touched: boolean
      }
      const openByHost = new Map<string, Set<Open>>()
      const revokedError = (hostId: string) => new Unauthorized({ error: "Unauthorized", message: `the token of host ${hostId} was revoked (rotated, or the host removed)` })
      /** Whether `hash` still acts for `hostId` (true while the store is away: the next request is authenticated afresh). */
      const stillActs = (hash: string, hostId: string) =>
        credentials.principalOf(hash).pipe(
          Effect.map((now) => now !== null && now._tag === "Host" && now.hostId === hostId),
          Effect.orElseSucceed(() => true),
        )
      const check = (hostId: string, polls: ReadonlySet<Open>) =>
        Effect.forEach(
          new Map([...polls].map((p) => [p.credential.tokenHash, p])).values(),
          (p) =>
            Effect.map(stillActs(p.credential.tokenHash, hostId), (acts) => {
              if (acts) return
              const revoked = revokedError(hostId)
              for (const q of polls) if (q.credential.tokenHash === p.credential.tokenHash) Deferred.doneUnsafe(q.revoked, Effect.fail(revoked))
            }),
          { discard: true },
        )
      const prefix = credentialTopic("")
      yield* changes.subscribe({
        changed: (topics) => {
          for (const t of topics) {
            if (!t.startsWith(prefix)) continue
            const hostId = t.slice(prefix.length)
            const polls = openByHost.get(hostId)
            // A copy: the polls open now are the ones the notice is about.
            if (polls === undefined) continue
            for (const p of polls) p.touched = true
            Effect.runFork(Effect.forkIn(check(hostId, new Set(polls)), scope))
          }
        },
        // A possible miss is not checked here (every open long-poll would read the store at once):
        // the credentials' copies are dropped, so each poll's next request asks the store.
        missed: () => undefined,
      })
      const revocable = (credential: Credential) =>
        Effect.acquireRelease(
          Effect.sync(() => {
            const p: Open = { credential, revoked: Deferred.makeUnsafe<never, Unauthorized>(), touched: false }
            if (credential.principal._tag !== "Host") return p
            addTo(openByHost, credential.principal.hostId, p)
            return p
          }),
          (p) =>
            Effect.sync(() => {
              if (p.credential.principal._tag === "Host") removeFrom(openByHost, p.credential.principal.hostId, p)
            }),
        )

      const run: LongPollsShape["run"] = (wait) =>
        Effect.flatMap(Effect.serviceOption(CurrentCredential), (credential) => {
          if (credential._tag === "None") return wait
          const c = credential.value
          return Effect.scoped(
            Effect.gen(function* () {
              yield* admit(c)
              if (c.principal._tag !== "Host") return yield* wait
              const hostId = c.principal.hostId
              const p = yield* revocable(c)
              const answer = yield* Effect.exit(Effect.raceFirst(wait, Deferred.await(p.revoked)))
              // The same notice that revoked the credential (a host removed) can wake the wait before
              // the revocation's check has read the store: a poll touched by a credential notice
              // answers (a success or an error) only once its credential is known to still act.
              if (p.touched && !(yield* stillActs(c.tokenHash, hostId))) return yield* Effect.fail(revokedError(hostId))
              return yield* answer
            }),
          )
        })
      return LongPolls.of({ run, open: () => total })
    }),
  )
}
