/**
 * The reclaim pass (SPEC §3): which reservations it removes (every expired or stale one; only
 * the expired ones while the failover grace holds, `Ledger.ReclaimOptions`) and what follows
 * from it, as one `Plan`. A reclaimed session reservation makes its session `lost`
 * and closes its open move (the target's reservation goes too: reclaimed if it is itself stale,
 * else released); a reclaimed move target closes its move and the session runs on the source
 * again. An in-doubt move (`Move.inDoubt`: its final round recorded) is never reclaimed: its
 * session's entry and its target's are held, stale as they are, until the move is committed or
 * aborted explicitly (SPEC §13); a silent peer only delays that. Entries are judged in id order, so when both of a moving session's entries are stale
 * the first one decides why the move closed; the session ends lost either way. Each session
 * change is a `Session.step`; the cascade is applied whole.
 */
import type { Entry } from "./Ledger.js"
import * as Ledger from "./Ledger.js"
import { defaults, type Limits } from "./Limits.js"
import * as Move from "./Move.js"
import { byId } from "./Order.js"
import * as Plan from "./Plan.js"
import * as Session from "./Session.js"

/** What a store must read, under its locks, before it asks for the plan. */
export interface Wanted<E extends Entry = Entry> {
  /** The entries the pass removes, sorted by id. */
  readonly doomed: readonly E[]
  /** Sessions owning a doomed session entry. */
  readonly sessionIds: readonly string[]
  /** Moves owning a doomed move entry. */
  readonly moveIds: readonly string[]
}

/** The entries `reclaim` removes at `now` (only the expired with `options.stale` false), and whose sessions and moves it needs. */
export const wanted = <E extends Entry>(entries: Iterable<E>, now: number, limits: Limits = defaults, options: Ledger.ReclaimOptions = {}): Wanted<E> => {
  const doomed = Ledger.reclaimable(entries, now, limits, options).sort(byId)
  const sessionIds = new Set<string>()
  const moveIds = new Set<string>()
  for (const e of doomed) {
    if (e.ownerKind === "session") sessionIds.add(e.ownerId)
    else if (e.ownerKind === "move") moveIds.add(e.ownerId)
  }
  return { doomed, sessionIds: [...sessionIds].sort(), moveIds: [...moveIds].sort() }
}

/** What the pass reads: the candidate entries, and the sessions and open moves they may touch. */
export interface Input<E extends Entry = Entry> {
  /** Entries to judge; those neither expired nor stale stay (pass every entry, or those read as suspects). */
  readonly entries: Iterable<E>
  /** Every session owning a doomed session entry, and the session of every open move below. */
  readonly sessions: Iterable<Session.Record>
  /** The pending moves owned by a doomed move entry or belonging to one of those sessions. */
  readonly openMoves: Iterable<Move.Record>
}

/** A reclaim pass, decided. */
export interface Decided<E extends Entry = Entry> {
  /** Everything the pass writes: every removal, the sessions lost or running again, the moves closed, their events. */
  readonly plan: Plan.Plan
  /** The expired or stale entries removed (counted as reclaimed), sorted by id. */
  readonly reclaimed: readonly E[]
  /** The stale entries held for an in-doubt move (left in place, judged again next pass), sorted by id. */
  readonly held: readonly E[]
  /** The sessions made lost, sorted. */
  readonly lostSessions: readonly string[]
  /**
   * The open moves the pass closed (a lost session's, or one whose target's entry went), sorted
   * by id: their targets' agents and their waiters are owed a notice, and a target's entry may
   * have been released rather than reclaimed (not in `reclaimed`).
   */
  readonly closedMoves: readonly Move.Record[]
  /**
   * The hosts that held the descent image of a session made lost (a restore cut short), sorted
   * and distinct: the image is no longer theirs to keep, and their agents are owed a notice.
   */
  readonly imageHostIds: readonly string[]
}

/**
 * Decides a reclaim pass at `now` (SPEC §3): the entries that go (only the expired with
 * `options.stale` false: a stale one stays, and a stale move target of a session lost is
 * released, not counted), and the cascade to sessions and moves.
 */
