/**
 * The agent's view of the coordinator: the few agent-facing endpoints, as a service so tests
 * can swap the HTTP client for an in-memory fake. Level-triggered: the assignments are the
 * commands, the CAS endpoints are the acknowledgements, and a 409 from one (a repeat, or a
 * state that already moved on) is `Conflict`, which the agent treats as done.
 */
import { Context, Duration, Effect, Layer, Schema } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest, HttpBody } from "effect/http"
import type { HostReport } from "./Measure.js"

export const SessionState = Schema.Literals(["queued", "pending", "running", "parked", "descending", "descended", "moving", "ended", "lost"])
export type SessionState = typeof SessionState.Type

/** A session as the agent needs it (extra fields are ignored). */
export const AssignedSession = Schema.Struct({
  id: Schema.String,
  state: SessionState,
  budget: Schema.Struct({ memMib: Schema.Number, vcpus: Schema.Number }),
  hostId: Schema.NullOr(Schema.String),
  reservationId: Schema.optional(Schema.NullOr(Schema.String)),
})
export type AssignedSession = typeof AssignedSession.Type

/** A move as the agent needs it. */
export const AssignedMove = Schema.Struct({
  id: Schema.String,
  sessionId: Schema.String,
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  maxDowntimeMs: Schema.Number,
  state: Schema.Literals(["pending", "committed", "aborted"]),
})
export type AssignedMove = typeof AssignedMove.Type

/** A move as `GET /v1/moves/{id}` shows it (extra fields are ignored). */
export const MoveView = Schema.Struct({
  ...AssignedMove.fields,
  abortReason: Schema.optional(Schema.NullOr(Schema.String)),
})
export type MoveView = typeof MoveView.Type

/**
 * The coordinator's limits that the agent's move guard uses (its `commitAllowanceMs`), sent
 * with every assignments answer so agent and coordinator cannot disagree. Optional only for
 * a coordinator older than this field; the agent then uses the SPEC §9 default.
 */
export const AssignedLimits = Schema.Struct({ commitAllowanceMs: Schema.Number })
export type AssignedLimits = typeof AssignedLimits.Type

/** `GET /v1/hosts/{id}/assignments`. */
export const Assignments = Schema.Struct({
  version: Schema.optional(Schema.String),
  sessions: Schema.Array(AssignedSession),
  moves: Schema.Array(AssignedMove),
  limits: Schema.optional(AssignedLimits),
})
export type Assignments = typeof Assignments.Type

/** One pre-copy round as the source reports it. */
export interface RoundReport {
  readonly kind: "full" | "delta" | "final"
  readonly wireBytes: number
  readonly apparentBytes: number
  readonly sendMs: number
  readonly captureMs: number
}

/** The phases of a committed move. */
export interface PhasesReport {
  readonly downtimeMs: number
  readonly captureMs: number
  readonly sendMs: number
  readonly commitMs: number
}

/** 409: the coordinator's state already moved past this step; the agent treats it as done. */
export class Conflict extends Schema.TaggedError<Conflict>()("Conflict", { op: Schema.String, message: Schema.String }) {}

/** Any other failure: the request may be retried (level-triggered, the next pass retries). */
export class CoordinatorError extends Schema.TaggedError<CoordinatorError>()("CoordinatorError", {
  op: Schema.String,
  status: Schema.NullOr(Schema.Number),
  message: Schema.String,
}) {}

type Fx<A> = Effect.Effect<A, Conflict | CoordinatorError>

/** The agent-facing coordinator API. */
export interface CoordinatorShape {
  readonly report: (r: HostReport) => Fx<void>
  readonly heartbeat: Fx<number>
  readonly assignments: (opts: { readonly waitMs: number; readonly since: string | undefined }) => Fx<Assignments>
  readonly started: (sessionId: string) => Fx<void>
  readonly descended: (sessionId: string) => Fx<void>
  readonly round: (moveId: string, round: RoundReport) => Fx<void>
  readonly commit: (moveId: string, phases: PhasesReport) => Fx<void>
  readonly abort: (moveId: string, reason: string, estimateMs?: number) => Fx<void>
  /** `GET /v1/moves/{id}` (this host is its source or target). */
  readonly getMove: (moveId: string) => Fx<MoveView>
  /** `GET /v1/sessions/{id}`; null when the session is not this host's (403) or unknown (404). */
  readonly getSession: (sessionId: string) => Fx<AssignedSession | null>
}

export class Coordinator extends Context.Service<Coordinator, CoordinatorShape>()("@engram/host-agent/Coordinator") {}

