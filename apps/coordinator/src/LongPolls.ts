/**
 * What every long-poll (an agent's assignments, a wait for a session's state) goes through:
 * the caps on how many are open at once, per credential and in total (beyond them, 429 with
 * `Retry-After`: a host's agent needs one or two, a runaway client would otherwise hold memory
 * and sockets without bound), and revocation (a host token rotated or removed through any
 * replica ends its open long-polls with 401 at once).
 */
import { TooManyRequests } from "@engram/api"
import type { Unauthorized } from "@engram/api"
import { Context, Effect, Layer } from "effect"
import type { Credential } from "./Auth.js"
import { Credentials, CurrentCredential } from "./Auth.js"
import { Settings } from "./Settings.js"

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
  static readonly layer: Layer.Layer<LongPolls, never, Settings | Credentials> = Layer.effect(
    LongPolls,
    Effect.gen(function* () {
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

      const run: LongPollsShape["run"] = (wait) =>
        Effect.flatMap(Effect.serviceOption(CurrentCredential), (credential) =>
          credential._tag === "None"
            ? wait
            : Effect.scoped(Effect.andThen(admit(credential.value), Effect.raceFirst(wait, credentials.revoked(credential.value)))),
        )
      return LongPolls.of({ run, open: () => total })
    }),
  )
}
