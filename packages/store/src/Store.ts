/**
 * The one store interface (SPEC §6). Every backend (memory, PostgreSQL, PGlite, yours)
 * implements `Store`, and `@engram/store-conformance` checks that they behave the same.
 *
 * Rules every implementation keeps:
 * - Every decision calls `@engram/core`: room (Headroom, Placement, QueueWalk), admission
 *   (Ledger), whether an idle session parks (`ParkPolicy.mayPark`, with the store's configured
 *   policy), and what each operation does (`Session.step`, `Reclaim.decide`): a `Plan`. A store
 *   reads a snapshot, asks core, and hands the plan to its one apply.
 * - Placement is atomic with its reservation: no two placements take the last room on a host.
 * - Every plan is applied as one compare-and-set (`Plan` says what is checked); an illegal
 *   change fails with `IllegalTransition` (a commit or abort refused by core, with `Conflict` on
 *   the move) and changes nothing.
 * - Time comes from the Effect `Clock`, so tests run on a `TestClock`.
 * - A failed operation changes nothing.
 */
import type { Budget, Ledger, Limits } from "@engram/core"
import { Clock, Context, Effect } from "effect"
import type { Conflict, IllegalTransition, InvalidInput, NoRoom, NotFound, Refused, Unavailable } from "./Errors.js"
import type {
  LifetimesDue,
  DrainResult,
  EndResult,
  FleetRead,
  Host,
  HostReport,
  HostAssignments,
  HostView,
  Move,
  MoveCommittedBy,
  MoveGuardReport,
  MovePhases,
  MoveFilter,
  AllowanceCommitsQuery,
  PairCommits,
  PairFilter,
  NumberedRound,
  OnNoRoom,
  Page,
  PageRequest,
  PlaceOutcome,
  PruneRequest,
  PruneResult,
  QueueEntry,
  QueueStanding,
  ReclaimOptions,
  ReportedHost,
  ReclaimResult,
  Reservation,
  ReserveInput,
  Session,
  SessionCounts,
  SessionEvent,
  SessionFilter,
} from "./Types.js"

type Fx<A, E = never> = Effect.Effect<A, E | Unavailable>

/** The operations of a store. */
export interface StoreShape {
  /** The limits this store decides with now. */
  readonly limits: () => Limits.Limits
  /**
   * Now (epoch ms) on the clock this store stamps and judges times with, when that is not the
   * Effect Clock's (store-pg with `databaseTime`: the database's clock, one timeline for every
   * replica). Absent: the Effect Clock's. A caller that compares a time the store stamped (a
   * report's, a heartbeat's) with now reads it here.
   */
  readonly now?: (() => number) | undefined

