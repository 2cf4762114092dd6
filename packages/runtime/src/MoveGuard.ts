/**
 * The downtime guard as every runtime applies it (SPEC §5): when pre-copy may stop, whether the
 * move may pause, and whether a paused move may switch over. The estimates and the rule are
 * `@engram/core`'s `Downtime` (one copy of the arithmetic, and of the rule that a guest paused
 * before its move is never refused: `Downtime.check`'s `alreadyPaused`); this module only picks
 * its inputs from the rounds a runtime measured and words the refusals. Pure functions over
 * plain data.
 */
import { Downtime } from "@engram/core"
import type { MoveBudget, MoveRound } from "./Runtime.js"

/**
 * The guest as its move began: `alreadyPaused`, paused before it (parked in RAM, or a committed
 * move's paused source copy streamed again), so its stream pauses it no further and no estimate
 * refuses it. The runtime knows it (its own VM's state when `migrate` began).
 */
export interface Guest {
  readonly alreadyPaused: boolean
}

/** A guest that runs when its move begins: the move pauses it, the guard bounds that pause. */
export const running: Guest = Object.freeze({ alreadyPaused: false })

/** What the source does after a round. */
export type Step =
  | { readonly _tag: "Continue" }
  /** The pre-pause estimate fits (or the guest is already paused): pause and take the final round. */
  | { readonly _tag: "Pause"; readonly estimateMs: number }
  /** The pre-pause estimate does not fit and pre-copy is over: refuse before pausing. */
  | { readonly _tag: "Refuse"; readonly estimateMs: number; readonly reason: string }

/** Integer ms for JSON, `MAX_SAFE_INTEGER` for an infinite estimate. */
export const jsonMs = (ms: number): number => (Number.isFinite(ms) ? Math.ceil(ms) : Number.MAX_SAFE_INTEGER)

const prePauseReason = (estimateMs: number, b: MoveBudget) =>
  `ErrMoveDowntime: pre-pause estimate ${jsonMs(estimateMs)} ms > maxDowntimeMs ${b.maxDowntimeMs} ms; refused before pausing`

/**
 * Before any round: even an empty final round costs the commit allowance, so a budget below it
 * is refused before the move starts (`Downtime`'s pre-pause estimate with no bytes to send); a
 * guest already paused is not.
 */
export const beforeStart = (b: MoveBudget, guest: Guest = running): Step => {
  const v = Downtime.check({ lastDeltaWireBytes: 0, rateBytesPerMs: 0, commitAllowanceMs: b.commitAllowanceMs, maxDowntimeMs: b.maxDowntimeMs, alreadyPaused: guest.alreadyPaused })
  return Downtime.refuses(v) ? { _tag: "Refuse", estimateMs: v.estimateMs, reason: prePauseReason(v.estimateMs, b) } : { _tag: "Continue" }
}

/**
 * The last delta round; none when the full round was the only one (a hypervisor that stopped
 * the guest right after its bulk pass): then the final round stands alone, its growth over an
 * empty delta is all of it.
 */
export const lastDelta = (rounds: readonly MoveRound[]): MoveRound | undefined => rounds.findLast((r) => r.kind === "delta")

/** The rounds' rate (wire bytes / send time), core's. */
export const rateBytesPerMs = (rounds: readonly MoveRound[]): number => Downtime.rateBytesPerMs(rounds)

/** The pre-pause estimate's inputs over the rounds so far: the last delta's wire bytes, the rounds' rate, the allowance. */
const prePauseInput = (rounds: readonly MoveRound[], b: MoveBudget): Downtime.PrePauseInput => ({
  lastDeltaWireBytes: lastDelta(rounds)?.wireBytes ?? 0,
  rateBytesPerMs: rateBytesPerMs(rounds),
  commitAllowanceMs: b.commitAllowanceMs,
})

