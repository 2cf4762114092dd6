/**
 * The records the API answers with, as JSON schemas. Literal unions come from `@engram/core`
 * (one list per word); numbers are plain finite JSON numbers, RAM in MiB, times in epoch ms.
 */
import { Ledger, Names, Session as CoreSession } from "@engram/core"
import { Schema } from "effect"

const Id = Schema.String
const Num = Schema.Finite
const NullableNum = Schema.NullOr(Schema.Finite)

/** A session's state (SPEC §2). */
export const SessionState = Schema.Literals(CoreSession.states)
export type SessionState = typeof SessionState.Type
/** A host's administrative state. */
export const HostState = Schema.Literals(Names.hostStates)
export type HostState = typeof HostState.Type
/** Who holds a reservation. */
export const OwnerKind = Schema.Literals(Ledger.ownerKinds)
export type OwnerKind = typeof OwnerKind.Type
/** The reasons a candidate host does not take a budget that this release knows (SPEC §2, §12). */
export const KnownNoFitReason = Schema.Literals(Names.noFitReasons)
export type KnownNoFitReason = typeof KnownNoFitReason.Type
/** The known reasons, in the order core names them. */
export const knownNoFitReasons: readonly KnownNoFitReason[] = Names.noFitReasons
/** Whether a decoded reason is one this release knows. */
export const isKnownNoFitReason = (reason: string): reason is KnownNoFitReason => (knownNoFitReasons as readonly string[]).includes(reason)
/**
 * Why a candidate host does not take a budget (SPEC §2): a reason this release knows, or any other
 * text. Reasons are added now and then (`silent` was), and a client decodes a newer coordinator's
 * answer with the reason kept as it came instead of refusing the whole answer. Typed so a `switch`
 * on the known reasons narrows (`(string & {})` keeps them apart from plain text);
 * `isKnownNoFitReason` tells them from the rest. The API description lists the known ones.
 */
export type NoFitReason = KnownNoFitReason | (string & {})
export const NoFitReason: Schema.Codec<NoFitReason> = Schema.Union([KnownNoFitReason, Schema.String])
/** A live move's state. */
export const MoveState = Schema.Literals(Names.moveStates)
/**
 * Who committed a move: `source` (its commit with the phases it measured: the normal path),
 * `target` (the target host's resolution: it runs the guest) or `operator` (the admin's resolve,
 * `engram moves commit`).
 */
export const MoveCommittedBy = Schema.Literals(Names.moveCommittedBy)
export type MoveCommittedBy = typeof MoveCommittedBy.Type
export type MoveState = typeof MoveState.Type
/** The kind of a pre-copy round. */
export const RoundKind = Schema.Literals(Names.roundKinds)
export type RoundKind = typeof RoundKind.Type

/** A session's size. */
export const Budget = Schema.Struct({ memMib: Num, vcpus: Num })
export type Budget = typeof Budget.Type

/** A session. `hostId` and `reservationId` are set while it holds a reservation. */
export const Session = Schema.Struct({
  id: Id,
  state: SessionState,
  budget: Budget,
  affinity: Schema.Array(Schema.String),
  hostId: Schema.NullOr(Schema.String),
  reservationId: Schema.NullOr(Schema.String),
  queuedAt: NullableNum,
  parkedAt: NullableNum,
  /** No reported activity for this long (ms) makes the running session idle; null: never. */
  idleTimeoutMs: NullableNum,
  /** The last reported guest activity, or when the session last began to run (epoch ms). */
  lastActiveAt: Num,
  /** When the TTL ends the session (epoch ms); null: no TTL. */
  endsAt: NullableNum,
  /**
   * The template the session starts from (its host's agent starts it from there, or boots when it
   * cannot); null: booted. Absent from a coordinator older than templates.
   */
  template: Schema.optionalKey(Schema.NullOr(Schema.String)),
  /**
   * The host whose agent holds the session's descent image (its memory), while it is descended,
   * queued or pending after a descent: its placement ranks that host first. Null otherwise.
   * Absent from a coordinator older than image hosts.
   */
  imageHostId: Schema.optionalKey(Schema.NullOr(Schema.String)),
  createdAt: Num,
  updatedAt: Num,
})
export type Session = typeof Session.Type

/** Why one candidate host does not take a budget, with its free room. */
export const NoFitDetail = Schema.Struct({
  hostId: Schema.String,
  reason: NoFitReason,
  freeMib: NullableNum,
  freeVcpus: NullableNum,
})
export type NoFitDetail = typeof NoFitDetail.Type

