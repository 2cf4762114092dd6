/**
 * The store's typed errors. Every store operation fails with one of these, and the apps map
 * each to one HTTP answer: NotFound 404, Conflict 409, IllegalTransition 409, Refused 409 (or
 * 503 for a move's downtime), InvalidInput 400, Unavailable 503 with a retry hint.
 */
import type { Placement, Session } from "@engram/core"
import { Schema } from "effect"

/** The kinds of record a store holds. */
export const Entity = Schema.Literals(["host", "session", "reservation", "move"])
export type Entity = typeof Entity.Type

/** No record with this id. */
export class NotFound extends Schema.TaggedError<NotFound>()("NotFound", {
  entity: Entity,
  id: Schema.String,
}) {
  override get message(): string {
    return `${this.entity} ${this.id} not found`
  }
}

/**
 * A conflict: the id exists already, a compare-and-set lost its race, or a session already
 * has an open move. Nothing was changed; re-read and decide again.
 */
export class Conflict extends Schema.TaggedError<Conflict>()("Conflict", {
  entity: Entity,
  id: Schema.String,
  reason: Schema.String,
  /** On a session that exists (a repeated create): its state. */
  state: Schema.optionalKey(Schema.String),
}) {
  override get message(): string {
    return `${this.entity} ${this.id}: ${this.reason}`
  }
}

/**
 * A credential hash another host holds already, given to host `hostId` (a registration or a
 * rotation): a host token authenticates one host, so a hash is never issued twice. Both stores
 * refuse it alike; the hash itself is not named.
 */
export const tokenHashTaken = (hostId: string): Conflict =>
  new Conflict({ entity: "host", id: hostId, reason: "tokenHash is held by another host: a host token authenticates one host" })

/** A session state change the life cycle does not allow (SPEC §2). Nothing was changed. */
export class IllegalTransition extends Schema.TaggedError<IllegalTransition>()("IllegalTransition", {
  sessionId: Schema.String,
  from: Schema.String,
  to: Schema.String,
  reason: Schema.String,
}) {
  override get message(): string {
    return this.reason
  }
}

/**
 * A refusal by policy: a ledger admission check (SPEC §3, `check` names it, `reason`
 * carries the figures) or a move target with no room (`check = "no_fit"`).
 */
export class Refused extends Schema.TaggedError<Refused>()("Refused", {
  check: Schema.String,
  reason: Schema.String,
}) {
  override get message(): string {
    return this.reason
  }
}

/** One host's reason in a `NoRoom` refusal (core's `NoFitDetail`). */
const NoFitDetail = Schema.Struct({
  hostId: Schema.String,
  reason: Schema.String,
  freeMib: Schema.NullOr(Schema.Number),
  freeVcpus: Schema.NullOr(Schema.Number),
})

/**
 * A create that asked to be refused rather than queued (`onNoRoom: "refuse"`) found no host:
 * nothing was stored. Carries why each host does not fit, and whether the budget is too big
 * for every host (SPEC §12).
 */
export class NoRoom extends Schema.TaggedError<NoRoom>()("NoRoom", {
  sessionId: Schema.String,
  noFit: Schema.Array(NoFitDetail),
  tooBig: Schema.Boolean,
}) {
  override get message(): string {
    return this.tooBig
      ? `session ${this.sessionId} is too big for every host, even an empty one`
      : `no host has room for session ${this.sessionId} now (${this.noFit.length} hosts)`
  }
}

/** Input that breaks a rule: names the field and the rule. Nothing was changed. */
export class InvalidInput extends Schema.TaggedError<InvalidInput>()("InvalidInput", {
  field: Schema.String,
  rule: Schema.String,
}) {
  override get message(): string {
    return `${this.field} ${this.rule}`
  }
}

