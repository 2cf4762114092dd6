/**
 * Workloads: what users do, independent of what the fleet does to them. A workload is one
 * script per session (when it arrives, its budget, and the lengths of its active and idle
 * periods); the simulator plays each script against the fleet. Scripts come from the seeded
 * generator or from a trace (JSON Lines), and a script round-trips through the trace exactly.
 */
import { Order } from "@engram/core"
import type { Budget } from "@engram/core"
import { Rng } from "./Rng.js"

const MINUTE = 60_000
const HOUR = 60 * MINUTE

/**
 * One session's script. The session arrives at `arriveAtMs`, runs `activeMs[0]`, goes idle for
 * `idleMs[0]`, resumes, runs `activeMs[1]`, and so on. Active periods count from the moment
 * the VM actually runs (after any queue wait or restore); idle periods from the moment it went
 * idle. With `endAfterIdle` it ends at the end of its last idle period (`idleMs.length ===
 * activeMs.length`), else at the end of its last active period (`idleMs.length ===
 * activeMs.length - 1`).
 */
export interface Script {
  readonly id: string
  readonly arriveAtMs: number
  readonly budget: Budget
  /**
   * The RAM the VM actually touches (MiB): what a descent captures and a restore reads back.
   * Missing: the whole budget.
   */
  readonly residentMib?: number
  readonly activeMs: readonly number[]
  readonly idleMs: readonly number[]
  readonly endAfterIdle: boolean
}

/** A workload: the scripts sorted by arrival, and the horizon the run covers. */
export interface Workload {
  readonly scripts: readonly Script[]
  readonly horizonMs: number
}

/** A session size and how often it is drawn. */
export interface SizeClass {
  readonly memMib: number
  readonly vcpus: number
  readonly weight: number
}

/** The synthetic generator's knobs. */
export interface GeneratorConfig {
  readonly seed: number
  readonly sessions: number
  readonly hours: number
  /** Arrival rate swing over the day: rate ∝ 1 + amplitude × cos(2π (hour − peakHour) / 24). */
  readonly dailyAmplitude: number
  readonly peakHour: number
  readonly sizes: readonly SizeClass[]
  /** Active periods: lognormal with this median (minutes) and shape. */
  readonly activeMedianMin: number
  readonly activeSigma: number
  /** Idle periods: Pareto with this minimum (minutes) and shape (heavy tail below 2). */
  readonly idleMinMin: number
  readonly idleAlpha: number
  /** Longest idle period (hours); the Pareto tail is cut here. */
  readonly idleCapHours: number
  /** Probability that a session comes back after an idle period. */
  readonly resumeProb: number
  /** A session that does not come back: probability it is left idle (ends later) rather than closed at once. */
  readonly abandonIdleProb: number
  /** At most this many active periods per session. */
  readonly maxCycles: number
  /**
   * Stretches of the run where the arrival rate is multiplied (a flash crowd, a shift that
   * lasts to the end) and, optionally, sizes come from another mix (a burst of very big
   * sessions, a size shift). Where phases overlap, the rates multiply and the last one's sizes win.
   */
  readonly phases?: readonly Phase[] | undefined
  /**
   * Size noise: every session's RAM is multiplied by (1 − U × pct / 100), U uniform in [0, 1),
   * drawn from a stream of its own, so a jittered workload is the unjittered one with slightly
   * smaller sessions (the same arrivals, periods and vCPUs). 0 or missing: none.
   */
  readonly sizeJitterPct?: number | undefined
}

/** A stretch of the run with another arrival rate and, optionally, other sizes. */
export interface Phase {
  readonly fromHour: number
  readonly hours: number
  /** The arrival rate in the phase is the daily cycle's times this. */
  readonly rateFactor: number
  /** Sizes of the sessions arriving in the phase (missing: the generator's). */
  readonly sizes?: readonly SizeClass[] | undefined
}

/** Defaults: a working day of sandboxes with 2–32 GiB, a busy afternoon and a long idle tail. */
export const defaultGenerator: GeneratorConfig = Object.freeze({
  seed: 1,
  sessions: 50_000,
  hours: 24,
  dailyAmplitude: 0.6,
  peakHour: 14,
  sizes: Object.freeze([
    { memMib: 2048, vcpus: 1, weight: 20 },
    { memMib: 4096, vcpus: 2, weight: 35 },
    { memMib: 8192, vcpus: 4, weight: 30 },
    { memMib: 16_384, vcpus: 8, weight: 12 },
    { memMib: 32_768, vcpus: 8, weight: 3 },
  ]),
  activeMedianMin: 15,
  activeSigma: 1.0,
  idleMinMin: 3,
  idleAlpha: 1.2,
  idleCapHours: 12,
  resumeProb: 0.8,
  abandonIdleProb: 0.7,
  maxCycles: 40,
})