/** 201 of a create or resume: placed (or, for a repeated id, the session holds a host). */
export const Placed = Schema.Struct({ id: Id, state: SessionState, hostId: Schema.String })
export type Placed = typeof Placed.Type

/**
 * 202 of a create or resume: queued, its 1-based FIFO position (0 when not in the queue), why
 * nothing fits, and whether it is too big for every host even when empty (`tooBig`, SPEC §12).
 */
export const Queued = Schema.Struct({
  id: Id,
  state: SessionState,
  position: Num,
  noFit: Schema.Array(NoFitDetail),
  tooBig: Schema.Boolean,
})
export type Queued = typeof Queued.Type

/** How a resume brought a session back: `warm` (a park unparked in place) or `cold` (restored from its descent). */
export const Resumed = Schema.Literals(["warm", "cold"])
export type Resumed = typeof Resumed.Type

/** 200 of a resume of a parked session: running again on its host, warm (SPEC §12). */
export const ResumedWarm = Schema.Struct({ id: Id, state: SessionState, hostId: Schema.String, resumed: Schema.Literal("warm") })
export type ResumedWarm = typeof ResumedWarm.Type

/** 201 of a resume of a descended session that was placed: restored cold on `hostId`. */
export const ResumedPlaced = Schema.Struct({ id: Id, state: SessionState, hostId: Schema.String, resumed: Schema.Literal("cold") })
export type ResumedPlaced = typeof ResumedPlaced.Type

/** 202 of a resume of a descended session that found no room: queued, as a create's 202. */
export const ResumedQueued = Schema.Struct({ ...Queued.fields, resumed: Schema.Literal("cold") })
export type ResumedQueued = typeof ResumedQueued.Type

/** Where a queued session stands: its 1-based FIFO position, each host's reason, and `tooBig`. */
export const QueueStanding = Schema.Struct({
  position: Num,
  noFit: Schema.Array(NoFitDetail),
  /** Too big for every ready measured host even when empty: no descent can help it; a bigger host would (SPEC §12). */
  tooBig: Schema.Boolean,
})
export type QueueStanding = typeof QueueStanding.Type

/** A session as `GET /v1/sessions/{id}` answers it: with `queue` (where it stands) while queued, null otherwise. */
export const SessionDetail = Schema.Struct({ ...Session.fields, queue: Schema.NullOr(QueueStanding) })
export type SessionDetail = typeof SessionDetail.Type

/** A page of a list: `items` in the list's stable order, and the cursor of the next page (null on the last). */
export const pageOf = <S extends Schema.Top>(item: S) => Schema.Struct({ items: Schema.Array(item), nextCursor: Schema.NullOr(Schema.String) })

/** A page of sessions, oldest first. */
export const SessionsPage = pageOf(Session)
export type SessionsPage = typeof SessionsPage.Type

/** A page of the queue, first in first out: each session with where it stands. */
export const QueuePage = pageOf(SessionDetail)
export type QueuePage = typeof QueuePage.Type

/** A template a host holds: its name and the size of the guest it starts. */
export const HeldTemplate = Schema.Struct({ name: Schema.String, memMib: Num, vcpus: Num })
export type HeldTemplate = typeof HeldTemplate.Type

/** What a host reported (SPEC §1); null = not measured. */
export const HostReport = Schema.Struct({
  totalMib: NullableNum,
  allocatableMib: NullableNum,
  totalVcpus: NullableNum,
  /** The templates the host's runtime holds (placement prefers their holders for sessions that name one). Absent from an older coordinator. */
  templates: Schema.optionalKey(Schema.Array(HeldTemplate)),
})
export type HostReport = typeof HostReport.Type

