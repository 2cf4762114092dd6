/**
 * The session life cycle (SPEC §2): the states, the legal transitions, and what each store
 * operation does. `step` is the one place that decides an operation's effect: its `Plan` (the
 * next session record, the reservations to create, hand over or release, the move to open or
 * update, and what happened, for the session's history), or why it is refused. An idle session
 * parks or descends by the configured park policy, decided here (`ParkPolicy.mayPark`). Both
 * stores read, call `step`, and hand its plan to their one apply; neither decides any of it.
 */
import type { Budget } from "./Headroom.js"
import type { Entry } from "./Ledger.js"
import * as Ledger from "./Ledger.js"
import * as Lifetime from "./Lifetime.js"
import * as Move from "./Move.js"
import * as ParkPolicy from "./ParkPolicy.js"
import * as Plan from "./Plan.js"

/** A session's state. */
export type State = "queued" | "pending" | "running" | "parked" | "descending" | "descended" | "moving" | "ended" | "lost"

/** Every state, in life-cycle order. */
export const states: readonly State[] = [
  "queued",
  "pending",
  "running",
  "parked",
  "descending",
  "descended",
  "moving",
  "ended",
  "lost",
]

const legal: { readonly [S in State]: readonly State[] } = {
  queued: ["pending", "ended"],
  pending: ["running", "ended", "lost"],
  running: ["parked", "descending", "moving", "ended", "lost"],
  parked: ["running", "descending", "ended", "lost"],
  descending: ["descended", "ended", "lost"],
  descended: ["queued", "pending", "ended"],
  moving: ["running", "ended", "lost"],
  ended: [],
  lost: ["ended"],
}

/** The states reachable from `from` in one step. */
export const next = (from: State): readonly State[] => legal[from]

/** Whether `from → to` is a legal transition. */
export const canTransition = (from: State, to: State): boolean => legal[from].includes(to)

/** The verdict on a transition. */
export type Transition =
  | { readonly _tag: "Legal"; readonly from: State; readonly to: State }
  | { readonly _tag: "Illegal"; readonly from: State; readonly to: State; readonly message: string }

/** Judges `from → to`; an illegal one carries a message naming both states and what is allowed. */
export const transition = (from: State, to: State): Transition =>
  canTransition(from, to)
    ? { _tag: "Legal", from, to }
    : {
        _tag: "Illegal",
        from,
        to,
        message: `session cannot go from ${from} to ${to}${legal[from].length > 0 ? ` (from ${from}: ${legal[from].join(", ")})` : ` (${from} is final)`}`,
      }

/** Whether a session in this state holds a reservation on a host. */
export const holdsReservation = (s: State): boolean =>
  s === "pending" || s === "running" || s === "parked" || s === "descending" || s === "moving"

/** Whether the state is final. */
export const isFinal = (s: State): boolean => s === "ended"

/**
 * Whether a session in `from` can still come to be in `to` through legal transitions (a state
 * reaches itself). What a wait for a state answers when the state can no longer come.
 */
export const canReach = (from: State, to: State): boolean => {
  if (from === to) return true
  const seen = new Set<State>([from])
  const todo: State[] = [from]
  for (let s = todo.pop(); s !== undefined; s = todo.pop())
    for (const n of legal[s]) {
      if (n === to) return true
      if (!seen.has(n)) {
        seen.add(n)
        todo.push(n)
      }
    }
  return false
}


/**
 * The store operations that change a session's state, each with the states it starts from and
 * the states it leads to. The life cycle alone cannot tell `markRunning` from `unpark` (both go
 * to running) or `resume` from a queue drain's `place` (both go to pending); these rules can,
 * so every store refuses the same calls.
 */
export const operations = {
  create: { from: [], to: ["pending", "queued"] },
  place: { from: ["queued"], to: ["pending"] },
  markRunning: { from: ["pending"], to: ["running"] },
  idle: { from: ["running"], to: ["parked", "descending"] },
  unpark: { from: ["parked"], to: ["running"] },
  beginDescent: { from: ["parked"], to: ["descending"] },
  finishDescent: { from: ["descending"], to: ["descended"] },
  // Resume is one verb (SPEC §12): a park unparks warm in place, a descended session restores cold.
  resume: { from: ["parked", "descended"], to: ["running", "pending", "queued"] },
  beginMove: { from: ["running"], to: ["moving"] },
  commitMove: { from: ["moving"], to: ["running"] },
  abortMove: { from: ["moving"], to: ["running"] },
  lose: { from: ["pending", "running", "parked", "descending", "moving"], to: ["lost"] },
  end: { from: ["queued", "pending", "running", "parked", "descending", "descended", "moving", "lost"], to: ["ended"] },
} as const satisfies { readonly [op: string]: { readonly from: readonly State[]; readonly to: readonly State[] } }

/** The name of a state-changing store operation. */
export type Operation = keyof typeof operations

