/**
 * The store's records: hosts, sessions, reservations, moves, and the fleet read. Plain data,
 * times in epoch ms (from the store's Effect Clock), RAM in MiB.
 */
import type { FleetHost, HostHeadroom, LedgerEntry, NoFitDetail, OwnerKind, Queued, SessionState } from "@engram/core"
import type * as core from "@engram/core"
import { Placement as CorePlacement, Session as CoreSession } from "@engram/core"

/** What a host agent reports about its host (SPEC §1). Null = not measured. */
export interface HostReport {
  readonly totalMib: number | null
  /** MemAvailable + the RAM of the VMs resident on the host. */
  readonly allocatableMib: number | null
  readonly totalVcpus: number | null
  /**
   * The templates the host's runtime holds (each name once): placement prefers a host holding a
   * session's template. Absent in a report: none; a host's stored report always lists them.
   */
  readonly templates?: readonly core.Placement.HeldTemplate[] | undefined
  /**
   * Where the host's agent serves its peers (`Validate.peerUrl`'s rule): a move's source agent
   * reaches it there. Absent or null: it advertises none; each report replaces the last one's.
   */
  readonly peerUrl?: string | null | undefined
}

/** A report's templates as a store keeps them: each `{name, memMib, vcpus}` (no other key); none when absent. */
export const reportedTemplates = (r: HostReport): readonly core.Placement.HeldTemplate[] =>
  (r.templates ?? []).map((t) => ({ name: t.name, memMib: t.memMib, vcpus: t.vcpus }))

/**
 * What a host's report changed, judged against the host as the store held it just before the
 * write and atomically with it: of two concurrent reports of one host, the one written second
 * judges against the first's. A host's first report ever changes both.
 */
export interface ReportChanges {
  /** Its peer URL differs from the stored one (a URL and none differ): the sources of moves into the host must learn it. */
  readonly peerUrlChanged: boolean
  /**
   * Its figures differ from the stored ones: `totalMib`, `allocatableMib`, `totalVcpus`, the
   * templates (name, size and order) or the peer URL. An unchanged report makes no room appear.
   */
  readonly figuresChanged: boolean
  /**
   * The report ends a silence: the host's previous report was older than the stale window at
   * this one's time (`Placement.isSilent`), so the host takes placements again from now on and
   * the queue is drained, as after a first report. False on a first report (`figuresChanged` says it).
   */
  readonly wasSilent: boolean
}

/**
 * What `reportHost` answers: the host's view after the write, with what the write changed
 * (`ReportChanges`, `reportChanges`' rule).
 */
export type ReportedHost = HostView & ReportChanges

/**
 * Whether a report of time `at` is older than the one the host holds (`before.reportedAt` later
 * by more than `reportReorderSlackMs`, and by no more than `reportReorderMs`):
 * a report that waited in a replica that stalled, while the agent's newer one landed through
 * another. It is not written and changes nothing (`unchangedByReport`): written, it would take the
 * host's figures, templates and peer URL back in time, and its `reportedAt` too (a host then read
 * as silent takes no placements until its next report).
 */
export const reportIsOutdated = (before: { readonly reportedAt: number | null }, at: number): boolean =>
  before.reportedAt !== null && before.reportedAt - at > reportReorderSlackMs && before.reportedAt - at <= reportReorderMs

/**
 * How much older than the stored report one may be and still be written, ms: two reports of one
 * host through two replicas at nearly the same time (their clocks are the database's, measured
 * to a few ms) are judged one against the other, as concurrent writes are. A report that waited
 * in a stalled replica is older by the agent's call bound and its failover: seconds.
 */
export const reportReorderSlackMs = 1000

/**
 * How much older than the stored one a report may be and still be taken as delayed
 * (`reportIsOutdated`), ms: longer than any report waits in a replica (its store bound, a
 * batch's hold). A stored time further ahead is a clock that stepped back, not a delay: the report
 * is written, so a host is not held at its old figures for the length of the step.
 */
export const reportReorderMs = 5 * 60_000

/** What an outdated report (`reportIsOutdated`) changes: nothing. */
export const unchangedByReport: ReportChanges = Object.freeze({ peerUrlChanged: false, figuresChanged: false, wasSilent: false })

/**
 * What `report` changes on a host that held `before` (its stored report, null before the first,
 * its peer URL and when it last reported): the one rule every store answers `reportHost`'s
 * `ReportChanges` by, given the host as it held it inside the write and the report's time `at.now`.
 */