/** A host with its room: capacity after policy beside the figure it reported. */
export const Host = Schema.Struct({
  id: Id,
  labels: Schema.Record(Schema.String, Schema.String),
  state: HostState,
  measured: Schema.Boolean,
  report: Schema.NullOr(HostReport),
  reportedAt: NullableNum,
  createdAt: Num,
  /** Where the host's agent serves its peers, as its last report said; null: none advertised. Absent from an older coordinator. */
  peerUrl: Schema.optionalKey(Schema.NullOr(Schema.String)),
  /**
   * Whether the host's agent is silent at the answer's time: its last report is older than the
   * stale window, so the host takes no placements until it reports again (its `state` is unchanged).
   * Absent from an older coordinator.
   */
  silent: Schema.optionalKey(Schema.Boolean),
  /** RAM capacity after policy (SPEC §1). */
  allocatableMib: NullableNum,
  /** The allocatable RAM the host reported, before policy. */
  reportedAllocatableMib: NullableNum,
  reservedMib: Num,
  freeMib: NullableNum,
  cpuBudget: NullableNum,
  reservedVcpus: Num,
  freeVcpus: NullableNum,
  entries: Num,
  parks: Num,
  descentsRunning: Num,
})
export type Host = typeof Host.Type

/** A page of hosts, by id. */
export const HostsPage = pageOf(Host)
export type HostsPage = typeof HostsPage.Type

/** A registered host and its own token (answered once). */
export const HostCreated = Schema.Struct({ id: Id, token: Schema.String })
export type HostCreated = typeof HostCreated.Type

/** A host's new token (answered once): the old one stopped working. */
export const HostToken = Schema.Struct({ id: Id, token: Schema.String })
export type HostToken = typeof HostToken.Type

/** One pre-copy round as the source measured it. */
export const MoveRound = Schema.Struct({
  kind: RoundKind,
  wireBytes: Num,
  apparentBytes: Num,
  sendMs: Num,
  captureMs: Num,
})
export type MoveRound = typeof MoveRound.Type

/** The phases of a committed move's pause (SPEC §5). */
export const MovePhases = Schema.Struct({
  downtimeMs: Num,
  captureMs: Num,
  sendMs: Num,
  commitMs: Num,
})
export type MovePhases = typeof MovePhases.Type

/**
 * Where a commit allowance came from (SPEC §13): `prior`, the configured `commitAllowanceMs` (no
 * commit of the pair's own within the horizon, and fewer than 5 of others' to pool); `learned`,
 * the host pair's own recent commits; `target`, pooled with recent commits of other pairs into
 * the same target; `fleet`, with the whole fleet's.
 */
export const AllowanceSource = Schema.Literals(["prior", "learned", "target", "fleet"])
export type AllowanceSource = typeof AllowanceSource.Type

/** What the source's downtime guard decided a committed move on (SPEC §13), as it reports it with the commit. */
export const MoveGuardReport = Schema.Struct({
  /** The commit allowance added to its estimates, ms. */
  allowanceMs: Num,
  allowanceSource: AllowanceSource,
  /** The commits the allowance was learned from (0 for the prior). */
  allowanceSamples: Num,
  /** The post-capture estimate that let the guest switch over, ms. */
  estimateMs: Num,
})
export type MoveGuardReport = typeof MoveGuardReport.Type

/** The guard's figures a committed move keeps: its report, and how far off it was. */
export const MoveGuard = Schema.Struct({
  ...MoveGuardReport.fields,
  /** Estimate − measured downtime, ms (positive: pessimistic). */
  estimateErrorMs: Num,
  /** Allowance − measured commit phase, ms (positive: pessimistic; negative: the commit ran past it). */
  allowanceErrorMs: Num,
})
export type MoveGuard = typeof MoveGuard.Type

/** A live move with its rounds, and its phases or abort once it ended. */
export const Move = Schema.Struct({
  id: Id,
  sessionId: Schema.String,
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  reservationId: Schema.String,
  maxDowntimeMs: Num,
  state: MoveState,
  rounds: Schema.Array(MoveRound),
  phases: Schema.NullOr(MovePhases),
  abortReason: Schema.NullOr(Schema.String),
  /** The downtime estimate an `ErrMoveDowntime` abort was refused on, in ms; null otherwise. */
  abortEstimateMs: NullableNum,
  /**
   * The source guard's figures of a committed move (the allowance it used and where it came
   * from, its estimate, and their errors against the measured phases); null otherwise. Absent
   * from a coordinator that does not keep them.
   */
  guard: Schema.optionalKey(Schema.NullOr(MoveGuard)),
  /**
   * The source's mark (`POST /v1/moves/{id}/resend`): true while the move's source holds the
   * guest's only whole copy, paused, and owes its target the stream (a move committed without
   * phases whose target never got a complete stream); should the target die while it is set, the
   * session goes back to the source. False when never marked or settled. Absent from a
   * coordinator older than the field: read it as false (the client does: `withResendOwed`).
   */
  resendOwed: Schema.optionalKey(Schema.Boolean),
  /**
   * How many times the resend mark was cleared (the target before it resumes a stream sent again,
   * or the source once its debt is over): the source names the count it read in its tell
   * (`seenClears`), and a tell naming fewer changes nothing. Absent from a coordinator older than
   * the count, or one whose store keeps none: read it as 0 (a tell then goes without the count).
   */
  resendClears: Schema.optionalKey(Num),
  /**
   * Who committed the move (`MoveCommittedBy`); null while it is not committed, or when it was
   * committed before the coordinator kept it. Absent from an older coordinator, or one whose
   * store keeps none: read it as null (the client does: `withResendOwed`).
   */
  committedBy: Schema.optionalKey(Schema.NullOr(MoveCommittedBy)),
  createdAt: Num,
  endedAt: NullableNum,
})
export type Move = typeof Move.Type

