/**
 * The downtime guard of a live move (SPEC §5): the estimate before the guest pauses, the
 * check after the final capture, and the commit allowance both include, learned per host pair
 * from recent commits (SPEC §13). Pure arithmetic over the figures the agents measured; the
 * agents measure, this module decides.
 */
import { defaults } from "./Limits.js"

/** One pre-copy round as the source measured it. */
export interface Round {
  /** Bytes actually sent on the wire. */
  readonly wireBytes: number
  /** Size of the dirty ranges the round captured. */
  readonly apparentBytes: number
  /** Time the send took. */
  readonly sendMs: number
}

/** The rounds' rate: wire bytes sent / send time, in bytes per ms; 0 when nothing was timed. */
export const rateBytesPerMs = (rounds: readonly Round[]): number => {
  let bytes = 0
  let ms = 0
  for (const r of rounds) {
    bytes += r.wireBytes
    ms += r.sendMs
  }
  return ms > 0 && bytes > 0 ? bytes / ms : 0
}

const transferMs = (bytes: number, rateBytesPerMs: number): number =>
  bytes <= 0 ? 0 : rateBytesPerMs > 0 ? bytes / rateBytesPerMs : Number.POSITIVE_INFINITY

/** Inputs of the estimate made before the guest pauses. */
export interface PrePauseInput {
  readonly lastDeltaWireBytes: number
  readonly rateBytesPerMs: number
  readonly commitAllowanceMs?: number
}

/**
 * Before pausing: the last delta's wire bytes at the rounds' rate plus the commit allowance.
 * An unknown rate (0) with bytes to send estimates `Infinity`: refuse rather than guess.
 */
export const prePauseEstimateMs = (i: PrePauseInput): number =>
  transferMs(i.lastDeltaWireBytes, i.rateBytesPerMs) + (i.commitAllowanceMs ?? defaults.commitAllowanceMs)

/** Inputs of the final round's size estimate. */
export interface FinalWireInput {
  readonly lastDeltaWireBytes: number
  readonly lastDeltaApparentBytes: number
  readonly finalApparentBytes: number
}

/**
 * The final round's wire bytes: the last delta's wire bytes plus the final round's growth
 * in apparent size. A final round smaller than the delta does not cancel the delta's bytes,
 * and the per-round transfer overhead is not scaled.
 */
export const finalWireBytes = (i: FinalWireInput): number =>
  i.lastDeltaWireBytes + Math.max(0, i.finalApparentBytes - i.lastDeltaApparentBytes)

/** Inputs of the check made after the final capture, with the guest paused. */
export interface PostCaptureInput extends FinalWireInput {
  readonly captureMs: number
  readonly rateBytesPerMs: number
  readonly commitAllowanceMs?: number
}

/** After the final capture: capture time + the final round's wire bytes at the rate + the allowance. */
export const postCaptureEstimateMs = (i: PostCaptureInput): number =>
  i.captureMs + transferMs(finalWireBytes(i), i.rateBytesPerMs) + (i.commitAllowanceMs ?? defaults.commitAllowanceMs)

/** The guard's verdict. */
export type Verdict =
  | { readonly _tag: "Fits"; readonly estimateMs: number }
  | { readonly _tag: "Overrun"; readonly estimateMs: number }

/** Inputs of {@link check}: either estimate's inputs and the budget. */
export type CheckInput = (PrePauseInput | PostCaptureInput) & { readonly maxDowntimeMs: number }

const isPostCapture = (i: PrePauseInput | PostCaptureInput): i is PostCaptureInput => "captureMs" in i

/**
 * Checks an estimate against `maxDowntimeMs`: post-capture inputs (with `captureMs`) get
 * the post-capture estimate, others the pre-pause one. Equal to the budget fits.
 */
export const check = (i: CheckInput): Verdict => {
  const estimateMs = isPostCapture(i) ? postCaptureEstimateMs(i) : prePauseEstimateMs(i)
  return estimateMs <= i.maxDowntimeMs ? { _tag: "Fits", estimateMs } : { _tag: "Overrun", estimateMs }
}

