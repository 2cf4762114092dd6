/**
 * The dashboard (`@engram/dashboard`) on this coordinator: its page under `/ui`, and the
 * questions its routes ask answered here: is this the admin token (the page shows the whole
 * fleet), what version is the fleet at (a hash of one fleet read and the pending moves, so it
 * changes when hosts, reservations, the queue, parks, descents or moves change), and the fleet
 * signal over time (`FleetHistory`). The version is read once per change notice (or possible
 * miss) and shared by every poll that asks before the next: N dashboards cost one fleet read per
 * change, not N. Its `/ui/changes` is a long-poll like the API's
 * (`LongPolls`): counted against the admin token's cap and the replica's total (429 with
 * `Retry-After` beyond, the API's body), and answered at once when the coordinator stops.
 */
import { Errors } from "@engram/api"
import type { TooManyRequests, Unauthorized } from "@engram/api"
import { Dashboard } from "@engram/dashboard"
import { Changes, Store } from "@engram/store"
import type { StoreError } from "@engram/store"
import { Deferred, Effect, Exit, Layer } from "effect"
import { HttpServerResponse } from "effect/http"
import type { HttpRouter } from "effect/http"
import { createHash } from "node:crypto"
import { AdminToken, CurrentCredential, hashToken, sameHash } from "./Auth.js"
import type { Credential } from "./Auth.js"
import { FleetHistory } from "./FleetHistory.js"
import { LongPolls } from "./LongPolls.js"
import { anyTopic, Notifier } from "./Notifier.js"

/** A long-poll's refusal as the API answers it: the same JSON body, `Retry-After` on a 429. */
const refusedPoll = (e: TooManyRequests | Unauthorized): HttpServerResponse.HttpServerResponse =>
  e._tag === "TooManyRequests"
    ? HttpServerResponse.jsonUnsafe(
        { error: e.error, message: e.message, retryAfterMs: e.retryAfterMs, limit: e.limit },
        { status: 429, headers: { "retry-after": String(Errors.retryAfterSeconds(e.retryAfterMs)), "cache-control": "no-store" } },
      )
    : HttpServerResponse.jsonUnsafe({ error: e.error, message: e.message }, { status: 401, headers: { "cache-control": "no-store" } })

/** The dashboard's routes, on this coordinator's store and admin token. */
export const UiLive: Layer.Layer<never, never, HttpRouter.HttpRouter | Store | AdminToken | FleetHistory | Notifier | LongPolls | Changes> = Layer.unwrap(
  Effect.gen(function* () {
    const store = yield* Store
    // The fleet's version is read once per change, whatever the number of dashboards waiting:
    // a read made since the last change notice (or possible miss) answers every poll that asks.
    let generation = 0
    yield* (yield* Changes).subscribe({ changed: () => void generation++, missed: () => void generation++ })
    let current: { readonly generation: number; readonly read: Deferred.Deferred<string, StoreError> } | null = null
    const readVersion = Effect.gen(function* () {
      const fleet = yield* store.fleetView()
      const moves = yield* store.listMoves({ state: "pending" })
      return createHash("sha256")
        .update(JSON.stringify([fleet.hosts, fleet.queue, moves.map((m) => [m.id, m.rounds.length])]))
        .digest("base64url")
        .slice(0, 22)
    })
    const version = Effect.suspend(() => {
      if (current !== null && current.generation === generation) return Deferred.await(current.read)
      const read = Deferred.makeUnsafe<string, StoreError>()
      const mine = { generation, read }
      current = mine
      // A failed read is not kept: the next poll reads again.
      return Effect.onExit(Effect.uninterruptible(readVersion), (exit) =>
        Effect.suspend(() => {
          if (Exit.isFailure(exit) && current === mine) current = null
          return Deferred.done(read, exit)
        }),
      )
    })
    const admin = yield* AdminToken
    const history = yield* FleetHistory
    const notifier = yield* Notifier
    const longPolls = yield* LongPolls
    // The dashboard takes only the admin token (`authorize`): its polls are that credential's.
    const adminCredential: Credential = { tokenHash: admin.tokenHash, principal: { _tag: "Admin" }, noticesAt: 0 }
    return Dashboard.layer({
      authorize: (token) => Effect.sync(() => sameHash(hashToken(token), admin.tokenHash)),
      history: Effect.map(history.samples, (samples) => ({ intervalMs: history.intervalMs, samples })),
      // Woken by any change notice (through any replica), never by a timer.
      watch: Effect.map(notifier.watch([anyTopic]), (w) => ({ next: (ms: number) => Effect.map(w.next(ms), (why) => why === "changed" || why === "missed") })),
      // Its watch opens inside the poll, under the poll's `WaitEnd`: the shutdown's `endAll` ends it.
      longPoll: (poll) =>
        longPolls.run(Effect.exit(poll)).pipe(
          Effect.provideService(CurrentCredential, adminCredential),
          Effect.catchTags({ TooManyRequests: (e) => Effect.succeed(Exit.succeed(refusedPoll(e))), Unauthorized: (e) => Effect.succeed(Exit.succeed(refusedPoll(e))) }),
          Effect.flatMap((exit) => exit),
        ),
      version,
    })
  }),
)
