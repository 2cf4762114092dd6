/**
 * What requests carry: JSON bodies, path ids and query strings. Mostly shapes: the store's rules
 * check ranges and ids and name the field they refuse (a 400 `{error, field, rule}`). The ids a
 * client chooses (a host's, a session's, a reservation's and its owner), host ids that only
 * select (query filters, a move's target) and a session's affinity keep core's rules here too,
 * in the store's words, so the OpenAPI document states them (`pattern`, `minLength`,
 * `maxLength`, `maxItems`, `uniqueItems`) as the server enforces them.
 */
import { Names } from "@engram/core"
import { Schema } from "effect"
import { MoveGuardReport, MoveState, MovePhases, MoveRound, SessionState } from "./Records.js"

// A high surrogate not followed by a low one, or a low one not preceded by a high one.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/** Text a store can hold as it was sent: no NUL (PostgreSQL text cannot hold it) and no lone surrogate (UTF-8 cannot encode it). */
export const Text = Schema.String.check(
  Schema.makeFilter((s: string) =>
    s.includes("\u0000") ? "must not contain a NUL character" : LONE_SURROGATE.test(s) ? "must not contain a lone surrogate (text must be valid Unicode)" : undefined,
  ),
)

/**
 * An id by core's one id rule (`Names.idPattern` and `Names.idMaxLength`, in words
 * `Names.idRule`): the decoder refuses by it (a 400 naming the field and the rule) and the
 * OpenAPI document publishes it as the field's `pattern`, `minLength` and `maxLength`, so the two
 * cannot drift. Not a string at all is refused with the same words.
 */
export const Id = Schema.String.annotate({ message: Names.idRule }).check(
  Schema.isMinLength(1, { message: Names.idRule }),
  Schema.isMaxLength(Names.idMaxLength, { message: Names.idRule }),
  Schema.isPattern(Names.idPattern, { message: Names.idRule }),
)

/** A reservation's owner: text a store can hold, not empty (`Names.ownerIdRule`, the store's words). */
export const OwnerId = Schema.String.annotate({ message: Names.ownerIdRule }).check(
  Schema.isMinLength(1, { message: Names.ownerIdRule }),
  Schema.makeFilter((s: string) => (s.includes("\u0000") || LONE_SURROGATE.test(s) ? Names.ownerIdRule : undefined)),
)

/** A host id that selects (a filter, a move's target): the id rule, so one that no host can have is refused, not matched against nothing. */
export const HostIdRef = Id

/**
 * A session's preferred hosts, in order of preference: at most `Names.maxAffinityHosts` (64) host
 * ids, each once, with the store's words (`Validate.affinity`, core's rules); published as the
 * array's `maxItems` and `uniqueItems` and each item's `pattern`.
 */
export const Affinity = Schema.Array(HostIdRef)
  .annotate({ message: Names.affinityRule })
  .check(
    Schema.isMaxLength(Names.maxAffinityHosts, { message: Names.affinityRule }),
    Schema.makeFilter(
      (hosts: readonly string[]) => {
        const repeat = Names.affinityRepeat(hosts)
        return repeat === null ? undefined : { path: [repeat[0]], issue: Names.affinityRepeatRule(repeat[1]) }
      },
      { expected: "each host once", toJsonSchema: () => ({ uniqueItems: true }) },
    ),
  )

// Ids in paths: text and bounded; a malformed id is a 400 (an id longer than any that can be stored is a 404).
const PathIdString = Text.check(Schema.isMinLength(1), Schema.isMaxLength(256))

/** The `{id}` of a path. */
export const PathId = { id: PathIdString }

/**
 * An integer in a query string, by core's one rule for integers read from text (`Names.decimalInt`,
 * in words `Names.decimalIntRule`): `?limit=0x10` is refused, not 16, and so is a 16th digit.
 */
export const DecimalIntFromString = Schema.String.check(Schema.isPattern(Names.decimalInt, { message: Names.decimalIntRule })).pipe(
  Schema.decodeTo(Schema.NumberFromString),
)

const PageLimit = DecimalIntFromString.check(Schema.isGreaterThanOrEqualTo(1), Schema.isLessThanOrEqualTo(1000))

/** `?limit=&cursor=` of every list: at most `limit` items (default 100, at most 1000) after the opaque `cursor` of a previous page. */
export const PageQuery = {
  limit: Schema.optionalKey(PageLimit),
  cursor: Schema.optionalKey(Schema.String),
}

const NullableFinite = Schema.NullOr(Schema.Finite)
const NonNegativeIntFromString = DecimalIntFromString.check(Schema.isGreaterThanOrEqualTo(0))

/** `POST /v1/hosts`. */
export const CreateHost = Schema.Struct({
  id: Id,
  labels: Schema.optionalKey(Schema.Record(Schema.String, Schema.String)),
})
export type CreateHost = typeof CreateHost.Type