  // Hosts
  /**
   * Registers a new host (state `ready`, unmeasured). An existing id is a `Conflict`, and so is
   * a `tokenHash` another host holds (`tokenHashTaken`: a host token authenticates one host);
   * nothing is written either way. It takes placements only after its first report
   * (registration is not readiness, SPEC §12).
   */
  readonly registerHost: (input: {
    readonly id: string
    readonly labels?: Readonly<Record<string, string>> | undefined
    /** A hash of the host's own credential; the store never sees the secret. */
    readonly tokenHash?: string | undefined
  }) => Fx<Host, Conflict | InvalidInput>
  /**
   * Records a host's measurement. Answers the host's view and what the report changed
   * (`ReportChanges`: its peer URL, its figures), judged against the host as stored just before
   * the write and atomically with it (`reportChanges`' rule): a coordinator replica tells the
   * sources of moves into the host and drains the queue on that, not on its own memory.
   */
  readonly reportHost: (id: string, report: HostReport) => Fx<ReportedHost, NotFound | InvalidInput>
  /** Sets `ready` (uncordon), `cordoned` or `draining`. */
  readonly setHostState: (id: string, state: "ready" | "cordoned" | "draining") => Fx<HostView, NotFound>
  readonly getHost: (id: string) => Fx<HostView, NotFound>
  /** The host whose credential hash this is (at most one holds it), or null: how a coordinator authenticates an agent. */
  readonly hostByTokenHash: (tokenHash: string) => Fx<Host | null>
  /**
   * The credential hash each of `ids` holds now, in one read (one statement on PostgreSQL, as of
   * one moment): host id to hash. A host that does not exist, or holds no credential, is left out.
   * An empty list reads nothing; the caller bounds how many ids one call asks (the coordinator
   * asks at most 500 a call). Optional: the coordinator's check of every open long-poll after a
   * possible miss of notices reads credentials this way, 500 hosts a statement, and falls back to
   * one `hostByTokenHash` per token on a store without it.
   */
  readonly hostTokenHashes?: ((ids: readonly string[]) => Fx<ReadonlyMap<string, string>>) | undefined
  /**
   * Replaces a host's credential hash (a rotation): the old credential finds no host from now on.
   * A hash another host holds is a `Conflict` (`tokenHashTaken`) and changes nothing; the host's
   * own hash again is no change.
   */
  readonly setHostTokenHash: (id: string, tokenHash: string) => Fx<Host, NotFound | Conflict>
  /**
   * Removes a host that holds nothing: a host with a reservation or a session on it is
   * `Refused` with check `host_in_use` (core's `Ledger.refuseHostRemoval`) and stays.
   */
  readonly removeHost: (id: string) => Fx<Host, NotFound | Refused>
  /**
   * A host's assignments in one read: its sessions in the assigned states and its pending moves
   * (what `listSessions({ hostId })` and `listMoves({ hostId, state: "pending" })` answer,
   * filtered alike), as of one moment. An unknown host is `NotFound`.
   */
  readonly hostAssignments: (hostId: string) => Fx<HostAssignments, NotFound>
  /** A page of hosts, by id. A cursor that is not one of this list's is `InvalidInput` naming `cursor`. */
  readonly pageHosts: (page?: PageRequest) => Fx<Page<HostView>, InvalidInput>

  // The fleet
  /**
   * Hosts with headroom, parks and descents, and the queue: one consistent read. Each host
   * carries `takesMoves` (core's `Move.takesMoves` of its reported `peerUrl`): the reaper plans
   * make-room moves only into hosts that take them.
   */
  readonly fleetView: () => Fx<FleetRead>

