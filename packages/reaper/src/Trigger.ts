/**
 * React at once: when a session queues without room (a create or a resume that
 * found no host, a host lost), the park gate should run for it now, not at the next reaper
 * pass. `Trigger.poke` asks for that; calls within one coalescing window (`windowMs`) share
 * one run of `Reaper.react` at the window's end, so a burst of queued sessions costs one fleet
 * read. Only the leader reacts: on another replica the run answers `Held` and the leader's next
 * pass serves the session.
 *
 * The coordinator's handlers call `poke` after every `Queued` outcome; the fleet simulator
 * drives the same `CoalescingWindow` and the same `Reaper.react` from its event loop.
 */
import { Store } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import * as Reaper from "./Reaper.js"
import { ReaperEvents } from "./ReaperEvents.js"
import * as ReaperState from "./ReaperState.js"

/** The coalescing rule, shared by the service and the simulator. */
export class CoalescingWindow {
  private dueAt: number | null = null

  /**
   * Asks for a run at `now`: answers when it runs if this call opened the window, or null
   * when a run is already due (this call joins it).
   */
  request(now: number, windowMs: number): number | null {
    if (this.dueAt !== null) return null
    this.dueAt = now + windowMs
    return this.dueAt
  }

  /** The run starts: calls from now on open a new window. */
  close(): void {
    this.dueAt = null
  }

  /** When the pending run is due, or null. */
  get due(): number | null {
    return this.dueAt
  }
}

/** A quarter of a second: a burst of arrivals shares one fleet read; a descent starts well within a pass. */
export const defaultTriggerWindowMs = 250

/** How the trigger reacts. */
export interface TriggerOptions extends Reaper.Options {
  /** The coalescing window; `defaultTriggerWindowMs` when missing. */
  readonly windowMs?: number | undefined
}

/** The trigger's operations. */
export interface TriggerShape {
  /**
   * A session queued without room: run the gate within one window. Returns at once; never
   * fails (the reaction's own failures go to `ReaperEvents`, and the next pass catches up).
   */
  readonly poke: Effect.Effect<void>
}

/** The trigger service. */
export class Trigger extends Context.Service<Trigger, TriggerShape>()("@engram/reaper/Trigger") {
  /**
   * A trigger whose reactions run in the layer's scope, on the store in context (and told to the
   * `ReaperEvents` listener in context, if any). Pass the same
   * `state` as the reaper loop's passes, so a reaction and a pass share the gate's memory.
   */
  static readonly layer = (options: TriggerOptions = {}): Layer.Layer<Trigger, never, Store> =>
    Layer.effect(
      Trigger,
      Effect.gen(function* () {
        const store = yield* Store
        // The reaction runs in its own fiber: it keeps the store and the listener of this layer.
        const listener = yield* Effect.serviceOption(ReaperEvents)
        const scope = yield* Effect.scope
        const window = new CoalescingWindow()
        const windowMs = options.windowMs ?? defaultTriggerWindowMs
        const reactOptions: Reaper.Options = { ...options, state: options.state ?? ReaperState.make() }
        const run = Effect.sleep(windowMs).pipe(
          Effect.andThen(Effect.sync(() => window.close())),
          Effect.andThen(Reaper.react(reactOptions)),
          Effect.provideService(Store, store),
          (e) => (listener._tag === "Some" ? Effect.provideService(e, ReaperEvents, listener.value) : e),
          Effect.catchCause((cause) => Effect.logError("reaper: immediate reaction failed", cause)),
        )
        return Trigger.of({
          poke: Effect.gen(function* () {
            const now = yield* Clock.currentTimeMillis
            if (window.request(now, windowMs) === null) return
            yield* Effect.forkIn(run, scope)
          }),
        })
      }),
    )

  /** A trigger that does nothing (a replica that never reaps, tests). */
  static readonly none: Layer.Layer<Trigger> = Layer.succeed(Trigger, Trigger.of({ poke: Effect.void }))
}