const inPhase = (p: Phase, hour: number): boolean => hour >= p.fromHour && hour < p.fromHour + p.hours

/** The product of the rate factors of the phases at `hour`. */
const phaseFactor = (phases: readonly Phase[], hour: number): number => {
  let f = 1
  for (const p of phases) if (inPhase(p, hour)) f *= p.rateFactor
  return f
}

/** The largest rate factor the phases reach at any time (their product where they overlap at most). */
const maxPhaseFactor = (phases: readonly Phase[]): number => {
  let max = 1
  for (const p of phases) max = Math.max(max, phaseFactor(phases, p.fromHour))
  return max
}

/** Arrival times of `n` sessions over `hours`, from a rate with a daily cycle and the phases (thinning). */
const arrivals = (rng: Rng, cfg: GeneratorConfig): number[] => {
  const horizon = cfg.hours * HOUR
  const amp = Math.max(0, Math.min(1, cfg.dailyAmplitude))
  const phases = cfg.phases ?? []
  const bound = (1 + amp) * maxPhaseFactor(phases)
  const out: number[] = []
  while (out.length < cfg.sessions) {
    const t = rng.uniform() * horizon
    const hour = t / HOUR
    const daily = 1 + amp * Math.cos((2 * Math.PI * (hour - cfg.peakHour)) / 24)
    const rate = phases.length === 0 ? daily : daily * phaseFactor(phases, hour)
    if (rng.uniform() * bound < rate) out.push(Math.floor(t))
  }
  return out.sort((a, b) => a - b)
}

/** The sizes of a session arriving at `hour`: the last phase with sizes that covers it, else the generator's. */
const sizesAt = (cfg: GeneratorConfig, hour: number): readonly SizeClass[] => {
  let sizes = cfg.sizes
  for (const p of cfg.phases ?? []) if (p.sizes !== undefined && inPhase(p, hour)) sizes = p.sizes
  return sizes
}

/** A different stream for the size noise, so the rest of the workload does not change with it. */
const JITTER_STREAM = 0x5eed_0003

const msAtLeast1 = (x: number): number => Math.max(1, Math.round(x))

/** Generates a workload from the seed: the same config always gives the same scripts. */
export const generate = (cfg: GeneratorConfig): Workload => {
  const rng = new Rng(cfg.seed)
  const jitter = cfg.sizeJitterPct !== undefined && cfg.sizeJitterPct > 0 ? { rng: new Rng((cfg.seed ^ JITTER_STREAM) >>> 0), share: cfg.sizeJitterPct / 100 } : null
  const times = arrivals(rng, cfg)
  const weightsOf = new Map<readonly SizeClass[], number[]>()
  const width = String(cfg.sessions).length
  const idleCap = cfg.idleCapHours * HOUR
  const scripts: Script[] = times.map((arriveAtMs, i) => {
    const mix = cfg.phases === undefined ? cfg.sizes : sizesAt(cfg, arriveAtMs / HOUR)
    let weights = weightsOf.get(mix)
    if (weights === undefined) {
      weights = mix.map((s) => s.weight)
      weightsOf.set(mix, weights)
    }
    const size = mix[rng.weighted(weights)] as SizeClass
    const memMib = jitter === null ? size.memMib : Math.max(1, Math.floor(size.memMib * (1 - jitter.rng.uniform() * jitter.share)))
    const activeMs: number[] = []
    const idleMs: number[] = []
    let endAfterIdle = false
    for (;;) {
      activeMs.push(msAtLeast1(rng.lognormal(cfg.activeMedianMin * MINUTE, cfg.activeSigma)))
      const idle = msAtLeast1(Math.min(idleCap, rng.pareto(cfg.idleMinMin * MINUTE, cfg.idleAlpha)))
      if (activeMs.length < cfg.maxCycles && rng.chance(cfg.resumeProb)) {
        idleMs.push(idle)
        continue
      }
      if (rng.chance(cfg.abandonIdleProb)) {
        idleMs.push(idle)
        endAfterIdle = true
      }
      break
    }
    return {
      id: `s${String(i).padStart(width, "0")}`,
      arriveAtMs,
      budget: { memMib, vcpus: size.vcpus },
      activeMs,
      idleMs,
      endAfterIdle,
    }
  })
  return { scripts, horizonMs: cfg.hours * HOUR }
}