  // Sessions
  /**
   * Places a new session on the best host (atomic with its reservation) or queues it with
   * the no-fit details. With `onNoRoom: "refuse"` a session that fits nowhere is not stored:
   * `NoRoom` with the no-fit details. A repeated id that asks for the existing session answers
   * it as it is now (`Placed` when it holds a host, else `Queued`); a different budget, or an
   * affinity, lifetime or template given that differs from the session's (core's
   * `Session.repeatDiffers`: a TTL as the deadline the first create set; `onNoRoom: "refuse"` of a
   * queued session), is a `Conflict` whose `reason` names the field, and so is a repeat of a session that ended, was lost or descended (its `reason`
   * names the state: a create cannot bring it back; a descended one is restored by `resume`). Every session's history starts here (`sessionEvents`).
   */
  readonly createSession: (input: {
    readonly id: string
    readonly budget: Budget
    readonly affinity?: readonly string[] | undefined
    readonly onNoRoom?: OnNoRoom | undefined
    /** No reported activity for this long makes the running session idle (ms; `Lifetime.lifetimeRule`). */
    readonly idleTimeoutMs?: number | undefined
    /** The session ends this long after its create (ms; `Lifetime.lifetimeRule`); `setTtl` moves it. */
    readonly ttlMs?: number | undefined
    /**
     * The template the session starts from (`Names.templateNameRule`), kept on the session for its
     * host's agent. Placement prefers hosts that hold it (same name and size); it never decides fit.
     */
    readonly template?: string | undefined
  }) => Fx<PlaceOutcome, Conflict | InvalidInput | NoRoom>
  readonly getSession: (id: string) => Fx<Session, NotFound>
  /**
   * The sessions of `ids` that exist, in one read (one statement on PostgreSQL, as of one
   * moment): each once, in no particular order. An id with no session is left out, never a
   * `NotFound`: the caller tells the ids it asked for and did not get (what `getSession` of that
   * id would fail `NotFound`). An empty list reads nothing. The caller bounds how many ids one
   * call asks (the coordinator's session waiters woken at once ask at most 500 a call).
   */
  readonly getSessions: (ids: readonly string[]) => Fx<readonly Session[]>
  /** Sessions, oldest first. */
  readonly listSessions: (filter?: SessionFilter) => Fx<readonly Session[]>
  /**
   * How many sessions are in each state now but `ended`, every such state with 0 included: one
   * grouped count of the live sessions, never a read of every session nor of the ended history
   * (which can outnumber the live fleet many times over; `/metrics` reads this at each scrape).
   */
  readonly countSessions: () => Fx<SessionCounts>
  /** A page of sessions, oldest first (`[createdAt, id]`), filtered; a bad filter or cursor is `InvalidInput`. */
  readonly pageSessions: (filter?: SessionFilter, page?: PageRequest) => Fx<Page<Session>, InvalidInput>
  /**
   * A session's history, oldest first: every event core's `Session.step` (and `Reclaim.decide`)
   * answered for it, written in the same atomic change as the step.
   */
  readonly sessionEvents: (id: string, page?: PageRequest) => Fx<Page<SessionEvent>, NotFound | InvalidInput>
  /** `pending → running`: its agent started the VM. */
  readonly markRunning: (id: string) => Fx<Session, NotFound | IllegalTransition>
  /**
   * An idle running session: `running → parked` when the store's park policy allows it on the
   * session's host now (`ParkPolicy.mayPark`: a measured host, and for the demand policies no
   * queued session without room), else `running → descending`. `onlyIfDue`: only while the
   * session is idle as it stands in the step's own atomic change (`Lifetime.isIdle`), else an
   * `IllegalTransition` that changes nothing: the reaper's, so activity that lands after its read
   * of the idle sessions keeps the session running.
   */
  readonly idle: (id: string, options?: { readonly onlyIfDue?: boolean | undefined }) => Fx<Session, NotFound | IllegalTransition>
  /** `parked → running`. */
  readonly unpark: (id: string) => Fx<Session, NotFound | IllegalTransition>
  /**
   * `parked → descending` (a yield; `reason` is the gate's, kept in the history). A lost race
   * is an `IllegalTransition` and changes nothing.
   */
  readonly beginDescent: (id: string, options?: { readonly reason?: string | undefined }) => Fx<Session, NotFound | IllegalTransition>
  /**
   * `descending → descended`: the capture is stored; the reservation is released. The host it
   * descended on holds its image (`imageHostId`), unless `imageless`: the descent left no image
   * (its agent found neither guest nor image, the loss told first), so no host is named and its
   * resume boots fresh without a fetch.
   */
  readonly finishDescent: (id: string, options?: { readonly imageless?: boolean | undefined }) => Fx<Session, NotFound | IllegalTransition>
  /**
   * Resume is one verb (SPEC §12): a `parked` session resumes warm — `running` on its host,
   * with its reservation, no placement (`Placed`, state `running`); a `descended` one cold —
   * `pending` (placed, then a restore) or `queued`. Any other state is an `IllegalTransition`.
   */
  readonly resume: (id: string) => Fx<PlaceOutcome, NotFound | IllegalTransition>
  /**
   * Any state but `ended` → `ended`; releases its reservation and aborts an open move. An ended
   * session is answered as it is (ending is idempotent). `reason` (text) is kept on the `Ended`
   * event when the session ends other than at a caller's word (the TTL's `ttl expired`). Answers
   * what the end changed (`EndResult`): the session before and after, and the move it closed,
   * all from the one atomic change. `onlyIfDue`: only while the session's TTL has ended it as it
   * stands in that change (`Lifetime.isExpired`), else an `IllegalTransition` that changes
   * nothing: the reaper's, so a TTL moved after its read of the expired sessions keeps the session.
   */
  readonly endSession: (
    id: string,
    options?: { readonly reason?: string | undefined; readonly onlyIfDue?: boolean | undefined },
  ) => Fx<EndResult, NotFound | IllegalTransition | InvalidInput>
  /**
   * A new TTL: the session ends `ttlMs` from now, whatever its state (an extension, or a cut).
   * A bad `ttlMs` is `InvalidInput` naming `ttlMs`; an ended session is an `IllegalTransition`.
   */
  readonly setTtl: (id: string, ttlMs: number) => Fx<Session, NotFound | IllegalTransition | InvalidInput>
  /**
   * The agent of `hostId` lost the session's guest (its VM ended by itself, or was not found where
   * it was recorded) and boots a fresh one: a `GuestLost` event with `reason` joins the session's
   * history; the session's record and state stay. Only a session on `hostId` now, or one its
   * latest committed move (its last `Moved` event) took away from `hostId`: a report that waited
   * while the move committed, its event carrying the move's `moveId` and `toHostId`, once (not
   * when an event since the move names `hostId`: a repeat, or the session was there again; core's
   * `Session.refuseGuestLost`). One elsewhere otherwise or on no host is a `Conflict` naming where it is, an
   * ended one an `IllegalTransition`; a bad `hostId` or `reason` (`Validate.reason`, not empty) is
   * `InvalidInput` naming it. A refusal changes nothing.
   */
  readonly recordGuestLost: (hostId: string, sessionId: string, reason: string) => Fx<Session, NotFound | Conflict | IllegalTransition | InvalidInput>
  /**
   * Guest activity a host's agent reported: each listed session running on `hostId` was active
   * now (its `lastActiveAt` moves to now). Others (not on the host, not running) are skipped;
   * answers how many moved.
   */
  readonly recordActivity: (hostId: string, sessionIds: readonly string[]) => Fx<number, InvalidInput>
  /**
   * The sessions whose lifetime is due now, by indexed reads (not a scan): running sessions
   * whose idle deadline passed (`Lifetime.isIdle`) and live sessions whose TTL passed
   * (`Lifetime.isExpired`), each oldest deadline first, at most `limit` (default 1000) of each.
   */
  readonly lifetimesDue: (options?: { readonly limit?: number | undefined }) => Fx<LifetimesDue>

