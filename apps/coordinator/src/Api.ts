/**
 * The coordinator's HTTP surface as one `HttpApi`: every endpoint, its JSON schemas and its
 * error answers. The server implements it (Handlers.ts), `/openapi.json` is derived from it,
 * and a host agent can derive a typed client from it (`HttpApiClient.make(CoordinatorApi)`).
 *
 * Error bodies are `{error, ...}` without an `_tag`: 400 `{error, field, rule}`, 401/403
 * `{error, message}`, 404 `{error, entity, id, message}`, 409 `{error, message, ...}`,
 * 503 `{error, message, retryAfterMs}` with a `Retry-After` header (seconds).
 */
import { Context, Schema } from "effect"
import { HttpApi, HttpApiEndpoint, HttpApiGroup, HttpApiMiddleware, HttpApiSchema, HttpApiSecurity, OpenApi } from "effect/http-api"

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/** 400: the input broke a rule; `field` is the path of the value, `rule` what it must be. */
export class BadRequest extends Schema.Error<BadRequest>("BadRequest")(
  { error: Schema.String, field: Schema.String, rule: Schema.String },
  { httpApiStatus: 400 },
) {}

/** 401: no bearer token, or one that belongs to nobody. */
export class Unauthorized extends Schema.Error<Unauthorized>("Unauthorized")(
  { error: Schema.String, message: Schema.String },
  { httpApiStatus: 401 },
) {}

/** 403: a host token used for another host's resources, or for an admin operation. */
export class Forbidden extends Schema.Error<Forbidden>("Forbidden")(
  { error: Schema.String, message: Schema.String },
  { httpApiStatus: 403 },
) {}

/** 404: no record with this id. */
export class NotFoundError extends Schema.Error<NotFoundError>("NotFoundError")(
  { error: Schema.String, entity: Schema.String, id: Schema.String, message: Schema.String },
  { httpApiStatus: 404 },
) {}

/** 409: a conflict, an illegal state transition or a policy refusal. Nothing changed. */
export class ConflictError extends Schema.Error<ConflictError>("ConflictError")(
  {
    error: Schema.String,
    message: Schema.String,
    entity: Schema.optionalKey(Schema.String),
    id: Schema.optionalKey(Schema.String),
    from: Schema.optionalKey(Schema.String),
    to: Schema.optionalKey(Schema.String),
    check: Schema.optionalKey(Schema.String),
  },
  { httpApiStatus: 409 },
) {}

const unavailableFields = {
  error: Schema.String,
  message: Schema.String,
  retryAfterMs: Schema.Number,
  /** A move's answers: which move, its estimate (ErrMoveDowntime) and its budget. */
  moveId: Schema.optionalKey(Schema.String),
  estimateMs: Schema.optionalKey(Schema.Number),
  maxDowntimeMs: Schema.optionalKey(Schema.Number),
}

/**
 * 503: the store is down or timed out (`Unavailable`; nothing changed, retry after
 * `retryAfterMs`), or a move failed: refused for downtime (`ErrMoveDowntime`, with
 * `estimateMs`), aborted by its agent (`MoveAborted`) or not acted on in time (`MoveTimeout`),
 * or still waiting for the source's commit after the final round was recorded
 * (`MoveCommitPending`: the move was left pending; `GET /v1/moves/{id}` shows the outcome).
 */
export class ServiceUnavailable extends Schema.Error<ServiceUnavailable>("ServiceUnavailable")(unavailableFields) {}

const ServiceUnavailableBody = Schema.Struct(unavailableFields).pipe(HttpApiSchema.status(503))

/** `ServiceUnavailable` on the wire: the JSON body plus a `Retry-After` header in whole seconds. */
export const ServiceUnavailableResponse = ServiceUnavailable.pipe(
  HttpApiSchema.encodeToWithHeaders(
    { body: ServiceUnavailableBody, headers: { "retry-after": Schema.NumberFromString } },
    {
      decode: ({ body }) => new ServiceUnavailable(body),
      encode: (e) => ({
        body: {
          error: e.error,
          message: e.message,
          retryAfterMs: e.retryAfterMs,
          ...(e.moveId === undefined ? {} : { moveId: e.moveId }),
          ...(e.estimateMs === undefined ? {} : { estimateMs: e.estimateMs }),
          ...(e.maxDowntimeMs === undefined ? {} : { maxDowntimeMs: e.maxDowntimeMs }),
        },
        headers: { "retry-after": Math.max(1, Math.ceil(e.retryAfterMs / 1000)) },
      }),
    },
  ),
)