/** Where the coordinator is and who this agent is. */
export interface CoordinatorTarget {
  readonly url: string
  readonly hostId: string
  readonly hostToken: string
}

const parseJson = (text: string): unknown => {
  try {
    return text === "" ? null : (JSON.parse(text) as unknown)
  } catch {
    return text
  }
}

/** The HTTP client of the coordinator (`fetch`). */
export const makeHttp = (t: CoordinatorTarget) =>
  Effect.gen(function* () {
    const base = t.url.replace(/\/+$/, "")
    const client = (yield* HttpClient.HttpClient).pipe(
      HttpClient.mapRequest((req) => req.pipe(HttpClientRequest.prependUrl(base), HttpClientRequest.bearerToken(t.hostToken))),
    )
    const host = encodeURIComponent(t.hostId)
    const call = <A>(op: string, req: HttpClientRequest.HttpClientRequest, decode: (body: unknown) => Effect.Effect<A, unknown>, timeoutMs = 30_000) =>
      client.execute(req).pipe(
        Effect.flatMap((res) =>
          Effect.gen(function* () {
            const text = yield* res.text
            const body = parseJson(text)
            const message =
              typeof body === "object" && body !== null && "message" in body ? String((body as { message: unknown }).message) : text.slice(0, 200)
            if (res.status === 409) return yield* new Conflict({ op, message })
            if (res.status < 200 || res.status >= 300) return yield* new CoordinatorError({ op, status: res.status, message })
            return yield* decode(body).pipe(Effect.mapError((e) => new CoordinatorError({ op, status: res.status, message: `bad answer: ${String(e)}` })))
          }),
        ),
        Effect.timeout(Duration.millis(timeoutMs)),
        Effect.catchTag("TimeoutError", () => Effect.fail(new CoordinatorError({ op, status: null, message: "timed out" }))),
        Effect.catchTag("HttpClientError", (e) => Effect.fail(new CoordinatorError({ op, status: null, message: e.message }))),
        Effect.provide(FetchHttpClient.layer),
      )
    const ignore = () => Effect.void
    const post = (path: string, body?: unknown) => {
      const req = HttpClientRequest.post(path)
      return body === undefined ? req : HttpClientRequest.setBody(req, HttpBody.jsonUnsafe(body))
    }
    const shape: CoordinatorShape = {
      report: (r) => call("report", HttpClientRequest.put(`/v1/hosts/${host}/report`).pipe(HttpClientRequest.setBody(HttpBody.jsonUnsafe(r))), ignore),
      heartbeat: call("heartbeat", post(`/v1/hosts/${host}/heartbeat`), (b) =>
        Effect.succeed(typeof b === "object" && b !== null && "renewed" in b ? Number((b as { renewed: unknown }).renewed) : 0),
      ),
      assignments: ({ waitMs, since }) =>
        call(
          "assignments",
          HttpClientRequest.get(`/v1/hosts/${host}/assignments`).pipe(
            HttpClientRequest.setUrlParams(since === undefined ? { waitMs: String(waitMs) } : { waitMs: String(waitMs), since }),
          ),
          (b) => Schema.decodeUnknownEffect(Assignments)(b),
          waitMs + 15_000,
        ),
      started: (id) => call("started", post(`/v1/sessions/${encodeURIComponent(id)}/started`), ignore),
      descended: (id) => call("descended", post(`/v1/sessions/${encodeURIComponent(id)}/descended`), ignore),
      round: (id, round) => call("round", post(`/v1/moves/${encodeURIComponent(id)}/rounds`, round), ignore),
      commit: (id, phases) => call("commit", post(`/v1/moves/${encodeURIComponent(id)}/commit`, phases), ignore),
      abort: (id, reason, estimateMs) =>
        call("abort", post(`/v1/moves/${encodeURIComponent(id)}/abort`, estimateMs === undefined ? { reason } : { reason, estimateMs }), ignore),
      getMove: (id) => call("getMove", HttpClientRequest.get(`/v1/moves/${encodeURIComponent(id)}`), (b) => Schema.decodeUnknownEffect(MoveView)(b)),
      getSession: (id) =>
        call("getSession", HttpClientRequest.get(`/v1/sessions/${encodeURIComponent(id)}`), (b) => Schema.decodeUnknownEffect(AssignedSession)(b)).pipe(
          Effect.catchIf(
            (e) => e._tag === "CoordinatorError" && (e.status === 403 || e.status === 404),
            () => Effect.succeed(null),
          ),
        ),
    }
    return shape
  })

export const layerHttp = (t: CoordinatorTarget) => Layer.effect(Coordinator, makeHttp(t).pipe(Effect.provide(FetchHttpClient.layer)))