/**
 * Judges `op` on a session in `from` that would lead to `to`: legal only when the operation
 * starts from `from` and the life cycle allows `from → to`.
 */
export const apply = (op: Operation, from: State, to: State): Transition => {
  const rule = operations[op]
  if (!(rule.from as readonly State[]).includes(from))
    return {
      _tag: "Illegal",
      from,
      to,
      message: `${op} needs a session in ${rule.from.join(" or ")}, not ${from} (cannot go from ${from} to ${to})`,
    }
  if (!(rule.to as readonly State[]).includes(to))
    return { _tag: "Illegal", from, to, message: `${op} leads to ${rule.to.join(" or ")}, not ${to}` }
  return transition(from, to)
}

// ---- the step: what an operation does ---------------------------------------------------------

/** A session record. `hostId` and `reservationId` are set while it holds a reservation; times are epoch ms. */
export interface Record {
  readonly id: string
  readonly state: State
  readonly budget: Budget
  readonly affinity: readonly string[]
  readonly hostId: string | null
  readonly reservationId: string | null
  readonly queuedAt: number | null
  readonly parkedAt: number | null
  /** No reported activity for this long makes a running session idle (`Lifetime.isIdle`); null: never. */
  readonly idleTimeoutMs: number | null
  /** The last reported guest activity, or the last time the session began to run (its idle clock starts there). */
  readonly lastActiveAt: number
  /** When the TTL ends the session whatever its state (`Lifetime.isExpired`); null: no TTL. */
  readonly endsAt: number | null
  /** The template the session starts from (`Names.isTemplateName`), instead of a boot; null: booted. */
  readonly template: string | null
  /**
   * The host whose agent holds the session's descent image (its memory): set when a descent
   * finishes with an image (the host it descended on; none for an imageless one), kept while the session is descended, queued or
   * pending, cleared when it runs again, is lost or ends. Its placement ranks that host first
   * among the hosts that fit (`Placement.requestOf`, `Placement.Request.imageHost`); null: none.
   */
  readonly imageHostId: string | null
  readonly createdAt: number
  readonly updatedAt: number
}

/**
 * Where a placement puts a session: the host the host choice picked, at the version of its row
 * the choice read, and the id of its new reservation.
 */
export interface Placed {
  readonly hostId: string
  readonly version: number
  readonly reservationId: string
}

/** A move about to open: ids chosen by the store, the target (at the version of its row) by the host choice. */
export interface NewMove {
  readonly id: string
  readonly targetHostId: string
  readonly targetVersion: number
  readonly reservationId: string
  readonly maxDowntimeMs: number
}