/**
 * A move as a host's assignments carry it: with `targetPeerUrl`, where the target's agent serves
 * its peers (its last report's `peerUrl`; null when it advertised none). The source's agent
 * reaches the target there unless its own `ENGRAM_PEERS` names the target. Absent from an older
 * coordinator.
 */
export const AssignedMove = Schema.Struct({ ...Move.fields, targetPeerUrl: Schema.optionalKey(Schema.NullOr(Schema.String)) })
export type AssignedMove = typeof AssignedMove.Type

/** A page of moves, oldest first. */
export const MovesPage = pageOf(Move)
export type MovesPage = typeof MovesPage.Type

/**
 * 200 of a move: the committed move and the four figures of its pause, as its source measured
 * them; all four null when it was committed on a resolution (SPEC §13: the target's report that
 * it runs the guest, or an operator's word), its pause not measured (`move.phases` null too).
 */
export const MoveCommitted = Schema.Struct({
  move: Move,
  downtimeMs: NullableNum,
  captureMs: NullableNum,
  sendMs: NullableNum,
  commitMs: NullableNum,
})
export type MoveCommitted = typeof MoveCommitted.Type

/** A reservation in the ledger (SPEC §3). */
export const Reservation = Schema.Struct({
  id: Id,
  hostId: Schema.String,
  ownerKind: OwnerKind,
  ownerId: Schema.String,
  memMib: Num,
  vcpus: Num,
  vramMib: NullableNum,
  createdAt: Num,
  lastHeartbeatAt: Num,
  expiresAt: NullableNum,
  description: Schema.NullOr(Schema.String),
})
export type Reservation = typeof Reservation.Type

/** A page of reservations, by id. */
export const ReservationsPage = pageOf(Reservation)
export type ReservationsPage = typeof ReservationsPage.Type

/** One host's ledger summary. */
export const HostSummary = Schema.Struct({
  hostId: Schema.String,
  totalMib: NullableNum,
  reservedMib: Num,
  reservedVramMib: Num,
  activeEntries: Num,
  staleEntries: Num,
  utilizationPct: NullableNum,
})
export type HostSummary = typeof HostSummary.Type

/** The cluster's ledger summary, every host sorted by id. */
export const ClusterSummary = Schema.Struct({
  hosts: Schema.Array(HostSummary),
  totalMib: Num,
  reservedMib: Num,
  reservedVramMib: Num,
  activeEntries: Num,
  staleEntries: Num,
  utilizationPct: NullableNum,
})
export type ClusterSummary = typeof ClusterSummary.Type

/** The ledger's cumulative metrics. */
export const LedgerMetrics = Schema.Struct({
  totalReservedMib: Num,
  totalReleasedMib: Num,
  totalReclaimedMib: Num,
  reserveFailures: Num,
  activeEntries: Num,
})
export type LedgerMetrics = typeof LedgerMetrics.Type

