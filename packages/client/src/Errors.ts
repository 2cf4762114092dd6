/**
 * What a call can fail with, as classes a plain `catch` tells apart with `instanceof` and an
 * Effect program with `Effect.catchTag`: one class per kind of answer (the coordinator's JSON
 * error bodies, by status and `error` code), each carrying the figures of its case, plus the
 * two failures that never reached an answer (the coordinator could not be reached, or answered
 * something this client cannot read). `fromAnswer` is the one place a status and body become
 * an error; `fromFailure` turns a failure of `@engram/api`'s `HttpApiClient` into the status and
 * body it stands for (the status of each API error is the API's own, `Errors.statuses`), and a
 * request that does not encode by the API's schemas into an `InvalidInput` with no status (refused
 * before it was sent, in the words of the coordinator's 400).
 */
import { Errors as ApiErrors, StrictJson } from "@engram/api"
import type { ApiError } from "@engram/api"
import { Effect, Schema } from "effect"

/** What the coordinator said, as far as an error needs it. */
export interface Answer {
  /** The HTTP status; null when no answer arrived. */
  readonly status: number | null
  /** The answer's JSON body (`{error, message, …}`), or null. */
  readonly body: Readonly<Record<string, unknown>> | null
}

/** Every error of this client. `code` is the body's `error` (`NotFound`, `IllegalTransition`, `ErrMoveDowntime`…). */
export abstract class EngramError extends Error {
  abstract readonly _tag: string
  /** The HTTP status; null when no answer arrived. */
  readonly status: number | null
  /** The body's `error` code, or a word of this client's when there was no body. */
  readonly code: string
  /** The answer's JSON body as sent. */
  readonly body: Readonly<Record<string, unknown>> | null

  constructor(message: string, answer: Answer, code: string) {
    super(message)
    this.status = answer.status
    this.body = answer.body
    this.code = code
  }

  override get name(): string {
    return this._tag
  }
}

const text = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined)
const num = (v: unknown): number | undefined => (typeof v === "number" && Number.isFinite(v) ? v : undefined)

/** 400: the input broke a rule; `field` is the path of the value (`affinity.1`), `rule` what it must be. Nothing changed. */
export class InvalidInput extends EngramError {
  readonly _tag = "InvalidInput" as const
  readonly field: string
  readonly rule: string
  /** Where the value was: body, query, path or headers. */
  readonly in: string | undefined
  constructor(answer: Answer) {
    const field = text(answer.body?.["field"]) ?? "request"
    const rule = text(answer.body?.["rule"]) ?? text(answer.body?.["message"]) ?? "is invalid"
    super(`${field}: ${rule}`, answer, text(answer.body?.["error"]) ?? "InvalidInput")
    this.field = field
    this.rule = rule
    this.in = text(answer.body?.["in"])
  }
}

/** 401: no token, or one that belongs to nobody (a wrong or rotated token). */
export class Unauthorized extends EngramError {
  readonly _tag = "Unauthorized" as const
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "the coordinator refused the token", answer, "Unauthorized")
  }
}

/** 403: a host token used for another host's resources or for an admin operation. */
export class Forbidden extends EngramError {
  readonly _tag = "Forbidden" as const
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "forbidden", answer, "Forbidden")
  }
}

/** 404: no such record (`entity`: host, session, move, reservation; `route` when the coordinator has no such endpoint). */
export class NotFound extends EngramError {
  readonly _tag = "NotFound" as const
  readonly entity: string
  readonly id: string
  constructor(answer: Answer) {
    const entity = text(answer.body?.["entity"]) ?? "record"
    const id = text(answer.body?.["id"]) ?? ""
    super(text(answer.body?.["message"]) ?? `${entity} ${id} not found`, answer, "NotFound")
    this.entity = entity
    this.id = id
  }
}

/**
 * 409: the request conflicts with the state: an illegal transition (`from`, `to`), a ledger
 * refusal (`check`), a repeated id (`state`: the existing session's, on a repeated create: one
 * that ended, was lost or descended, or one asking for another budget or options), a host that still holds
 * reservations… Nothing changed.
 */
