/**
 * The records a call answers, as the client decodes them: `@engram/api`'s schemas, widened by
 * the fields of the session-lifecycle contract that a coordinator may or may not send yet
 * (a queued session's `queue`, a resume's `resumed`, the fleet's `unplaceable`, session
 * events). A field the coordinator does not send is absent, never invented.
 */
import { Records } from "@engram/api"
import { Schema } from "effect"

export type Budget = Records.Budget
export type Host = Records.Host
export type HostCreated = Records.HostCreated
export type Move = Records.Move
export type MoveCommitted = Records.MoveCommitted
export type Reservation = Records.Reservation
export type ClusterSummary = Records.ClusterSummary
export type LedgerMetrics = Records.LedgerMetrics
export type NoFit = Records.NoFit
export type NoFitDetail = Records.NoFitDetail
export type Ready = Records.Ready
export type SessionState = Records.SessionState
export type HostState = Records.HostState
export type MoveState = Records.MoveState

const optional = Schema.optionalKey

/** Where a queued session stands: its 1-based position, each host's reason, and whether no host could ever take it. */
export const QueueInfo = Schema.Struct({
  position: Schema.Finite,
  noFit: Schema.Array(Records.NoFitDetail),
  tooBig: Schema.Boolean,
})
export type QueueInfo = typeof QueueInfo.Type

/** A session; `queue` is set (by coordinators that send it) while it is queued. */
export const Session = Schema.Struct({ ...Records.Session.fields, queue: optional(Schema.NullOr(QueueInfo)) })
export type Session = typeof Session.Type

/** How a resume brought a session back: warm (unparked on its host) or cold (restored from its descent image). */
export const Resumed = Schema.Literals(["warm", "cold"])
export type Resumed = typeof Resumed.Type

/** A create or resume that holds a host (201), or a warm resume (200). */
export const Placed = Schema.Struct({ ...Records.Placed.fields, resumed: optional(Resumed) })
export type Placed = typeof Placed.Type

/** A create or resume that waits in the queue (202): its position and why nothing fits. */
export const Queued = Schema.Struct({ ...Records.Queued.fields, resumed: optional(Resumed), tooBig: optional(Schema.Boolean) })
export type Queued = typeof Queued.Type

/** The answer of a create or a resume. */
export type PlaceAnswer = ({ readonly outcome: "placed" } & Placed) | ({ readonly outcome: "queued" } & Queued)

/** Queued sessions that no host could take even empty: how many and the largest budget (the cue for a bigger host). */
export const Unplaceable = Schema.Struct({ count: Schema.Finite, largestMemMib: Schema.NullOr(Schema.Finite), largestVcpus: Schema.NullOr(Schema.Finite) })
export type Unplaceable = typeof Unplaceable.Type

/** The fleet signal. */
export const Fleet = Schema.Struct({ ...Records.Fleet.fields, unplaceable: optional(Unplaceable) })
export type Fleet = typeof Fleet.Type

/** One entry of a session's history (`kind`: created, placed, parked, yielded, descended, resumed, moved, lost, ended…). */
export const SessionEvent = Schema.StructWithRest(
  Schema.Struct({ seq: Schema.Finite, at: Schema.Finite, kind: Schema.String, hostId: optional(Schema.NullOr(Schema.String)) }),
  [Schema.Record(Schema.String, Schema.Unknown)],
)
export type SessionEvent = typeof SessionEvent.Type

/** The answer of a host token rotation: the new token (the old one stops working). */
export const HostToken = Schema.Struct({ token: Schema.String })
export type HostToken = typeof HostToken.Type