/** The fleet signal (core `Fleet.snapshot`) and when the fleet was read. */
export const Fleet = Schema.Struct({
  hosts: Schema.Struct({
    total: Num,
    ready: Num,
    measured: Num,
    cordoned: Num,
    draining: Num,
    /**
     * Hosts (any state) whose agent has not reported within the stale window at `readAt`: they
     * take no placements until it reports again. Absent from an older coordinator.
     */
    silent: Schema.optionalKey(Num),
    /** The silent hosts among `ready` (counted there too): `ready − readySilent` take placements. Absent from an older coordinator. */
    readySilent: Schema.optionalKey(Num),
  }),
  /** Over measured ready hosts, silent ones included (their part: `silentFreeMib`). */
  capacityMib: Num,
  reservedMib: Num,
  freeMib: Num,
  cpuBudget: Num,
  reservedVcpus: Num,
  freeVcpus: Num,
  /** The part of `freeMib` on ready silent hosts: room no placement can use until their agents report. Absent from an older coordinator. */
  silentFreeMib: Schema.optionalKey(Num),
  /** The part of `freeVcpus` on ready silent hosts. Absent from an older coordinator. */
  silentFreeVcpus: Schema.optionalKey(Num),
  queue: Schema.Struct({
    sessions: Num,
    memMib: Num,
    vcpus: Num,
    withoutRoom: Num,
  }),
  /** Queued sessions too big for every ready measured host even empty (`too_big`), and the largest budget among them (0 when none): the cue for a bigger host. */
  unplaceable: Schema.Struct({
    count: Num,
    largestMemMib: Num,
    largestVcpus: Num,
  }),
  parks: Num,
  descentsRunning: Num,
  /** Each template (name and size) the hosts hold, with how many hosts hold it. Absent from an older coordinator. */
  templates: Schema.optionalKey(Schema.Array(Schema.Struct({ ...HeldTemplate.fields, hosts: Num }))),
  /**
   * Moves in doubt (SPEC §13): pending with the final round recorded, waiting for their source's
   * or target's word or an operator's. Absent from a coordinator older than it.
   */
  movesInDoubt: Schema.optionalKey(Num),
  readAt: Num,
})
export type Fleet = typeof Fleet.Type

// ---- a session's history -------------------------------------------------------------------

const at = { seq: Num, at: Num }
const HostOrNull = Schema.NullOr(Schema.String)

/**
 * One entry of a session's history (`GET /v1/sessions/{id}/events`): `seq` from 1, `at` epoch
 * ms, `kind`, and the figures of that kind. `hostId` names the host it happened on, where one.
 */
export const SessionEvent = Schema.Union([
  Schema.Struct({ ...at, kind: Schema.Literal("created") }),
  Schema.Struct({ ...at, kind: Schema.Literal("queued") }),
  Schema.Struct({ ...at, kind: Schema.Literal("placed"), hostId: Schema.String }),
  Schema.Struct({ ...at, kind: Schema.Literal("running"), hostId: HostOrNull }),
  Schema.Struct({ ...at, kind: Schema.Literal("parked"), hostId: HostOrNull }),
  /** A descent began: `idle` (no park allowed) or `yield` (a park gave its room; `reason` is the gate's). */
  Schema.Struct({
    ...at,
    kind: Schema.Literal("descending"),
    hostId: HostOrNull,
    cause: Schema.Literals(["idle", "yield"]),
    reason: Schema.NullOr(Schema.String),
  }),
  Schema.Struct({ ...at, kind: Schema.Literal("descended"), hostId: HostOrNull }),
  Schema.Struct({ ...at, kind: Schema.Literal("resumed"), resumed: Resumed, hostId: HostOrNull }),
  Schema.Struct({ ...at, kind: Schema.Literal("move_begun"), moveId: Schema.String, hostId: HostOrNull, targetHostId: Schema.String }),
  /** A committed move, with the phases of its pause (null: committed on a resolution, its pause not measured). */
  Schema.Struct({
    ...at,
    kind: Schema.Literal("moved"),
    moveId: Schema.String,
    hostId: Schema.String,
    fromHostId: Schema.String,
    toHostId: Schema.String,
    phases: Schema.NullOr(MovePhases),
  }),
  /** A move that ended without committing: why, and the downtime estimate a guard refusal was made on. */
  Schema.Struct({
    ...at,
    kind: Schema.Literal("move_aborted"),
    moveId: Schema.String,
    hostId: HostOrNull,
    reason: Schema.String,
    estimateMs: NullableNum,
  }),
  Schema.Struct({ ...at, kind: Schema.Literal("lost"), hostId: HostOrNull }),
  /** Ended; `reason` when not at a caller's word (`ttl expired`). */
  Schema.Struct({ ...at, kind: Schema.Literal("ended"), hostId: HostOrNull, reason: Schema.optionalKey(Schema.String) }),
  /** The TTL was set anew: the session ends at `endsAt` (epoch ms). */
  Schema.Struct({ ...at, kind: Schema.Literal("ttl_set"), endsAt: Num }),
  /**
   * Its guest on `hostId` was lost (`reason`: its agent's words) and a fresh one booted: its memory
   * state is gone; its state did not change. `moveId` and `toHostId` when the report came after
   * that move took the session from `hostId` to `toHostId`: the copy lost was the one on `hostId`,
   * before the move. Optional keys, so a decoder from before them reads the event (it ignores keys
   * it does not know).
   */
  Schema.Struct({
    ...at,
    kind: Schema.Literal("guest_lost"),
    hostId: Schema.String,
    reason: Schema.String,
    moveId: Schema.optionalKey(Schema.String),
    toHostId: Schema.optionalKey(Schema.String),
  }),
])
export type SessionEvent = typeof SessionEvent.Type

