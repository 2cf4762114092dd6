/**
 * A wall clock that a test can jump: Effect's `Clock` whose current time is the real time plus an
 * offset the test sets (forward or backward), while monotonic time and sleeps stay real. Provided
 * to a coordinator's layer, every time the coordinator reads (reservation heartbeats, staleness,
 * timestamps) jumps with it, as an NTP step or a VM resumed after hours would do to `Date.now()`.
 */
import { Clock, Effect, Layer } from "effect"

/** A clock and the handle that moves it. */
export interface JumpClock {
  readonly clock: Clock.Clock
  /** The clock as a layer, for `Layer.provide`. */
  readonly layer: Layer.Layer<never>
  /** Moves the wall clock by `deltaMs` (negative: backward). */
  readonly jump: (deltaMs: number) => void
  /** The current offset from the real time, in ms. */
  readonly offsetMs: () => number
}

/** A jumpable wall clock, starting at the real time. */
export const make = (): JumpClock => {
  const real = Clock.Clock.defaultValue()
  let offset = 0
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: () => real.currentTimeMillisUnsafe() + offset,
    currentTimeMillis: Effect.sync(() => real.currentTimeMillisUnsafe() + offset),
    currentTimeNanosUnsafe: () => real.currentTimeNanosUnsafe() + BigInt(offset) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => real.currentTimeNanosUnsafe() + BigInt(offset) * 1_000_000n),
    monotonicTimeNanosUnsafe: () => real.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: real.monotonicTimeNanos,
    sleep: (duration) => real.sleep(duration),
  }
  return {
    clock,
    layer: Layer.succeed(Clock.Clock, clock),
    jump: (deltaMs) => {
      offset += deltaMs
    },
    offsetMs: () => offset,
  }
}