/** The errors every authenticated endpoint may answer. */
export const StandardErrors = [BadRequest, Forbidden, NotFoundError, ConflictError, ServiceUnavailableResponse] as const

// ---------------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------------

const Id = Schema.String
const NullableNumber = Schema.NullOr(Schema.Number)
const NullableFinite = Schema.NullOr(Schema.Finite)

export const SessionState = Schema.Literals(["queued", "pending", "running", "parked", "descending", "descended", "moving", "ended", "lost"])
export const HostState = Schema.Literals(["ready", "cordoned", "draining"])

export const Budget = Schema.Struct({ memMib: Schema.Number, vcpus: Schema.Number })

export const SessionJson = Schema.Struct({
  id: Id,
  state: SessionState,
  budget: Budget,
  affinity: Schema.Array(Schema.String),
  hostId: Schema.NullOr(Schema.String),
  reservationId: Schema.NullOr(Schema.String),
  queuedAt: NullableNumber,
  parkedAt: NullableNumber,
  createdAt: Schema.Number,
  updatedAt: Schema.Number,
})

export const NoFitDetail = Schema.Struct({
  hostId: Schema.String,
  reason: Schema.Literals(["unmeasured", "ram_full", "cpu_full", "entries_full", "cordoned", "draining", "fits_now"]),
  freeMib: NullableNumber,
  freeVcpus: NullableNumber,
})

/** 201: placed (or, for a repeated id, the session holds a host). */
export const Placed = Schema.Struct({ id: Id, state: SessionState, hostId: Schema.String })
/** 202: queued, with its 1-based FIFO position (0 when the session is not in the queue) and why nothing fits. */
export const QueuedAnswer = Schema.Struct({
  id: Id,
  state: SessionState,
  position: Schema.Number,
  noFit: Schema.Array(NoFitDetail),
})
const PlaceAnswers = [Placed.pipe(HttpApiSchema.status(201)), QueuedAnswer.pipe(HttpApiSchema.status(202))] as const

export const HostReportJson = Schema.Struct({
  totalMib: NullableNumber,
  allocatableMib: NullableNumber,
  totalVcpus: NullableNumber,
})

export const HostJson = Schema.Struct({
  id: Id,
  labels: Schema.Record(Schema.String, Schema.String),
  state: HostState,
  measured: Schema.Boolean,
  report: Schema.NullOr(HostReportJson),
  reportedAt: NullableNumber,
  createdAt: Schema.Number,
  /** RAM capacity after policy (SPEC §1). */
  allocatableMib: NullableNumber,
  /** The allocatable RAM the host reported, before policy. */
  reportedAllocatableMib: NullableNumber,
  reservedMib: Schema.Number,
  freeMib: NullableNumber,
  cpuBudget: NullableNumber,
  reservedVcpus: Schema.Number,
  freeVcpus: NullableNumber,
  entries: Schema.Number,
  parks: Schema.Number,
  descentsRunning: Schema.Number,
})

export const MoveRoundJson = Schema.Struct({
  kind: Schema.Literals(["full", "delta", "final"]),
  wireBytes: Schema.Finite,
  apparentBytes: Schema.Finite,
  sendMs: Schema.Finite,
  captureMs: Schema.Finite,
})

export const MovePhasesJson = Schema.Struct({
  downtimeMs: Schema.Finite,
  captureMs: Schema.Finite,
  sendMs: Schema.Finite,
  commitMs: Schema.Finite,
})

export const MoveJson = Schema.Struct({
  id: Id,
  sessionId: Schema.String,
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  reservationId: Schema.String,
  maxDowntimeMs: Schema.Number,
  state: Schema.Literals(["pending", "committed", "aborted"]),
  rounds: Schema.Array(MoveRoundJson),
  phases: Schema.NullOr(MovePhasesJson),
  abortReason: Schema.NullOr(Schema.String),
  /** The downtime estimate an `ErrMoveDowntime` abort was refused on, in ms. */
  abortEstimateMs: NullableNumber,
  createdAt: Schema.Number,
  endedAt: NullableNumber,
})

export const MoveCommitted = Schema.Struct({
  move: MoveJson,
  downtimeMs: Schema.Number,
  captureMs: Schema.Number,
  sendMs: Schema.Number,
  commitMs: Schema.Number,
})

export const OwnerKind = Schema.Literals(["session", "move", "capture", "external"])