  // The queue
  /** A page of the queue, first in first out, each session with where it stands (position, reasons, `too_big`). */
  readonly pageQueue: (page?: PageRequest) => Fx<Page<QueueEntry>, InvalidInput>
  /** Where a session stands in the queue; null when it is not queued. */
  readonly queueStanding: (id: string) => Fx<QueueStanding | null, NotFound>
  /**
   * Places queued sessions in FIFO order into whatever room exists; one that fits nowhere
   * keeps its place while later ones may pass it. Each placement is a CAS `queued → pending`.
   */
  readonly drainQueue: (options?: { readonly limit?: number | undefined }) => Fx<DrainResult>

  // The ledger
  /** Runs the admission checks of SPEC §3 and records the reservation. Duplicate id → `Conflict`. */
  readonly reserve: (input: ReserveInput) => Fx<Reservation, Refused | Conflict | InvalidInput>
  /** Releases a reservation. A session's reservation cannot be released here (end the session). */
  readonly release: (id: string) => Fx<Reservation, NotFound | Refused>
  readonly heartbeat: (id: string) => Fx<Reservation, NotFound>
  /** Renews every session, move and capture reservation on the host; answers how many. */
  readonly heartbeatHost: (hostId: string) => Fx<number, NotFound>
  readonly getReservation: (id: string) => Fx<Reservation, NotFound>
  /** A page of reservations by id, optionally of one host. */
  readonly pageReservations: (filter?: { readonly hostId?: string | undefined }, page?: PageRequest) => Fx<Page<Reservation>, InvalidInput>
  /**
   * Removes every expired or stale reservation now; their sessions become `lost`. With
   * `{ stale: false }` only the expired ones (core's `Ledger.isReclaimable` with the option
   * decides): a stale one and its session stay. The reaper asks for that while the failover
   * grace holds, so a backend that ignores the option reclaims the whole fleet after a
   * coordinator-side outage (the conformance suite's `reclaim` cases catch it).
   */
  readonly reclaim: (options?: ReclaimOptions) => Fx<ReclaimResult>
  readonly clusterSummary: () => Fx<Ledger.ClusterSummary>
  readonly metrics: () => Fx<Ledger.Metrics>