/**
 * The backend is down, timed out, or kept losing transient conflicts. Nothing was changed
 * (the operation's transaction did not commit); retry after `retryAfterMs`. `kind` names a
 * cause the operator must act on: `disk_full`, the store's disk has no room for a write (reads
 * still work; writes fail until room is freed); `read_only`, the database refuses writes (a hot
 * standby after a failover, or `default_transaction_read_only`); or one that says the store is
 * healthy: `contended`, the operation lost to concurrent work (`storeUnhealthy`).
 */
export class Unavailable extends Schema.TaggedError<Unavailable>()("Unavailable", {
  reason: Schema.String,
  retryAfterMs: Schema.Number,
  /**
   * What kind of unavailability, where it is known: `disk_full` (writes refused until room is
   * freed), `read_only` (writes refused by a database that only reads: SQLSTATE 25006),
   * `timed_out` (the database did not answer in time: the caller's bound or the server's
   * `statement_timeout`, one cause however it showed), `contended` (the database answered, but
   * the operation lost to concurrent work on it: a lock wait past `lock_timeout`, serialization
   * failures or deadlocks that persisted through the retries, a version check that kept losing).
   */
  kind: Schema.optionalKey(Schema.Literals(["disk_full", "read_only", "timed_out", "contended"])),
}) {
  override get message(): string {
    return `store unavailable: ${this.reason}`
  }
}

/**
 * Whether `e` says the store is unhealthy (down, timed out, its connection lost, its disk full,
 * read-only): not when the operation only lost to concurrent work on a database that answered
 * (`contended`), nor when a write made under a lease was refused because a newer leader exists
 * ("fenced"). A leader that steps down for a busy but healthy store only moves the contention.
 */
export const storeUnhealthy = (e: { readonly reason: string; readonly kind?: Unavailable["kind"] | undefined }): boolean => e.kind !== "contended" && !e.reason.startsWith("fenced")

/** Every error a store operation can fail with. */
export type StoreError = NotFound | Conflict | IllegalTransition | Refused | InvalidInput | NoRoom | Unavailable

/** The store error for core's refusal of an operation on session `sessionId`: one mapping for every store. */
export const fromRefusal = (sessionId: string, refusal: Session.Refusal): NotFound | IllegalTransition | Conflict => {
  switch (refusal._tag) {
    case "NotFound":
      return new NotFound({ entity: "session", id: sessionId })
    case "Illegal":
      return new IllegalTransition({ sessionId: refusal.sessionId, from: refusal.from, to: refusal.to, reason: refusal.message })
    case "Conflict":
      return new Conflict({ entity: refusal.entity, id: refusal.id, reason: refusal.reason, ...(refusal.state === undefined ? {} : { state: refusal.state }) })
  }
}

/**
 * The store error for core's refusal of a commit or an abort of move `moveId`: a finished move,
 * or a session that is not moving (never, while the store is consistent), is a `Conflict` on the move.
 */
export const fromMoveRefusal = (moveId: string, refusal: Session.Refusal): Conflict =>
  refusal._tag === "Conflict"
    ? new Conflict({ entity: refusal.entity, id: refusal.id, reason: refusal.reason })
    : new Conflict({ entity: "move", id: moveId, reason: refusal._tag === "Illegal" ? refusal.message : "its session is gone" })

/**
 * The store error for a move target core's host choice refused (`Placement.choose`): the
 * source itself is `InvalidInput` naming `targetHostId`, an unknown host `NotFound`, no room
 * `Refused` with check `no_fit`. Null when a host was chosen.
 */
export const fromTargetChoice = (choice: Placement.Chosen): InvalidInput | NotFound | Refused | null => {
  switch (choice._tag) {
    case "Chosen":
      return null
    case "SameHost":
      return new InvalidInput({ field: "targetHostId", rule: "must differ from the source host" })
    case "UnknownHost":
      return new NotFound({ entity: "host", id: choice.hostId })
    case "NoFit":
      return new Refused({ check: "no_fit", reason: choice.message })
  }
}