/** An operation with what it needs beyond the session record (ids, choices and reads are arguments). */
export type Step =
  | {
      readonly _tag: "create"
      readonly id: string
      readonly budget: Budget
      /** The preferred hosts, in order; absent: none (and a repeated create does not compare it). */
      readonly affinity?: readonly string[] | undefined
      /** The chosen host, or null: no host fits and the session queues. */
      readonly placement: Placed | null
      /** Valid lifetimes (`Lifetime.validLifetimeMs`) or absent. */
      readonly idleTimeoutMs?: number | null | undefined
      readonly ttlMs?: number | null | undefined
      /** A valid template name (`Names.isTemplateName`) or absent. */
      readonly template?: string | null | undefined
      /**
       * What the caller asked for when nothing fits (absent: `queue`). Only a repeated create
       * reads it: a new session's store refuses before asking for a plan (`NoRoom`).
       */
      readonly onNoRoom?: "queue" | "refuse" | undefined
    }
  | { readonly _tag: "place"; readonly placement: Placed }
  | { readonly _tag: "markRunning" }
  /** Parked or descending, as the configured park policy decides on what the store read (`ParkPolicy.mayPark`). */
  | {
      readonly _tag: "idle"
      readonly policy: ParkPolicy.Rule
      readonly view: ParkPolicy.IdleView
      /**
       * Only while the session is idle at `now` (`Lifetime.isIdle` on the record as it stands): the
       * reaper's, whose list of idle sessions was read before the step, so activity reported since
       * keeps the session running. Absent: an explicit idle, taken whenever the session runs.
       */
      readonly onlyIfDue?: boolean | undefined
    }
  | { readonly _tag: "unpark" }
  /** A park yields; `reason` is the gate's (`demand`, `over_reserved`, `hard_ttl`…), kept in the history. */
  | { readonly _tag: "beginDescent"; readonly reason?: string | null | undefined }
  /**
   * `imageless`: the descent left no image (its agent found neither the guest nor an image, and
   * told the loss first): the session keeps no image host, so its resume boots fresh without
   * fetching, and a named image host without the image is a loss of its own.
   */
  | { readonly _tag: "finishDescent"; readonly imageless?: boolean | undefined }
  /** A park resumes warm (no placement: pass null); a descended session is placed, or queued when null. */
  | { readonly _tag: "resume"; readonly placement: Placed | null }
  | { readonly _tag: "beginMove"; readonly openMove: Move.Record | null; readonly move: NewMove }
  /** `phases` null: committed on a resolution (the target's report or an operator's), without the source's measurement. */
  | {
      readonly _tag: "commitMove"
      readonly move: Move.Record
      readonly phases: Move.Phases | null
      /** The source guard's figures, kept on the move with their errors (only beside measured phases). */
      readonly guard?: Move.GuardReport | null | undefined
      /** Who commits (`Move.committedBy`); absent: its `source` beside measured phases, else not said (null). */
      readonly by?: Move.CommittedBy | null | undefined
    }
  | {
      readonly _tag: "abortMove"
      readonly move: Move.Record
      readonly reason: string
      readonly estimateMs: number | null
      /** Refuse a move whose final round is recorded (its pause is spent). */
      readonly onlyBeforeFinalRound: boolean
      /** The target's reservation goes because it was reclaimed (counts as reclaimed, not released). */
      readonly targetReclaimed: boolean
    }
  | {
      readonly _tag: "lose"
      readonly openMove: Move.Record | null
      /** Whether the open move's target reservation is reclaimed too (else it is released). */
      readonly targetReclaimed: boolean
    }
  /** `reason`: why it ends when not at a caller's word (the TTL's `Lifetime.ttlExpiredReason`), kept on `Ended`. */
  | {
      readonly _tag: "end"
      readonly openMove: Move.Record | null
      readonly reason?: string | null | undefined
      /**
       * Only while the session's TTL has ended it at `now` (`Lifetime.isExpired` on the record as it
       * stands): the reaper's, whose list of expired sessions was read before the step, so a TTL
       * moved since keeps the session. Absent: a caller's end, taken in any live state.
       */
      readonly onlyIfDue?: boolean | undefined
    }
  /** A new TTL from now (a valid `ttlMs`): the session's `endsAt` moves; its state stays. */
  | { readonly _tag: "setTtl"; readonly ttlMs: number }
  /**
   * The agent of `hostId` lost the session's guest (its VM ended by itself, or was not found) and
   * boots a fresh one in its place: recorded in the history; the record and its state stay.
   * `lastMove`: the session's latest committed move (its last `Moved` event), read by the store
   * when the session is no longer on `hostId`: a report from the host that move left is of the
   * copy lost there before the move (the report waited while the move committed).
   */
  | { readonly _tag: "guestLost"; readonly hostId: string; readonly reason: string; readonly lastMove?: LastMove | null | undefined }

/** A session's latest committed move, as its history has it (`Moved`): what a late report of a lost guest is judged on. */
export interface LastMove {
  readonly moveId: string
  readonly fromHostId: string
  readonly toHostId: string
  /**
   * Whether an event after the move names the reporting host as the session's (`hostId`): the
   * session was there again after the move, or a loss there was told since. A late report of
   * that host is then not of the copy the move left (or is that report again): refused.
   */
  readonly revisited?: boolean | undefined
}

/**
 * The latest committed move of a history (oldest first): its last `Moved` event, with whether an
 * event after it names `hostId` (`LastMove.revisited`); null when it has none.
 */
export const lastMoveOf = (events: readonly Event[], hostId: string): LastMove | null => {
  let revisited = false
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i]!
    if (e._tag === "Moved") return { moveId: e.moveId, fromHostId: e.fromHostId, toHostId: e.toHostId, revisited }
    if ("hostId" in e && e.hostId === hostId) revisited = true
  }
  return null
}

/**
 * The session's latest move, as its history has it (oldest first): the move its newest
 * `MoveBegun` event names (pending, committed or aborted since); null when it never moved. What
 * `Store.latestMove` reads (the move itself, if still kept).
 */
export const latestMoveIdOf = (events: readonly Event[]): string | null => {
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i]!
    if (e._tag === "MoveBegun") return e.moveId
  }
  return null
}