export const reportChanges = (
  before: { readonly report: HostReport | null; readonly peerUrl: string | null; readonly reportedAt: number | null },
  report: HostReport,
  at: { readonly now: number; readonly limits: core.Limits.Limits },
): ReportChanges => {
  if (reportIsOutdated(before, at.now)) return unchangedByReport
  if (before.report === null) return { peerUrlChanged: true, figuresChanged: true, wasSilent: false }
  const wasSilent = CorePlacement.isSilent(before, at.now, at.limits)
  const peerUrlChanged = before.peerUrl !== (report.peerUrl ?? null)
  const was = reportedTemplates(before.report)
  const now = reportedTemplates(report)
  const templatesChanged = was.length !== now.length || now.some((t, i) => t.name !== was[i]?.name || t.memMib !== was[i]?.memMib || t.vcpus !== was[i]?.vcpus)
  const figuresChanged =
    peerUrlChanged ||
    templatesChanged ||
    before.report.totalMib !== report.totalMib ||
    before.report.allocatableMib !== report.allocatableMib ||
    before.report.totalVcpus !== report.totalVcpus
  return { peerUrlChanged, figuresChanged, wasSilent }
}

/** A host as registered. */
export interface Host {
  readonly id: string
  readonly labels: Readonly<Record<string, string>>
  readonly state: core.Placement.HostState
  /** The host's figures and templates as last reported (its `peerUrl` is the host's own field). */
  readonly report: HostReport | null
  readonly reportedAt: number | null
  readonly createdAt: number
  /** Where its agent serves its peers, as its last report said; null: none advertised (or not reported yet). */
  readonly peerUrl: string | null
}

/** A host with its headroom (SPEC §1, via `Headroom.fromReport`) and what runs on it. */
export interface HostView extends Host {
  readonly measured: boolean
  readonly headroom: HostHeadroom
  /** Reservations held on the host. */
  readonly entries: number
  readonly parks: number
  readonly descentsRunning: number
}

/** A session (core's record, `Session.Record`). `hostId` and `reservationId` are set while it holds a reservation. */
export type Session = core.Session.Record

/** What a create or a resume did. */
export type PlaceOutcome =
  | { readonly _tag: "Placed"; readonly session: Session }
  | {
      readonly _tag: "Queued"
      readonly session: Session
      /** 1-based position in the FIFO queue. */
      readonly position: number
      readonly noFit: readonly NoFitDetail[]
      /** Too big for every ready measured host even when empty (SPEC §12 `too_big`): no descent can help it. */
      readonly tooBig: boolean
    }

/** Where a queued session stands (SPEC §2, §12): its 1-based FIFO position, each host's reason, and `too_big`. */
export interface QueueStanding {
  readonly position: number
  readonly noFit: readonly NoFitDetail[]
  readonly tooBig: boolean
}

/** A queued session and where it stands. */
export interface QueueEntry {
  readonly session: Session
  readonly standing: QueueStanding
}

/** What a create does when nothing fits: queue (the default) or refuse (`NoRoom`, nothing stored). */
export type OnNoRoom = "queue" | "refuse"

/** One page of a list, in the list's stable order; `nextCursor` is null on the last page. */
export interface Page<A> {
  readonly items: readonly A[]
  readonly nextCursor: string | null
}

/** Which page: at most `limit` items (default 100, at most 1000) after the item `cursor` names (from the start without). */
export interface PageRequest {
  readonly limit?: number | undefined
  readonly cursor?: string | undefined
}

/** One entry of a session's history: what `Session.step` said happened, numbered from 1, and when. */
export interface SessionEvent {
  readonly sessionId: string
  readonly seq: number
  /** Epoch ms, on the store's time (`nowOf`: the Effect Clock's, or the store's own, as store-pg's `databaseTime`). */
  readonly at: number
  readonly event: core.Session.Event
}

/** A reservation in the ledger. */
export type Reservation = LedgerEntry

/** A request to reserve. `id` and `hostId` may be missing: the ledger's first checks refuse it by name. */
export interface ReserveInput {
  readonly id?: string | null | undefined
  readonly hostId?: string | null | undefined
  readonly ownerKind: OwnerKind
  readonly ownerId: string
  readonly memMib: number
  readonly vcpus: number
  readonly vramMib?: number | null | undefined
  readonly expiresAt?: number | null | undefined
  readonly description?: string | null | undefined
}

