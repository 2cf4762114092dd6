/**
 * The fleet over time, for the dashboard's small charts: every `sampleMs` one fleet read summed
 * by core's `Fleet.snapshot` (free RAM, the queue, parks, descents), kept for the last
 * `samples` samples in this process's memory. A read that fails is skipped (a gap, not an
 * error): the charts are a view, never a reason to fail or to log while the store is away.
 * Each replica keeps its own: a restarted coordinator starts a new history.
 */
import { Fleet } from "@engram/core"
import type { Dashboard } from "@engram/dashboard"
import { nowOf, Store } from "@engram/store"
import { Context, Duration, Effect, Layer, Schedule } from "effect"
import { ruleNow } from "./Reaper.js"

/** One sample of the fleet signal, as the dashboard draws it. */
export type Sample = Dashboard.HistorySample

/** How often to sample and how many samples to keep. */
export interface Options {
  /** Default 10 s. */
  readonly sampleMs?: number | undefined
  /** Default 360: an hour at the default interval. */
  readonly samples?: number | undefined
}

export interface FleetHistoryShape {
  readonly intervalMs: number
  /** The kept samples, oldest first. */
  readonly samples: Effect.Effect<readonly Sample[]>
}

/** The fleet's recent history. */
export class FleetHistory extends Context.Service<FleetHistory, FleetHistoryShape>()("@engram/coordinator/FleetHistory") {
  /** Samples in a fiber of the layer's scope until the coordinator stops. */
  static readonly layer = (options: Options = {}): Layer.Layer<FleetHistory, never, Store> =>
    Layer.effect(
      FleetHistory,
      Effect.gen(function* () {
        const store = yield* Store
        // The reaper's gate options: the queue without room is counted as its gate counts it.
        const gate = (yield* ruleNow).options
        const intervalMs = options.sampleMs ?? 10_000
        const keep = Math.max(2, options.samples ?? 360)
        const kept: Sample[] = []
        const sample = Effect.gen(function* () {
          const view = yield* store.fleetView()
          // The store's time: a host's silence is judged against its report's, stamped on it.
          const at = yield* nowOf(store)
          const s = Fleet.snapshot(view, store.limits(), at, gate)
          kept.push({
            at,
            freeMib: s.freeMib,
            capacityMib: s.capacityMib,
            queue: s.queue.sessions,
            withoutRoom: s.queue.withoutRoom,
            parks: s.parks,
            descents: s.descentsRunning,
          })
          if (kept.length > keep) kept.splice(0, kept.length - keep)
        }).pipe(Effect.ignore, Effect.withTracerEnabled(false))
        yield* Effect.forkScoped(sample.pipe(Effect.repeat(Schedule.spaced(Duration.millis(intervalMs)))))
        return FleetHistory.of({ intervalMs, samples: Effect.sync(() => [...kept]) })
      }),
    )
}
