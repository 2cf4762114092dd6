/**
 * The dashboard (`@engram/dashboard`) on this coordinator: its page under `/ui`, and the
 * questions its routes ask answered here: is this the admin token (the page shows the whole
 * fleet), what version is the fleet at (a hash of one fleet read and the pending moves, so it
 * changes when hosts, reservations, the queue, parks, descents or moves change), and the fleet
 * signal over time (`FleetHistory`).
 */
import { Dashboard } from "@engram/dashboard"
import { Store } from "@engram/store"
import { Effect, Layer } from "effect"
import type { HttpRouter } from "effect/http"
import { createHash } from "node:crypto"
import { AdminToken, hashToken, sameHash } from "./Auth.js"
import { FleetHistory } from "./FleetHistory.js"
import { anyTopic, Notifier } from "./Notifier.js"

/** The dashboard's routes, on this coordinator's store and admin token. */
export const UiLive: Layer.Layer<never, never, HttpRouter.HttpRouter | Store | AdminToken | FleetHistory | Notifier> = Layer.unwrap(
  Effect.gen(function* () {
    const store = yield* Store
    const admin = yield* AdminToken
    const history = yield* FleetHistory
    const notifier = yield* Notifier
    return Dashboard.layer({
      authorize: (token) => Effect.sync(() => sameHash(hashToken(token), admin.tokenHash)),
      history: Effect.map(history.samples, (samples) => ({ intervalMs: history.intervalMs, samples })),
      // Woken by any change notice (through any replica), never by a timer.
      watch: Effect.map(notifier.watch([anyTopic]), (w) => ({ next: (ms: number) => Effect.map(w.next(ms), (why) => why === "changed" || why === "missed") })),
      version: Effect.gen(function* () {
        const fleet = yield* store.fleetView()
        const moves = yield* store.listMoves({ state: "pending" })
        return createHash("sha256")
          .update(JSON.stringify([fleet.hosts, fleet.queue, moves.map((m) => [m.id, m.rounds.length])]))
          .digest("base64url")
          .slice(0, 22)
      }),
    })
  }),
)