export const ReservationJson = Schema.Struct({
  id: Id,
  hostId: Schema.String,
  ownerKind: OwnerKind,
  ownerId: Schema.String,
  memMib: Schema.Number,
  vcpus: Schema.Number,
  vramMib: NullableNumber,
  createdAt: Schema.Number,
  lastHeartbeatAt: Schema.Number,
  expiresAt: NullableNumber,
  description: Schema.NullOr(Schema.String),
})

export const HostSummaryJson = Schema.Struct({
  hostId: Schema.String,
  totalMib: NullableNumber,
  reservedMib: Schema.Number,
  reservedVramMib: Schema.Number,
  activeEntries: Schema.Number,
  staleEntries: Schema.Number,
  utilizationPct: NullableNumber,
})

export const ClusterSummaryJson = Schema.Struct({
  hosts: Schema.Array(HostSummaryJson),
  totalMib: Schema.Number,
  reservedMib: Schema.Number,
  reservedVramMib: Schema.Number,
  activeEntries: Schema.Number,
  staleEntries: Schema.Number,
  utilizationPct: NullableNumber,
})

export const LedgerMetricsJson = Schema.Struct({
  totalReservedMib: Schema.Number,
  totalReleasedMib: Schema.Number,
  totalReclaimedMib: Schema.Number,
  reserveFailures: Schema.Number,
  activeEntries: Schema.Number,
})

export const FleetJson = Schema.Struct({
  hosts: Schema.Struct({
    total: Schema.Number,
    ready: Schema.Number,
    measured: Schema.Number,
    cordoned: Schema.Number,
    draining: Schema.Number,
  }),
  capacityMib: Schema.Number,
  reservedMib: Schema.Number,
  freeMib: Schema.Number,
  cpuBudget: Schema.Number,
  reservedVcpus: Schema.Number,
  freeVcpus: Schema.Number,
  queue: Schema.Struct({
    sessions: Schema.Number,
    memMib: Schema.Number,
    vcpus: Schema.Number,
    withoutRoom: Schema.Number,
  }),
  parks: Schema.Number,
  descentsRunning: Schema.Number,
  readAt: Schema.Number,
})

export const AssignmentsJson = Schema.Struct({
  hostId: Schema.String,
  /** Changes whenever the assignments change; pass it back as `since` to long-poll. */
  version: Schema.String,
  sessions: Schema.Array(SessionJson),
  moves: Schema.Array(MoveJson),
  /** The coordinator's limits that the agent's move guard uses (SPEC §5), so both sides agree. */
  limits: Schema.Struct({ commitAllowanceMs: Schema.Number }),
})

// ---------------------------------------------------------------------------------------------
// Payloads and queries (shapes only; the store's rules check ranges and name the field)
// ---------------------------------------------------------------------------------------------

// Ids in paths: NUL-free and bounded (PostgreSQL text cannot hold NUL); a malformed id is a 400.
// eslint-disable-next-line no-control-regex -- the NUL is the point: it is what the check refuses
const PathId = { id: Schema.String.check(Schema.isPattern(/^[^\u0000]{1,256}$/)) }

export const CreateHostBody = Schema.Struct({
  id: Schema.String,
  labels: Schema.optionalKey(Schema.Record(Schema.String, Schema.String)),
})

export const ReportBody = Schema.Struct({
  totalMib: NullableFinite,
  allocatableMib: NullableFinite,
  totalVcpus: NullableFinite,
})

export const CreateSessionBody = Schema.Struct({
  id: Schema.optionalKey(Schema.String),
  memMib: Schema.Finite,
  vcpus: Schema.Finite,
  affinity: Schema.optionalKey(Schema.Array(Schema.String)),
})

export const MoveBody = Schema.Struct({
  targetHostId: Schema.optionalKey(Schema.String),
  maxDowntimeMs: Schema.Finite,
})

export const AbortBody = Schema.Struct({
  reason: Schema.String,
  estimateMs: Schema.optionalKey(Schema.Finite),
})

export const ReserveBody = Schema.Struct({
  id: Schema.optionalKey(Schema.String),
  hostId: Schema.String,
  ownerKind: Schema.Literals(["capture", "external"]),
  ownerId: Schema.String,
  memMib: Schema.Finite,
  vcpus: Schema.Finite,
  vramMib: Schema.optionalKey(Schema.NullOr(Schema.Finite)),
  expiresAt: Schema.optionalKey(Schema.NullOr(Schema.Finite)),
  description: Schema.optionalKey(Schema.NullOr(Schema.String)),
})