export class Conflict extends EngramError {
  readonly _tag: "Conflict" | "NoRoom" | "Unreachable" = "Conflict"
  readonly from: string | undefined
  readonly to: string | undefined
  readonly check: string | undefined
  readonly entity: string | undefined
  readonly id: string | undefined
  /** The session's state where the answer names it: a repeated create (`ended`, `lost`, `descended`: resume that one; any state with another budget or options), a wait that gave up. */
  readonly state: string | undefined
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "conflict", answer, text(answer.body?.["error"]) ?? "Conflict")
    this.state = text(answer.body?.["state"])
    this.from = text(answer.body?.["from"])
    this.to = text(answer.body?.["to"])
    this.check = text(answer.body?.["check"])
    this.entity = text(answer.body?.["entity"])
    this.id = text(answer.body?.["id"])
  }
}

/** 429: a long-poll beyond its credential's cap or the coordinator's total; retry after `retryAfterMs`. */
export class TooManyRequests extends EngramError {
  readonly _tag = "TooManyRequests" as const
  readonly retryAfterMs: number
  readonly limit: number | undefined
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "too many open long-polls", answer, text(answer.body?.["error"]) ?? "TooManyWaits")
    this.retryAfterMs = num(answer.body?.["retryAfterMs"]) ?? 1000
    this.limit = num(answer.body?.["limit"])
  }
}

/** Why one host does not take a budget, with its free room. */
export interface NoFitDetail {
  readonly hostId: string
  readonly reason: string
  readonly freeMib: number | null
  readonly freeVcpus: number | null
}

const noFitOf = (v: unknown): readonly NoFitDetail[] =>
  Array.isArray(v) ? v.filter((d): d is NoFitDetail => typeof d === "object" && d !== null && typeof (d as NoFitDetail).hostId === "string") : []

/** 409 `NoRoom`: a create with `onNoRoom: "refuse"` found no host; `noFit` says why each host does not take it. */
export class NoRoom extends Conflict {
  override readonly _tag = "NoRoom" as const
  readonly noFit: readonly NoFitDetail[]
  /** True when no host could take the budget even empty (`too_big`). */
  readonly tooBig: boolean
  constructor(answer: Answer) {
    super(answer)
    this.noFit = noFitOf(answer.body?.["noFit"])
    this.tooBig = answer.body?.["tooBig"] === true
  }
}

/** 409 of a wait: the wanted state can no longer be reached (the session ended, was lost…). */
export class Unreachable extends Conflict {
  /** `state`: the session's state when the wait gave up. */
  override readonly _tag = "Unreachable" as const
}

/** 408: a wait ran out before the session reached the state; `state` is where it stands. */
export class WaitTimeout extends EngramError {
  readonly _tag = "WaitTimeout" as const
  readonly state: string | undefined
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? `the wait timed out (state ${text(answer.body?.["state"]) ?? "unknown"})`, answer, "WaitTimeout")
    this.state = text(answer.body?.["state"])
  }
}

/** 413: the body is over the coordinator's limit (`limitBytes`). */
export class PayloadTooLarge extends EngramError {
  readonly _tag = "PayloadTooLarge" as const
  readonly limitBytes: number | undefined
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "the request body is too large", answer, "PayloadTooLarge")
    this.limitBytes = num(answer.body?.["limitBytes"])
  }
}

/**
 * 503: the store is down or slow, or the coordinator is stopping; retry after `retryAfterMs`. A
 * read or a refused request changed nothing, but a write whose store call timed out may have
 * landed: a create or a reserve repeated with its id is answered as the first (keep the id the
 * client chose, or choose one); read before repeating another write (a resume, a move, a host's
 * registration).
 */
export class Unavailable extends EngramError {
  readonly _tag = "Unavailable" as const
  readonly retryAfterMs: number
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "the coordinator is unavailable", answer, text(answer.body?.["error"]) ?? "Unavailable")
    this.retryAfterMs = num(answer.body?.["retryAfterMs"]) ?? 1000
  }
}

/**
 * 503 `ErrMoveDowntime`: the downtime guard refused the move before the guest paused (or
 * aborted it after the final capture): the session runs on its source. `estimateMs` is what
 * the pause would have been, `maxDowntimeMs` the budget.
 */