export const decide = <E extends Entry>(input: Input<E>, now: number, limits: Limits = defaults, options: Ledger.ReclaimOptions = {}): Decided<E> => {
  const { doomed } = wanted(input.entries, now, limits, options)
  const doomedIds = new Set(doomed.map((e) => e.id))
  const current = new Map<string, Session.Record>()
  for (const s of input.sessions) current.set(s.id, s)
  const before = new Map(current)
  const openMoves = new Map<string, Move.Record>()
  const openOf = new Map<string, Move.Record>()
  for (const m of input.openMoves)
    if (m.state === "pending") {
      openMoves.set(m.id, m)
      openOf.set(m.sessionId, m)
    }
  const removed = new Set<string>()
  const ledger: Plan.LedgerChange[] = []
  const closed = new Map<string, Move.Record>()
  const lost: string[] = []
  const events: Plan.Happened[] = []
  const held: E[] = []
  /** Whether the entry belongs to an in-doubt move: its session's own, or its target's. */
  const ofMoveInDoubt = (e: E): boolean => {
    if (e.ownerKind === "move") {
      const m = openMoves.get(e.ownerId)
      return m !== undefined && m.reservationId === e.id && Move.inDoubt(m)
    }
    if (e.ownerKind !== "session") return false
    const s = current.get(e.ownerId)
    const m = s === undefined ? undefined : openOf.get(s.id)
    return s !== undefined && s.reservationId === e.id && m !== undefined && Move.inDoubt(m)
  }

  const take = (sessionId: string, answer: Session.Answer): boolean => {
    if (answer._tag !== "Plan") return false
    current.set(sessionId, answer.sessions[0]?.record as Session.Record)
    for (const c of answer.ledger)
      if (c._tag === "Release" && !removed.has(c.id)) {
        removed.add(c.id)
        // A stale entry counts as reclaimed whichever step removes it.
        ledger.push(doomedIds.has(c.id) ? Plan.release(c, "reclaimed") : c)
      }
    for (const m of answer.moves) {
      closed.set(m.move.id, m.move)
      openMoves.delete(m.move.id)
      openOf.delete(sessionId)
    }
    events.push(...answer.events)
    return true
  }

  for (const e of doomed) {
    if (removed.has(e.id)) continue
    if (ofMoveInDoubt(e)) {
      held.push(e)
      continue
    }
    if (e.ownerKind === "session") {
      const s = current.get(e.ownerId)
      if (s !== undefined && s.reservationId === e.id) {
        const m = openOf.get(s.id) ?? null
        const lose: Session.Step = { _tag: "lose", openMove: m, targetReclaimed: m !== null && doomedIds.has(m.reservationId) }
        if (take(s.id, Session.step(s, lose, now))) lost.push(s.id)
      }
    } else if (e.ownerKind === "move") {
      const m = openMoves.get(e.ownerId)
      if (m !== undefined && m.reservationId === e.id) {
        const s = current.get(m.sessionId)
        const abort: Session.Step = {
          _tag: "abortMove",
          move: m,
          reason: Session.targetLostReason,
          estimateMs: null,
          onlyBeforeFinalRound: false,
          targetReclaimed: true,
        }
        if (s === undefined || !take(s.id, Session.step(s, abort, now))) {
          // A move whose session is not moving (never, while the store is consistent) still closes: its target is gone.
          closed.set(m.id, Move.close(m, Session.targetLostReason, null, now))
          openMoves.delete(m.id)
          openOf.delete(m.sessionId)
        }
      }
    }
    if (!removed.has(e.id)) {
      removed.add(e.id)
      ledger.push(Plan.release(e, "reclaimed"))
    }
  }

  const changed = [...current.keys()].filter((id) => current.get(id) !== before.get(id)).sort()
  const plan = Plan.make(now, {
    // Each session written once, from the state it was read in, to where the cascade left it.
    sessions: changed.map((id) => ({ record: current.get(id) as Session.Record, from: (before.get(id) as Session.Record).state })),
    ledger,
    moves: [...closed.values()].sort(byId).map((move) => ({ _tag: "Update" as const, move })),
    events,
  })
  const heldIds = new Set(held.map((e) => e.id))
  const imageHostIds = [...new Set(lost.flatMap((id) => before.get(id)?.imageHostId ?? []))].sort()
  return {
    plan,
    reclaimed: doomed.filter((e) => !heldIds.has(e.id)),
    held,
    lostSessions: lost.sort(),
    closedMoves: [...closed.values()].sort(byId),
    imageHostIds,
  }
}