/** A page of a session's history, oldest first. */
export const SessionEventsPage = pageOf(SessionEvent)
export type SessionEventsPage = typeof SessionEventsPage.Type

/** Whether a budget fits now, and each candidate's reason. */
export const NoFit = Schema.Struct({ fits: Schema.Boolean, hosts: Schema.Array(NoFitDetail) })
export type NoFit = typeof NoFit.Type

/**
 * The coordinator's limits an agent follows (SPEC §5), so both sides agree: its move guard's
 * `commitAllowanceMs`, and `heartbeatStaleWindowMs` (`ENGRAM_HEARTBEAT_STALE_WINDOW_MS`): a host
 * with no heartbeat for longer has its reservations reclaimed, so an agent heartbeats within a
 * third of it even when its own setting is longer. Optional: a coordinator before it sends none.
 */
export const AgentLimits = Schema.Struct({ commitAllowanceMs: Num, heartbeatStaleWindowMs: Schema.optionalKey(Num) })
export type AgentLimits = typeof AgentLimits.Type

/** The guard's commit allowance for moves from one host to another (SPEC §13). */
export const PairAllowance = Schema.Struct({
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  allowanceMs: Num,
  source: AllowanceSource,
  /** The commits it was learned from (0 for the prior). */
  samples: Num,
})
export type PairAllowance = typeof PairAllowance.Type

/** The pool a pooled allowance was learned from: `target`, recent commits into the same target; `fleet`, the whole fleet's. */
export const AllowancePool = Schema.Literals(["target", "fleet"])
export type AllowancePool = typeof AllowancePool.Type

/**
 * A pending move's allowance as the assignments carry it to its source's agent. `source` stays
 * within `prior` | `learned` (a pooled allowance is `learned`), the literals an agent of an
 * earlier release decodes: a value it does not know would fail its whole poll. `pool` names a
 * pooled allowance's pool; an older agent ignores the key it does not know.
 */
export const AssignedAllowance = Schema.Struct({
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  allowanceMs: Num,
  source: Schema.Literals(["prior", "learned"]),
  /** The commits it was learned from (0 for the prior). */
  samples: Num,
  /** Present only when it was pooled: with the target's recent commits, or the fleet's. */
  pool: Schema.optionalKey(AllowancePool),
})
export type AssignedAllowance = typeof AssignedAllowance.Type

/** A pair's allowance as the assignments carry it: a pooled source is `learned` with its `pool`. */
export const assignedAllowance = (a: PairAllowance): AssignedAllowance => {
  const { source, ...rest } = a
  return source === "target" || source === "fleet" ? { ...rest, source: "learned", pool: source } : { ...rest, source }
}

/** The full allowance back from the assignments' form: a `learned` one with a `pool` came from that pool. */
export const pairAllowanceOf = (a: AssignedAllowance): PairAllowance => {
  const { pool, source, ...rest } = a
  return { ...rest, source: source === "learned" && pool !== undefined ? pool : source }
}

/** A host pair's learned allowance with the recent commit phases it is made of. */
export const PairHistory = Schema.Struct({
  ...PairAllowance.fields,
  /** Its recent commit phases, ms, oldest first (at most the policy's window). */
  commitsMs: Schema.Array(Num),
  /** When each of them was recorded (epoch ms), in the same order: one older than the horizon no longer counts. */
  recordedAtMs: Schema.Array(Num),
  /** When the last one was recorded (epoch ms); null: the pair has no commits of its own (it was asked for by target). */
  updatedAt: Schema.NullOr(Num),
})
export type PairHistory = typeof PairHistory.Type