/**
 * `PUT /v1/hosts/{id}/report`: what the agent measured; null or absent = not measured (an
 * explicit `allocatableMib: 0` is a full host, SPEC §12).
 */
export const Report = Schema.Struct({
  totalMib: Schema.optionalKey(NullableFinite),
  allocatableMib: Schema.optionalKey(NullableFinite),
  totalVcpus: Schema.optionalKey(NullableFinite),
  /**
   * The sessions whose guest was active since the agent's last report (for QEMU: guest CPU time
   * grew). Each restarts its idle clock; absent = no activity measured.
   */
  activeSessions: Schema.optionalKey(Schema.Array(Schema.String)),
  /**
   * The templates the host's runtime holds, each name once (`name`: 1-100 of `[A-Za-z0-9._-]`,
   * not starting with `.`; `memMib`, `vcpus`: integers > 0). Placement prefers a host holding a
   * session's template; absent = none.
   */
  templates: Schema.optionalKey(Schema.Array(Schema.Struct({ name: Schema.String, memMib: Schema.Finite, vcpus: Schema.Finite }))),
  /**
   * Where the host's agent serves its peers: an absolute `http://` or `https://` URL (at most
   * 2048 characters, naming a host peers reach: not a wildcard such as 0.0.0.0 or ::; no spaces,
   * no `user:password@`, query or fragment). The coordinator gives it
   * to the source of each move to this host. Absent or null: none (each report replaces the last's).
   */
  peerUrl: Schema.optionalKey(Schema.NullOr(Schema.String)),
})
export type Report = typeof Report.Type

/** The longest an assignments request waits (a longer `waitMs` is cut to it); an agent's poll wait is at most this. */
export const maxAssignmentsWaitMs = 30_000

/** `GET /v1/hosts/{id}/assignments`: long-poll up to `waitMs` (capped at `maxAssignmentsWaitMs`, 30 s) for a version other than `since`. */
export const AssignmentsQuery = {
  waitMs: Schema.optionalKey(NonNegativeIntFromString),
  since: Schema.optionalKey(Schema.String),
}

/** `GET /v1/hosts/{id}/allowances?targetHostId=`: also the pair to this target, though it has no commits of its own. */
export const AllowancesQuery = {
  targetHostId: Schema.optionalKey(HostIdRef),
}

/** What a create does when nothing fits: `queue` (the default) or `refuse` (409 `NoRoom`, nothing stored). */
export const OnNoRoom = Schema.Literals(["queue", "refuse"])

/** `POST /v1/sessions`: a budget, optional id (a UUID is generated), preferred hosts, and what to do without room. */
export const CreateSession = Schema.Struct({
  id: Schema.optionalKey(Id),
  memMib: Schema.Finite,
  vcpus: Schema.Finite,
  /** The preferred hosts, in order of preference: at most 64 host ids, each once (the store's rule, `Validate.affinity`). */
  affinity: Schema.optionalKey(Affinity),
  onNoRoom: Schema.optionalKey(OnNoRoom),
  /** No reported guest activity for this long (ms) makes the running session idle; the park gate then parks or descends it. */
  idleTimeoutMs: Schema.optionalKey(Schema.Finite),
  /** The session ends this long (ms) after its create, whatever its state; `PUT /v1/sessions/{id}/ttl` sets it anew. */
  ttlMs: Schema.optionalKey(Schema.Finite),
  /** The template the session starts from instead of a boot (1-100 of `[A-Za-z0-9._-]`, not starting with `.`); hosts holding it are preferred. */
  template: Schema.optionalKey(Schema.String),
})
export type CreateSession = typeof CreateSession.Type

/** `PUT /v1/sessions/{id}/ttl`: the session ends `ttlMs` from now. */
export const SetTtl = Schema.Struct({ ttlMs: Schema.Finite })
export type SetTtl = typeof SetTtl.Type

/** `GET /v1/sessions`: filters and a page. */
export const SessionsQuery = {
  state: Schema.optionalKey(SessionState),
  hostId: Schema.optionalKey(HostIdRef),
  ...PageQuery,
}

/** The longest a wait for a state may last. */
export const maxWaitTimeoutMs = 60_000

/** `GET /v1/sessions/{id}/wait`: the state to wait for, and for how long (default 30 s, at most 60 s). */
export const WaitQuery = {
  state: SessionState,
  timeoutMs: Schema.optionalKey(
    DecimalIntFromString.check(Schema.isGreaterThanOrEqualTo(0), Schema.isLessThanOrEqualTo(maxWaitTimeoutMs)),
  ),
}

/**
 * `POST /v1/sessions/{id}/descended`: `image=none` when the descent left no image (its agent found
 * neither the guest nor an image, and told the loss first): the session then names no image host.
 * Absent: the host it descended on holds the image.
 */
export const DescendedQuery = {
  image: Schema.optionalKey(Schema.Literal("none")),
}