export class MoveDowntime extends EngramError {
  readonly _tag = "MoveDowntime" as const
  readonly moveId: string | undefined
  readonly estimateMs: number | undefined
  readonly maxDowntimeMs: number | undefined
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "the move was refused for downtime", answer, "ErrMoveDowntime")
    this.moveId = text(answer.body?.["moveId"])
    this.estimateMs = num(answer.body?.["estimateMs"])
    this.maxDowntimeMs = num(answer.body?.["maxDowntimeMs"])
  }
}

/**
 * 503 of a move that did not commit for another reason: `MoveAborted` (its agent aborted it),
 * `MoveTimeout` (no agent acted in time; aborted) or `MoveCommitPending` (the source recorded
 * its final round but has not settled: the move stays pending, read it again later).
 */
export class MoveFailed extends EngramError {
  readonly _tag = "MoveFailed" as const
  readonly moveId: string | undefined
  readonly retryAfterMs: number
  constructor(answer: Answer) {
    super(text(answer.body?.["message"]) ?? "the move failed", answer, text(answer.body?.["error"]) ?? "MoveFailed")
    this.moveId = text(answer.body?.["moveId"])
    this.retryAfterMs = num(answer.body?.["retryAfterMs"]) ?? 1000
  }
}

/** No answer: the coordinator could not be reached (refused, reset, DNS…) or the call was cut off. */
export class TransportError extends EngramError {
  readonly _tag = "TransportError" as const
  /** The replica tried last. */
  readonly url: string
  /** Why it could not be reached (the message without the URL). */
  readonly reason: string
  /** The replicas this call tried, in order (`url` last): fewer than given when a call not safe to repeat stopped at one. */
  readonly tried: readonly string[]
  /** Whether the last replica took the request but did not answer within the client's timeout (not refused nor cut). */
  readonly timedOut: boolean
  constructor(url: string, reason: string, more: { readonly tried?: readonly string[] | undefined; readonly timedOut?: boolean | undefined } = {}) {
    super(`cannot reach the coordinator at ${url}: ${reason}`, { status: null, body: null }, "TransportError")
    this.url = url
    this.reason = reason
    this.tried = more.tried ?? [url]
    this.timedOut = more.timedOut ?? false
  }
}

/** An answer this client cannot read: an undocumented status, or a body that does not have the documented shape. */
export class UnexpectedAnswer extends EngramError {
  readonly _tag = "UnexpectedAnswer" as const
  constructor(answer: Answer, detail: string) {
    super(`unexpected answer${answer.status === null ? "" : ` (HTTP ${answer.status})`}: ${detail}`, answer, text(answer.body?.["error"]) ?? "UnexpectedAnswer")
  }
}

/** Any error of a call. */
export type ClientError =
  | InvalidInput
  | Unauthorized
  | Forbidden
  | NotFound
  | Conflict
  | NoRoom
  | Unreachable
  | WaitTimeout
  | PayloadTooLarge
  | TooManyRequests
  | Unavailable
  | MoveDowntime
  | MoveFailed
  | TransportError
  | UnexpectedAnswer

/** The error of a non-2xx answer: by status, then by the body's `error` code. */
export const fromAnswer = (answer: Answer): ClientError => {
  const code = text(answer.body?.["error"])
  switch (answer.status) {
    case 400:
    case 415:
      return new InvalidInput(
        answer.status === 415 && answer.body?.["field"] === undefined
          ? { ...answer, body: { ...answer.body, field: "content-type", rule: text(answer.body?.["message"]) ?? "must be application/json" } }
          : answer,
      )
    case 401:
      return new Unauthorized(answer)
    case 403:
      return new Forbidden(answer)
    case 404:
      return new NotFound(answer)
    case 408:
      return new WaitTimeout(answer)
    case 409:
      return code === "NoRoom" ? new NoRoom(answer) : code === "Unreachable" || code === "WaitUnreachable" ? new Unreachable(answer) : new Conflict(answer)
    case 413:
      return new PayloadTooLarge(answer)
    case 429:
      return new TooManyRequests(answer)
    case 503:
      if (code === "ErrMoveDowntime") return new MoveDowntime(answer)
      if (code === "MoveAborted" || code === "MoveTimeout" || code === "MoveCommitPending") return new MoveFailed(answer)
      return new Unavailable(answer)
    default:
      return new UnexpectedAnswer(answer, text(answer.body?.["message"]) ?? "no documented answer for this status")
  }
}

