/**
 * Errors as HTTP answers: one answer per store error (see the store's Errors.ts), and the
 * request decode failures as `400 {error, field, rule, in}` with the field as a dotted path.
 */
import { BadRequest, ConflictError, InputErrors, NotFoundError, ServiceUnavailable, StrictJson } from "@engram/api"
import type { StoreError, Unavailable } from "@engram/store"
import { Effect, Option } from "effect"
import { HttpServerRequest, HttpServerResponse } from "effect/http"
import { HttpApiMiddleware } from "effect/http-api"
import { Metrics } from "./Metrics.js"
import { agentCallMsOf } from "./AgentBound.js"
import { Stalls, stalledAnswer, stalledForEveryReplica } from "./Stalls.js"

/** What a store error becomes over HTTP. */
export type StoreAnswer = BadRequest | NotFoundError | ConflictError | ServiceUnavailable

/** The 503's `error` when the store refuses writes (by `Unavailable`'s `kind`), in the API's answers and in readiness. */
export const writesRefusedError = { disk_full: "DiskFull", read_only: "ReadOnly" } as const

/** One HTTP answer per store error. */
export const toApiError = (e: StoreError): StoreAnswer => {
  switch (e._tag) {
    case "InvalidInput":
      return new BadRequest({ error: "InvalidInput", field: e.field, rule: e.rule })
    case "NotFound":
      return new NotFoundError({ error: "NotFound", entity: e.entity, id: e.id, message: e.message })
    case "Conflict":
      return new ConflictError({ error: "Conflict", message: e.message, entity: e.entity, id: e.id, ...(e.state === undefined ? {} : { state: e.state }) })
    case "IllegalTransition":
      return new ConflictError({ error: "IllegalTransition", message: e.reason, id: e.sessionId, from: e.from, to: e.to })
    case "Refused":
      return new ConflictError({ error: "Refused", message: e.reason, check: e.check })
    case "NoRoom":
      return new ConflictError({ error: "NoRoom", message: e.message, id: e.sessionId, noFit: e.noFit, tooBig: e.tooBig })
    case "Unavailable":
      return e.kind === "disk_full"
        ? new ServiceUnavailable({ error: writesRefusedError.disk_full, message: `${e.message}. Nothing was changed; free room on the store's disk (ENGRAM_DATA_DIR)`, retryAfterMs: e.retryAfterMs })
        : e.kind === "read_only"
          ? new ServiceUnavailable({ error: writesRefusedError.read_only, message: `${e.message}. Nothing was changed; the database refuses writes (a standby after a failover, or default_transaction_read_only): point ENGRAM_DATABASE_URL at the primary`, retryAfterMs: e.retryAfterMs })
          : new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs })
  }
}

/**
 * An agent's call (it states its bound, `engram-agent-call-timeout-ms`: `AgentBound.agentCallMsOf`) whose store call timed out
 * (`ENGRAM_STORE_TIMEOUT_MS`): `503 StoreStalled` when the database is stalled for every replica
 * (`Stalls.stalledForEveryReplica`: the agent stays on its replica), else null (the `503
 * Unavailable` as for anyone: the agent moves). Every replica's agents bounced between replicas
 * that all waited on one lock when the store's bound came before theirs (the defaults: the
 * store 15 s, an agent 30 s). The diagnosis is shared (`Stalls`): read while the call still
 * waited, 2 s before its bound.
 */
const stalledForAgent = (e: Unavailable): Effect.Effect<ServiceUnavailable | null, never, Stalls> =>
  Effect.gen(function* () {
    if (e.kind !== "timed_out") return null
    const request = yield* Effect.serviceOption(HttpServerRequest.HttpServerRequest)
    if (Option.isNone(request) || agentCallMsOf(request.value.headers) === null) return null
    const d = yield* (yield* Stalls).diagnose
    return stalledForEveryReplica(d) ? stalledAnswer(`is stalled: ${e.reason}`, d, e.retryAfterMs) : null
  })

/** Runs a store call and maps its errors to HTTP answers (a 503 is counted). */
export const api = <A, E extends StoreError, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, StoreAnswer, R | Metrics | Stalls> =>
  eff.pipe(
    Effect.catch((e: E) =>
      Effect.gen(function* () {
        if (e._tag === "Unavailable") {
          ;(yield* Metrics).storeUnavailable.inc()
          const stalled = yield* stalledForAgent(e)
          if (stalled !== null) return yield* Effect.fail(stalled)
        }
        return yield* Effect.fail(toApiError(e))
      }),
    ),
  )

/** A 400 naming the field and the rule. */
export const badRequest = (field: string, rule: string) => new BadRequest({ error: "InvalidInput", field, rule })

/** A key as a 400 names it (`@engram/api`'s `StrictJson.keyName`). */
export const keyName = StrictJson.keyName

/**
 * `400 {error, field, rule, in}` for every request that fails its schema; an unknown key (in a
 * body or the query: the API refuses excess properties, as its description's
 * `additionalProperties: false` says) is named with the keys that are known.
 */
export const InputErrorsLive = HttpApiMiddleware.layerSchemaErrorTransform(InputErrors, (error) => {
  if (error.kind === "ResponseHeaders" || error.kind === "Body") {
    return Effect.succeed(HttpServerResponse.jsonUnsafe({ error: "Internal", message: "the answer could not be encoded" }, { status: 500 }))
  }
  const where: StrictJson.InputLocation = error.kind === "Payload" ? "body" : error.kind === "Query" ? "query" : error.kind === "Params" ? "path" : "headers"
  return Effect.succeed(HttpServerResponse.jsonUnsafe({ error: "InvalidInput", ...StrictJson.issueProblem(error.cause.issue, where) }, { status: 400 }))
})