/** `GET /v1/moves`: the source or target host, the state, and a page. */
export const MovesQuery = {
  hostId: Schema.optionalKey(HostIdRef),
  state: Schema.optionalKey(MoveState),
  ...PageQuery,
}

/** `POST /v1/sessions/{id}/move`: a target (default: the best-ranked other host that takes moves, its agent advertising a peer URL) and the downtime budget. */
export const StartMove = Schema.Struct({
  targetHostId: Schema.optionalKey(HostIdRef),
  maxDowntimeMs: Schema.Finite,
})
export type StartMove = typeof StartMove.Type

/**
 * `POST /v1/moves/{id}/rounds`: the round's figures and, optionally, its position `seq` (how many
 * records the move held before it, the intent included): recorded once at that position, a
 * repeat with the same figures changes nothing (the store's rule: an integer >= 0, else a 400
 * naming `seq`). Without it the round is appended (an older source).
 */
export const Round = Schema.Struct({ ...MoveRound.fields, seq: Schema.optionalKey(Schema.Finite) })
export type Round = typeof Round.Type

/** `POST /v1/moves/{id}/commit`: the phases, and what the source's guard decided on (kept on the move). */
export const Commit = Schema.Struct({ ...MovePhases.fields, guard: Schema.optionalKey(MoveGuardReport) })
export type Commit = typeof Commit.Type

/** The longest reason a caller sends (core's `Names.maxReasonLength`; a store keeps a little more: what the coordinator adds, as "resolved by …"). */
export const maxReasonLength = Names.maxReasonLength

const Reason = Schema.String.check(Schema.isMaxLength(maxReasonLength, { message: `must be at most ${maxReasonLength} characters` }))

/**
 * `POST /v1/moves/{id}/abort`: why, and for a downtime refusal the estimate it was refused on
 * (kept on the move as `abortEstimateMs`; the waiter answers `ErrMoveDowntime` with it).
 */
export const Abort = Schema.Struct({
  reason: Reason,
  estimateMs: Schema.optionalKey(Schema.Finite),
})
export type Abort = typeof Abort.Type

/**
 * `POST /v1/moves/{id}/resolve`: ends an in-doubt move (SPEC §13). `commit`: the target runs the
 * guest (its agent's report, or an operator's word); `abort`: it runs on the source. `reason` is
 * kept on an aborted move.
 */
export const Resolve = Schema.Struct({
  outcome: Schema.Literals(["commit", "abort"]),
  reason: Reason,
})
export type Resolve = typeof Resolve.Type

/**
 * `POST /v1/moves/{id}/resend`: the move's source owes its target a resend (`owed: true`: it holds
 * the guest's only whole copy, paused; the target never got a complete stream) or no longer does
 * (`owed: false`: the target runs the guest, or the session went elsewhere or ended).
 * `seenClears` (optional, an integer >= 0; else a 400 naming it): the move's `resendClears` the
 * source read before its tell; a tell naming fewer clears than the move holds changes nothing
 * (the target cleared the mark since, before it resumed: a tell that reached the coordinator late
 * must not set it again). Absent (an older source's agent): the mark is set as before the count.
 */
export const ResendMark = Schema.Struct({ owed: Schema.Boolean, seenClears: Schema.optionalKey(Schema.Finite) })
export type ResendMark = typeof ResendMark.Type

/**
 * `POST /v1/hosts/{id}/guest-lost`: the session whose guest the host's agent lost and booted
 * fresh, and why (its agent's words, e.g. \`QEMU exited\`, \`not found at start\`; not empty).
 */
export const GuestLost = Schema.Struct({
  sessionId: Id,
  reason: Reason.check(Schema.isMinLength(1, { message: "must not be empty" })),
})
export type GuestLost = typeof GuestLost.Type

/** `GET /v1/placement/no-fit`: the budget to judge. */
export const NoFitQuery = { memMib: DecimalIntFromString, vcpus: DecimalIntFromString }

/** `POST /v1/reservations`: `capture` or `external` (sessions and moves reserve through placement). */
export const Reserve = Schema.Struct({
  id: Schema.optionalKey(Id),
  hostId: Id,
  ownerKind: Schema.Literals(["capture", "external"]),
  ownerId: OwnerId,
  memMib: Schema.Finite,
  vcpus: Schema.Finite,
  vramMib: Schema.optionalKey(Schema.NullOr(Schema.Finite)),
  expiresAt: Schema.optionalKey(Schema.NullOr(Schema.Finite)),
  /** The expiry from now on the coordinator's (the store's) clock, instead of `expiresAt`: a client's own clock does not set it. */
  expiresInMs: Schema.optionalKey(Schema.Finite),
  description: Schema.optionalKey(Schema.NullOr(Schema.String)),
})
export type Reserve = typeof Reserve.Type

/** `GET /v1/reservations`: a host, and a page. */
export const ReservationsQuery = { hostId: Schema.optionalKey(HostIdRef), ...PageQuery }
