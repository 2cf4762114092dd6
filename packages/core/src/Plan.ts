/**
 * The plan: everything one decision writes, as core answered it. Every operation that changes
 * state reads a snapshot, asks core, and gets a plan (or a refusal), which its store hands to
 * its one apply: the session records to insert or update (each with the state it must still be
 * in), the reservations to create, hand over or release, the moves to open or update, what
 * happened (the sessions' history), and the host whose room it took, at the version the
 * decision read. A group of plans (creates placed together, a queue drain, a batch of resumes)
 * is a list of plans through the same apply.
 *
 * What an apply does with a group, in every store (`checkGroup` holds the rule that makes it
 * safe): each plan is checked against the store as it was before the group — every session it
 * writes is still in the state it was decided on (or, for a new one, absent), and the host it
 * took room on is still at the version it was decided on — and the plans that pass are written,
 * in one atomic change. Plans deciding on the same host version pass or fail together; a plan
 * left out only leaves room unused, never over-commits.
 */
import type { Entry } from "./Ledger.js"
import type * as Move from "./Move.js"
import type * as Session from "./Session.js"

/** A session record to write: a new one (`from` null: only if no session has its id) or the next record of one still in `from`. */
export interface SessionWrite {
  readonly record: Session.Record
  readonly from: Session.State | null
}

/** How a reservation leaves the ledger, for its cumulative metrics (SPEC §3). */
export type Removal = "released" | "reclaimed"

/** A change to the ledger. A release names the entry's host and budget: an apply changes the host's sums without reading it. */
export type LedgerChange =
  | { readonly _tag: "Reserve"; readonly entry: Entry }
  | {
      readonly _tag: "Release"
      readonly id: string
      readonly hostId: string
      readonly memMib: number
      readonly vcpus: number
      readonly how: Removal
    }
  /** The reservation changes hands (a committed move's target becomes the session's), renewed `heartbeatAt`. */
  | { readonly _tag: "Transfer"; readonly id: string; readonly ownerId: string; readonly heartbeatAt: number }

/** A change to a move: a new one, or its next record (a round, a commit, a close). */
export type MoveChange =
  | { readonly _tag: "Open"; readonly move: Move.Record }
  | { readonly _tag: "Update"; readonly move: Move.Record }

/** What happened to one session (one entry of its history). */
export interface Happened {
  readonly sessionId: string
  readonly event: Session.Event
}

/** A host row as a decision read it: its id and the version of its room. */
export interface HostVersion {
  readonly hostId: string
  readonly version: number
}

/** Everything one decision writes, in one atomic change. */
export interface Plan {
  readonly _tag: "Plan"
  /** When it was decided (epoch ms): the time of its events. */
  readonly at: number
  readonly sessions: readonly SessionWrite[]
  readonly ledger: readonly LedgerChange[]
  readonly moves: readonly MoveChange[]
  /** In order. */
  readonly events: readonly Happened[]
  /**
   * The host whose room the plan takes (every `Reserve` is on it), at the version the decision
   * read; null when it takes no room. An apply writes the plan only while the host is at it.
   */
  readonly host: HostVersion | null
}

/** Why an apply left a plan out: a session it writes changed since, or the host it took room on did. */
export type Stale = "session" | "host"

/** What an apply did with one plan of a group. */
export type Outcome = { readonly _tag: "Applied" } | { readonly _tag: "Stale"; readonly stale: Stale }

const noSessions: readonly SessionWrite[] = []
const noLedger: readonly LedgerChange[] = []
const noMoves: readonly MoveChange[] = []
const noEvents: readonly Happened[] = []

/** A plan made of these parts (missing ones empty). */
export const make = (
  at: number,
  parts: {
    readonly sessions?: readonly SessionWrite[]
    readonly ledger?: readonly LedgerChange[]
    readonly moves?: readonly MoveChange[]
    readonly events?: readonly Happened[]
    readonly host?: HostVersion | null
  },
): Plan => ({
  _tag: "Plan",
  at,
  sessions: parts.sessions ?? noSessions,
  ledger: parts.ledger ?? noLedger,
  moves: parts.moves ?? noMoves,
  events: parts.events ?? noEvents,
  host: parts.host ?? null,
})

