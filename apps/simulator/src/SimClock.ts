/**
 * The simulated clock: an Effect `Clock` whose time is whatever the event loop says it is.
 * The store reads time only through the Clock, so every timestamp it writes (queuedAt,
 * parkedAt, heartbeats) is simulated time; nothing ever sleeps.
 */
import { Clock, Context, Effect } from "effect"
import type { Exit } from "effect"

/** A settable clock and a runner that executes store effects on it. */
export interface SimClock {
  /** Simulated epoch milliseconds. */
  now: number
  /** Runs an effect synchronously with this clock provided. */
  readonly run: <A, E>(effect: Effect.Effect<A, E>) => Exit.Exit<A, E>
}

/** A clock that starts at `startMs` and moves only when the simulator sets `now`. */
export const make = (startMs = 0): SimClock => {
  const state = { now: startMs }
  const nanos = (): bigint => BigInt(Math.floor(state.now)) * 1_000_000n
  const clock: Clock.Clock = {
    currentTimeMillisUnsafe: () => state.now,
    currentTimeMillis: Effect.sync(() => state.now),
    currentTimeNanosUnsafe: nanos,
    currentTimeNanos: Effect.sync(nanos),
    monotonicTimeNanosUnsafe: nanos,
    monotonicTimeNanos: Effect.sync(nanos),
    // The simulator never sleeps inside a store operation; time moves between events.
    sleep: () => Effect.void,
  }
  const run = Effect.runSyncExitWith(Context.make(Clock.Clock, clock))
  return {
    get now() {
      return state.now
    },
    set now(t: number) {
      state.now = t
    },
    run,
  }
}