/** What happened to a session, for its history. `hostId` names the host it happened on, where there is one. */
export type Event =
  | { readonly _tag: "Created" }
  | { readonly _tag: "Queued" }
  | { readonly _tag: "Placed"; readonly hostId: string }
  | { readonly _tag: "Running"; readonly hostId: string | null }
  | { readonly _tag: "Parked"; readonly hostId: string | null }
  /** A descent began: straight from idle (no park allowed), or a park yielded (`reason`: the gate's, when known). */
  | { readonly _tag: "Descending"; readonly hostId: string | null; readonly cause: "idle" | "yield"; readonly reason: string | null }
  | { readonly _tag: "Descended"; readonly hostId: string | null }
  /** Resumed warm (a park unparked in place, on `hostId`) or cold (a descended session restored: placed or queued next). */
  | { readonly _tag: "Resumed"; readonly warm: boolean; readonly hostId: string | null }
  | { readonly _tag: "MoveBegun"; readonly moveId: string; readonly hostId: string | null; readonly targetHostId: string }
  | {
      readonly _tag: "Moved"
      readonly moveId: string
      readonly fromHostId: string
      readonly toHostId: string
      /** Null for a move committed on a resolution (SPEC §13): its pause was not measured. */
      readonly phases: Move.Phases | null
    }
  | {
      readonly _tag: "MoveAborted"
      readonly moveId: string
      readonly hostId: string | null
      readonly reason: string
      readonly estimateMs: number | null
    }
  | { readonly _tag: "Lost"; readonly hostId: string | null }
  /** `reason`: why, when the session did not end at a caller's word (e.g. `ttl expired`). */
  | { readonly _tag: "Ended"; readonly hostId: string | null; readonly reason?: string | undefined }
  /** The TTL was set anew: the session ends at `endsAt`. */
  | { readonly _tag: "TtlSet"; readonly endsAt: number }
  /**
   * Its guest on `hostId` was lost (`reason`: its agent's word) and a fresh one booted: its memory
   * state is gone. `moveId` and `toHostId` when the report came after move `moveId` took the
   * session from `hostId` to `toHostId`: the copy lost was the one on `hostId`, before that move
   * (the session runs on elsewhere; its state is not changed).
   */
  | { readonly _tag: "GuestLost"; readonly hostId: string; readonly reason: string; readonly moveId?: string | undefined; readonly toHostId?: string | undefined }

/** Every event tag, in life-cycle order. */
export const eventTags: readonly Event["_tag"][] = [
  "Created",
  "Queued",
  "Placed",
  "Running",
  "Parked",
  "Descending",
  "Descended",
  "Resumed",
  "MoveBegun",
  "Moved",
  "MoveAborted",
  "Lost",
  "Ended",
  "TtlSet",
  "GuestLost",
]

/** A state change the life cycle (or the operation's own rule) refuses. */
export interface Illegal {
  readonly _tag: "Illegal"
  readonly sessionId: string
  readonly from: State
  readonly to: State
  readonly message: string
}

/**
 * A refusal that is not about the life cycle: a repeated create that asks for another session
 * (another budget, affinity, lifetime or template: `repeatDiffers`) or of a session that ended,
 * was lost or descended, an open or finished move.
 */
export interface Conflict {
  readonly _tag: "Conflict"
  readonly entity: "session" | "move"
  readonly id: string
  readonly reason: string
  /** On a session that exists: its state, for callers that branch on it (a descended one is resumed, an ended one needs a new id). */
  readonly state?: State
}

/**
 * A step that is already done: a repeated create that asks for the session as it was created
 * (`repeatDiffers`; of a session neither ended, lost nor descended: one that is queued or on a
 * host), or an end of an ended session. Nothing changes; the caller gets the session as it is.
 */
export interface Unchanged {
  readonly _tag: "Unchanged"
  readonly session: Record
}

/** The answer of {@link step}: a plan writing exactly this session (and what follows from it), or why not. */
export type Answer = Plan.Plan | Illegal | Conflict | Unchanged | { readonly _tag: "NotFound" }

/** A refusal of {@link step}: anything but a plan or `Unchanged`. */
export type Refusal = Exclude<Answer, Plan.Plan | Unchanged>

/** Judges `op` on the session, leading to `to`: the refusal, or null when legal (see {@link apply}). */
export const judge = (s: Pick<Record, "id" | "state">, op: Operation, to: State): Illegal | null => {
  const t = apply(op, s.state, to)
  return t._tag === "Legal" ? null : { _tag: "Illegal", sessionId: s.id, from: s.state, to, message: t.message }
}

/** A reaper's step (`onlyIfDue`) on a session no longer due: refused, and nothing changes. */
const notDue = (s: Record, to: State, why: string): Illegal => ({ _tag: "Illegal", sessionId: s.id, from: s.state, to, message: `session ${s.id} ${why}` })

const moveConflict = (r: Move.Refusal): Conflict => ({ _tag: "Conflict", entity: "move", id: r.moveId, reason: r.reason })

/**
 * Whether a move may begin: a session has one open move at most (a `Conflict`, judged before
 * the state), and only a running session moves.
 */
export const refuseBeginMove = (s: Record, openMove: Pick<Move.Record, "id"> | null): Illegal | Conflict | null =>
  openMove !== null
    ? { _tag: "Conflict", entity: "move", id: openMove.id, reason: `session ${s.id} already has an open move` }
    : judge(s, "beginMove", "moving")

/**
 * Whether `hostId`'s agent may report the session's guest lost: only a session that is on that
 * host now (`hostId`), or that its latest committed move (`lastMove`) took away from that host
 * and that was not there again since, nor reported lost there since (the report of a copy lost
 * there before the move, late: it waited while the move committed; told once), and not ended (an `Illegal`: nothing left to lose). A session elsewhere otherwise, or on no
 * host, is a `Conflict` naming where it is: the report changes nothing.
 */
