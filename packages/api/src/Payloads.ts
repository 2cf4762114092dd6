/**
 * What requests carry: JSON bodies, path ids and query strings. Shapes only: the store's rules
 * check ranges and ids and name the field they refuse (a 400 `{error, field, rule}`).
 */
import { Schema } from "effect"
import { MovePhases, MoveRound, SessionState } from "./Records.js"

// Ids in paths: NUL-free and bounded (PostgreSQL text cannot hold NUL); a malformed id is a 400.
// eslint-disable-next-line no-control-regex -- the NUL is the point: it is what the check refuses
const PathIdString = Schema.String.check(Schema.isPattern(/^[^\u0000]{1,256}$/))

/** The `{id}` of a path. */
export const PathId = { id: PathIdString }

const NullableFinite = Schema.NullOr(Schema.Finite)
const NonNegativeIntFromString = Schema.NumberFromString.check(Schema.isInt(), Schema.isGreaterThanOrEqualTo(0))

/** `POST /v1/hosts`. */
export const CreateHost = Schema.Struct({
  id: Schema.String,
  labels: Schema.optionalKey(Schema.Record(Schema.String, Schema.String)),
})
export type CreateHost = typeof CreateHost.Type

/** `PUT /v1/hosts/{id}/report`: what the agent measured; null = not measured. */
export const Report = Schema.Struct({
  totalMib: NullableFinite,
  allocatableMib: NullableFinite,
  totalVcpus: NullableFinite,
})
export type Report = typeof Report.Type

/** `GET /v1/hosts/{id}/assignments`: long-poll up to `waitMs` (capped at 30 s) for a version other than `since`. */
export const AssignmentsQuery = {
  waitMs: Schema.optionalKey(NonNegativeIntFromString),
  since: Schema.optionalKey(Schema.String),
}

/** `POST /v1/sessions`: a budget, optional id (a UUID is generated) and preferred hosts. */
export const CreateSession = Schema.Struct({
  id: Schema.optionalKey(Schema.String),
  memMib: Schema.Finite,
  vcpus: Schema.Finite,
  affinity: Schema.optionalKey(Schema.Array(Schema.String)),
})
export type CreateSession = typeof CreateSession.Type

/** `GET /v1/sessions`. */
export const SessionsQuery = {
  state: Schema.optionalKey(SessionState),
  hostId: Schema.optionalKey(Schema.String),
}

/** `POST /v1/sessions/{id}/move`: a target (default: the best-ranked host) and the downtime budget. */
export const StartMove = Schema.Struct({
  targetHostId: Schema.optionalKey(Schema.String),
  maxDowntimeMs: Schema.Finite,
})
export type StartMove = typeof StartMove.Type

/** `POST /v1/moves/{id}/rounds`. */
export const Round = MoveRound
export type Round = typeof Round.Type

/** `POST /v1/moves/{id}/commit`. */
export const Commit = MovePhases
export type Commit = typeof Commit.Type

/**
 * `POST /v1/moves/{id}/abort`: why, and for a downtime refusal the estimate it was refused on
 * (kept on the move as `abortEstimateMs`; the waiter answers `ErrMoveDowntime` with it).
 */
export const Abort = Schema.Struct({
  reason: Schema.String,
  estimateMs: Schema.optionalKey(Schema.Finite),
})
export type Abort = typeof Abort.Type

/** `GET /v1/placement/no-fit`: the budget to judge. */
export const NoFitQuery = { memMib: Schema.NumberFromString, vcpus: Schema.NumberFromString }

/** `POST /v1/reservations`: `capture` or `external` (sessions and moves reserve through placement). */
export const Reserve = Schema.Struct({
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
export type Reserve = typeof Reserve.Type

/** `GET /v1/reservations`. */
export const ReservationsQuery = { hostId: Schema.optionalKey(Schema.String) }
