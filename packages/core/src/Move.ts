/**
 * A live move's record (SPEC §5, the store's part): a move is `pending` from its start until it
 * is `committed` (the session runs on the target) or `aborted` (it runs on the source). This
 * module holds the record and decides what may still happen to it; `Session.step` decides what
 * a commit or an abort does to the session and the ledger.
 */
import type * as Downtime from "./Downtime.js"
import type { Limits } from "./Limits.js"
import { hasControlCharacter } from "./Names.js"
import type { MoveCommittedBy } from "./Names.js"
import { isSilent } from "./Placement.js"
import * as Plan from "./Plan.js"

/** A move's state: open (`pending`) or finished. */
export type State = "pending" | "committed" | "aborted"

/** The kind of a move's record: a pre-copy round, the source's intent (no figures), the final round (Names.RoundKind). */
export type RoundKind = "full" | "delta" | "intent" | "final"

/** One pre-copy round as the source measured it. */
export interface Round {
  readonly kind: RoundKind
  readonly wireBytes: number
  readonly apparentBytes: number
  readonly sendMs: number
  readonly captureMs: number
}

/** The phases of a committed move's pause. */
export interface Phases {
  readonly downtimeMs: number
  readonly captureMs: number
  readonly sendMs: number
  readonly commitMs: number
}

/**
 * What the source's downtime guard decided a committed move on (SPEC §13): the commit allowance
 * it used and where that came from, and its post-capture estimate. Reported with the commit.
 */
export interface GuardReport {
  /** The commit allowance the guard added to its estimates. */
  readonly allowanceMs: number
  /**
   * `prior`: the configured `commitAllowanceMs` (no recent commit of the pair's own, and too few
   * pooled ones); `learned`: the host
   * pair's recent commits; `target`, `fleet`: pooled with recent commits into the same target, of the fleet.
   */
  readonly allowanceSource: Downtime.AllowanceSource
  /** The commits the allowance was learned from (0 for the prior). */
  readonly allowanceSamples: number
  /** The post-capture estimate that let the guest switch over. */
  readonly estimateMs: number
}

/** The guard's figures as the move keeps them: what it decided on, and how far off it was. */
export interface Guard extends GuardReport {
  /** Estimate − measured downtime (positive: pessimistic). */
  readonly estimateErrorMs: number
  /** Allowance − measured commit phase (positive: pessimistic; negative: the commit ran past it). */
  readonly allowanceErrorMs: number
}

/** The guard's figures of a move committed with `phases`: its report and the errors against the measurement. */
export const guardOf = (r: GuardReport, phases: Phases): Guard => ({
  allowanceMs: r.allowanceMs,
  allowanceSource: r.allowanceSource,
  allowanceSamples: r.allowanceSamples,
  estimateMs: r.estimateMs,
  estimateErrorMs: r.estimateMs - phases.downtimeMs,
  allowanceErrorMs: r.allowanceMs - phases.commitMs,
})

/**
 * Who committed a move: its `source` (`POST /v1/moves/{id}/commit` with the phases it measured:
 * the normal path), its `target`'s resolution (the target host reports that it runs the guest),
 * or an `operator` (the admin's resolve, `engram moves commit`). The list: `Names.moveCommittedBy`.
 */
export type CommittedBy = MoveCommittedBy