export const refuseGuestLost = (s: Record, hostId: string, lastMove: LastMove | null = null): Illegal | Conflict | null => {
  if (s.state === "ended") return { _tag: "Illegal", sessionId: s.id, from: s.state, to: s.state, message: `session ${s.id} is ended: it has no guest to lose` }
  if (s.hostId !== hostId && (lastMove === null || lastMove.fromHostId !== hostId || lastMove.revisited === true))
    return {
      _tag: "Conflict",
      entity: "session",
      id: s.id,
      reason: `session ${s.id} is not on host ${hostId} (it is ${s.state}${s.hostId === null ? ", on no host" : ` on host ${s.hostId}`}): only its own host's agent reports its guest lost`,
      state: s.state,
    }
  return null
}

/** Whether a resume of a session in this state is warm: a park unparks in place, with no placement. */
export const resumesWarm = (state: State): boolean => state === "parked"

/**
 * Judges a resume before any host is chosen (SPEC §12: resume is one verb): a park resumes
 * warm (judged against running), a descended session cold (judged against pending).
 */
export const judgeResume = (s: Pick<Record, "id" | "state">): Illegal | null =>
  judge(s, "resume", resumesWarm(s.state) ? "running" : "pending")

/** The state an operation asks for (the state named by its refusal). */
export const target = (op: Exclude<Step, { readonly _tag: "setTtl" | "guestLost" }>): State => {
  switch (op._tag) {
    case "create":
    case "place":
    case "resume":
      return op._tag === "create" && op.placement === null ? "queued" : "pending"
    case "markRunning":
    case "unpark":
    case "commitMove":
    case "abortMove":
      return "running"
    case "idle":
      return ParkPolicy.mayPark(op.policy, op.view) ? "parked" : "descending"
    case "beginDescent":
      return "descending"
    case "finishDescent":
      return "descended"
    case "beginMove":
      return "moving"
    case "lose":
      return "lost"
    case "end":
      return "ended"
  }
}

const entryFor = (id: string, hostId: string, ownerKind: "session" | "move", ownerId: string, b: Budget, now: number): Entry =>
  Ledger.entryOf({ id, hostId, ownerKind, ownerId, memMib: b.memMib, vcpus: b.vcpus }, now)

/** The release of the session's own reservation, if it holds one. */
const releaseOwn = (s: Record, how: Plan.Removal): Plan.LedgerChange[] =>
  s.reservationId === null || s.hostId === null
    ? []
    : [Plan.release({ id: s.reservationId, hostId: s.hostId, memMib: s.budget.memMib, vcpus: s.budget.vcpus }, how)]

/** The release of a move's target reservation (it holds the session's budget). */
const releaseTarget = (s: Record, m: Move.Record, how: Plan.Removal): Plan.LedgerChange =>
  Plan.release({ id: m.reservationId, hostId: m.targetHostId, memMib: s.budget.memMib, vcpus: s.budget.vcpus }, how)

const none: readonly Plan.LedgerChange[] = []

/** The plan of a step on `s` (null: a new session): its next record and what else changes. */
function planOf(
  s: Record | null,
  next: Record,
  now: number,
  ledger: readonly Plan.LedgerChange[],
  move: Plan.MoveChange | null,
  events: readonly Event[],
  host: Plan.HostVersion | null = null,
): Plan.Plan {
  return {
    _tag: "Plan",
    at: now,
    sessions: [{ record: next, from: s === null ? null : s.state }],
    ledger,
    moves: move === null ? [] : [move],
    events: events.map((event) => ({ sessionId: next.id, event })),
    host,
  }
}

/** The session placed on a host: pending there, holding a new reservation. */
const placedOn = (s: Record, p: Placed, now: number): [Record, Plan.LedgerChange, Plan.HostVersion] => [
  { ...s, state: "pending", hostId: p.hostId, reservationId: p.reservationId, queuedAt: null, parkedAt: null, updatedAt: now },
  { _tag: "Reserve", entry: entryFor(p.reservationId, p.hostId, "session", s.id, s.budget, now) },
  { hostId: p.hostId, version: p.version },
]

/** The session waiting in the queue from `now`, holding nothing. */
const queuedAt = (s: Record, now: number): Record => ({
  ...s,
  state: "queued",
  hostId: null,
  reservationId: null,
  queuedAt: now,
  parkedAt: null,
  updatedAt: now,
})

const closed = (m: Move.Record, reason: string, estimateMs: number | null, now: number): Plan.MoveChange => ({
  _tag: "Update",
  move: Move.close(m, reason, estimateMs, now),
})