/** The release of an entry, counted as `how`. */
export const release = (e: Pick<Entry, "id" | "hostId" | "memMib" | "vcpus">, how: Removal): LedgerChange => ({
  _tag: "Release",
  id: e.id,
  hostId: e.hostId,
  memMib: e.memMib,
  vcpus: e.vcpus,
  how,
})

/** The record the plan writes for its first session (a step's plan writes exactly one). */
export const sessionOf = (plan: Plan): Session.Record | undefined => plan.sessions[0]?.record

/** The move the plan opens or updates, if any (a step's plan changes at most one). */
export const moveOf = (plan: Plan): Move.Record | null => plan.moves[0]?.move ?? null

/**
 * The hosts whose room changes with the plan: each entry's host, once, in order. What a
 * store's host sums, and the waiters of those hosts, follow.
 */
export const hostsChanged = (plan: Plan): string[] => {
  const out: string[] = []
  for (const c of plan.ledger) {
    if (c._tag === "Transfer") continue
    const hostId = c._tag === "Reserve" ? c.entry.hostId : c.hostId
    if (!out.includes(hostId)) out.push(hostId)
  }
  return out
}

/** What changed with an applied plan, for whoever waits on it: the sessions, the hosts whose assignments or room changed, the moves. */
export interface Changes {
  readonly sessionIds: readonly string[]
  readonly hostIds: readonly string[]
  readonly moveIds: readonly string[]
}

/** The sessions, hosts and moves an applied plan changed (each once). */
export const changes = (plan: Plan): Changes => {
  const hosts = new Set(hostsChanged(plan))
  for (const w of plan.sessions) if (w.record.hostId !== null) hosts.add(w.record.hostId)
  for (const m of plan.moves) {
    hosts.add(m.move.sourceHostId)
    hosts.add(m.move.targetHostId)
  }
  return {
    sessionIds: [...new Set(plan.sessions.map((w) => w.record.id))],
    hostIds: [...hosts],
    moveIds: [...new Set(plan.moves.map((m) => m.move.id))],
  }
}

/**
 * Why a group of plans cannot be applied as one, or null. The version checks of an apply hold
 * only when (1) a plan's reservations are all on the host it relies on, and so are its releases
 * when it relies on one (a plan left out for its host must change no other host's sums: an
 * apply that writes every host's change in one statement cannot take back another's), (2) plans relying on a
 * host rely on one version of it, and (3) no plan of the group changes the sums of a host
 * another plan of the group relies on unless it relies on it too: then a plan left out for its
 * host takes that host's changes with it, and nothing else's. And (4) each session is written by
 * one plan of the group.
 */
export const checkGroup = (plans: readonly Plan[]): string | null => {
  const relied = new Map<string, number>()
  const written = new Set<string>()
  for (const p of plans) {
    for (const c of p.ledger) {
      if (c._tag === "Reserve" && (p.host === null || c.entry.hostId !== p.host.hostId))
        return `a plan reserves on host ${c.entry.hostId} without relying on it`
      if (c._tag === "Release" && p.host !== null && c.hostId !== p.host.hostId)
        return `a plan relies on host ${p.host.hostId} and releases on host ${c.hostId}`
    }
    if (p.host !== null) {
      const v = relied.get(p.host.hostId)
      if (v !== undefined && v !== p.host.version) return `host ${p.host.hostId} is relied on at two versions`
      relied.set(p.host.hostId, p.host.version)
    }
    // A session's history is numbered in plan order: one plan of the group writes it.
    for (const w of p.sessions) {
      if (written.has(w.record.id)) return `session ${w.record.id} is written by two plans`
      written.add(w.record.id)
    }
  }
  for (const p of plans)
    for (const hostId of hostsChanged(p))
      if (relied.has(hostId) && p.host?.hostId !== hostId) return `host ${hostId} is relied on by one plan and changed by another that does not rely on it`
  return null
}