  // Moves
  /**
   * Starts a live move of a running session: reserves the target (the given one, or the best
   * ranked host other than the source among those that take moves, `Candidate.takesMoves`) and
   * marks the session `moving`. One open move per session (`Conflict`); no room on the target
   * (or on no host that takes moves) → `Refused` with check `no_fit`.
   */
  readonly beginMove: (input: {
    readonly sessionId: string
    readonly targetHostId?: string | undefined
    readonly maxDowntimeMs: number
  }) => Fx<Move, NotFound | Conflict | IllegalTransition | Refused | InvalidInput>
  /**
   * Appends a round (or the source's intent, `kind: "intent"`, no figures) to a pending move; a
   * round after the final one is a `Conflict`; a second intent changes nothing. A round with a
   * position (`seq`, an integer >= 0, else `InvalidInput` naming `seq`) is recorded only at the
   * move's next position: a repeat of a recorded one with the same figures changes nothing (a
   * retry whose answer was lost), with other figures, or a gap, it is a `Conflict` naming the rule
   * (`Move.placeRound`).
   */
  readonly recordRound: (moveId: string, round: NumberedRound) => Fx<Move, NotFound | Conflict | InvalidInput>
  /**
   * The target committed: the session runs on the target, its reservation is the target's,
   * the source's is released. The move ends `committed`. A move without its final round
   * recorded is a `Conflict`; every phase must be > 0 and their sum ≤ `downtimeMs`. `phases`
   * null commits an in-doubt move on a resolution (the target's report that it runs the guest,
   * or an operator's commit, SPEC §13): the move's pause was not measured and it keeps none.
   * `guard`: the source guard's figures, kept on the move with their errors (core's
   * `Move.guardOf`; ignored beside null phases). A measured commit phase joins the host pair's
   * recent commits with the time it is recorded (`listPairCommits`), the policy's window of them
   * kept (core's `Downtime.recordTimedCommit`: never before a time the pair keeps, and the pair's
   * `updatedAt` is then that time).
   * `by`: who commits, kept on the move (`Move.committedBy`; store-pg's `moves.committed_by`) and
   * shown on every read of it: `source` (the source's commit with its phases), `target` (the
   * target's resolution) or `operator` (the admin's word; `commitMoveByOperator` keeps it itself).
   * Absent: `source` beside phases, else null (not said). Any other value is `InvalidInput`
   * naming `by`, nothing changed. A store written before the field may ignore `by` (the record's
   * `committedBy` is optional; the coordinator then shows none).
   */
  readonly commitMove: (
    moveId: string,
    phases: MovePhases | null,
    guard?: MoveGuardReport | null,
    by?: MoveCommittedBy | null,
  ) => Fx<Move, NotFound | Conflict | InvalidInput>
  /**
   * An operator's commit of a move in doubt (`engram moves commit`, the coordinator's resolve with
   * the admin's word; SPEC §13): `commitMove(moveId, null, null, "operator")` judged by core's
   * `Move.refuseOperatorCommit` against the move's source host as it is at the commit, in the same
   * atomic step: before the final round is recorded, refused (`Conflict`, that rule's reason,
   * nothing changed) while the source is heard (its last report within the stale window), a
   * report the source makes concurrently being either seen or made after the commit, never lost
   * between a check and the commit (store-pg: the source host's row is read under its row lock,
   * which a report holds while it writes). A source host removed is not heard.
   *
   * Optional: on a store without it the coordinator judges the rule on a read of the source host
   * of its own, then calls `commitMove(moveId, null, null, "operator")`: two steps, so a source heard between them is
   * not refused.
   */
  readonly commitMoveByOperator?: ((moveId: string) => Fx<Move, NotFound | Conflict>) | undefined
  /**
   * The move failed: the target's reservation is dropped, the session runs on the source.
   * With `onlyBeforeFinalRound`, a move past its point of no return (its intent or its final
   * round recorded: the target may run the guest) is not aborted: `Conflict`, nothing changed.
   */
  readonly abortMove: (
    moveId: string,
    reason: string,
    options?: {
      readonly onlyBeforeFinalRound?: boolean | undefined
      /** The downtime estimate the move is refused on (a finite number ≥ 0), kept on the record. */
      readonly estimateMs?: number | undefined
    },
  ) => Fx<Move, NotFound | Conflict | InvalidInput>
  /**
   * The move's source owes its target a resend (`owed` true: the source holds the guest's only
   * whole copy, paused, the target never having got a complete stream) or no longer does (false:
   * the target runs the guest, or the session went elsewhere or ended). Only a move committed
   * without phases may be marked (core's `Move.refuseResendMark`; else `Conflict`, nothing
   * changed); a repeat changes nothing. The mark is on the move's record (`Move.resendOwed`, shown
   * on every read of the move; store-pg's `moves.resend_owed`): it opens the way back to the source when the target's reservation is reclaimed (core's
   * `Reclaim.wayBackOf`, read by `reclaim`).
   *
   * Optional: a store without it keeps no mark, so its `reclaim` never sends a session back to a
   * move's source (the session reclaimed from a dead target ends lost, as before the mark); the
   * coordinator then refuses `POST /v1/moves/{id}/resend` with a 400 naming `owed`, which a
   * source's agent takes as a coordinator older than the mark (it asks once, then settles its
   * debt as before).
   *
   * Every clear counts (`Move.resendClears`, the mark's generation; store-pg's
   * `moves.resend_clears`), in the same step as the clear. `seenClears`: the count the source read
   * before its tell; a tell (`owed` true) naming fewer clears than the move holds is stale (core's
   * `Move.resendTellStale`: the target cleared the mark since, before it resumed) and changes
   * nothing, answered with the move as it is (its `resendOwed` false, its `resendClears` above the
   * one named), judged with the write in one atomic step. Absent (an older source's agent): set as
   * before the count. Not an integer >= 0: `InvalidInput` naming `seenClears`, nothing changed.
   * A store written before the count may ignore `seenClears` (the record's `resendClears` is
   * optional): a tell that lands late then sets the mark again, as before.
   */
  readonly markResendOwed?: ((moveId: string, owed: boolean, seenClears?: number) => Fx<Move, NotFound | Conflict | InvalidInput>) | undefined
  readonly getMove: (id: string) => Fx<Move, NotFound>
  /**
   * The session's latest move kept (the one begun last, whatever its state: pending, committed or
   * aborted), or null: it never moved, its moves were pruned (`pruneHistory`), or there is no such
   * session. One short read by the session (store-pg: its moves by `moves_session_idx`).
   * Optional: the coordinator lets a host's agent read a session placed elsewhere when that host
   * is the source or the target of the session's latest move (a move's source owing its target a
   * resend must tell "still placed on the target" from "ended or elsewhere"); a store without it
   * is read the slow way, to the same answer (the session's history, newest `MoveBegun` event,
   * then that move, `getMove`).
   */
  readonly latestMove?: ((sessionId: string) => Fx<Move | null>) | undefined
  /**
   * The moves of `ids` that exist, in one read, as `getSessions` reads sessions: each once, in
   * no particular order, an unknown id left out, an empty list read nothing.
   */
  readonly getMoves: (ids: readonly string[]) => Fx<readonly Move[]>
  /** The open (pending) move of a session, if any. */
  readonly openMove: (sessionId: string) => Fx<Move | null>
  /**
   * Moves oldest first; `hostId` matches the source or the target; `endedSince` keeps the moves
   * that ended at or after it (by an index: the reaper reads the aborts of its cooldown window,
   * not every abort kept). A bad filter is `InvalidInput` naming its field.
   */
  readonly listMoves: (filter?: MoveFilter) => Fx<readonly Move[], InvalidInput>
  /** A page of moves, oldest first (`[createdAt, id]`), filtered. */
  readonly pageMoves: (filter?: MoveFilter, page?: PageRequest) => Fx<Page<Move>, InvalidInput>
  /**
   * The recent commit phases of each host pair with a committed move (at most the allowance
   * policy's window each, oldest first, each with its time), by source then target; with
   * `recordedSince`, only the pairs with a commit recorded since then (one read of all an
   * allowance within the horizon may count). Core's `Downtime.pairAllowance` makes the guard's
   * allowance of them. A bad filter is `InvalidInput` naming its field.
   */
  readonly listPairCommits: (filter?: PairFilter) => Fx<readonly PairCommits[], InvalidInput>
  /**
   * The commits the allowances of moves from one host to some targets may count, bounded: core's
   * `Downtime.allowanceCommits` of every pair (at most `limit` of each of the pair's own, the
   * others' into each target, and the rest of the fleet's), over which `Downtime.pairAllowance`
   * answers as over every recent pair, in one read whatever the fleet's size. A store must keep
   * each pair's commit times never decreasing and its `updatedAt` the last of them, whatever the
   * clock says at a commit (it records commits through core's `Downtime.recordTimedCommit`, which
   * does): then the fleet's most recent commits are in its pairs with the latest `updatedAt`. A
   * bad query is `InvalidInput` naming its field.
   */
  readonly listAllowanceCommits: (query: AllowanceCommitsQuery) => Fx<readonly PairCommits[], InvalidInput>