const NonNegativeIntFromString = Schema.NumberFromString.check(Schema.isInt(), Schema.isGreaterThanOrEqualTo(0))

// ---------------------------------------------------------------------------------------------
// Auth
// ---------------------------------------------------------------------------------------------

/** Who made the request: the admin, or a host agent acting for its own host. */
export type Principal = { readonly _tag: "Admin" } | { readonly _tag: "Host"; readonly hostId: string }

/** The authenticated caller of the current request. */
export class CurrentPrincipal extends Context.Service<CurrentPrincipal, Principal>()("@engram/coordinator/CurrentPrincipal") {}

/** `Authorization: Bearer <token>`: the admin token or a host's own token. */
export class BearerAuth extends HttpApiMiddleware.Service<BearerAuth, { provides: CurrentPrincipal }>()(
  "@engram/coordinator/BearerAuth",
  { security: { bearer: HttpApiSecurity.bearer }, error: [Unauthorized, ServiceUnavailableResponse], requiredForClient: true },
) {}

/** Turns request decode failures into `400 {error, field, rule}`. */
export class InputErrors extends HttpApiMiddleware.Service<InputErrors>()("@engram/coordinator/InputErrors", {
  error: BadRequest,
}) {}

// ---------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------

/** `GET /healthz`: the only endpoint without a credential. */
export class HealthGroup extends HttpApiGroup.make("health", { topLevel: true }).add(
  HttpApiEndpoint.get("healthz", "/healthz", { success: Schema.Struct({ ok: Schema.Boolean }) }),
) {}

export class OpsGroup extends HttpApiGroup.make("ops", { topLevel: true })
  .add(
    HttpApiEndpoint.get("readyz", "/readyz", {
      success: Schema.Struct({ ok: Schema.Boolean, store: Schema.String, leader: Schema.Boolean }),
      error: ServiceUnavailableResponse,
    }),
    HttpApiEndpoint.get("metrics", "/metrics", { success: Schema.String.pipe(HttpApiSchema.asText({ contentType: "text/plain; version=0.0.4" })) }),
    HttpApiEndpoint.get("openapi", "/openapi.json", { success: Schema.Unknown }),
  )
  .middleware(BearerAuth) {}

export class HostsGroup extends HttpApiGroup.make("hosts")
  .add(
    HttpApiEndpoint.post("create", "/v1/hosts", {
      payload: CreateHostBody,
      success: Schema.Struct({ id: Id, token: Schema.String }).pipe(HttpApiSchema.status(201)),
      error: StandardErrors,
    }),
    HttpApiEndpoint.get("list", "/v1/hosts", { success: Schema.Array(HostJson), error: StandardErrors }),
    HttpApiEndpoint.get("get", "/v1/hosts/:id", { params: PathId, success: HostJson, error: StandardErrors }),
    HttpApiEndpoint.put("report", "/v1/hosts/:id/report", { params: PathId, payload: ReportBody, success: HostJson, error: StandardErrors }),
    HttpApiEndpoint.post("heartbeat", "/v1/hosts/:id/heartbeat", {
      params: PathId,
      success: Schema.Struct({ hostId: Schema.String, renewed: Schema.Number }),
      error: StandardErrors,
    }),
    HttpApiEndpoint.post("cordon", "/v1/hosts/:id/cordon", { params: PathId, success: HostJson, error: StandardErrors }),
    HttpApiEndpoint.post("uncordon", "/v1/hosts/:id/uncordon", { params: PathId, success: HostJson, error: StandardErrors }),
    HttpApiEndpoint.post("drain", "/v1/hosts/:id/drain", { params: PathId, success: HostJson, error: StandardErrors }),
    HttpApiEndpoint.get("assignments", "/v1/hosts/:id/assignments", {
      params: PathId,
      query: { waitMs: Schema.optionalKey(NonNegativeIntFromString), since: Schema.optionalKey(Schema.String) },
      success: AssignmentsJson,
      error: StandardErrors,
    }),
  )
  .middleware(BearerAuth) {}

