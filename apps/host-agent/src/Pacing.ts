/**
 * When the agent calls the coordinator again, so that a fleet of agents does not move as one.
 *
 * After a failure: capped exponential back-off with jitter. The n-th consecutive retry waits a
 * time drawn uniformly between `baseMs` (`ENGRAM_AGENT_RETRY_MS`) and `baseMs · 2^n`, capped at
 * `capFactor · baseMs` ("full jitter" above a floor, as in the AWS architecture blog's "Exponential
 * Backoff And Jitter"). A success starts the count again only once earned (`healedBy`): the
 * coordinator has answered every call for as long as the cap. Never sooner than the coordinator
 * asked, up to the cap: a failure that carries `retryAfterMs` (a 429 or 503 body, or a
 * `Retry-After` header, a proxy's unbounded) waits at least that long, clamped to `capMs`, plus up
 * to half of it again, drawn, so the agents it answered at once do not come back at once either
 * (at most 1.5 × `capMs`: a proxy's `Retry-After: 3600` does not stop an agent for an hour).
 *
 * Periodic calls (heartbeats, reports): the first after start at a random point within one
 * interval, then each interval shortened by up to a tenth, drawn. A heartbeat never later than
 * its interval, whatever the coordinator (or a proxy) asked: its bound against the stale window
 * is the interval itself, as without jitter. A report honours the advice as a retry does (up to
 * the cap, plus up to half).
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

/**
 * Whether a failure at `nowMs` starts the back-off again from the first delay: the coordinator has
 * answered every call since `answeredSinceMs` (the first call answered after the last failure;
 * undefined while calls fail) for at least the cap. The cap, because it is the longest any agent
 * of a fleet backing off waits: a coordinator that answered that long has answered them all, one
 * that answered a call in between failures (a coordinator that flaps) has not, and its agents go on
 * backing off towards the cap instead of coming back at the first delay (a herd on the coordinator
 * least able to take one). Kubernetes client-go's back-off manager resets the same way (after
 * `resetDuration` without a failure), as do reconnecting clients that reset only once a
 * connection stayed up past the back-off's ceiling.
 */
export const healedBy = (b: Backoff, answeredSinceMs: number | undefined, nowMs: number): boolean =>
  answeredSinceMs !== undefined && nowMs - answeredSinceMs >= b.capMs

/** What the coordinator asked a failure to wait, ms (`CoordinatorError.retryAfterMs`); undefined when it did not. */
export const retryAfterOf = (e: unknown): number | undefined => {
  const ms = typeof e === "object" && e !== null && "retryAfterMs" in e ? (e as { readonly retryAfterMs?: unknown }).retryAfterMs : undefined
  return typeof ms === "number" && Number.isFinite(ms) && ms > 0 ? ms : undefined
}

/** At least `retryAfterMs` clamped to `capMs`, plus up to half of that, drawn; 0 without it. */
const askedMs = (retryAfterMs: number | undefined, capMs: number): Effect.Effect<number> => {
  if (retryAfterMs === undefined) return Effect.succeed(0)
  const honoured = Math.min(retryAfterMs, capMs)
  return Effect.map(Random.nextBetween(0, honoured / 2), (extra) => Math.ceil(honoured + extra))
}

/**
 * How long the `attempt`-th consecutive retry (from 1) waits, ms: drawn in
 * `[baseMs, ceilingMs(attempt)]`, and at least what the coordinator asked (`retryAfterMs`), up to `capMs`.
 */
export const retryDelayMs = (b: Backoff, attempt: number, retryAfterMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.ceil(yield* Random.nextBetween(b.baseMs, Math.max(b.baseMs, ceilingMs(b, attempt))))
    return Math.max(drawn, yield* askedMs(retryAfterMs, b.capMs))
  })

/**
 * `retryDelayMs` as a schedule for `Effect.retry`: forever, each delay drawn for its attempt,
 * at least what the failure asked (unless `honourAdvice` is false: a move's brief retries in
 * its guest's pause, whose bound is the back-off's own). A new retry (a new `Effect.retry`)
 * starts from attempt `afterAttempts + 1`: the failures of the same trouble already counted
 * elsewhere (the retry pass's rounds) are not forgotten by its read's own retries.
 */
export const retrySchedule = (b: Backoff, honourAdvice = true, afterAttempts = 0): Schedule.Schedule<number, unknown> =>
  Schedule.fromStepWithMetadata(
    Effect.succeed((meta: Schedule.InputMetadata<unknown>) =>
      Effect.map(retryDelayMs(b, afterAttempts + meta.attempt, honourAdvice ? retryAfterOf(meta.input) : undefined), (ms): [number, Duration.Duration] => [ms, Duration.millis(ms)]),
    ),
  )

/**
 * The pause between two assignments polls after an unchanged answer (or a coordinator without
 * long-polls), ms: `min(retryDelayMs, 1000)`, drawn in half to one and a half of it. Agents whose
 * polls a stopping replica answered in one tick (or a crashed one cut at once) do not poll the
 * next replica in one burst, nor stay in step after.
 */
export const pollPauseMs = (retryDelayMs: number): Effect.Effect<number> => {
  const baseMs = Math.min(retryDelayMs, 1000)
  return Effect.map(Random.nextBetween(baseMs / 2, (3 * baseMs) / 2), Math.round)
}

/**
 * How long a long-poll moved to another replica waits before it is sent there, ms: drawn in
 * `[0, maxMs]`. Every agent of a replica that stops or crashes moves at once to the same next
 * one; spread, they do not arrive in one burst of authentications and reads.
 */
export const moveSpreadMs = (maxMs = 1000): Effect.Effect<number> => Effect.map(Random.nextBetween(0, maxMs), Math.round)

/**
 * How a periodic call takes the coordinator's advice (`retryAfterMs`): a heartbeat (`adviceCapMs`
 * undefined) never past its interval, the stale window's bound; a report up to `adviceCapMs`
 * (the back-off's cap), plus up to half of it, drawn.
 */
const periodicMs = (drawn: number, intervalMs: number, retryAfterMs: number | undefined, adviceCapMs: number | undefined): Effect.Effect<number> =>
  adviceCapMs === undefined
    ? Effect.map(askedMs(retryAfterMs, intervalMs), (asked) => Math.max(Math.min(drawn, intervalMs), Math.min(asked, intervalMs)))
    : Effect.map(askedMs(retryAfterMs, adviceCapMs), (asked) => Math.max(drawn, asked))

/** The first periodic call after start: at a random point within one interval (later only as `periodicMs` lets the coordinator ask). */
export const firstTickMs = (intervalMs: number, retryAfterMs?: number, adviceCapMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.round(yield* Random.nextBetween(0, intervalMs))
    return yield* periodicMs(drawn, intervalMs, retryAfterMs, adviceCapMs)
  })

/** The next periodic call: the interval shortened by up to a tenth, drawn, never longer (a report's, unless the coordinator asked for longer). */
export const nextTickMs = (intervalMs: number, retryAfterMs?: number, adviceCapMs?: number): Effect.Effect<number> =>
  Effect.gen(function* () {
    const drawn = Math.max(1, Math.round(yield* Random.nextBetween(0.9 * intervalMs, intervalMs)))
    return yield* periodicMs(Math.min(drawn, intervalMs), intervalMs, retryAfterMs, adviceCapMs)
  })
