/**
 * Serializes, within this process, the two writes that decide who settles a move after its
 * pause: the source recording its final round, and the move request's timeout deciding
 * whether it may still abort. Once a final round is recorded the pause is spent (SPEC §5) and
 * the coordinator must not abort the move itself. The store has no "abort unless a final round
 * is recorded" operation, so without this fence a timeout could read the move (no final
 * round), the source record its final round and go on to commit the target, and the timeout
 * then abort it. Across replicas on one PostgreSQL the fence does not reach; see the README
 * ("Moves") for that window and how the agent recovers from it.
 */
import { Context, Effect, Layer, Semaphore } from "effect"

export interface MoveFenceShape {
  /** Runs `effect` while holding the fence (one holder at a time in this process). */
  readonly guard: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

export class MoveFence extends Context.Service<MoveFence, MoveFenceShape>()("@engram/coordinator/MoveFence") {
  static readonly layer: Layer.Layer<MoveFence> = Layer.effect(
    MoveFence,
    Effect.map(Semaphore.make(1), (lock) => MoveFence.of({ guard: (effect) => lock.withPermits(1)(effect) })),
  )
}
