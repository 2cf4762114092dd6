/**
 * When the agent calls the coordinator again, so that a fleet of agents does not move as one.
 *
 * After a failure: capped exponential back-off with jitter. The n-th consecutive retry waits a
 * time drawn uniformly between `baseMs` (`ENGRAM_AGENT_RETRY_MS`) and `baseMs · 2^n`, capped at
 * `capFactor · baseMs` ("full jitter" above a floor, as in the AWS architecture blog's "Exponential
 * Backoff And Jitter"); a success starts the count again. Never sooner than the coordinator
 * asked: a failure that carries `retryAfterMs` (a 429 or 503 body, or a `Retry-After` header)
 * waits at least that long, plus up to half of it again, drawn, so the agents it answered at
 * once do not come back at once either.
 *
 * Periodic calls (heartbeats, reports): the first after start at a random point within one
 * interval, then each interval shortened by up to a tenth, drawn. Never later than the interval,
 * so the heartbeat's bound against the stale window is the interval itself, as without jitter.
 *
 * Every draw goes through Effect's `Random` service (tests seed it with `Random.withSeed`) and
 * every wait through the caller's `Clock`.
 */
import { Duration, Effect, Random, Schedule } from "effect"

/** How many times `baseMs` a retry waits at most. */
export const capFactor = 30

/** The back-off of one kind of retry, in ms: the floor of every delay, and their cap. */
export interface Backoff {
  readonly baseMs: number
  readonly capMs: number
}

/** The back-off from `ENGRAM_AGENT_RETRY_MS`: from it, capped at `capFactor` times it. */
export const backoffOf = (retryDelayMs: number): Backoff => ({ baseMs: retryDelayMs, capMs: capFactor * retryDelayMs })

/** The longest the `attempt`-th consecutive retry (from 1) may wait before its draw: `baseMs · 2^attempt`, capped. */
export const ceilingMs = (b: Backoff, attempt: number): number => Math.min(b.capMs, b.baseMs * 2 ** Math.min(Math.max(1, attempt), 52))

/** What the coordinator asked a failure to wait, ms (`CoordinatorError.retryAfterMs`); undefined when it did not. */
export const retryAfterOf = (e: unknown): number | undefined => {
  const ms = typeof e === "object" && e !== null && "retryAfterMs" in e ? (e as { readonly retryAfterMs?: unknown }).retryAfterMs : undefined
  return typeof ms === "number" && Number.isFinite(ms) && ms > 0 ? ms : undefined
}

/** At least `retryAfterMs`, plus up to half of it, drawn; 0 without it. */
const askedMs = (retryAfterMs: number | undefined): Effect.Effect<number> =>
  retryAfterMs === undefined ? Effect.succeed(0) : Effect.map(Random.nextBetween(0, retryAfterMs / 2), (extra) => Math.ceil(retryAfterMs + extra))

/**
 * How long the `attempt`-th consecutive retry (from 1) waits, ms: drawn in
 * `[baseMs, ceilingMs(attempt)]`, and at least what the coordinator asked (`retryAfterMs`).
 */
export const retryDelayMs = (b: Backoff, attempt: number, retryAfterMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.ceil(yield* Random.nextBetween(b.baseMs, Math.max(b.baseMs, ceilingMs(b, attempt))))
    return Math.max(drawn, yield* askedMs(retryAfterMs))
  })

/**
 * `retryDelayMs` as a schedule for `Effect.retry`: forever, each delay drawn for its attempt,
 * at least what the failure asked. A new retry (a new `Effect.retry`) starts from the first.
 */
export const retrySchedule = (b: Backoff): Schedule.Schedule<number, unknown> =>
  Schedule.fromStepWithMetadata(
    Effect.succeed((meta: Schedule.InputMetadata<unknown>) => Effect.map(retryDelayMs(b, meta.attempt, retryAfterOf(meta.input)), (ms): [number, Duration.Duration] => [ms, Duration.millis(ms)])),
  )

/** The first periodic call after start: at a random point within one interval (and no sooner than asked). */
export const firstTickMs = (intervalMs: number, retryAfterMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.round(yield* Random.nextBetween(0, intervalMs))
    return Math.max(drawn, yield* askedMs(retryAfterMs))
  })

/** The next periodic call: the interval shortened by up to a tenth, drawn, never longer (unless the coordinator asked for longer). */
export const nextTickMs = (intervalMs: number, retryAfterMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.max(1, Math.round(yield* Random.nextBetween(0.9 * intervalMs, intervalMs)))
    return Math.max(Math.min(drawn, intervalMs), yield* askedMs(retryAfterMs))
  })
