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
 *
 * One exception to `lost` (`Way`, `returnsTo`): a running session whose host is reclaimed and
 * whose last event is its commit there by a move the source did not confirm (committed without
 * phases) and whose source declared that it owes the target a resend (it holds the guest's only
 * whole copy, paused: the target never got a complete stream) goes back to that move's source
 * while the source is heard and has room (`Placement.fitsReturn`: a cordoned or draining source
 * too, since the guest is already there; a drain moves it off again), as a plan of its own. Placed there, the source's agent
 * resumes its copy (and boots afresh, telling the loss, when it holds none). Without that
 * declaration (an operator's commit the source never answered, or the target's own resolution:
 * it ran the guest) the session is lost rather than rolled back to an older copy. One rollback
 * stays possible (the host agent's README, step 8): a target that resumed a stream sent again
 * and died before the source heard its commit, the mark still set.
 */
import type { Entry } from "./Ledger.js"
import * as Ledger from "./Ledger.js"
import { defaults, type Limits } from "./Limits.js"
import * as Headroom from "./Headroom.js"
import * as Move from "./Move.js"
import { byId } from "./Order.js"
import * as Placement from "./Placement.js"
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

/**
 * The source host a reclaimed session may go back to (`returnsTo`), judged on what the store read:
 * the session running on the host of the reclaimed entry, its last event (newest in its history)
 * the `Moved` that committed it there without the source's phases, and that move (`lastMove`, the
 * one the event names) marked by its source as owing a resend (`resendOwed`: the source declared
 * that the target never got a complete stream, so the source holds the guest's only whole copy).
 * A commit without phases alone is not enough: a target's own resolution commit has none either,
 * and that target ran the guest (possibly for minutes); sending the session back would resume the
 * source's older paused copy, a silent rollback. Null: it ends lost, as any. A store reads the
 * source's row (`Way`) only for these.
 */
export const wayBackOf = (
  s: Session.Record,
  entry: Pick<Entry, "id" | "hostId">,
  lastEvent: Session.Event | undefined,
  lastMove: { readonly id: string; readonly resendOwed: boolean } | undefined,
): string | null =>
  s.state === "running" &&
  s.reservationId === entry.id &&
  s.hostId === entry.hostId &&
  lastEvent?._tag === "Moved" &&
  lastEvent.toHostId === entry.hostId &&
  lastEvent.fromHostId !== entry.hostId &&
  lastEvent.phases === null &&
  lastMove !== undefined &&
  lastMove.id === lastEvent.moveId &&
  lastMove.resendOwed
    ? lastEvent.fromHostId
    : null

/** A session's way back to its move's source, as the store read it (`wayBackOf` named the source). */
export interface Way {
  readonly sessionId: string
  /** The session's last event, read with it: `decide` judges `wayBackOf` again on it. */
  readonly lastEvent: Session.Event
  /** The move that event names, with its source's resend mark, read with it (`wayBackOf`). */
  readonly lastMove: { readonly id: string; readonly resendOwed: boolean }
  /** The source as placement sees it now, and the version of its row read (the plan's `host`). */
  readonly source: Placement.Candidate
  readonly version: number
  /** The id of the reservation the session takes on the source. */
  readonly reservationId: string
}

/** What the pass reads: the candidate entries, and the sessions and open moves they may touch. */
export interface Input<E extends Entry = Entry> {
  /** Entries to judge; those neither expired nor stale stay (pass every entry, or those read as suspects). */
  readonly entries: Iterable<E>
  /** Every session owning a doomed session entry, and the session of every open move below. */
  readonly sessions: Iterable<Session.Record>
  /** The pending moves owned by a doomed move entry or belonging to one of those sessions. */
  readonly openMoves: Iterable<Move.Record>
  /** The ways back (`Way`) of the sessions `wayBackOf` names a source for; absent: none, every such session is lost. */
  readonly ways?: Iterable<Way> | undefined
}

/** A reclaim pass, decided. */
export interface Decided<E extends Entry = Entry> {
  /** Everything the pass writes: every removal, the sessions lost or running again, the moves closed, their events. */
  readonly plan: Plan.Plan
  /** The expired or stale entries removed (counted as reclaimed), sorted by id. */
  readonly reclaimed: readonly E[]
  /**
   * The stale entries held for an in-doubt move, or for a way back to a source whose own entries
   * this pass reclaims (left in place, judged again next pass), sorted by id.
   */
  readonly held: readonly E[]
  /** The sessions made lost, sorted. */
  readonly lostSessions: readonly string[]
  /**
   * The sessions sent back to their move's source, sorted by session id, each with its plan
   * (`returnsTo`): applied with `plan` in one group; a plan left out (the source's row changed) is
   * the pass to run again. Their reclaimed entries are in `reclaimed`, released by their plans.
   */
  readonly returned: readonly { readonly sessionId: string; readonly hostId: string; readonly plan: Plan.Plan }[]
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
  const ways = new Map<string, Way>()
  for (const w of input.ways ?? []) ways.set(w.sessionId, w)
  const returned: { sessionId: string; hostId: string; plan: Plan.Plan; entry: E }[] = []
  /** What the pass's returns took on each source so far: two returns to one host never share its room. */
  const taken = new Map<string, { readonly budget: Headroom.Budget; readonly entries: number }>()
  /** The hosts of the doomed entries: a plan relying on one of them would share its sums with the pass's own plan (`Plan.checkGroup`). */
  const doomedHosts = new Set(doomed.map((e) => e.hostId))
  /**
   * The plan sending the session of entry `e` back to its move's source; null: it has no way back,
   * or no room there; `hold`: the source has entries of its own reclaimed in this pass, so the
   * entry is held and judged again on the next pass, when they are gone.
   */
  const returnOf = (s: Session.Record, e: E): Plan.Plan | "hold" | null => {
    const way = ways.get(s.id)
    if (way === undefined || openOf.has(s.id)) return null
    const sourceId = wayBackOf(s, e, way.lastEvent, way.lastMove)
    if (sourceId === null || way.source.id !== sourceId) return null
    if (doomedHosts.has(sourceId)) return "hold"
    const before = taken.get(sourceId) ?? { budget: Headroom.zero, entries: 0 }
    const room: Placement.Candidate = { ...way.source, entries: (way.source.entries ?? 0) + before.entries, headroom: { ...way.source.headroom, reserved: Headroom.add(way.source.headroom.reserved, before.budget) } }
    // A return is no new placement: a cordoned or draining source takes back the guest it holds (`fitsReturn`), heard and with room.
    if (room.reportedAt == null || Placement.isSilent(room, now, limits) || !Placement.fitsReturn(room, s.budget, limits)) return null
    taken.set(sourceId, { budget: Headroom.add(before.budget, s.budget), entries: before.entries + 1 })
    return returnsTo(s, way, now)
  }
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
      const back = s === undefined ? null : returnOf(s, e)
      if (back === "hold") {
        held.push(e)
        continue
      }
      if (s !== undefined && back !== null) {
        // The entry is released by the pass's own plan (a plan relying on the source releases nothing elsewhere).
        removed.add(e.id)
        ledger.push(Plan.release(e, "reclaimed"))
        returned.push({ sessionId: s.id, hostId: back.host!.hostId, plan: back, entry: e })
        continue
      } else if (s !== undefined && s.reservationId === e.id) {
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

  // A return relies on its source's row; the pass's own plan must not change that host too
  // (`Plan.checkGroup` refuses the group: the whole pass would fail, every pass). Besides the
  // doomed entries' hosts (held above), a lost session's open move releases its target's entry,
  // and that target may be a return's source: such a return is held, its entry judged again on
  // the next pass, once the release is written.
  const releasedOn = new Set(ledger.flatMap((c) => (c._tag === "Release" && !returned.some((r) => r.entry.id === c.id) ? [c.hostId] : [])))
  for (const r of returned.filter((x) => releasedOn.has(x.hostId))) {
    returned.splice(returned.indexOf(r), 1)
    ledger.splice(
      ledger.findIndex((c) => c._tag === "Release" && c.id === r.entry.id),
      1,
    )
    held.push(r.entry)
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
    held: held.sort(byId),
    lostSessions: lost.sort(),
    returned: returned.map(({ sessionId, hostId, plan }) => ({ sessionId, hostId, plan })).sort((a, b) => byId({ id: a.sessionId }, { id: b.sessionId })),
    closedMoves: [...closed.values()].sort(byId),
    imageHostIds,
  }
}

/**
 * The plan that sends a session whose entry (on its move's target) is reclaimed back to the move's
 * source (`way`): a new entry on the source (at the version of its row read), the session running
 * there; the pass's own plan releases the reclaimed entry. Its state stays `running`: on the source its agent
 * resumes the paused copy it holds (a copy it owes the target, which never got its stream), or
 * boots it afresh and tells the loss when it holds none.
 */
const returnsTo = (s: Session.Record, way: Way, now: number): Plan.Plan =>
  Plan.make(now, {
    sessions: [{ record: { ...s, hostId: way.source.id, reservationId: way.reservationId, updatedAt: now }, from: s.state }],
    ledger: [{ _tag: "Reserve", entry: Ledger.entryOf({ id: way.reservationId, hostId: way.source.id, ownerKind: "session", ownerId: s.id, memMib: s.budget.memMib, vcpus: s.budget.vcpus }, now) }],
    events: [{ sessionId: s.id, event: { _tag: "Running", hostId: way.source.id } }],
    host: { hostId: way.source.id, version: way.version },
  })

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