/**
 * Which reservations a `Store.reclaim` takes: `{ stale: false }` takes only those whose own
 * `expiresAt` passed (core's `Ledger.isExpired`) and leaves stale ones and their sessions alone:
 * the reaper's call while the failover grace holds. Default: expired and stale.
 */
export type ReclaimOptions = core.Ledger.ReclaimOptions

/** What one reclaim pass removed. */
export interface ReclaimResult {
  readonly reclaimed: readonly Reservation[]
  /** Sessions whose reservation was reclaimed: they are now `lost`. */
  readonly lostSessions: readonly string[]
  /**
   * The open moves the pass aborted (a lost session's, or one whose target's reservation went),
   * as they ended, by id: their targets and waiters are owed a notice (a lost session's target
   * reservation may be released, not reclaimed, and so not in `reclaimed`).
   */
  readonly closedMoves: readonly Move[]
  /**
   * The hosts that held the descent image of a session made lost (its restore cut short), sorted
   * and distinct: the image is no longer theirs to keep.
   */
  readonly imageHostIds: readonly string[]
  /**
   * Sessions whose reservation was reclaimed but which went back to the source of the move that
   * brought them to that host (core's `Reclaim.wayBackOf`: committed there without the source's
   * confirmation, the source heard and with room), running there on a new reservation, by session
   * id. Absent when none: the source's agent and the session are owed a notice.
   */
  readonly returned?: readonly { readonly sessionId: string; readonly hostId: string }[]
}

/**
 * What one `Store.endSession` changed, as the store's own transaction saw it: who is owed a
 * notice is read from here, never from a read before the end (a move begun between that read and
 * the end would go untold).
 */
export interface EndResult {
  /** The session as the end left it: `ended` (also when it was ended already: then nothing changed). */
  readonly session: Session
  /**
   * The session as the end found it (the same as `session` when it was ended already): the host
   * it held (its room is free now) and the host of its descent image (no longer that host's to keep).
   */
  readonly before: Session
  /** The open move the end aborted, as it ended; null when none was open. Its target and waiters are owed a notice. */
  readonly closedMove: Move | null
}

/** The fleet in one read (SPEC §4.1): what the reaper and the fleet snapshot read once per pass. */
export interface FleetRead {
  readonly hosts: readonly FleetHost[]
  readonly queue: readonly Queued[]
  readonly readAt: number
}

/** What a queue drain placed. */
export interface DrainResult {
  readonly placed: readonly { readonly sessionId: string; readonly hostId: string }[]
  /**
   * Sessions the walk placed whose placement was not written, and why: core refused the step
   * (`refused`, e.g. the session changed state since the read), or the apply found the session
   * or the host changed (`stale`, a lost race). They stay queued for the next drain.
   */
  readonly unapplied: readonly { readonly sessionId: string; readonly reason: "refused" | "stale" }[]
  /** Sessions still queued after the drain. */
  readonly remaining: number
}

/** A live move's state. */
export type MoveState = core.Move.State

/** The kind of a pre-copy round. */
export type RoundKind = core.Move.RoundKind

/** One pre-copy round as the source measured it. */
export type MoveRound = core.Move.Round

/**
 * A round as its source sends it: the figures and, optionally, its position `seq` (how many
 * records the move held before it, the intent included): recorded once at that position.
 */
export type NumberedRound = core.Move.Numbered

/** The phases of a committed move's pause. */
export type MovePhases = core.Move.Phases

/** What the source's downtime guard decided a move on, as it reports it with the commit. */
export type MoveGuardReport = core.Move.GuardReport
/** Who committed a move (core's `Move.CommittedBy`): `source`, `target` or `operator`. */
export type MoveCommittedBy = core.Move.CommittedBy

/** The guard's figures a committed move keeps: its report and its errors. */
export type MoveGuard = core.Move.Guard

/** The recent commit phases of moves from one host to another (SPEC §13: the guard learns its allowance from them). */
export type PairCommits = core.Downtime.PairCommits

/**
 * Which commits `listAllowanceCommits` answers: those the allowances of moves from
 * `sourceHostId` to each of `targetHostIds` may count, recorded since `recordedSince`, at most
 * `limit` of each group (core's `Downtime.allowanceCommits`; `limit` is core's `Downtime.poolLimit`).
 */
export type AllowanceCommitsQuery = core.Downtime.AllowanceCommitsQuery

/** Filters of `listPairCommits`. */
export interface PairFilter {
  readonly sourceHostId?: string | undefined
  readonly targetHostId?: string | undefined
  /**
   * Only pairs with a commit recorded at or after this time (epoch ms): what the guard's
   * allowance may count (core's `Downtime.pairAllowance` over the allowance horizon), in one read.
   */
  readonly recordedSince?: number | undefined
}

