/**
 * The reaper pass (SPEC §4.3), once, for every app: the coordinator runs it on its store under
 * leader election, the fleet simulator runs it on `@engram/store-sim` under a simulated clock,
 * so the simulator measures what production runs.
 *
 * One pass: read the fleet once (a failed read ends the pass and holds every park); sample the
 * recent demand for room; reclaim expired and stale reservations; run the park policy (a
 * parameter; `ParkPolicy.defaultName` by default) over that read; start a descent for each
 * yield (a CAS `parked → descending`; a lost race is skipped); drain the queue. Leadership is
 * checked between steps through an injected predicate: a replica that loses the lock stops at
 * once. Each step is told to `ReaperEvents` as it happens (metrics, logs, wake-ups).
 *
 * `react` is the gate alone, run at once when a session queues without room (SPEC §12 / issue
 * "react at once"): read, decide, descend; `Trigger` coalesces the calls.
 */
import { ParkPolicy } from "@engram/core"
import type { ParkGate } from "@engram/core"
import { Store } from "@engram/store"
import type { FleetRead } from "@engram/store"
import { Effect } from "effect"
import { ReaperEvents } from "./ReaperEvents.js"
import type { Event, Source } from "./ReaperEvents.js"
import * as ReaperState from "./ReaperState.js"

/** How a pass decides and whom it asks whether it still leads. */
export interface Options {
  /** The park policy, by name or as a function; `ParkPolicy.defaultName` when missing. */
  readonly policy?: ParkPolicy.Name | ParkPolicy.Policy | undefined
  /** The policy's knobs; `ParkPolicy.defaultOptions` when missing. */
  readonly policyOptions?: ParkPolicy.Options | undefined
  /** Whether this replica still leads; asked between steps. Missing: it always leads. */
  readonly leading?: (() => boolean) | undefined
  /**
   * What the reaper remembers between passes (holds for starving sessions, the recent demand).
   * Missing: a fresh memory for this call only (no holds kept, no reserve of free room).
   */
  readonly state?: ReaperState.ReaperState | undefined
}

/** A placement a drain made. */
export interface Placed {
  readonly sessionId: string
  readonly hostId: string
}

/** What one pass did. */
export type PassReport =
  | { readonly _tag: "Held"; readonly reason: string }
  | {
      readonly _tag: "Done"
      readonly reclaimed: number
      readonly lostSessions: readonly string[]
      readonly yields: readonly ParkPolicy.PolicyYield[]
      /** Yields whose descent started (the others lost a race and were skipped). */
      readonly descents: readonly ParkPolicy.PolicyYield[]
      readonly placed: readonly Placed[]
      readonly withoutRoom: number
      readonly unplaceable: number
      readonly holds: readonly ParkGate.Hold[]
    }

/** What one immediate reaction did. */
export type ReactReport =
  | { readonly _tag: "Held"; readonly reason: string }
  | {
      readonly _tag: "Done"
      readonly yields: readonly ParkPolicy.PolicyYield[]
      readonly descents: readonly ParkPolicy.PolicyYield[]
      readonly withoutRoom: number
    }

const LOST = "lost the leader lock mid-pass"

/** Tells the listener an event (resolved once per pass: a pass tells several). */
type Tell = (event: Event) => Effect.Effect<void>

const silent: Tell = () => Effect.void

/** The listener in context, or one that drops every event. */
const listener: Effect.Effect<Tell> = Effect.map(Effect.serviceOption(ReaperEvents), (l) => (l._tag === "Some" ? l.value.emit : silent))

/** The policy function of the options. */
export const policyOf = (options: Options): ParkPolicy.Policy => {
  const p = options.policy ?? ParkPolicy.defaultName
  return typeof p === "string" ? ParkPolicy.policy(p) : p
}

/** The fleet read, or the reason it failed (told to the listener). */
const readFleet = (source: Source, emit: Tell) =>
  Effect.gen(function* () {
    const store = yield* Store
    const read = yield* Effect.result(store.fleetView())
    if (read._tag === "Failure") {
      yield* emit({ _tag: "FleetReadFailed", source, reason: read.failure.reason })
      return { _tag: "Failed" as const, reason: read.failure.reason }
    }
    yield* emit({ _tag: "FleetRead", source, fleet: read.success })
    return { _tag: "Read" as const, fleet: read.success }
  })

/** Runs the policy over the read with what the reaper remembers, and remembers its answer. */
const decideOn = (fleet: FleetRead, options: Options, state: ReaperState.ReaperState, source: Source, emit: Tell) =>
  Effect.gen(function* () {
    const store = yield* Store
    const decision = policyOf(options)(fleet, {
      now: fleet.readAt,
      limits: store.limits(),
      options: options.policyOptions ?? ParkPolicy.defaultOptions,
      memory: state.memory,
      recent: state.meter.rate(),
    })
    state.memory = { holds: decision.holds }
    yield* emit({ _tag: "Decided", source, decision })
    return decision
  })