/** A live move of a running session. Times are epoch ms. */
export interface Record {
  readonly id: string
  readonly sessionId: string
  readonly sourceHostId: string
  readonly targetHostId: string
  /** The target's reservation (`ownerKind = move`) while pending; the session's after commit. */
  readonly reservationId: string
  readonly maxDowntimeMs: number
  readonly state: State
  readonly rounds: readonly Round[]
  readonly phases: Phases | null
  /** Why an aborted move aborted (e.g. `ErrMoveDowntime: estimate 812 ms > 600 ms`). */
  readonly abortReason: string | null
  /** The downtime estimate an aborted move was refused on (`ErrMoveDowntime`), in ms; null otherwise. */
  readonly abortEstimateMs: number | null
  /** The source guard's figures of a committed move; null otherwise (or when its source did not report them). */
  readonly guard: Guard | null
  /**
   * The source's mark that it owes the target a resend (`refuseResendMark`): it holds the guest's
   * only whole copy, paused, and the target never got a complete stream. Only a move committed
   * without phases carries it; it opens the way back to the source should the target die
   * (`Reclaim.wayBackOf`). False when never marked or cleared, and in a store that keeps no mark.
   */
  readonly resendOwed: boolean
  /**
   * How many times the resend mark was cleared (the move's target before it resumes a stream sent
   * again, or its source once its debt is over): the mark's generation. A source's tell names the
   * count it read before it (`seenClears`), and a tell made before a clear it did not see changes
   * nothing (`resendTellStale`): a tell its source's client gave up on, reaching the store after
   * the target's clear and resume, never sets the mark again. Optional: absent (a store that keeps
   * none, or an older one) reads as 0.
   */
  readonly resendClears?: number
  /**
   * Who committed the move (`CommittedBy`); null while it is not committed, or when it was
   * committed before the record kept it. Optional: a store that keeps none may leave it out
   * (read a missing one as null).
   */
  readonly committedBy?: CommittedBy | null
  readonly createdAt: number
  readonly endedAt: number | null
}

/** Why a move refuses a change: it is finished, or its pause is already spent. */
export interface Refusal {
  readonly _tag: "Conflict"
  readonly moveId: string
  readonly reason: string
}

/** Whether the move is still open; a finished move refuses rounds, commits and aborts. */
export const refuseUnlessPending = (m: Pick<Record, "id" | "state">): Refusal | null =>
  m.state === "pending" ? null : { _tag: "Conflict", moveId: m.id, reason: `move is ${m.state}` }

/**
 * Whether the move's source may mark it as owing its target a resend (`owed` true: the source
 * holds the guest's only whole copy, paused; the target never got a complete stream): only a move
 * committed without phases (an operator's or a resolution's commit; a commit with phases is the
 * source's own word that the target runs the guest). Clearing it (`owed` false) is always allowed.
 * The mark opens the way back to the source when the target dies (`Reclaim.wayBackOf`).
 */
export const refuseResendMark = (m: Pick<Record, "id" | "state" | "phases">, owed: boolean): Refusal | null =>
  !owed
    ? null
    : m.state !== "committed"
      ? { _tag: "Conflict", moveId: m.id, reason: `a resend is owed only on a committed move; move is ${m.state}` }
      : m.phases !== null
        ? { _tag: "Conflict", moveId: m.id, reason: "a resend is owed only on a move committed without phases; its source confirmed that the target runs the guest" }
        : null

/**
 * Whether a tell of the resend mark is stale: it sets the mark (`owed`) naming the clears it saw
 * (`seenClears`, the move's `resendClears` its source read before the tell) and the mark was
 * cleared since (the target cleared it before it resumed a stream sent again, or the source once
 * its debt was over). A stale tell changes nothing: the store answers the move as it is. A tell
 * without `seenClears` (a source's agent older than the count) is never stale: it sets the mark
 * as before the count. A clear is never stale.
 */
export const resendTellStale = (m: Pick<Record, "resendClears">, owed: boolean, seenClears: number | undefined): boolean =>
  owed && seenClears !== undefined && seenClears < (m.resendClears ?? 0)

/**
 * The resend mark after a tell (`owed` true) or a clear (false) that `refuseResendMark` lets
 * through, or null when it changes nothing: a stale tell (`resendTellStale`), or a clear of a move
 * that may carry no mark (not committed without phases: nothing to clear, nothing counted). Any
 * other clear counts (`resendClears` + 1), even of a mark already clear: a tell in flight from
 * before it must not set the mark after it.
 */