/** A live move of a running session (SPEC §5; core's record, `Move.Record`). */
export type Move = core.Move.Record

/** Filters of `listMoves` and `pageMoves`. */
export interface MoveFilter {
  /** The source or the target. */
  readonly hostId?: string | undefined
  readonly state?: MoveState | undefined
  /**
   * Only moves that ended (committed or aborted) at or after this time (epoch ms, a finite
   * number): a pending move has not ended and is left out. The reaper's read of the aborts still
   * cooling down: bounded by the window, not by every abort the store keeps.
   */
  readonly endedSince?: number | undefined
}

/**
 * Which history `pruneHistory` deletes: what ended before `endedBefore`, at most `limit` rows of
 * each kind (sessions, moves, host pairs) in one call, oldest first.
 */
export interface PruneRequest {
  /** Only history that ended before this time (epoch ms): an integer >= 0, not after the store's now. */
  readonly endedBefore: number
  /** At most this many sessions, this many moves and this many host pairs: an integer from 1 to `Validate.maxPruneLimit`. */
  readonly limit: number
}

/** What one `pruneHistory` call deleted, per kind. */
export interface PruneResult {
  /** Ended sessions (state `ended`, ended before the cutoff and before every ended move still kept, no move of theirs left). */
  readonly sessions: number
  /** The history of those sessions (`sessionEvents`): a session's events go with it, not counted against `limit`. */
  readonly events: number
  /** Committed and aborted moves that ended before the cutoff. */
  readonly moves: number
  /** Host pairs whose last commit (`updatedAt`) was recorded before the cutoff. */
  readonly pairs: number
}

/** A prune's kinds, as `PruneResult` counts them (and `engram_reaper_pruned_total{kind}` labels them). */
export const pruneKinds = ["sessions", "events", "moves", "pairs"] as const satisfies readonly (keyof PruneResult)[]

/**
 * The states in which a session has work for its host's agent: the sessions of a host's
 * assignments (`hostAssignments`).
 */
export const assignedStates: readonly SessionState[] = ["pending", "running", "parked", "descending", "moving"]

/**
 * A host's assignments as one read (`hostAssignments`): what its agent acts on. Not the host's
 * record (`getHost` answers it): the coordinator needs only to know the host exists.
 */
export interface HostAssignments {
  readonly hostId: string
  /** Its sessions in the assigned states (`assignedStates`), oldest first (`[createdAt, id]`). */
  readonly sessions: readonly Session[]
  /** The pending moves it is the source or the target of, oldest first (`[createdAt, id]`). */
  readonly moves: readonly Move[]
  /**
   * The sessions whose descent image this host holds (`imageHostId` is this host), by id. An image
   * on the host whose session is not here, nor among its sessions, is of a session that ended or
   * ran again elsewhere: its agent may remove it.
   */
  readonly imageSessionIds: readonly string[]
}

/** The states of a session not yet ended: what `countSessions` counts. */
export type LiveState = Exclude<SessionState, "ended">

/** Every live state, in life-cycle order (core's `Session.states` without `ended`). */
export const liveStates: readonly LiveState[] = CoreSession.states.filter((s): s is LiveState => s !== "ended")

/** How many sessions are in each live state (`countSessions`): every live state, 0 included. */
export type SessionCounts = { readonly [S in LiveState]: number }

/** `SessionCounts` from a grouped count's rows: every live state, 0 where no row names it; other rows are ignored. */
export const sessionCountsOf = (rows: Iterable<{ readonly state: string; readonly n: number }>): SessionCounts => {
  const counts = Object.fromEntries(liveStates.map((s) => [s, 0])) as { [S in LiveState]: number }
  for (const r of rows) if (Object.hasOwn(counts, r.state)) counts[r.state as LiveState] += r.n
  return counts
}

/** Filters of `listSessions`. */
export interface SessionFilter {
  readonly state?: SessionState | undefined
  readonly hostId?: string | undefined
  /** The host holding the session's descent image (`Session.imageHostId`). */
  readonly imageHostId?: string | undefined
}

/** The sessions whose lifetime is due (the reaper idles the first and ends the second). */
export interface LifetimesDue {
  /** Running sessions with no activity for their idle timeout. */
  readonly idle: readonly Session[]
  /** Sessions, in any state but ended, whose TTL passed. */
  readonly expired: readonly Session[]
}