// ---- the trace format -----------------------------------------------------------------------

/** What a trace line says a session does. */
export type TraceKind = "arrive" | "idle" | "resume" | "end"

/** One trace line. `memMib`, `vcpus` and the optional `residentMib` are on `arrive` lines only. */
export type TraceEvent =
  | {
      readonly t: number
      readonly kind: "arrive"
      readonly sessionId: string
      readonly memMib: number
      readonly vcpus: number
      readonly residentMib?: number
    }
  | { readonly t: number; readonly kind: "idle" | "resume" | "end"; readonly sessionId: string }

/** The optional first line of a trace: the horizon the recorded run covered. */
export interface TraceMeta {
  readonly kind: "meta"
  readonly horizonMs: number
  readonly note?: string
}

/** The length of a period that never closes: a session without an `end` line runs to the horizon. */
export const OPEN = Number.MAX_SAFE_INTEGER

/**
 * The trace events of a script, on the timeline of a fleet that never makes anyone wait: a
 * replay reads the gaps between one session's lines as the lengths of its periods.
 */
export const eventsOf = (s: Script): TraceEvent[] => {
  const out: TraceEvent[] = [
    s.residentMib === undefined
      ? { t: s.arriveAtMs, kind: "arrive", sessionId: s.id, memMib: s.budget.memMib, vcpus: s.budget.vcpus }
      : { t: s.arriveAtMs, kind: "arrive", sessionId: s.id, memMib: s.budget.memMib, vcpus: s.budget.vcpus, residentMib: s.residentMib },
  ]
  let t = s.arriveAtMs
  for (let k = 0; k < s.activeMs.length; k++) {
    const active = s.activeMs[k] as number
    // A period that never closes (a session that runs to the horizon) ends the lines.
    if (active >= OPEN) break
    t += active
    const idle = s.idleMs[k]
    if (idle === undefined) {
      out.push({ t, kind: "end", sessionId: s.id })
      break
    }
    out.push({ t, kind: "idle", sessionId: s.id })
    if (idle >= OPEN) break
    t += idle
    out.push({ t, kind: k === s.activeMs.length - 1 ? "end" : "resume", sessionId: s.id })
  }
  return out
}

/** Writes a workload as a trace: a meta line, then every event sorted by time (ties in script order). */
export const toTrace = (w: Workload, note?: string): string => {
  const events: { e: TraceEvent; order: number }[] = []
  let order = 0
  for (const s of w.scripts) for (const e of eventsOf(s)) events.push({ e, order: order++ })
  events.sort((a, b) => a.e.t - b.e.t || a.order - b.order)
  const meta: TraceMeta = note === undefined ? { kind: "meta", horizonMs: w.horizonMs } : { kind: "meta", horizonMs: w.horizonMs, note }
  const lines = [JSON.stringify(meta)]
  for (const { e } of events) lines.push(JSON.stringify(e))
  return `${lines.join("\n")}\n`
}

/** A trace that could not be read: the line (1-based) and what is wrong with it. */
export interface TraceIssue {
  readonly line: number
  readonly message: string
}

/** The result of reading a trace. */
export type ParseResult =
  | { readonly _tag: "Parsed"; readonly workload: Workload }
  | { readonly _tag: "Invalid"; readonly issue: TraceIssue }

interface Building {
  id: string
  arriveAtMs: number
  budget: Budget
  residentMib: number | undefined
  activeMs: number[]
  idleMs: number[]
  /** The time and kind of the session's last line. */
  lastT: number
  last: TraceKind
}

const scriptOf = (b: Building, endAfterIdle: boolean): Script =>
  b.residentMib === undefined
    ? { id: b.id, arriveAtMs: b.arriveAtMs, budget: b.budget, activeMs: b.activeMs, idleMs: b.idleMs, endAfterIdle }
    : { id: b.id, arriveAtMs: b.arriveAtMs, budget: b.budget, residentMib: b.residentMib, activeMs: b.activeMs, idleMs: b.idleMs, endAfterIdle }