/** The phases of a finished move's pause, as reported to the caller. */
export interface Phases {
  readonly downtimeMs: number
  readonly captureMs: number
  readonly sendMs: number
  readonly commitMs: number
}

/** Whether reported phases are consistent: each > 0 and their sum within the downtime. */
export const phasesConsistent = (p: Phases): boolean =>
  p.captureMs > 0 && p.sendMs > 0 && p.commitMs > 0 && p.captureMs + p.sendMs + p.commitMs <= p.downtimeMs

/** How the commit allowance is learned from recent commits of one host pair (SPEC §13). */
export interface AllowancePolicy {
  /** The allowance before any history: SPEC §9's `commitAllowanceMs`. */
  readonly priorMs: number
  /** Only the last `window` commits count: the estimate follows a host pair whose commits change. */
  readonly window: number
  /**
   * The quantile of those commits (nearest rank). At 0.95 about one commit in twenty runs past
   * the allowance: the documented commit tail, which `downtimeMs` reports.
   */
  readonly quantile: number
  /** Added to the quantile: headroom for a commit slower than the ones seen. */
  readonly marginMs: number
}

/** A high quantile of the last 20 commits; the fixed 400 ms only before any history. */
export const defaultAllowancePolicy: AllowancePolicy = Object.freeze({
  priorMs: defaults.commitAllowanceMs,
  window: 20,
  quantile: 0.95,
  marginMs: 0,
})

/** A commit allowance and what it rests on. */
export interface Allowance {
  readonly allowanceMs: number
  /** `prior`: no history yet; `learned`: the quantile of `samples` recent commits. */
  readonly source: "prior" | "learned"
  readonly samples: number
}

/** How many recent commits count: the policy's window, at least 1. */
const windowOf = (policy: Partial<AllowancePolicy>): number => {
  const w = policy.window ?? defaultAllowancePolicy.window
  return Math.max(1, Math.floor(Number.isFinite(w) ? w : 1))
}

/**
 * The commit allowance of a host pair from its recent commits (ms, oldest first): the policy's
 * quantile of the last `window` plus the margin; the prior while there is no history. Samples
 * that are not finite non-negative numbers are not commits and are ignored.
 */
export const commitAllowance = (commitsMs: readonly number[], policy: Partial<AllowancePolicy> = {}): Allowance => {
  const p = { ...defaultAllowancePolicy, ...policy }
  const window = windowOf(p)
  const recent = commitsMs.filter((ms) => Number.isFinite(ms) && ms >= 0).slice(-window)
  if (recent.length === 0) return { allowanceMs: p.priorMs, source: "prior", samples: 0 }
  const sorted = [...recent].sort((a, b) => a - b)
  const q = Math.min(1, Math.max(0, Number.isFinite(p.quantile) ? p.quantile : 1))
  const at = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))
  return { allowanceMs: (sorted[at] as number) + Math.max(0, p.marginMs), source: "learned", samples: recent.length }
}

/**
 * A host pair's commit history after one more commit (ms, oldest first): only the policy's
 * `window` most recent are kept, since no allowance reads further back. A commit that is not a
 * finite non-negative number is not kept.
 */
export const recordCommit = (commitsMs: readonly number[], commitMs: number, policy: Partial<AllowancePolicy> = {}): readonly number[] => {
  const kept = Number.isFinite(commitMs) && commitMs >= 0 ? [...commitsMs, commitMs] : [...commitsMs]
  return kept.slice(-windowOf(policy))
}

/** The recent commits of moves from one host to another, as a store keeps them. */
export interface PairCommits {
  readonly sourceHostId: string
  readonly targetHostId: string
  /** Commit phases (ms), oldest first, at most the policy's window. */
  readonly commitsMs: readonly number[]
  /** When the last one was recorded (epoch ms). */
  readonly updatedAt: number
}
