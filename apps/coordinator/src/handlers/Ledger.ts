/** `/v1/reservations…` and `/v1/ledger…`: the reservation ledger. */
import { EngramApi } from "@engram/api"
import { nowOf, Store, Validate } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { randomUUID } from "node:crypto"
import { requireHostOrAdmin } from "../Auth.js"
import * as HandlerGroup from "../HandlerGroup.js"
import { api } from "../HttpErrors.js"
import { fleetTopic, hostTopic, Notifier, withNotices } from "../Notifier.js"
import { Drainer } from "../Drainer.js"
import { pageJson } from "../Views.js"

export const LedgerHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const drainer = yield* Drainer
    const notifier = yield* Notifier
    return HttpApiBuilder.group(EngramApi, "ledger", (h) =>
      h
        .handle("reserve", ({ payload }) => {
          const reserve = Effect.gen(function* () {
            const bad = Validate.expiresIn(payload)
            if (bad !== null) return yield* bad
            // An expiry from now (`expiresInMs`) is taken on the store's time, not the client's clock.
            const { expiresInMs, ...asked } = payload
            const expiresAt = expiresInMs === undefined ? asked.expiresAt : (yield* nowOf(store)) + expiresInMs
            return yield* store.reserve({ ...asked, ...(expiresAt === undefined ? {} : { expiresAt }), id: payload.id ?? randomUUID() })
          })
          return withNotices(api(reserve).pipe(Effect.tap(() => notifier.notify(fleetTopic))))
        })
        .handle("list", ({ query }) =>
          api(store.pageReservations({ hostId: query.hostId }, { limit: query.limit, cursor: query.cursor })).pipe(Effect.map((page) => pageJson(page, (r) => r))),
        )
        .handle("get", ({ params }) => api(store.getReservation(params.id)))
        .handle("release", ({ params }) => withNotices(api(store.release(params.id)).pipe(Effect.tap((r) => drainer.roomAppeared(hostTopic(r.hostId))))))
        .handle("heartbeat", ({ params }) =>
          api(store.getReservation(params.id)).pipe(
            Effect.tap((r) => requireHostOrAdmin(r.hostId)),
            Effect.andThen(api(store.heartbeat(params.id))),
          ),
        )
        .handle("summary", () => api(store.clusterSummary()))
        .handle("metrics", () => api(store.metrics()))
    )
  }),
)
