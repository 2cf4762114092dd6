/**
 * Long-polls that hold no fiber while they wait. An agent's assignments long-poll waits 20–30 s,
 * and at 10,000 agents every object an open poll holds is copied by the young generation's
 * collector (once within it, once into the old): a request's fiber parked inside the API builder
 * holds its frames, continuations and generators and two copies of the request's context. A
 * parking handler instead files its poll's state here (a plain object: `ParkedPoll`) and answers
 * `parked`; the edge (`HttpEdge`), which holds the request at its outermost frame, waits until the
 * poll is woken, then runs the route again (its middlewares, its input, its handler), whose
 * handler finds its poll here and carries on from where it parked. If the request ends otherwise
 * first (the client left, the route answered without taking its poll back), the edge abandons the
 * poll: it releases what it held.
 */
import { Context, Effect } from "effect"
import { HttpServerResponse } from "effect/http"

/** What a handler answers when its poll parked: the edge holds the request, then runs the route again. Never sent. */
export const parked: HttpServerResponse.HttpServerResponse = HttpServerResponse.empty({ status: 204 })

/** A parked poll, as the edge sees it. */
export interface Park {
  /** Set by the edge while it holds the request: called once, when the poll should carry on. */
  wake: (() => void) | null
  /** Whether the poll should carry on already (woken before the edge held the request). */
  readonly due: boolean
  /** Releases what the poll holds (its watch, its place among the open polls). */
  readonly abandon: () => void
  /**
   * The credential the poll was admitted with (`Auth.Credential`), or null: the route run again
   * is authenticated by it (`BearerAuth`), as the poll was, not afresh (a revocation meanwhile
   * is the poll's to answer, by `LongPolls`' rules; a second read of the credential per poll
   * would also cost the store a read for each poll woken after a miss of notices).
   */
  readonly admitted: { readonly tokenHash: string } | null
}

/** The parked polls, by request (`HttpServerRequest`): at most one each. */
const parks = new WeakMap<object, Park>()

/** Files `park` for `request` (the handler, as it answers `parked`). */
export const file = (request: object, park: Park): void => {
  parks.set(request, park)
}

/** The poll `request` parked, taken back (the handler, when the route runs again), or undefined. */
export const take = (request: object): Park | undefined => {
  const p = parks.get(request)
  if (p !== undefined) parks.delete(request)
  return p
}

/** The credential the poll `request` parked was admitted with (see `Park.admitted`), or undefined. */
export const admittedOf = (request: object): { readonly tokenHash: string } | null | undefined => parks.get(request)?.admitted

/** Abandons the poll `request` parked, if it is still filed. */
export const drop = (request: object): void => take(request)?.abandon()

/**
 * Waits until the poll `request` parked is woken (at once when it already was); interrupted (the
 * client left), the poll is abandoned. A route that answered `parked` without filing a poll is a
 * defect.
 */
export const wake = (request: object): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const p = parks.get(request)
    if (p === undefined) return resume(Effect.die(new Error("a route answered `parked` without filing its poll")))
    if (p.due) return resume(Effect.void)
    p.wake = () => resume(Effect.void)
    return Effect.sync(() => drop(request))
  })

/** Marks a run of a route that may park (`hold`): a context of its own. */
class Aside extends Context.Service<Aside, true>()("@engram/coordinator/Parking/Aside") {}

/** Whether the current request is held by the edge (`hold`), so its route may answer `parked`. */
export const isHeld: Effect.Effect<boolean> = Effect.map(Effect.serviceOption(Aside), (held) => held._tag === "Some")

/**
 * The context a route runs in while its request is held: the request's, with one service added
 * (a new context over the same services). The API builder flattens the context it runs in into a
 * `Map` of every service, kept with that context: the held request's own would keep it while the
 * poll waits; this one is dropped when the run ends.
 */
const aside = <R>(context: Context.Context<R>): Context.Context<R> => Context.add(context, Aside, true)

/**
 * Runs the route `app` for `request` until it answers something other than `parked`: after each
 * `parked`, waits for the poll's wake-up and runs it again. A poll still filed when a run ends
 * otherwise (an answer, a failure, an interruption) is abandoned.
 */
export const hold = <E, R>(request: object, app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R> =>
  Effect.flatMap(
    Effect.onExit(Effect.updateContext(app, aside), (exit) => (exit._tag === "Success" && exit.value === parked ? Effect.void : Effect.sync(() => drop(request)))),
    // The wait interruptible whatever the route's run left (the client leaving ends it, as it ended the poll's fiber before).
    // Its cleanup (`drop`) registered before the wait turns interruptible: a client that left
    // while the route answered `parked` interrupts the wait before `wake` runs (its own cleanup
    // never registered), and the poll would stay filed, its ticket and watch held for good.
    (response) =>
      response === parked
        ? Effect.andThen(
            Effect.onExit(Effect.interruptible(wake(request)), (exit) => (exit._tag === "Failure" ? Effect.sync(() => drop(request)) : Effect.void)),
            hold(request, app),
          )
        : Effect.succeed(response),
  )