export const resendMarkStep = (
  m: Pick<Record, "id" | "state" | "phases" | "resendOwed" | "resendClears">,
  owed: boolean,
  seenClears: number | undefined,
): { readonly resendOwed: boolean; readonly resendClears: number } | null => {
  const clears = m.resendClears ?? 0
  if (owed) return resendTellStale(m, owed, seenClears) ? null : { resendOwed: true, resendClears: clears }
  return refuseResendMark(m, true) === null ? { resendOwed: false, resendClears: clears + 1 } : null
}

/** Whether the move's final round is recorded: its guest paused and the stream sent (or being sent). */
export const finalRoundRecorded = (m: Pick<Record, "rounds">): boolean => m.rounds.some((r) => r.kind === "final")

/**
 * Whether the source's intent is recorded (SPEC §5, §13): taken while the guest still runs, it
 * says that the next round is the final one and that the target may run the guest once that
 * stream is complete. An older source records no intent: its final round stands for it.
 */
export const intentRecorded = (m: Pick<Record, "rounds">): boolean => m.rounds.some((r) => r.kind === "intent")

/**
 * Whether the move is past its point of no return: its intent or its final round is recorded, so
 * the target may run the guest (once the stream is complete and the source commits it). From
 * then on no timeout aborts it.
 */
export const pastNoReturn = (m: Pick<Record, "rounds">): boolean => intentRecorded(m) || finalRoundRecorded(m)

/**
 * Whether the move is in doubt (SPEC §13): open and past its point of no return, so the guest may
 * already run on the target while its source holds the paused copy. Only an explicit commit or
 * abort ends it (the source's or the target's report, an operator, the end of its session); the
 * stale window never does: its reservations are held (`Reclaim.decide`).
 */
export const inDoubt = (m: Pick<Record, "state" | "rounds">): boolean => m.state === "pending" && pastNoReturn(m)

/** How an in-doubt move is resolved: committed (the target runs the guest) or aborted (it runs on the source). */
export type Resolution = "commit" | "abort"

/**
 * Judges an abort: refused on a finished move, and — with `onlyBeforeFinalRound` (a timeout's
 * abort) — on a move past its point of no return (its intent or its final round recorded).
 */
export const refuseAbort = (m: Pick<Record, "id" | "state" | "rounds">, onlyBeforeFinalRound: boolean): Refusal | null =>
  refuseUnlessPending(m) ??
  (onlyBeforeFinalRound && pastNoReturn(m)
    ? { _tag: "Conflict", moveId: m.id, reason: finalRoundRecorded(m) ? "final round recorded: the pause is spent" : "intent recorded: the target may run the guest" }
    : null)

/**
 * Judges a commit (SPEC §5, §12): refused on a finished move, and on a move whose final round
 * is not recorded (the target cannot hold the guest's last state). A resolution's commit
 * (`measured` false: the target reports that it runs the guest, or an operator's word) needs
 * only the point of no return (the intent): the source may not have recorded the final round's
 * figures yet (they follow the resume).
 */
export const refuseCommit = (m: Pick<Record, "id" | "state" | "rounds">, measured = true): Refusal | null =>
  refuseUnlessPending(m) ??
  (measured
    ? finalRoundRecorded(m)
      ? null
      : { _tag: "Conflict", moveId: m.id, reason: "no final round recorded: a commit needs the final round" }
    : pastNoReturn(m)
      ? null
      : { _tag: "Conflict", moveId: m.id, reason: "neither an intent nor a final round recorded: the move is not in doubt" })

/**
 * Whether a move's source is heard at `now` (SPEC §13): its agent reported within the stale
 * window (not `Placement.isSilent`). A host that never reported is not heard.
 */
export const sourceHeard = (source: { readonly reportedAt: number | null }, now: number, limits: Limits): boolean =>
  source.reportedAt !== null && !isSilent(source, now, limits)