/** The close of a session's open move when the session leaves (ended or lost): its target reservation goes. */
const leaving = (s: Record, openMove: Move.Record | null, reason: string, how: Plan.Removal, now: number) =>
  openMove === null
    ? { ledger: [] as Plan.LedgerChange[], move: null, events: [] as Event[] }
    : {
        ledger: [releaseTarget(s, openMove, how)],
        move: closed(openMove, reason, null, now),
        events: [{ _tag: "MoveAborted", moveId: openMove.id, hostId: openMove.sourceHostId, reason, estimateMs: null }] as Event[],
      }

// Events that carry nothing are shared (readonly by type): steps are on every store's hot path.
const created = [{ _tag: "Created" }, { _tag: "Queued" }] as const satisfies readonly Event[]
const createdQueued: readonly Event[] = created
const queuedEvent: Event = created[1]
const cold: Event = { _tag: "Resumed", warm: false, hostId: null }

/** The reason a move closes when its session ends. */
export const endedReason = "session ended"
/** The reason a move closes when its session's reservation is reclaimed. */
export const lostReason = "session lost: its reservation was reclaimed"
/** The reason a move closes when its target's reservation is reclaimed. */
export const targetLostReason = "move target's reservation was reclaimed"

/** A new session's plan: pending on the chosen host, or queued. */
const createPlan = (op: Extract<Step, { readonly _tag: "create" }>, now: number): Plan.Plan => {
  // Built once, as it leaves: this is the hot path of every create.
  const p = op.placement
  const session: Record = {
    id: op.id,
    state: p === null ? "queued" : "pending",
    budget: { memMib: op.budget.memMib, vcpus: op.budget.vcpus },
    affinity: op.affinity === undefined ? [] : [...op.affinity],
    hostId: p === null ? null : p.hostId,
    reservationId: p === null ? null : p.reservationId,
    queuedAt: p === null ? now : null,
    parkedAt: null,
    idleTimeoutMs: op.idleTimeoutMs ?? null,
    lastActiveAt: now,
    endsAt: Lifetime.endsAtOf(op.ttlMs, now),
    template: op.template ?? null,
    imageHostId: null,
    createdAt: now,
    updatedAt: now,
  }
  if (p === null) return planOf(null, session, now, none, null, createdQueued)
  const reserve: Plan.LedgerChange = { _tag: "Reserve", entry: entryFor(p.reservationId, p.hostId, "session", op.id, session.budget, now) }
  return planOf(null, session, now, [reserve], null, [created[0], { _tag: "Placed", hostId: p.hostId }], { hostId: p.hostId, version: p.version })
}

const sameList = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((x, i) => x === b[i])

/**
 * Why a repeated create is not the create of `s` (the first field it names that differs), or
 * null when it is: a repeat answers the session only when it asks for that session. The budget
 * is always sent; the options only when given (a repeat that leaves one out asks nothing of it).
 * A TTL counts from the first create, so `ttlMs` is compared as the deadline it set
 * (`createdAt + ttlMs`): after a new TTL (`setTtl`) the first create's no longer matches. A
 * repeat that refuses to queue (`onNoRoom: refuse`) is not answered with a queued session.
 */
export const repeatDiffers = (s: Record, op: Extract<Step, { readonly _tag: "create" }>): string | null => {
  if (s.budget.memMib !== op.budget.memMib || s.budget.vcpus !== op.budget.vcpus) return "session exists with another budget"
  if (op.affinity !== undefined && !sameList(s.affinity, op.affinity))
    return `session exists with another affinity (${s.affinity.length === 0 ? "none" : s.affinity.join(", ")})`
  if (op.idleTimeoutMs != null && s.idleTimeoutMs !== op.idleTimeoutMs)
    return `session exists with another idleTimeoutMs (${s.idleTimeoutMs === null ? "none" : s.idleTimeoutMs})`
  if (op.ttlMs != null && s.endsAt !== s.createdAt + op.ttlMs)
    return s.endsAt === null
      ? "session exists with another ttlMs (none: it has no TTL)"
      : `session exists with another ttlMs: it ends at ${s.endsAt}, not at its create's time + ttlMs (${s.createdAt + op.ttlMs}; a TTL counts from the first create, and a new TTL moves it)`
  if (op.template != null && s.template !== op.template) return `session exists with another template (${s.template ?? "none"})`
  if (op.onNoRoom === "refuse" && s.state === "queued") return "session exists and is queued: onNoRoom refuse asks for a session that is placed, or none"
  return null
}

/**
 * What `op` does to the session `s` at `now` (SPEC §2, §3, §5): its plan, or why it is
 * refused. `s` is null when no session has the id (only a `create` applies then). Nothing else
 * decides what an operation changes.
 */
