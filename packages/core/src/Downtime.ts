/**
 * The downtime guard of a live move (SPEC §5): the estimate before the guest pauses, the
 * check after the final capture, and the commit allowance both include, learned per host pair
 * from recent commits (SPEC §13); a guest paused before its move is never refused (its move
 * pauses it no further). Pure arithmetic over the figures the agents measured; the agents
 * measure, this module decides.
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

/**
 * The guard's verdict. `AlreadyPaused`: the guest was paused before the move began, so the move
 * causes no pause and its estimate, whatever it is, refuses nothing (see {@link check}).
 */
export type Verdict =
  | { readonly _tag: "Fits"; readonly estimateMs: number }
  | { readonly _tag: "Overrun"; readonly estimateMs: number }
  | { readonly _tag: "AlreadyPaused"; readonly estimateMs: number }

/** Inputs of {@link check}: either estimate's inputs, the budget, and whether the guest was paused before the move. */
export type CheckInput = (PrePauseInput | PostCaptureInput) & {
  readonly maxDowntimeMs: number
  /**
   * The guest was paused before the move began (parked in RAM, or a committed move's paused
   * source copy streamed again) and stays paused until the target's commit: its stream pauses it
   * no further. Absent: false (the guest runs, the move pauses it).
   */
  readonly alreadyPaused?: boolean | undefined
}

const isPostCapture = (i: PrePauseInput | PostCaptureInput): i is PostCaptureInput => "captureMs" in i

/**
 * Checks an estimate against `maxDowntimeMs` (SPEC §5): post-capture inputs (with `captureMs`)
 * get the post-capture estimate, others the pre-pause one. Equal to the budget fits. A guest
 * `alreadyPaused` is never refused: `maxDowntimeMs` bounds the pause a move causes, and its move
 * causes none (it was paused before and stays paused until the commit); the estimate is still
 * made, for the caller to report (`AlreadyPaused`), whether or not it is within the budget.
 */
export const check = (i: CheckInput): Verdict => {
  const estimateMs = isPostCapture(i) ? postCaptureEstimateMs(i) : prePauseEstimateMs(i)
  if (i.alreadyPaused === true) return { _tag: "AlreadyPaused", estimateMs }
  return estimateMs <= i.maxDowntimeMs ? { _tag: "Fits", estimateMs } : { _tag: "Overrun", estimateMs }
}

/** Whether a verdict refuses the move (an `Overrun`): a fit, or a guest already paused, goes on. */
export const refuses = (v: Verdict): boolean => v._tag === "Overrun"

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

/**
 * Where a commit allowance came from: `prior`, no recent commit of the pair's own and too few
 * pooled ones (`pooledMinSamples`); `learned`, the host pair's own recent commits; `target`, pooled with recent commits of other pairs into the same
 * target host; `fleet`, pooled with recent commits of the whole fleet.
 */
export type AllowanceSource = "prior" | "learned" | "target" | "fleet"

/** Every {@link AllowanceSource}, from no evidence to the widest pool. */
export const allowanceSources: readonly AllowanceSource[] = ["prior", "learned", "target", "fleet"]