/**
 * Judges an operator's commit (the coordinator's resolve with the admin's word, `engram moves
 * commit`; SPEC §13): as a resolution's commit (`refuseCommit` without phases), and, while the
 * final round is not recorded, refused when the move's source is heard (`sourceHeard`): it is
 * still sending the move, so the target may hold no complete copy, and a commit then would
 * place the session on a target that can only boot it afresh, its memory lost. A source not
 * heard (frozen or dead) may never send the final round: the operator's word stands. `source` is
 * the source host as stored (null: removed, not heard).
 */
export const refuseOperatorCommit = (
  m: Pick<Record, "id" | "state" | "rounds" | "sourceHostId">,
  source: { readonly reportedAt: number | null } | null,
  now: number,
  limits: Limits,
): Refusal | null => {
  const refused = refuseCommit(m, false)
  if (refused !== null || finalRoundRecorded(m) || source === null || !sourceHeard(source, now, limits)) return refused
  const agoS = Math.max(0, Math.round((now - (source.reportedAt as number)) / 1000))
  return {
    _tag: "Conflict",
    moveId: m.id,
    reason: `the move's source ${m.sourceHostId} is heard (its last report ${agoS} s ago, within the ${Math.round(limits.heartbeatStaleWindowMs / 1000)} s stale window) and the move's final round is not recorded yet: the target may hold no complete copy; wait for the final round (or the target's own commit) or abort`,
  }
}

/** Judges a new record: refused on a finished move, and after the final round (nothing follows it). */
export const refuseRound = (m: Pick<Record, "id" | "state" | "rounds">): Refusal | null =>
  refuseUnlessPending(m) ??
  (finalRoundRecorded(m) ? { _tag: "Conflict", moveId: m.id, reason: "the final round is recorded: no round follows it" } : null)

/**
 * A round as its source sends it: the figures and, from a source that numbers its records, its
 * position `seq` (how many records the move held before it, the intent included; 0-based). A
 * round without one (an older source) is appended as before.
 */
export interface Numbered extends Round {
  readonly seq?: number | undefined
}

/**
 * Where a round goes: `append` (a new record), or `held` (nothing changes: a repeat of a recorded
 * position with the same figures, e.g. a retry of a round whose answer was lost; or, from a
 * source that sends no position, a second intent).
 */
export type Placement = "append" | "held"

/** Whether two rounds carry the same figures (kind, bytes, timings): a repeat of one record. */
export const sameFigures = (a: Round, b: Round): boolean =>
  a.kind === b.kind && a.wireBytes === b.wireBytes && a.apparentBytes === b.apparentBytes && a.sendMs === b.sendMs && a.captureMs === b.captureMs

const figuresOf = (r: Round): string => `${r.kind}, ${r.wireBytes} wire bytes, ${r.apparentBytes} apparent, send ${r.sendMs} ms, capture ${r.captureMs} ms`

/**
 * Judges a round on a move (SPEC §5): refused on a finished move. A round with a position is
 * recorded only at the move's next position: a recorded position is a repeat (`held` with the same
 * figures, a `Conflict` with others: a position is recorded once), a position past the next one
 * is a gap (`Conflict`: a round is missing). A new record is refused after the final round, and a
 * second intent changes nothing without a position but is a `Conflict` at a new one (the source
 * would count a record the move does not hold). `seq` is a non-negative integer (the store
 * validates it first).
 */
export const placeRound = (m: Pick<Record, "id" | "state" | "rounds">, round: Numbered): Placement | Refusal => {
  const finished = refuseUnlessPending(m)
  if (finished !== null) return finished
  const conflict = (reason: string): Refusal => ({ _tag: "Conflict", moveId: m.id, reason })
  const { seq } = round
  const held = m.rounds.length
  const at = seq === undefined ? undefined : m.rounds[seq]
  if (seq !== undefined && at !== undefined) {
    return sameFigures(at, round) ? "held" : conflict(`round ${seq} is recorded with other figures (${figuresOf(at)}): a position is recorded once`)
  }
  if (seq !== undefined && seq > held) return conflict(`round ${seq} leaves a gap: the move holds ${held} rounds, so the next is round ${held}`)
  const refused = refuseRound(m)
  if (refused !== null) return refused
  if (round.kind === "intent" && intentRecorded(m)) return seq === undefined ? "held" : conflict(`the intent is recorded: round ${seq} cannot be a second one`)
  return "append"
}