/** `GET /v1/hosts/{id}/allowances`: the allowance of moves from the host to each target it has committed moves to. */
export const HostAllowances = Schema.Struct({
  hostId: Schema.String,
  /** The allowance of a pair without recent commits and too few to pool: the coordinator's `commitAllowanceMs`. */
  priorMs: Num,
  /** How old a commit may be and still count (ms): the coordinator's `ENGRAM_ALLOWANCE_HORIZON_MS`. */
  horizonMs: Num,
  items: Schema.Array(PairHistory),
})
export type HostAllowances = typeof HostAllowances.Type

/**
 * A host holding the descent image of a session resumed onto another host (`Assignments.imageHosts`):
 * where its agent serves its peers (null: it advertises none, or it was removed), and `removed: true`
 * when it is no longer in the fleet (absent otherwise, and from an older coordinator).
 */
export const ImageHost = Schema.Struct({ hostId: Schema.String, peerUrl: Schema.NullOr(Schema.String), removed: Schema.optionalKey(Schema.Boolean) })
export type ImageHost = typeof ImageHost.Type

/** A host's desired state: its sessions with work for its agent and its pending moves. */
export const Assignments = Schema.Struct({
  hostId: Schema.String,
  /** Changes whenever the assignments change; pass it back as `since` to long-poll. */
  version: Schema.String,
  sessions: Schema.Array(Session),
  moves: Schema.Array(AssignedMove),
  limits: AgentLimits,
  /**
   * The guard's commit allowance of each pending move this host is the source of, by target:
   * learned from recent commits (the pair's own, else pooled with its target's or the fleet's),
   * or the prior when too few are (a pooled one is `learned` with its `pool`: see
   * {@link AssignedAllowance}). It is not part of `version`: the allowance of a move is the one
   * read when the move appeared. Absent from an older coordinator (the agent then learns from
   * its own commits).
   */
  allowances: Schema.optionalKey(Schema.Array(AssignedAllowance)),
  /**
   * Where the agent of each host holding the descent image of a session resumed onto this host
   * (`Session.imageHostId`, another host) serves its peers (its last report's `peerUrl`; null
   * when it advertises none or is removed): the agent fetches the image from there before it
   * restores. `removed: true` when the host was removed from the fleet (`DELETE /v1/hosts/{id}`):
   * its image can never come, so the agent boots fresh at once and reports the loss (`guest-lost`);
   * absent otherwise, and from an older coordinator (the agent then waits out its fetch deadline).
   * Part of `version`: a new peer URL, or the host's removal, answers the agent's long-poll. The
   * list is absent from an older coordinator (the agent then boots such a session fresh).
   */
  imageHosts: Schema.optionalKey(Schema.Array(ImageHost)),
  /**
   * The sessions whose descent image this host holds (their `imageHostId` is this host), by id:
   * an image on the host of a session neither here nor among `sessions` is of a session that
   * ended or ran again elsewhere, and its agent removes it. Absent from an older coordinator (the
   * agent then removes nothing).
   */
  imageSessions: Schema.optionalKey(Schema.Array(Schema.String)),
})
export type Assignments = typeof Assignments.Type

/** `POST /v1/hosts/{id}/heartbeat`'s answer: how many reservations were renewed. */
export const HeartbeatRenewed = Schema.Struct({ hostId: Schema.String, renewed: Num })
export type HeartbeatRenewed = typeof HeartbeatRenewed.Type

/** `POST /v1/sessions/{id}/idle`'s answer: parked or descending. */
export const Idled = Schema.Struct({ id: Id, state: SessionState })
export type Idled = typeof Idled.Type

/** `GET /livez` and `GET /healthz`. */
export const Alive = Schema.Struct({ ok: Schema.Boolean })
export type Alive = typeof Alive.Type

/** `GET /readyz`: the store answered; which backend, and whether this replica leads the reaper. */
export const Ready = Schema.Struct({
  ok: Schema.Boolean,
  store: Schema.String,
  leader: Schema.Boolean,
  /**
   * On PostgreSQL, whether this replica's admin token is the leader's (by the fingerprint the
   * leader writes with its lease); absent while no other leader is known. `false`: the replicas
   * were given different `ENGRAM_ADMIN_TOKEN`s (still ready: a rotation passes through it).
   */
  adminTokenMatchesLeader: Schema.optionalKey(Schema.Boolean),
})
export type Ready = typeof Ready.Type