/**
 * Starts a descent for each yield, in order, while the replica leads; answers the ones that
 * started, or null when leadership was lost on the way.
 */
const descend = (yields: readonly ParkPolicy.PolicyYield[], leading: () => boolean, source: Source, emit: Tell) =>
  Effect.gen(function* () {
    const store = yield* Store
    const started: ParkPolicy.PolicyYield[] = []
    for (const y of yields) {
      if (!leading()) {
        yield* emit({ _tag: "LeadershipLost", source, step: "descents" })
        return null
      }
      const began = yield* Effect.result(store.beginDescent(y.sessionId))
      if (began._tag === "Success") {
        started.push(y)
        yield* emit({ _tag: "DescentStarted", source, yield: y })
      } else if (began.failure._tag === "Unavailable") {
        yield* emit({ _tag: "DescentFailed", source, yield: y, reason: began.failure.reason })
      } else {
        yield* emit({ _tag: "DescentLostRace", source, yield: y })
      }
    }
    return started
  })

/** One reaper pass (SPEC §4.3). Never fails: a store failure ends or skips a step and is told to the listener. */
export const pass = (options: Options = {}): Effect.Effect<PassReport, never, Store> =>
  Effect.gen(function* () {
    const store = yield* Store
    const emit = yield* listener
    const leading = options.leading ?? (() => true)
    const state = options.state ?? ReaperState.make()
    const held = (step: string) => emit({ _tag: "LeadershipLost", source: "pass", step }).pipe(Effect.as({ _tag: "Held" as const, reason: LOST }))

    // 1. One fleet read. Without it nothing is known, so nothing descends: every park holds.
    const read = yield* readFleet("pass", emit)
    if (read._tag === "Failed") return { _tag: "Held", reason: read.reason } satisfies PassReport
    const fleet = read.fleet
    // The recent demand for room, from the store's cumulative counter (a failed read keeps the last rate).
    const counters = yield* Effect.result(store.metrics())
    if (counters._tag === "Success") state.meter.sample(fleet.readAt, counters.success.totalReservedMib)

    // 2. Reclaim expired and stale reservations (their sessions become lost).
    if (!leading()) return yield* held("reclaim")
    const reclaim = yield* Effect.result(store.reclaim())
    let reclaimed = 0
    let lostSessions: readonly string[] = []
    if (reclaim._tag === "Success") {
      reclaimed = reclaim.success.reclaimed.length
      lostSessions = reclaim.success.lostSessions
      yield* emit({ _tag: "Reclaimed", result: reclaim.success })
    } else {
      yield* emit({ _tag: "ReclaimFailed", reason: reclaim.failure.reason })
    }

    // 3. The policy decides which parks yield; each yield is a CAS parked → descending.
    if (!leading()) return yield* held("gate")
    const decision = yield* decideOn(fleet, options, state, "pass", emit)
    const descents = yield* descend(decision.yields, leading, "pass", emit)
    if (descents === null) return { _tag: "Held", reason: LOST } satisfies PassReport

    // 4. Drain the queue into whatever room exists now.
    if (!leading()) return yield* held("drain")
    const drained = yield* Effect.result(store.drainQueue())
    let placed: readonly Placed[] = []
    if (drained._tag === "Success") {
      placed = drained.success.placed
      yield* emit({ _tag: "Drained", result: drained.success })
    } else {
      yield* emit({ _tag: "DrainFailed", reason: drained.failure.reason })
    }
    return {
      _tag: "Done",
      reclaimed,
      lostSessions,
      yields: decision.yields,
      descents,
      placed,
      withoutRoom: decision.withoutRoom,
      unplaceable: decision.unplaceable,
      holds: decision.holds,
    } satisfies PassReport
  })

/**
 * The gate at once, between passes: read the fleet, run the policy, start the descents it
 * asks for. For a session that just queued without room, so its descent starts now rather than
 * at the next pass. Only the leader reacts (others answer `Held`); never fails.
 */
export const react = (options: Options = {}): Effect.Effect<ReactReport, never, Store> =>
  Effect.gen(function* () {
    const leading = options.leading ?? (() => true)
    if (!leading()) return { _tag: "Held", reason: "not the leader" } satisfies ReactReport
    const emit = yield* listener
    const state = options.state ?? ReaperState.make()
    const read = yield* readFleet("react", emit)
    if (read._tag === "Failed") return { _tag: "Held", reason: read.reason } satisfies ReactReport
    if (!leading()) return { _tag: "Held", reason: LOST } satisfies ReactReport
    const decision = yield* decideOn(read.fleet, options, state, "react", emit)
    const descents = yield* descend(decision.yields, leading, "react", emit)
    if (descents === null) return { _tag: "Held", reason: LOST } satisfies ReactReport
    return { _tag: "Done", yields: decision.yields, descents, withoutRoom: decision.withoutRoom } satisfies ReactReport
  })