export const step = (s: Record | null, op: Step, now: number): Answer => {
  if (op._tag === "create") {
    if (s === null) return createPlan(op, now)
    const differs = repeatDiffers(s, op)
    if (differs !== null) return { _tag: "Conflict", entity: "session", id: s.id, reason: differs, state: s.state }
    // A create answers placed or queued; a repeat after the session ended (or was lost) is
    // neither, and a create cannot bring it back: its id is spent. A descended session is
    // neither placed nor queued either: only a resume restores it (SPEC §12).
    if (s.state === "ended" || s.state === "lost")
      return { _tag: "Conflict", entity: "session", id: s.id, reason: `session exists and is ${s.state}: a create does not start it again (a new session needs a new id)`, state: s.state }
    if (s.state === "descended")
      return { _tag: "Conflict", entity: "session", id: s.id, reason: "session exists and is descended: a create does not restore it (a resume does)", state: s.state }
    return { _tag: "Unchanged", session: s }
  }
  if (s === null) return { _tag: "NotFound" }
  switch (op._tag) {
    case "place": {
      const bad = judge(s, "place", "pending")
      if (bad) return bad
      const [next, reserve, host] = placedOn(s, op.placement, now)
      return planOf(s, next, now, [reserve], null, [{ _tag: "Placed", hostId: op.placement.hostId }], host)
    }
    case "markRunning":
    case "unpark": {
      const bad = judge(s, op._tag, "running")
      if (bad) return bad
      const events: readonly Event[] = [op._tag === "unpark" ? { _tag: "Resumed", warm: true, hostId: s.hostId } : { _tag: "Running", hostId: s.hostId }]
      // Running again: its memory is in the guest, no longer in the image (`imageHostId`).
      return planOf(s, { ...s, state: "running", parkedAt: null, lastActiveAt: now, imageHostId: null, updatedAt: now }, now, none, null, events)
    }
    case "idle": {
      const to = target(op)
      const bad = judge(s, "idle", to)
      if (bad) return bad
      if (op.onlyIfDue === true && !Lifetime.isIdle(s, s.lastActiveAt, now)) return notDue(s, to, "is not idle: it was active since the idle sessions were read")
      const events: readonly Event[] = [
        to === "parked" ? { _tag: "Parked", hostId: s.hostId } : { _tag: "Descending", hostId: s.hostId, cause: "idle", reason: null },
      ]
      return planOf(s, { ...s, state: to, parkedAt: to === "parked" ? now : null, updatedAt: now }, now, none, null, events)
    }
    case "beginDescent": {
      const bad = judge(s, "beginDescent", "descending")
      if (bad) return bad
      return planOf(s, { ...s, state: "descending", parkedAt: null, updatedAt: now }, now, none, null, [
        { _tag: "Descending", hostId: s.hostId, cause: "yield", reason: op.reason ?? null },
      ])
    }
    case "finishDescent": {
      const bad = judge(s, "finishDescent", "descended")
      if (bad) return bad
      return planOf(
        s,
        { ...s, state: "descended", hostId: null, reservationId: null, parkedAt: null, imageHostId: op.imageless === true ? null : s.hostId, updatedAt: now },
        now,
        releaseOwn(s, "released"),
        null,
        [{ _tag: "Descended", hostId: s.hostId }],
      )
    }
    case "resume": {
      // Judged against pending whatever the room (running for a park): a refused resume names the state it asked for.
      const bad = judgeResume(s)
      if (bad) return bad
      // A park resumes warm: running again on its host, with its reservation, no placement.
      if (resumesWarm(s.state))
        return planOf(s, { ...s, state: "running", parkedAt: null, lastActiveAt: now, updatedAt: now }, now, none, null, [{ _tag: "Resumed", warm: true, hostId: s.hostId }])
      if (op.placement === null) return planOf(s, queuedAt(s, now), now, none, null, [cold, queuedEvent])
      const [next, reserve, host] = placedOn(s, op.placement, now)
      return planOf(s, next, now, [reserve], null, [cold, { _tag: "Placed", hostId: op.placement.hostId }], host)
    }
    case "beginMove": {
      const bad = refuseBeginMove(s, op.openMove)
      if (bad) return bad
      const m = op.move
      const move: Move.Record = {
        id: m.id,
        sessionId: s.id,
        sourceHostId: s.hostId as string,
        targetHostId: m.targetHostId,
        reservationId: m.reservationId,
        maxDowntimeMs: m.maxDowntimeMs,
        state: "pending",
        rounds: [],
        phases: null,
        abortReason: null,
        abortEstimateMs: null,
        guard: null,
        resendOwed: false,
        resendClears: 0,
        committedBy: null,
        createdAt: now,
        endedAt: null,
      }
      return planOf(
        s,
        { ...s, state: "moving", parkedAt: null, updatedAt: now },
        now,
        [{ _tag: "Reserve", entry: entryFor(m.reservationId, m.targetHostId, "move", m.id, s.budget, now) }],
        { _tag: "Open", move },
        [{ _tag: "MoveBegun", moveId: m.id, hostId: s.hostId, targetHostId: m.targetHostId }],
        { hostId: m.targetHostId, version: m.targetVersion },
      )
    }
    case "commitMove": {
      const m = op.move
      const refused = Move.refuseCommit(m, op.phases !== null)
      if (refused) return moveConflict(refused)
      const bad = judge(s, "commitMove", "running")
      if (bad) return bad
      // The target's reservation becomes the session's; the source's is released.
      const ledger: Plan.LedgerChange[] = [{ _tag: "Transfer", id: m.reservationId, ownerId: s.id, heartbeatAt: now }]
      if (s.reservationId !== m.reservationId) ledger.push(...releaseOwn(s, "released"))
      const phases = op.phases === null ? null : { downtimeMs: op.phases.downtimeMs, captureMs: op.phases.captureMs, sendMs: op.phases.sendMs, commitMs: op.phases.commitMs }
      return planOf(
        s,
        { ...s, state: "running", hostId: m.targetHostId, reservationId: m.reservationId, parkedAt: null, lastActiveAt: now, updatedAt: now },
        now,
        ledger,
        {
          _tag: "Update",
          move: {
            ...m,
            state: "committed",
            phases,
            guard: phases === null || op.guard == null ? null : Move.guardOf(op.guard, phases),
            committedBy: op.by ?? (phases === null ? null : "source"),
            endedAt: now,
          },
        },
        [{ _tag: "Moved", moveId: m.id, fromHostId: m.sourceHostId, toHostId: m.targetHostId, phases }],
      )
    }
    case "abortMove": {
      const m = op.move
      const refused = Move.refuseAbort(m, op.onlyBeforeFinalRound)
      if (refused) return moveConflict(refused)
      const bad = judge(s, "abortMove", "running")
      if (bad) return bad
      return planOf(
        s,
        { ...s, state: "running", parkedAt: null, lastActiveAt: now, updatedAt: now },
        now,
        [releaseTarget(s, m, op.targetReclaimed ? "reclaimed" : "released")],
        closed(m, op.reason, op.estimateMs, now),
        [{ _tag: "MoveAborted", moveId: m.id, hostId: m.sourceHostId, reason: op.reason, estimateMs: op.estimateMs }],
      )
    }
    case "lose": {
      const bad = judge(s, "lose", "lost")
      if (bad) return bad
      const gone = leaving(s, op.openMove, lostReason, op.targetReclaimed ? "reclaimed" : "released", now)
      return planOf(
        s,
        { ...s, state: "lost", hostId: null, reservationId: null, parkedAt: null, imageHostId: null, updatedAt: now },
        now,
        [...releaseOwn(s, "reclaimed"), ...gone.ledger],
        gone.move,
        [...gone.events, { _tag: "Lost", hostId: s.hostId }],
      )
    }
    case "end": {
      // Ending is idempotent: a repeated end (a retry, a second operator) finds the session ended and changes nothing.
      if (s.state === "ended") return { _tag: "Unchanged", session: s }
      const bad = judge(s, "end", "ended")
      if (bad) return bad
      if (op.onlyIfDue === true && !Lifetime.isExpired(s, now)) return notDue(s, "ended", "is not expired: its TTL was moved since the expired sessions were read")
      const next: Record = { ...s, state: "ended", hostId: null, reservationId: null, queuedAt: null, parkedAt: null, imageHostId: null, updatedAt: now }
      const ended: Event = op.reason === null || op.reason === undefined ? { _tag: "Ended", hostId: s.hostId } : { _tag: "Ended", hostId: s.hostId, reason: op.reason }
      if (op.openMove === null) return planOf(s, next, now, releaseOwn(s, "released"), null, [ended])
      const gone = leaving(s, op.openMove, endedReason, "released", now)
      return planOf(s, next, now, [...gone.ledger, ...releaseOwn(s, "released")], gone.move, [...gone.events, ended])
    }
    case "setTtl": {
      // Any live session may get a new TTL; an ended one has nothing left to end.
      if (s.state === "ended") return { _tag: "Illegal", sessionId: s.id, from: s.state, to: s.state, message: "an ended session has no TTL to set" }
      const endsAt = Lifetime.endsAtOf(op.ttlMs, now) as number
      return planOf(s, { ...s, endsAt, updatedAt: now }, now, none, null, [{ _tag: "TtlSet", endsAt }])
    }
    case "guestLost": {
      const lastMove = op.lastMove ?? null
      const refused = refuseGuestLost(s, op.hostId, lastMove)
      if (refused) return refused
      // Only the history changes: the fresh guest keeps the session's state (its agent boots it
      // so); a copy lost before a move that took the session away changes nothing where it runs now.
      const away = s.hostId !== op.hostId && lastMove !== null ? { moveId: lastMove.moveId, toHostId: lastMove.toHostId } : {}
      return planOf(s, s, now, none, null, [{ _tag: "GuestLost", hostId: op.hostId, reason: op.reason, ...away }])
    }
  }
}
