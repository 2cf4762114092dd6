/**
 * An agent's heartbeat and report answered within the agent's own bound, and a stalled database
 * told from a replica cut off from it. An agent gives up on a call after its heartbeat interval
 * (1-30 s; 30 s at the defaults) and moves to the next replica on a timeout or a 503
 * `Unavailable`; a database that stalls (a lock held) reached agents as replicas that hang or
 * fail, and each bounced between replicas that all wait on the same database. The agent states
 * its bound (`engram-agent-call-timeout-ms`); when it is shorter than the store's bound
 * (`ENGRAM_STORE_TIMEOUT_MS`) plus the time to say why, the route's work is bounded below it;
 * past that bound this replica reads what the database waits on (`Stalls`): a database that
 * answers that read, with this replica's statements running on it, is stalled for every replica,
 * answered `503 StoreStalled` (the agent stays); otherwise it is this replica's problem as far as
 * it can tell, answered `503 Unavailable` (the agent moves). Past the store's own bound, when it
 * comes first (the defaults), any call of an agent is answered the same way (`HttpErrors.api`).
 */
import { Errors as ApiErrors } from "@engram/api"
import { Blockers } from "@engram/store-pg"
import { Context, Effect, Option } from "effect"
import { HttpServerRequest } from "effect/http"
import { Metrics } from "./Metrics.js"
import { Settings } from "./Settings.js"
import { Stalls, stalledAnswer, stalledForEveryReplica } from "./Stalls.js"
import { bounded, retryAfterMs, timedOut } from "./StoreBound.js"

/** What the route keeps of the agent's bound to say why it did not answer: the diagnosis's bound and a margin for the answer's trip, ms. */
export const answerMarginMs = Blockers.defaultBoundMs + 500

/** The least bound of a route's work, ms: an agent's bound too short to leave it is served with the store's bound alone. */
export const minRouteBoundMs = 500

/**
 * The bound of a host route's work for an agent that waits `agentCallMs`: its bound less
 * `answerMarginMs`, or null when that is not shorter than the store's own bound (or too short to
 * do anything: under `minRouteBoundMs`).
 */
export const routeBoundMs = (agentCallMs: number, storeTimeoutMs: number): number | null => {
  const ms = agentCallMs - answerMarginMs
  return ms >= storeTimeoutMs || ms < minRouteBoundMs ? null : ms
}

/** The agent's stated bound from its request header, ms, or null (absent, not a positive integer). */
export const agentCallMsOf = (headers: Readonly<Record<string, string | undefined>>): number | null => {
  const text = headers[ApiErrors.agentCallTimeoutHeader]
  if (text === undefined || !/^\d{1,9}$/.test(text.trim())) return null
  const ms = Number(text.trim())
  return ms > 0 ? ms : null
}

/** Bounds a host route's `work` by the agent's stated bound (see the module). */
export type AgentBound = <A, E, R>(work: Effect.Effect<A, E, R>, name: string) => Effect.Effect<A, E | ApiErrors.ServiceUnavailable, R>

/**
 * The bound of the host routes, built where the coordinator's services are (the handlers close
 * over it): `work` (the route `name`'s) within the bound the agent stated, if any and shorter
 * than the store's; past it, `503 StoreStalled` when the database answers this replica's read
 * of what it waits on, else `503 Unavailable`.
 */
export const make: Effect.Effect<AgentBound, never, Settings | Stalls | Metrics> = Effect.gen(function* () {
  const settings = yield* Settings
  const stalls = yield* Stalls
  const metrics = yield* Metrics
  const pastRouteBound = (name: string, ms: number, agentCallMs: number): Effect.Effect<never, ApiErrors.ServiceUnavailable> =>
    Effect.gen(function* () {
      metrics.storeUnavailable.inc()
      yield* stalls.timedOut(name)
      const d = yield* stalls.diagnose
      const within = `within ${ms} ms (the agent's ${agentCallMs} ms bound, ${ApiErrors.agentCallTimeoutHeader}, less ${answerMarginMs} ms to say why)`
      return yield* Effect.fail(
        stalledForEveryReplica(d)
          ? stalledAnswer(`did not complete ${name} ${within}`, d, retryAfterMs)
          : new ApiErrors.ServiceUnavailable({
              error: "Unavailable",
              message: `the database did not answer ${name} ${within}${d === null ? "" : `; ${Blockers.describe(d)}`}`,
              retryAfterMs,
            }),
      )
    })
  return <A, E, R>(work: Effect.Effect<A, E, R>, name: string): Effect.Effect<A, E | ApiErrors.ServiceUnavailable, R> =>
    Effect.withFiber<A, E | ApiErrors.ServiceUnavailable, R>((fiber) => {
      const request = Context.getOption(fiber.context, HttpServerRequest.HttpServerRequest)
      const agentCallMs = Option.isSome(request) ? agentCallMsOf(request.value.headers) : null
      const ms = agentCallMs === null ? null : routeBoundMs(agentCallMs, settings.config.storeTimeoutMs)
      if (agentCallMs === null || ms === null) return work
      // The failure of the route's own bound, told apart from any other by identity.
      let fired: unknown = null
      const mark = (boundMs: number, op: string) => {
        const e = timedOut(boundMs, op)
        fired = e
        return e
      }
      return bounded(work, ms, name, mark).pipe(
        Effect.catch((e): Effect.Effect<never, E | ApiErrors.ServiceUnavailable> => (e === fired ? pastRouteBound(name, ms, agentCallMs) : Effect.fail(e as E | ApiErrors.ServiceUnavailable))),
      )
    })
})