  // Retention
  /**
   * Deletes history that ended before `endedBefore`, at most `limit` rows of each kind, oldest
   * first, each call one short atomic change (a backlog goes in bounded chunks: call again while
   * a kind comes back full). Sessions in state `ended` whose end (`updatedAt`) is before the
   * cutoff and which have no move left, with their events, oldest first across kinds: a session
   * goes only once every ended move that ended no later than it has gone (a session's moves end no
   * later than it does; this bounds a store's walk when moves outnumber sessions), so while moves
   * come back full, sessions may come back short; moves committed or aborted before the cutoff;
   * host pairs whose last commit was recorded before it. Never anything live: a session in any
   * other state (queued, running, parked, descended, lost…), a pending move, a reservation (the
   * ledger holds only live ones: a released or reclaimed reservation is deleted as it goes), a
   * pair with a commit at or after the cutoff. The caller picks a cutoff older than every window
   * it still reads history in (the allowance horizon, the make-room cooldown, a client's retry of
   * a create by id). A bad request is `InvalidInput` naming `endedBefore` or `limit`, nothing
   * deleted. A write: under a lease it carries the leader's fence (`CurrentFence`).
   */
  readonly pruneHistory: (request: PruneRequest) => Fx<PruneResult, InvalidInput>
}

/** The store service. */
export class Store extends Context.Service<Store, StoreShape>()("@engram/store/Store") {}