export class SessionsGroup extends HttpApiGroup.make("sessions")
  .add(
    HttpApiEndpoint.post("create", "/v1/sessions", { payload: CreateSessionBody, success: PlaceAnswers, error: StandardErrors }),
    HttpApiEndpoint.get("list", "/v1/sessions", {
      query: { state: Schema.optionalKey(SessionState), hostId: Schema.optionalKey(Schema.String) },
      success: Schema.Array(SessionJson),
      error: StandardErrors,
    }),
    HttpApiEndpoint.get("get", "/v1/sessions/:id", { params: PathId, success: SessionJson, error: StandardErrors }),
    HttpApiEndpoint.post("idle", "/v1/sessions/:id/idle", {
      params: PathId,
      success: Schema.Struct({ id: Id, state: SessionState }),
      error: StandardErrors,
    }),
    HttpApiEndpoint.post("resume", "/v1/sessions/:id/resume", { params: PathId, success: PlaceAnswers, error: StandardErrors }),
    HttpApiEndpoint.post("started", "/v1/sessions/:id/started", { params: PathId, success: SessionJson, error: StandardErrors }),
    HttpApiEndpoint.post("descended", "/v1/sessions/:id/descended", { params: PathId, success: SessionJson, error: StandardErrors }),
    HttpApiEndpoint.delete("end", "/v1/sessions/:id", { params: PathId, success: SessionJson, error: StandardErrors }),
    HttpApiEndpoint.post("move", "/v1/sessions/:id/move", {
      params: PathId,
      payload: MoveBody,
      success: MoveCommitted,
      error: StandardErrors,
    }),
  )
  .middleware(BearerAuth) {}

export class MovesGroup extends HttpApiGroup.make("moves")
  .add(
    HttpApiEndpoint.get("get", "/v1/moves/:id", { params: PathId, success: MoveJson, error: StandardErrors }),
    HttpApiEndpoint.post("round", "/v1/moves/:id/rounds", { params: PathId, payload: MoveRoundJson, success: MoveJson, error: StandardErrors }),
    HttpApiEndpoint.post("commit", "/v1/moves/:id/commit", { params: PathId, payload: MovePhasesJson, success: MoveJson, error: StandardErrors }),
    HttpApiEndpoint.post("abort", "/v1/moves/:id/abort", { params: PathId, payload: AbortBody, success: MoveJson, error: StandardErrors }),
  )
  .middleware(BearerAuth) {}

export class FleetGroup extends HttpApiGroup.make("fleet")
  .add(
    HttpApiEndpoint.get("snapshot", "/v1/fleet", { success: FleetJson, error: StandardErrors }),
    HttpApiEndpoint.get("noFit", "/v1/placement/no-fit", {
      query: { memMib: Schema.NumberFromString, vcpus: Schema.NumberFromString },
      success: Schema.Struct({ fits: Schema.Boolean, hosts: Schema.Array(NoFitDetail) }),
      error: StandardErrors,
    }),
  )
  .middleware(BearerAuth) {}

export class LedgerGroup extends HttpApiGroup.make("ledger")
  .add(
    HttpApiEndpoint.post("reserve", "/v1/reservations", {
      payload: ReserveBody,
      success: ReservationJson.pipe(HttpApiSchema.status(201)),
      error: StandardErrors,
    }),
    HttpApiEndpoint.get("list", "/v1/reservations", {
      query: { hostId: Schema.optionalKey(Schema.String) },
      success: Schema.Array(ReservationJson),
      error: StandardErrors,
    }),
    HttpApiEndpoint.get("get", "/v1/reservations/:id", { params: PathId, success: ReservationJson, error: StandardErrors }),
    HttpApiEndpoint.delete("release", "/v1/reservations/:id", { params: PathId, success: ReservationJson, error: StandardErrors }),
    HttpApiEndpoint.post("heartbeat", "/v1/reservations/:id/heartbeat", { params: PathId, success: ReservationJson, error: StandardErrors }),
    HttpApiEndpoint.get("summary", "/v1/ledger/summary", { success: ClusterSummaryJson, error: StandardErrors }),
    HttpApiEndpoint.get("metrics", "/v1/ledger/metrics", { success: LedgerMetricsJson, error: StandardErrors }),
  )
  .middleware(BearerAuth) {}

/** The coordinator's API. */
export class CoordinatorApi extends HttpApi.make("engram-coordinator")
  .add(HealthGroup)
  .add(OpsGroup)
  .add(HostsGroup)
  .add(SessionsGroup)
  .add(MovesGroup)
  .add(FleetGroup)
  .add(LedgerGroup)
  .middleware(InputErrors)
  .annotateMerge(
    OpenApi.annotations({
      title: "engram coordinator",
      description: "Sessions, hosts, moves, the reservation ledger and the fleet signal. Every endpoint but GET /healthz needs `Authorization: Bearer <token>`.",
    }),
  ) {}