/** One line for a person: the error's message, with the field and rule of a 400 and the figures of a move refusal. */
export const describe = (e: EngramError): string => {
  if (e instanceof InvalidInput) return `invalid input: ${e.field} ${e.rule}`
  if (e instanceof MoveDowntime) {
    const figures = [e.estimateMs === undefined ? null : `estimate ${Math.round(e.estimateMs)} ms`, e.maxDowntimeMs === undefined ? null : `budget ${e.maxDowntimeMs} ms`].filter((x) => x !== null)
    return `move refused for downtime${figures.length > 0 ? ` (${figures.join(" > ")})` : ""}: the session keeps running on its source`
  }
  if (e instanceof Unavailable) return `${e.message} (retry in ${Math.ceil(e.retryAfterMs / 1000)} s)`
  if (e instanceof Conflict && e.from !== undefined && e.to !== undefined) return `${e.message} (${e.from} → ${e.to})`
  return e.message
}

/** A transport failure's cause as a short text: its code (ECONNREFUSED…) and message. */
const messageOf = (e: unknown): string => {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause
    const code = typeof cause === "object" && cause !== null && "code" in cause ? String((cause as { code: unknown }).code) : undefined
    const inner = cause instanceof Error ? cause.message : undefined
    return [code, inner ?? e.message].filter((x) => x !== undefined && x !== "").join(" ")
  }
  return String(e)
}

const isApiError = (e: unknown): e is ApiError =>
  typeof e === "object" && e !== null && "_tag" in e && Object.hasOwn(ApiErrors.statuses, String((e as { _tag: unknown })._tag))

type Reason = { readonly _tag: string; readonly cause?: unknown; readonly response?: { readonly status: number; readonly json: Effect.Effect<unknown, unknown> } }

/**
 * A failure of `@engram/api`'s `HttpApiClient` (a decoded error answer, a transport or decode
 * failure) as one of this client's errors; `where` is where the call's input goes (its body or
 * its query: a path's ids are plain text, never refused here), named by a refusal before sending. An answer whose status the API does not declare for
 * the call is read as it came (status and JSON body).
 */
export const fromFailure =
  (baseUrl: string, where: StrictJson.InputLocation = "body") =>
  (e: unknown): Effect.Effect<never, ClientError> => {
    if (isApiError(e)) {
      // The body's fields; an Error's `message` is not an own enumerable property, so it is copied by name.
      const { _tag: _, ...fields } = { ...(e as unknown as Record<string, unknown>) }
      const body = e.message === "" ? fields : { ...fields, message: e.message }
      return Effect.fail(fromAnswer({ status: ApiErrors.statusOf(e), body }))
    }
    // A request that does not encode by the API's schemas: refused here, before anything is
    // sent, in the coordinator's words (the field, the rule and where it was, as its 400 says:
    // `where`, the part of the request the call's input goes in).
    if (Schema.isSchemaError(e)) return Effect.fail(new InvalidInput({ status: null, body: { error: "InvalidInput", ...StrictJson.issueProblem(e.issue, where) } }))
    const reason = typeof e === "object" && e !== null && (e as { _tag?: unknown })._tag === "HttpClientError" ? (e as { reason: Reason }).reason : undefined
    if (reason?._tag === "TransportError") return Effect.fail(new TransportError(baseUrl, messageOf(reason.cause ?? e)))
    // An error status the call does not declare (or whose body does not decode): read it as it came.
    if (reason?.response !== undefined && (reason.response.status < 200 || reason.response.status >= 300)) {
      const status = reason.response.status
      return reason.response.json.pipe(
        Effect.orElseSucceed(() => null),
        Effect.flatMap((body) =>
          Effect.fail(
            typeof body === "object" && body !== null && !Array.isArray(body)
              ? fromAnswer({ status, body: body as Record<string, unknown> })
              : new UnexpectedAnswer({ status, body: null }, `not an engram answer (is ${baseUrl} an engram coordinator?)`),
          ),
        ),
      )
    }
    const status = reason?.response?.status ?? null
    return Effect.fail(new UnexpectedAnswer({ status, body: null }, `${messageOf(e)} (is ${baseUrl} an engram coordinator?)`))
  }
