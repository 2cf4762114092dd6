/**
 * A handlers group whose requests carry a small context. effect's API builder provides the
 * context a group was built in to every request of the group (`Effect.provideContext`: the
 * request's context and the group's copied into a new `Map`, on every request), so a group
 * built where every coordinator service is in reach copies them all per request, and the
 * copies are most of what an idle fleet's requests leave to the collector. A group made here
 * resolves the services it calls once, when it is built (its handlers close over them), and
 * keeps only the API's middlewares, which the builder looks up in it. What a handler reads per
 * request comes from the server's context (`Coordinator.ts` keeps `Metrics` and `Stalls` there
 * for `HttpErrors.api`), and the types hold a handler to that: one that reads another service per
 * request does not compile.
 */
import { AdminOnly, BearerAuth, InputErrors, ScrapeAuth, StrictInput } from "@engram/api"
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"
import type { HttpRouter } from "effect/http"
import type { Metrics } from "./Metrics.js"
import type { Stalls } from "./Stalls.js"

/** What the API builder looks up in a group's context: the middlewares of its endpoints. */
const middlewares = [BearerAuth, AdminOnly, ScrapeAuth, InputErrors, StrictInput] as const

/** What a group may require: its middlewares, and per request (the router's `Request`) `Metrics` and `Stalls` alone. */
export type PerRequest = BearerAuth | AdminOnly | ScrapeAuth | InputErrors | StrictInput | HttpRouter.Request<"Requires", Metrics> | HttpRouter.Request<"Requires", Stalls>

/**
 * The group `make` returns, built in a context of its middlewares alone; `make` runs where the
 * coordinator's services are (its handlers take what they call from there).
 */
export const make = <A, E, R extends PerRequest, E2, R2>(make: Effect.Effect<Layer.Layer<A, E, R>, E2, R2>): Layer.Layer<A, E | E2, R | Exclude<R2, Scope.Scope>> =>
  Layer.unwrap(
    Effect.map(make, (group) =>
      Layer.fromBuild((memoMap, scope) =>
        Effect.updateContext(Layer.buildWithMemoMap(group, memoMap, scope), (context: Context.Context<R>) => Context.pick(...middlewares)(context) as Context.Context<R>),
      ),
    ),
  )
