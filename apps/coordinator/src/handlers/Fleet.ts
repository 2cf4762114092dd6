/** `/v1/fleet`, `/v1/queue` and `/v1/placement/no-fit`: core's fleet signal, the queue with its standings, and no-fit details. */
import { EngramApi } from "@engram/api"
import { Fleet, Move, Placement } from "@engram/core"
import { Store, Validate } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import * as HandlerGroup from "../HandlerGroup.js"
import { api, badRequest } from "../HttpErrors.js"
import { ruleNow } from "../Reaper.js"
import { pageJson, sessionDetail } from "../Views.js"

export const FleetHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    // The reaper's gate options: the queue without room is counted as its gate counts it.
    const gate = (yield* ruleNow).options
    return HttpApiBuilder.group(EngramApi, "fleet", (h) =>
      h
        .handle("snapshot", () =>
          Effect.gen(function* () {
            const fleet = yield* api(store.fleetView())
            // Open moves are few (one per moving session): counted from their own list.
            const open = yield* api(store.listMoves({ state: "pending" }))
            return { ...Fleet.snapshot(fleet, store.limits(), fleet.readAt, gate), movesInDoubt: open.filter(Move.inDoubt).length, readAt: fleet.readAt }
          }),
        )
        .handle("queue", ({ query }) =>
          api(store.pageQueue({ limit: query.limit, cursor: query.cursor })).pipe(
            Effect.map((page) => pageJson(page, (e) => sessionDetail(e.session, e.standing))),
          ),
        )
        .handle("noFit", ({ query }) =>
          Effect.gen(function* () {
            const budget = { memMib: query.memMib, vcpus: query.vcpus }
            const bad = Validate.budget(budget)
            if (bad !== null) return yield* badRequest(bad.field, bad.rule)
            const fleet = yield* api(store.fleetView())
            const limits = store.limits()
            // Judged at the read's time: a host whose agent went silent says `silent`.
            const req = { budget, now: fleet.readAt }
            return { fits: Placement.pick(fleet.hosts, req, limits) !== null, hosts: Placement.noFit(fleet.hosts, req, limits) }
          }),
        )
    )
  }),
)