/**
 * The failover grace (Nomad's `failover_heartbeat_ttl`): when the coordinator side was down
 * (no reaper leading, the store unreachable, the process frozen or suspended), no host could
 * heartbeat, so every reservation looks stale though every host may be fine. Stale reservations
 * are therefore not reclaimed until the reaper has reached the store as leader for `graceMs`
 * without a gap. The reaper notes its contacts with the store as leader: every store call of a
 * pass that succeeds (its fleet read, its reclaim, its writes). The grace starts (`startedAt` =
 * the contact's time) at the first contact of a leadership (`lastContactAt` null), and at a contact
 * more than `gapMs` after the last one (however that gap came about: failed reads, a frozen
 * process, a pass that could not run, one call that hung, a forward step of the clock) or more
 * than `gapMs` before it (a backward step: the grace is measured again from there, never
 * stretched by the step). Right before a stale reclaim and at a pass's end the reaper checks the
 * clock against the last contact too (`graceCheck`: no contact itself), so a process frozen
 * anywhere in a pass is a gap. A failed call alone restarts nothing: a short blip (a statement
 * timeout now and then) cannot hold reclaims for ever; and a long pass whose calls keep
 * succeeding is not a gap. `graceMs` 0: no grace (the seed's rule: reclaim every pass).
 */
export interface Grace {
  /** When the running grace started (Clock ms); null: it starts at the next contact. */
  readonly startedAt: number | null
  /** The last contact with the store as leader (Clock ms): a store call that succeeded; null: none yet in this leadership. */
  readonly lastContactAt: number | null
}

/** A grace that starts at the next contact with the store: a new leadership. */
export const graceRestart: Grace = Object.freeze({ startedAt: null, lastContactAt: null })

/**
 * The grace after a contact with the store at `now` (a fleet read, or any store call that
 * succeeded): started again (`started` true: tell it) at a leadership's first contact, after a
 * gap of more than `gapMs` since the last contact, or when the clock went back; else kept, with
 * `now` as the last contact.
 */
export const graceAfterContact = (grace: Grace, now: number, gapMs: number): { readonly grace: Grace; readonly started: boolean } => {
  const checked = graceCheck(grace, now, gapMs)
  return checked.started ? checked : { grace: { startedAt: grace.startedAt, lastContactAt: now }, started: false }
}

/**
 * Whether `now` is a gap: no grace has started, or it is more than `gapMs` after the last
 * contact, or more than `gapMs` before it (the clock went back).
 */
export const graceGap = (grace: Grace, now: number, gapMs: number): boolean => {
  const last = grace.lastContactAt
  return grace.startedAt === null || last === null || now - last > gapMs || last - now > gapMs
}

/**
 * The grace at `now` checked against the last contact, which this is not (no store call
 * succeeded now): right before a pass reclaims stale reservations, and at a pass's end. A gap
 * since the last contact (the process frozen or suspended mid-pass, a clock step) starts it
 * again as a gap at a contact would (`started` true: tell it), so the stale reclaim waits; else
 * it is kept as it is.
 */
export const graceCheck = (grace: Grace, now: number, gapMs: number): { readonly grace: Grace; readonly started: boolean } =>
  graceGap(grace, now, gapMs) ? { grace: { startedAt: now, lastContactAt: now }, started: true } : { grace, started: false }

/** Whether the reclaim waits at `now`: the grace has not started, or has run less than `graceMs`. */
export const graceHolds = (grace: Grace, now: number, graceMs: number): boolean => graceMs > 0 && (grace.startedAt === null || now - grace.startedAt < graceMs)

/** When the running grace ends (Clock ms), or null when none has started. */
export const graceEnds = (grace: Grace, graceMs: number): number | null => (grace.startedAt === null ? null : grace.startedAt + graceMs)

/**
 * The longest time between two contacts with the store that is not a gap: a third of the
 * heartbeat stale window (the agents heartbeat at that interval; a host misses its window only
 * when heartbeats were blocked longer than the window less one interval), never from the grace
 * (a longer grace must not let a longer freeze pass unseen); at least two of the reaper's
 * intervals, so the time between one pass's end and the next pass's read is never a gap.
 */
export const graceGapMs = (staleWindowMs: number, intervalMs = 0): number => Math.max(minGraceMs(staleWindowMs), 2 * intervalMs)

/**
 * The shortest failover grace that protects anything: the agents' default heartbeat interval (a
 * third of the stale window). A shorter grace can end before a live host's next heartbeat lands,
 * so the fleet is reclaimed as if there were none; 0 (no grace) is the other choice.
 */
export const minGraceMs = (staleWindowMs: number): number => Math.floor(staleWindowMs / 3)