/**
 * Test support every backend provides beside its `Store`: the conformance suite resets state
 * (and sets the limits of a case) before each case. Not for production wiring.
 */
export interface StoreTestingShape {
  /** Empties the store (hosts, sessions, ledger, moves, metrics) and decides with `limits` from now on. */
  readonly reset: (limits?: Limits.Limits) => Effect.Effect<void, Unavailable>
}

/** The reset service of the conformance suite. */
export class StoreTesting extends Context.Service<StoreTesting, StoreTestingShape>()("@engram/store/StoreTesting") {}

/**
 * The store's operations that only read (a journal, a readiness check or a retry policy treats
 * every other operation as a write). A new operation that only reads belongs here.
 */
export const readOperations: ReadonlySet<string> = new Set<keyof StoreShape>([
  "limits",
  "getHost",
  "hostAssignments",
  "hostByTokenHash",
  "hostTokenHashes",
  "pageHosts",
  "fleetView",
  "getSession",
  "getSessions",
  "listSessions",
  "countSessions",
  "pageSessions",
  "sessionEvents",
  "pageQueue",
  "queueStanding",
  "getReservation",
  "pageReservations",
  "clusterSummary",
  "metrics",
  "getMove",
  "getMoves",
  "latestMove",
  "openMove",
  "listMoves",
  "pageMoves",
  "lifetimesDue",
  "listPairCommits",
  "listAllowanceCommits",
])

/**
 * Now (epoch ms) on the clock `store` stamps and judges times with: its `now` where it has one
 * (store-pg with `databaseTime`: the database's), else the Effect Clock's. Whatever compares a
 * time the store stamped (a heartbeat, a report, a move's start, a session's end) with now reads
 * now here.
 */
export const nowOf = (store: Pick<StoreShape, "now">): Effect.Effect<number> => (store.now === undefined ? Clock.currentTimeMillis : Effect.sync(store.now))