/** A commit allowance and what it rests on. */
export interface Allowance {
  readonly allowanceMs: number
  /** What the quantile was taken over (see {@link AllowanceSource}). */
  readonly source: AllowanceSource
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

/**
 * The recent commits of moves from one host to another, as a store keeps them. Their times never
 * decrease and the last is `updatedAt` ({@link recordTimedCommit} keeps it so, whatever the
 * clocks of the coordinators that record them): a store may cut the fleet's pairs by
 * `updatedAt` and hold every one of the fleet's most recent commits ({@link allowanceCommits}).
 */
export interface PairCommits {
  readonly sourceHostId: string
  readonly targetHostId: string
  /** Commit phases (ms), oldest first, at most the policy's window. */
  readonly commitsMs: readonly number[]
  /** When each of `commitsMs` was recorded (epoch ms), in the same order: never decreasing. */
  readonly recordedAtMs: readonly number[]
  /** When the last one was recorded (epoch ms): the last of `recordedAtMs`. */
  readonly updatedAt: number
}

/**
 * A pair's history after one more commit recorded at `atMs`: {@link recordCommit}'s window, with
 * each commit's time beside it (a kept commit without one takes the history's `updatedAt`), and
 * the pair's `updatedAt`, the last commit's time. The commit is recorded no earlier than any time
 * the pair keeps (nor its `updatedAt`): a coordinator whose clock is behind another's, or a clock
 * stepped back, would otherwise record a commit before older ones, and a pair's `updatedAt`
 * would no longer be its latest commit's time. Every store records a pair's commits through
 * this. A commit that is not a finite non-negative number is not kept (the history is unchanged).
 */
export const recordTimedCommit = (
  history: Pick<PairCommits, "commitsMs" | "recordedAtMs"> & { readonly updatedAt?: number },
  commitMs: number,
  atMs: number,
  policy: Partial<AllowancePolicy> = {},
): Pick<PairCommits, "commitsMs" | "recordedAtMs" | "updatedAt"> => {
  const times = timesOf(history)
  if (!(Number.isFinite(commitMs) && commitMs >= 0))
    return { commitsMs: [...history.commitsMs], recordedAtMs: times, updatedAt: history.updatedAt ?? times[times.length - 1] ?? atMs }
  const at = Math.max(atMs, ...times, ...(history.updatedAt === undefined ? [] : [history.updatedAt]))
  const keep = windowOf(policy)
  return { commitsMs: [...history.commitsMs, commitMs].slice(-keep), recordedAtMs: [...times, at].slice(-keep), updatedAt: at }
}

/** A pair's commit times, one per commit: a commit kept without one (an older store) counts as recorded at the pair's last. */
const timesOf = (p: Pick<PairCommits, "commitsMs" | "recordedAtMs"> & { readonly updatedAt?: number }): number[] =>
  p.commitsMs.map((_, i) => p.recordedAtMs[i] ?? p.updatedAt ?? p.recordedAtMs[p.recordedAtMs.length - 1] ?? 0)

/** One commit phase and when the coordinator recorded it (epoch ms). */
export interface CommitSample {
  readonly commitMs: number
  readonly atMs: number
}

/** A pair's commits as samples, oldest first. */
export const samplesOf = (p: PairCommits): readonly CommitSample[] => {
  const at = timesOf(p)
  return p.commitsMs.map((commitMs, i) => ({ commitMs, atMs: at[i] as number }))
}

/** How old a commit may be and still count, and when a pair's own commits are enough (SPEC §13). */
export interface RecencyPolicy extends AllowancePolicy {
  /**
   * A commit recorded this long ago (ms) or longer no longer counts: a pair refused before any
   * pause makes no commit, so without an end to old evidence two slow commits in a load spike
   * would refuse its tight-budget moves for ever.
   */
  readonly horizonMs: number
  /**
   * A pair with fewer recent commits of its own than this pools them with others' (first its
   * target's, then the fleet's). 1 by default: a pair's own commit is the most specific evidence
   * (a pair with any keeps the allowance it had before the horizon existed); pooling replaces
   * only the prior. Higher values trade that specificity for a quantile over more samples.
   */
  readonly minSamples: number
  /**
   * A pooled level (the target's, the fleet's) replaces the prior only when it holds at least
   * this many recent commits (5 by default): one other pair's commit, perhaps from an unrelated
   * part of the fleet, is weaker evidence than the conservative prior. A pair's own commits
   * count from 1.
   */
  readonly pooledMinSamples: number
}

/** An hour's horizon; a pair's own recent commits, when it has any, stand alone; a pool needs 5. */
export const defaultRecencyPolicy: RecencyPolicy = Object.freeze({ ...defaultAllowancePolicy, horizonMs: 60 * 60 * 1000, minSamples: 1, pooledMinSamples: 5 })

/**
 * The recent commits a pair's allowance may use, in three disjoint pools: the pair's own, other
 * pairs' into the same target host, and the rest of the fleet's.
 */
export interface CommitPools {
  readonly pair: readonly CommitSample[]
  readonly target: readonly CommitSample[]
  readonly fleet: readonly CommitSample[]
}

/** The samples that count at `nowMs`: commit times that are finite and ≥ 0, recorded less than `horizonMs` ago. */
const recentOf = (samples: readonly CommitSample[], nowMs: number, horizonMs: number): CommitSample[] =>
  samples.filter((s) => Number.isFinite(s.commitMs) && s.commitMs >= 0 && Number.isFinite(s.atMs) && nowMs - s.atMs < horizonMs)

/** The quantile of the `window` most recent samples (by time) plus the margin. */
const quantileOf = (samples: readonly CommitSample[], p: AllowancePolicy): number => {
  const latest = [...samples].sort((a, b) => a.atMs - b.atMs).slice(-windowOf(p))
  return commitAllowance(latest.map((s) => s.commitMs), p).allowanceMs
}

/**
 * The commit allowance of a host pair at `nowMs` (SPEC §13): the pair's own recent commits when it
 * has `minSamples` of them; else pooled with recent commits into the same target (the commit
 * phase is the coordinator's final-round record and the target's commit, so the target and the
 * coordinator dominate it), else with the whole fleet's. A pool counts only when it holds
 * `pooledMinSamples` (and, for the target's, `minSamples`); else the pair's own, however few;
 * the prior when it has none. A commit older than `horizonMs` never counts. The quantile is
 * over the `window` most recent samples of the pool chosen; `source` names the narrowest pool
 * holding them.
 */
export const recentAllowance = (pools: CommitPools, nowMs: number, policy: Partial<RecencyPolicy> = {}): Allowance => {
  const p = { ...defaultRecencyPolicy, ...policy }
  const own = recentOf(pools.pair, nowMs, p.horizonMs)
  const target = [...own, ...recentOf(pools.target, nowMs, p.horizonMs)]
  const fleet = [...target, ...recentOf(pools.fleet, nowMs, p.horizonMs)]
  const levels: readonly [AllowanceSource, CommitSample[]][] = [["learned", own], ["target", target], ["fleet", fleet]]
  const ownEnough = Math.max(1, p.minSamples)
  const pooledEnough = Math.max(1, p.pooledMinSamples)
  // Each level holds the narrower ones, so the widest that holds `pooledEnough` is the best pool.
  const chosen =
    own.length >= ownEnough ? own : target.length >= Math.max(ownEnough, pooledEnough) ? target : fleet.length >= pooledEnough ? fleet : own
  if (chosen.length === 0) return { allowanceMs: p.priorMs, source: "prior", samples: 0 }
  // A wider pool that added nothing is the narrower one: name the narrowest.
  const [source] = levels.find(([, s]) => s.length === chosen.length)!
  return { allowanceMs: quantileOf(chosen, p), source, samples: Math.min(chosen.length, windowOf(p)) }
}

/**
 * The allowance of moves from `sourceHostId` to `targetHostId` at `nowMs`, from the pairs a store
 * returned (any superset of the recent ones): {@link recentAllowance} over their pools.
 */
export const pairAllowance = (
  pairs: readonly PairCommits[],
  sourceHostId: string,
  targetHostId: string,
  nowMs: number,
  policy: Partial<RecencyPolicy> = {},
): Allowance => {
  const pair: CommitSample[] = []
  const target: CommitSample[] = []
  const fleet: CommitSample[] = []
  for (const q of pairs) {
    const into = q.targetHostId !== targetHostId ? fleet : q.sourceHostId === sourceHostId ? pair : target
    into.push(...samplesOf(q))
  }
  return recentAllowance({ pair, target, fleet }, nowMs, policy)
}

/**
 * How many of a pool's most recent samples {@link recentAllowance} may read: the quantile's
 * `window`, and enough to tell whether a pool holds `minSamples` / `pooledMinSamples`. A store may
 * cut each pool to this many (see {@link allowanceCommits}) and the allowance is the same.
 */
export const poolLimit = (policy: Partial<RecencyPolicy> = {}): number => {
  const p = { ...defaultRecencyPolicy, ...policy }
  // `recentAllowance` compares a pool's count with the policy's as given: holding 1.5 is holding 2.
  const atLeast = (n: number) => Math.max(1, Math.ceil(Number.isFinite(n) ? n : 1))
  return Math.max(windowOf(p), atLeast(p.minSamples), atLeast(p.pooledMinSamples))
}

/** Which commits the allowances of moves from one host to some targets may count ({@link allowanceCommits}). */
export interface AllowanceCommitsQuery {
  readonly sourceHostId: string
  readonly targetHostIds: readonly string[]
  /** Only commits recorded at or after this time (epoch ms): the allowance horizon's start. */
  readonly recordedSince: number
  /** How many of each group's most recent commits: {@link poolLimit} of the policy. */
  readonly limit: number
}

/**
 * The bounded read ({@link allowanceCommits}) the allowances of moves from `sourceHostId` to each
 * of `targetHostIds` need at `nowMs` under `policy`: the commits recorded within its horizon
 * (whole ms: at or after `nowMs − horizonMs + 1` is less than `horizonMs` ago, as
 * {@link recentAllowance} counts them), at most its {@link poolLimit} of each group.
 */
export const allowanceCommitsQuery = (
  sourceHostId: string,
  targetHostIds: readonly string[],
  nowMs: number,
  policy: Partial<RecencyPolicy> = {},
): AllowanceCommitsQuery => ({
  sourceHostId,
  targetHostIds,
  recordedSince: nowMs - { ...defaultRecencyPolicy, ...policy }.horizonMs + 1,
  limit: poolLimit(policy),
})

/** One kept commit of a pair, where it sits in the pair's history. */
interface Indexed {
  readonly pair: PairCommits
  readonly index: number
  readonly commitMs: number
  readonly atMs: number
}

const byCodeUnits = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** Oldest first; a tie by time goes by source, target, then place in the pair's history. */
const olderFirst = (a: Indexed, b: Indexed): number =>
  a.atMs - b.atMs || byCodeUnits(a.pair.sourceHostId, b.pair.sourceHostId) || byCodeUnits(a.pair.targetHostId, b.pair.targetHostId) || a.index - b.index

/**
 * The commits the allowances of moves from `sourceHostId` to each of `targetHostIds` may count,
 * at most `limit` of each group, from every pair a store keeps: the most recent (recorded since
 * `recordedSince`) of each asked target's own pair, of the other pairs into each asked target,
 * and of the pairs into any other target. {@link pairAllowance} of any asked target over them
 * answers as over every pair (sorted by source then target) when `limit` is the policy's
 * {@link poolLimit}: each pool it reads is a union of these groups, and the most recent
 * `limit` of a union are among the most recent `limit` of its parts. So a store answers a
 * bounded read (at most `limit` × (2 × targets + 1) commits) however many pairs the fleet has.
 * Pairs are answered by source then target (by code units), each with its kept commits oldest
 * first; a pair whose last commit is older than `recordedSince` has none that count.
 */
export const allowanceCommits = (pairs: readonly PairCommits[], q: AllowanceCommitsQuery): PairCommits[] => {
  const asked = new Set(q.targetHostIds)
  const groupOf = (p: PairCommits) => (!asked.has(p.targetHostId) ? "" : p.sourceHostId === q.sourceHostId ? `pair ${p.targetHostId}` : `into ${p.targetHostId}`)
  const groups = new Map<string, Indexed[]>()
  for (const pair of pairs) {
    if (!(pair.updatedAt >= q.recordedSince)) continue
    const at = timesOf(pair)
    const group = groups.get(groupOf(pair)) ?? []
    groups.set(groupOf(pair), group)
    pair.commitsMs.forEach((commitMs, index) => {
      const atMs = at[index] as number
      if (Number.isFinite(commitMs) && commitMs >= 0 && Number.isFinite(atMs) && atMs >= q.recordedSince) group.push({ pair, index, commitMs, atMs })
    })
  }
  const keep = Math.max(0, Math.floor(q.limit))
  const kept = [...groups.values()].flatMap((g) => (keep === 0 ? [] : g.sort(olderFirst).slice(-keep)))
  const byPair = new Map<PairCommits, Indexed[]>()
  for (const s of kept) byPair.set(s.pair, [...(byPair.get(s.pair) ?? []), s])
  return [...byPair.entries()]
    .sort(([a], [b]) => byCodeUnits(a.sourceHostId, b.sourceHostId) || byCodeUnits(a.targetHostId, b.targetHostId))
    .map(([p, ss]) => {
      const inOrder = ss.sort((a, b) => a.index - b.index)
      return { sourceHostId: p.sourceHostId, targetHostId: p.targetHostId, commitsMs: inOrder.map((s) => s.commitMs), recordedAtMs: inOrder.map((s) => s.atMs), updatedAt: p.updatedAt }
    })
}
