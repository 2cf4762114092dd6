/**
 * Every error answer of the API, as tagged errors with their status. Bodies are JSON objects
 * with an `error` code and the figures of the case (the classes carry a `_tag` for
 * `Effect.catchTag`; it is not part of the body):
 * 400 `{error, field, rule, in?}`, 401/403 `{error, message}`, 404 `{error, entity, id, message}`,
 * 409 `{error, message, …}`, 413 `{error, message, limitBytes}`, 415 `{error, message, contentType}`,
 * 417 `{error: "ExpectationFailed", message, expect}` (an `Expect` header other than `100-continue`),
 * 429 `{error: "TooManyWaits", message, retryAfterMs, limit}` with a `Retry-After` header (a long-poll
 * beyond its credential's or the coordinator's cap),
 * 431 `{error: "HeadersTooLarge", message, limitBytes}` (the request line and headers over Node's
 * limit), 503 `{error, message, retryAfterMs, …}` with a `Retry-After` header in whole seconds.
 * Every 5xx (a 503, or a 500 `{error: "Internal", message}`) carries `requestId`, also sent as the
 * `x-request-id` header (a proxy's own `x-request-id` is kept) and logged by the coordinator with it.
 */
import { Schema } from "effect"
import { HttpApiSchema } from "effect/http-api"

/**
 * The HTTP status of each error answer, by its class's tag: the classes below are declared
 * with it, and clients read it here rather than keeping a table of their own.
 */
export const statuses = {
  BadRequest: 400,
  Unauthorized: 401,
  Forbidden: 403,
  NotFoundError: 404,
  WaitTimeout: 408,
  ConflictError: 409,
  PayloadTooLarge: 413,
  UnsupportedMediaType: 415,
  TooManyRequests: 429,
  ServiceUnavailable: 503,
} as const

/** Where a bad value was found. */
export const InputLocation = Schema.Literals(["body", "query", "path", "headers"])

/** 400: the input broke a rule; `field` is the path of the value (`affinity.1`), `rule` what it must be. */
export class BadRequest extends Schema.Error<BadRequest>("BadRequest")(
  { error: Schema.String, field: Schema.String, rule: Schema.String, in: Schema.optionalKey(InputLocation) },
  { httpApiStatus: statuses.BadRequest },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "BadRequest" as const
}

/** 401: no bearer token, or one that belongs to nobody. */
export class Unauthorized extends Schema.Error<Unauthorized>("Unauthorized")(
  { error: Schema.String, message: Schema.String },
  { httpApiStatus: statuses.Unauthorized },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "Unauthorized" as const
}

/** 403: a host token used for another host's resources, or for an admin operation. */
export class Forbidden extends Schema.Error<Forbidden>("Forbidden")(
  { error: Schema.String, message: Schema.String },
  { httpApiStatus: statuses.Forbidden },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "Forbidden" as const
}

/** 404: no record with this id (`entity` names the kind: host, session, move, reservation, route). */
export class NotFoundError extends Schema.Error<NotFoundError>("NotFoundError")(
  { error: Schema.String, entity: Schema.String, id: Schema.String, message: Schema.String },
  { httpApiStatus: statuses.NotFoundError },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "NotFoundError" as const
}

/**
 * 409: a conflict, an illegal state transition (`from`, `to`), a ledger refusal (`check`), a
 * create refused for lack of room (`NoRoom`, with `noFit` and `tooBig`), or a wait for a
 * state that can no longer come (`Unreachable`, `from` the state now, `to` the one waited
 * for). Nothing changed.
 */