/**
 * The plan of one more record on the move (it updates the move alone), as `placeRound` judges
 * it: a round already held writes the move as it is; the position itself is not stored (it is
 * the round's index in `rounds`).
 */
export const recordRound = (m: Record, round: Numbered, now: number): Plan.Plan | Refusal => {
  const placed = placeRound(m, round)
  if (typeof placed !== "string") return placed
  if (placed === "held") return Plan.make(now, { moves: [{ _tag: "Update", move: m }] })
  const { kind, wireBytes, apparentBytes, sendMs, captureMs } = round
  return Plan.make(now, { moves: [{ _tag: "Update", move: { ...m, rounds: [...m.rounds, { kind, wireBytes, apparentBytes, sendMs, captureMs }] } }] })
}

/** The move closed without committing (`aborted`) at `now`, with why and the estimate it was refused on. */
export const close = (m: Record, reason: string, estimateMs: number | null, now: number): Record => ({
  ...m,
  state: "aborted",
  abortReason: reason,
  abortEstimateMs: estimateMs,
  endedAt: now,
})

/** The longest peer URL a host may advertise (where its agent serves a move's target side). */
export const maxPeerUrlLength = 2048

/** The hosts a listener on every interface binds to: no peer can reach a host there. */
export const wildcardHosts: ReadonlySet<string> = new Set(["0.0.0.0", "::", "[::]", "[::ffff:0:0]"])

/**
 * The rule of a peer URL (`isPeerUrl`), in words: the store's (`Validate.peerUrlRule`, which
 * allows null) and the host agent's say it after "must be".
 */
export const peerUrlRule = `an absolute http:// or https:// URL of at most ${maxPeerUrlLength} characters naming a host peers reach (not 0.0.0.0 or ::), without spaces, control characters, user:password@, a query or a fragment`

/**
 * Whether `url` is a peer URL (a host's agent, where a move's source reaches its target): an
 * absolute `http://` or `https://` URL of at most `maxPeerUrlLength` characters with a host that
 * is not a wildcard (`wildcardHosts`, however spelt: `http://0:7100` parses to 0.0.0.0; a peer
 * can never reach a listener's wildcard), and no whitespace, control character,
 * `user:password@`, query or fragment (URL parsing trims and drops tabs and newlines, so a URL
 * that needed it is not the one given). The one rule of the store's `Validate.peerUrl` and the
 * host agent's (`peerUrlRule`).
 */
export const isPeerUrl = (url: string): boolean => {
  if (url.length > maxPeerUrlLength || /\s/.test(url) || url.includes("?") || url.includes("#") || hasControlCharacter(url)) return false
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return false
  }
  return (
    (parsed.protocol === "http:" || parsed.protocol === "https:") &&
    parsed.hostname !== "" &&
    !wildcardHosts.has(parsed.hostname) &&
    parsed.username === "" &&
    parsed.password === ""
  )
}

/**
 * Whether a host can be a move's target (`Placement.Candidate.takesMoves`): its agent advertises
 * a peer URL (`peerUrl`, its last report's) that is one (`isPeerUrl`), so the coordinator can tell
 * the move's source where to reach it. Without one the source knows the target only from its own
 * `ENGRAM_PEERS`, which the coordinator cannot see: a make-room move planned there, or a move the
 * store picked it for, would likely abort (so neither is: `MakeRoom.plan`,
 * `Placement.Request.takesMovesOnly`). A URL stored before the rule refused it (a wildcard such
 * as `http://0.0.0.0:7100`, kept until the host's next report) is none: no peer reaches it.
 */
export const takesMoves = (peerUrl: string | null): boolean => peerUrl !== null && isPeerUrl(peerUrl)