const isTime = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v >= 0
const isPositive = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v > 0

/**
 * Reads a trace. Each session must go `arrive`, then `idle` / `resume` in turn, then `end`
 * (after an active or an idle period); its times must not go backwards. Blank lines are
 * ignored. Without a meta line the horizon is the last event's time. `horizonMs` overrides both.
 */
export const parseTrace = (text: string, horizonMs?: number): ParseResult => {
  const sessions = new Map<string, Building>()
  const done = new Map<string, Script>()
  let metaHorizon: number | undefined
  let lastT = 0
  const lines = text.split("\n")
  const invalid = (line: number, message: string): ParseResult => ({ _tag: "Invalid", issue: { line, message } })
  for (let n = 0; n < lines.length; n++) {
    const raw = (lines[n] as string).trim()
    if (raw === "") continue
    let v: unknown
    try {
      v = JSON.parse(raw)
    } catch {
      return invalid(n + 1, "not valid JSON")
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) return invalid(n + 1, "expected a JSON object")
    const o = v as Record<string, unknown>
    if (o["kind"] === "meta") {
      if (!isPositive(o["horizonMs"])) return invalid(n + 1, "meta.horizonMs must be a positive number")
      metaHorizon = o["horizonMs"]
      continue
    }
    const { t, kind, sessionId } = o
    if (!isTime(t)) return invalid(n + 1, "t must be a number ≥ 0 (ms)")
    if (typeof sessionId !== "string" || sessionId === "") return invalid(n + 1, "sessionId must be a non-empty string")
    if (kind !== "arrive" && kind !== "idle" && kind !== "resume" && kind !== "end")
      return invalid(n + 1, `kind must be arrive, idle, resume or end (got ${JSON.stringify(kind)})`)
    lastT = Math.max(lastT, t)
    if (done.has(sessionId)) return invalid(n + 1, `session ${sessionId} has a line after its end`)
    const b = sessions.get(sessionId)
    if (kind === "arrive") {
      if (b !== undefined) return invalid(n + 1, `session ${sessionId} arrives twice`)
      const { memMib, vcpus } = o
      if (!isPositive(memMib) || !Number.isInteger(memMib)) return invalid(n + 1, "memMib must be a positive integer on arrive")
      if (!isPositive(vcpus) || !Number.isInteger(vcpus)) return invalid(n + 1, "vcpus must be a positive integer on arrive")
      const resident = o["residentMib"]
      if (resident !== undefined && (!isPositive(resident) || resident > memMib))
        return invalid(n + 1, "residentMib must be a positive number no larger than memMib")
      sessions.set(sessionId, {
        id: sessionId,
        arriveAtMs: t,
        budget: { memMib, vcpus },
        residentMib: resident as number | undefined,
        activeMs: [],
        idleMs: [],
        lastT: t,
        last: "arrive",
      })
      continue
    }
    if (b === undefined) return invalid(n + 1, `session ${sessionId} has ${kind} before arrive`)
    if (t < b.lastT) return invalid(n + 1, `session ${sessionId} goes back in time (${t} < ${b.lastT})`)
    const gap = Math.max(1, t - b.lastT)
    const wasActive = b.last === "arrive" || b.last === "resume"
    if (kind === "idle") {
      if (!wasActive) return invalid(n + 1, `session ${sessionId} goes idle twice`)
      b.activeMs.push(gap)
    } else if (kind === "resume") {
      if (wasActive) return invalid(n + 1, `session ${sessionId} resumes while active`)
      b.idleMs.push(gap)
    } else {
      if (wasActive) b.activeMs.push(gap)
      else b.idleMs.push(gap)
      done.set(sessionId, scriptOf(b, !wasActive))
      sessions.delete(sessionId)
    }
    b.lastT = t
    b.last = kind
  }
  // A session without an end line runs to the horizon: its open period never closes.
  for (const b of sessions.values()) {
    const wasActive = b.last === "arrive" || b.last === "resume"
    if (wasActive) b.activeMs.push(OPEN)
    else b.idleMs.push(OPEN)
    done.set(b.id, scriptOf(b, !wasActive))
  }
  const scripts = [...done.values()].sort((a, b) => a.arriveAtMs - b.arriveAtMs || Order.byId(a, b))
  const horizon = horizonMs ?? metaHorizon ?? Math.max(1, lastT)
  return { _tag: "Parsed", workload: { scripts, horizonMs: horizon } }
}
