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
/** Why a candidate host does not take a budget (SPEC §2). */
export const NoFitReason = Schema.Literals(Names.noFitReasons)
export type NoFitReason = typeof NoFitReason.Type
/** A live move's state. */
export const MoveState = Schema.Literals(Names.moveStates)
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

/** 202 of a create or resume: queued, its 1-based FIFO position (0 when not in the queue) and why nothing fits. */
export const Queued = Schema.Struct({
  id: Id,
  state: SessionState,
  position: Num,
  noFit: Schema.Array(NoFitDetail),
})
export type Queued = typeof Queued.Type

/** What a host reported (SPEC §1); null = not measured. */
export const HostReport = Schema.Struct({
  totalMib: NullableNum,
  allocatableMib: NullableNum,
  totalVcpus: NullableNum,
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

/** A registered host and its own token (answered once). */
export const HostCreated = Schema.Struct({ id: Id, token: Schema.String })
export type HostCreated = typeof HostCreated.Type

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
  createdAt: Num,
  endedAt: NullableNum,
})
export type Move = typeof Move.Type

/** 200 of a move: the committed move and its four figures. */
export const MoveCommitted = Schema.Struct({
  move: Move,
  downtimeMs: Num,
  captureMs: Num,
  sendMs: Num,
  commitMs: Num,
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
  }),
  capacityMib: Num,
  reservedMib: Num,
  freeMib: Num,
  cpuBudget: Num,
  reservedVcpus: Num,
  freeVcpus: Num,
  queue: Schema.Struct({
    sessions: Num,
    memMib: Num,
    vcpus: Num,
    withoutRoom: Num,
  }),
  parks: Num,
  descentsRunning: Num,
  readAt: Num,
})
export type Fleet = typeof Fleet.Type

/** Whether a budget fits now, and each candidate's reason. */
export const NoFit = Schema.Struct({ fits: Schema.Boolean, hosts: Schema.Array(NoFitDetail) })
export type NoFit = typeof NoFit.Type

/** The coordinator's limits that an agent's move guard uses (SPEC §5), so both sides agree. */
export const AgentLimits = Schema.Struct({ commitAllowanceMs: Num })
export type AgentLimits = typeof AgentLimits.Type

/** A host's desired state: its sessions with work for its agent and its pending moves. */
export const Assignments = Schema.Struct({
  hostId: Schema.String,
  /** Changes whenever the assignments change; pass it back as `since` to long-poll. */
  version: Schema.String,
  sessions: Schema.Array(Session),
  moves: Schema.Array(Move),
  limits: AgentLimits,
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
export const Ready = Schema.Struct({ ok: Schema.Boolean, store: Schema.String, leader: Schema.Boolean })
export type Ready = typeof Ready.Type