/** The pre-pause estimate over the rounds so far. */
export const prePauseEstimateMs = (rounds: readonly MoveRound[], b: MoveBudget): number => Downtime.prePauseEstimateMs(prePauseInput(rounds, b))

/**
 * After a pre-copy round: go on while the dirty set shrinks (a full round, then deltas; stop at
 * the first delta not smaller than the one before, an empty delta, or `maxPreCopyRounds` rounds
 * with the full one), then check the pre-pause estimate: the last delta's wire bytes at the
 * rounds' rate plus the commit allowance (a guest already paused takes its final round
 * whatever the estimate).
 */
export const afterRound = (rounds: readonly MoveRound[], b: MoveBudget, guest: Guest = running): Step => {
  const deltas = rounds.filter((r) => r.kind === "delta")
  const last = deltas.at(-1)
  if (last === undefined) return { _tag: "Continue" }
  const before = deltas.at(-2)
  const shrank = before === undefined || last.apparentBytes < before.apparentBytes
  if (rounds.length < Math.max(2, b.maxPreCopyRounds) && shrank && last.apparentBytes > 0) return { _tag: "Continue" }
  const v = Downtime.check({ ...prePauseInput(rounds, b), maxDowntimeMs: b.maxDowntimeMs, alreadyPaused: guest.alreadyPaused })
  return Downtime.refuses(v) ? { _tag: "Refuse", estimateMs: v.estimateMs, reason: prePauseReason(v.estimateMs, b) } : { _tag: "Pause", estimateMs: v.estimateMs }
}

/** The final round as measured with the guest paused, before it is sent. */
export interface FinalCapture {
  /** Pause to "final round known". */
  readonly captureMs: number
  /** Memory the final round covers. */
  readonly apparentBytes: number
}

/**
 * The post-capture verdict, with the refusal's words when it does not fit; `AlreadyPaused`: the
 * guest was paused before the move, which switches over whatever the estimate.
 */
export type PostCapture =
  | { readonly _tag: "Fits"; readonly estimateMs: number }
  | { readonly _tag: "AlreadyPaused"; readonly estimateMs: number }
  | { readonly _tag: "Overrun"; readonly estimateMs: number; readonly reason: string }

/**
 * After the final capture, guest paused: capture time + the final round's wire bytes (the last
 * delta's plus the final round's growth in apparent size) at the rounds' rate + the allowance.
 */
export const postCapture = (rounds: readonly MoveRound[], final: FinalCapture, b: MoveBudget, guest: Guest = running): PostCapture => {
  const last = lastDelta(rounds)
  const v = Downtime.check({
    captureMs: final.captureMs,
    lastDeltaWireBytes: last?.wireBytes ?? 0,
    lastDeltaApparentBytes: last?.apparentBytes ?? 0,
    finalApparentBytes: final.apparentBytes,
    rateBytesPerMs: rateBytesPerMs(rounds),
    commitAllowanceMs: b.commitAllowanceMs,
    maxDowntimeMs: b.maxDowntimeMs,
    alreadyPaused: guest.alreadyPaused,
  })
  return v._tag !== "Overrun"
    ? v
    : {
        _tag: "Overrun",
        estimateMs: v.estimateMs,
        reason: `ErrMoveDowntime: post-capture estimate ${jsonMs(v.estimateMs)} ms > maxDowntimeMs ${b.maxDowntimeMs} ms (final capture ${jsonMs(final.captureMs)} ms); aborted before the final round, guest resumed on the source`,
      }
}

/** The final round's wire bytes as the post-capture check estimated them (for the round record). */
export const finalWireEstimate = (rounds: readonly MoveRound[], final: FinalCapture): number => {
  const last = lastDelta(rounds)
  return Downtime.finalWireBytes({
    lastDeltaWireBytes: last?.wireBytes ?? 0,
    lastDeltaApparentBytes: last?.apparentBytes ?? 0,
    finalApparentBytes: final.apparentBytes,
  })
}