export class ConflictError extends Schema.Error<ConflictError>("ConflictError")(
  {
    error: Schema.String,
    message: Schema.String,
    entity: Schema.optionalKey(Schema.String),
    id: Schema.optionalKey(Schema.String),
    from: Schema.optionalKey(Schema.String),
    to: Schema.optionalKey(Schema.String),
    /** A repeated create of a session that exists (ended, lost, descended, or asking for another budget or options): the session's state. */
    state: Schema.optionalKey(Schema.String),
    check: Schema.optionalKey(Schema.String),
    noFit: Schema.optionalKey(
      Schema.Array(
        Schema.Struct({ hostId: Schema.String, reason: Schema.String, freeMib: Schema.NullOr(Schema.Finite), freeVcpus: Schema.NullOr(Schema.Finite) }),
      ),
    ),
    tooBig: Schema.optionalKey(Schema.Boolean),
  },
  { httpApiStatus: statuses.ConflictError },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "ConflictError" as const
}

/** 408: a wait for a state ran out of time; `state` is the session's state when it did. */
export class WaitTimeout extends Schema.Error<WaitTimeout>("WaitTimeout")(
  { error: Schema.String, message: Schema.String, state: Schema.String },
  { httpApiStatus: statuses.WaitTimeout },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "WaitTimeout" as const
}

/** 413: the request body is larger than the coordinator accepts (`limitBytes`, `ENGRAM_MAX_BODY_BYTES`). */
export class PayloadTooLarge extends Schema.Error<PayloadTooLarge>("PayloadTooLarge")(
  { error: Schema.String, message: Schema.String, limitBytes: Schema.Finite },
  { httpApiStatus: statuses.PayloadTooLarge },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "PayloadTooLarge" as const
}

/** 415: a body that is not JSON; send `content-type: application/json` (or no content type). */
export class UnsupportedMediaType extends Schema.Error<UnsupportedMediaType>("UnsupportedMediaType")(
  { error: Schema.String, message: Schema.String, contentType: Schema.String },
  { httpApiStatus: statuses.UnsupportedMediaType },
) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "UnsupportedMediaType" as const
}

const tooManyFields = { error: Schema.String, message: Schema.String, retryAfterMs: Schema.Finite, limit: Schema.Finite }

/**
 * 429: a long-poll (an agent's assignments, a wait for a session's state) beyond the caps: its
 * credential holds `limit` open already, or the coordinator holds its total. Retry after
 * `retryAfterMs` (also the `Retry-After` header, whole seconds).
 */
export class TooManyRequests extends Schema.Error<TooManyRequests>("TooManyRequests")(tooManyFields) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "TooManyRequests" as const
}

/** `TooManyRequests` on the wire: the JSON body plus a `Retry-After` header in whole seconds. */
export const TooManyRequestsResponse = TooManyRequests.pipe(
  HttpApiSchema.encodeToWithHeaders(
    { body: Schema.Struct(tooManyFields).pipe(HttpApiSchema.status(statuses.TooManyRequests)), headers: { "retry-after": Schema.NumberFromString } },
    {
      decode: ({ body }) => new TooManyRequests(body),
      encode: (e) => ({
        body: { error: e.error, message: e.message, retryAfterMs: e.retryAfterMs, limit: e.limit },
        headers: { "retry-after": retryAfterSeconds(e.retryAfterMs) },
      }),
    },
  ),
)

const unavailableFields = {
  error: Schema.String,
  message: Schema.String,
  /**
   * When a retry may succeed, ms (also the `Retry-After` header, in whole seconds). Absent when
   * retrying the same request cannot help (`ErrMoveDowntime`: the guard refuses the same move again).
   */
  retryAfterMs: Schema.optionalKey(Schema.Finite),
  /** A move's answers: which move, its estimate (`ErrMoveDowntime`) and its budget. */
  moveId: Schema.optionalKey(Schema.String),
  estimateMs: Schema.optionalKey(Schema.Finite),
  maxDowntimeMs: Schema.optionalKey(Schema.Finite),
  /** The request's id, as in the `x-request-id` header and the coordinator's log line of the answer. */
  requestId: Schema.optionalKey(Schema.String),
}

/**
 * The header in which an agent states its ordinary calls' bound, ms (`engram-agent-call-timeout-ms:
 * 10000`): the coordinator bounds a heartbeat's or a report's store work below it, so a database
 * that stalls is answered (`StoreStalled`) before the agent gives up on the replica.
 */
