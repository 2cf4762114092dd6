import { Effect } from "effect"
import { CoordinatorError, type CoordinatorShape } from "../../src/Coordinator.js"

/**
 * `client`'s `round` with the final round's record landing once while its answer is lost, and
 * every later try of it failing (the coordinator unreachable since): the source gives the pause
 * back with the move in doubt (its final round recorded, its commit never sent).
 */
export const finalRoundAnswerLost = (client: CoordinatorShape): CoordinatorShape["round"] => {
  let finalTries = 0
  return (id, r) =>
    r.kind !== "final"
      ? client.round(id, r)
      : Effect.suspend(() => {
          const lost = new CoordinatorError({ op: "round", status: null, message: "timed out (the answer was lost)" })
          return finalTries++ === 0 ? client.round(id, r).pipe(Effect.andThen(Effect.fail(lost))) : Effect.fail(lost)
        })
}