export const agentCallTimeoutHeader = "engram-agent-call-timeout-ms"

/**
 * The `error` of a 503 that says the coordinator's database answers this replica but did not
 * complete the call within the agent's bound (a lock held, an overloaded server): every replica
 * shares that database, so a client stays on its replica (unlike `Unavailable`).
 */
export const storeStalledError = "StoreStalled"

/**
 * 503: the store is down or timed out (`Unavailable`: nothing changed, retry after
 * `retryAfterMs`; `StoreStalled` on an agent's heartbeat or report: the database answers but did
 * not complete the call within the agent's bound), the coordinator is shutting down (`Unavailable`), or a move failed: refused
 * for downtime (`ErrMoveDowntime`, with `estimateMs` and no `retryAfterMs` nor `Retry-After`:
 * the same move is refused again; raise `maxDowntimeMs` or move when the guest dirties less), aborted by its agent (`MoveAborted`),
 * not acted on in time (`MoveTimeout`), or still waiting for the source's commit after the
 * final round was recorded (`MoveCommitPending`: the move is left pending; `GET /v1/moves/{id}`
 * shows the outcome).
 */
export class ServiceUnavailable extends Schema.Error<ServiceUnavailable>("ServiceUnavailable")(unavailableFields) {
  /** The tag `Effect.catchTag` matches (not part of the JSON body). */
  readonly _tag = "ServiceUnavailable" as const
}

const ServiceUnavailableBody = Schema.Struct(unavailableFields).pipe(HttpApiSchema.status(statuses.ServiceUnavailable))

/** The `Retry-After` header of a 503 or a 429: whole seconds, at least 1. */
export const retryAfterSeconds = (retryAfterMs: number): number => Math.max(1, Math.ceil(retryAfterMs / 1000))

/** `ServiceUnavailable` on the wire: the JSON body plus a `Retry-After` header in whole seconds. */
export const ServiceUnavailableResponse = ServiceUnavailable.pipe(
  HttpApiSchema.encodeToWithHeaders(
    { body: ServiceUnavailableBody, headers: { "retry-after": Schema.optionalKey(Schema.NumberFromString) } },
    {
      decode: ({ body }) => new ServiceUnavailable(body),
      encode: (e) => ({
        body: {
          error: e.error,
          message: e.message,
          ...(e.retryAfterMs === undefined ? {} : { retryAfterMs: e.retryAfterMs }),
          ...(e.moveId === undefined ? {} : { moveId: e.moveId }),
          ...(e.estimateMs === undefined ? {} : { estimateMs: e.estimateMs }),
          ...(e.maxDowntimeMs === undefined ? {} : { maxDowntimeMs: e.maxDowntimeMs }),
          ...(e.requestId === undefined ? {} : { requestId: e.requestId }),
        },
        headers: e.retryAfterMs === undefined ? {} : { "retry-after": retryAfterSeconds(e.retryAfterMs) },
      }),
    },
  ),
)

/** The errors every authenticated endpoint may answer. */
export const StandardErrors = [BadRequest, Forbidden, NotFoundError, ConflictError, ServiceUnavailableResponse] as const

/** The errors of a long-poll, on top of the standard ones. */
export const LongPollErrors = [...StandardErrors, TooManyRequestsResponse] as const

/** The errors of an endpoint that reads a JSON body, on top of the standard ones. */
export const BodyErrors = [...StandardErrors, PayloadTooLarge, UnsupportedMediaType] as const

/** Any error answer of the API. */
export type ApiError =
  | BadRequest
  | Unauthorized
  | Forbidden
  | NotFoundError
  | ConflictError
  | WaitTimeout
  | PayloadTooLarge
  | UnsupportedMediaType
  | TooManyRequests
  | ServiceUnavailable

/** The status an error answer is sent with (every class above has one in `statuses`). */
export const statusOf = (e: ApiError): number => (statuses satisfies Record<ApiError["_tag"], number>)[e._tag]
