/**
 * The target's side of a live move: it stages the rounds a source sends, commits (restores
 * the VM from the staged rounds and resumes it) when the source says so, and drops everything
 * for the move on an abort: staged rounds and any VM it restored.
 */
import { Clock, Effect, Ref, Schema } from "effect"
import type { Residents } from "./Residents.js"
import type { Capture, VmRuntimeShape } from "./Runtime.js"

/** Who a round belongs to: sent with every round. */
export interface MoveHeader {
  readonly moveId: string
  readonly sessionId: string
  readonly sourceHostId: string
  readonly targetHostId: string
  readonly memMib: number
  readonly vcpus: number
}

/** A peer operation failed (refused, unreachable, or the runtime failed on the target). */
export class PeerError extends Schema.TaggedError<PeerError>()("PeerError", {
  op: Schema.String,
  moveId: Schema.String,
  message: Schema.String,
}) {}

/** What a target holds for one move. */
export interface StagedMove {
  readonly header: MoveHeader
  readonly rounds: readonly Capture[]
  readonly stagedAt: number
}

export interface MoveTarget {
  readonly receive: (header: MoveHeader, capture: Capture) => Effect.Effect<void, PeerError>
  readonly commit: (moveId: string) => Effect.Effect<void, PeerError>
  readonly abort: (moveId: string) => Effect.Effect<void>
  readonly staged: Effect.Effect<readonly StagedMove[]>
  /** When this target committed a move, if it did (the grace of a VM whose move the coordinator has not yet shown). */
  readonly committedAt: (moveId: string) => Effect.Effect<number | undefined>
}

export const makeMoveTarget = (hostId: string, runtime: VmRuntimeShape, residents: Residents): Effect.Effect<MoveTarget> =>
  Effect.gen(function* () {
    const staging = yield* Ref.make(new Map<string, StagedMove>())
    const committed = yield* Ref.make(new Map<string, number>())
    const drop = (moveId: string) =>
      Ref.update(staging, (m) => {
        const next = new Map(m)
        next.delete(moveId)
        return next
      })
    const fail = (op: string, moveId: string, message: string) => Effect.fail(new PeerError({ op, moveId, message }))

    const target: MoveTarget = {
      receive: (header, capture) =>
        Effect.gen(function* () {
          if (header.targetHostId !== hostId) return yield* fail("receive", header.moveId, `this host is ${hostId}, not ${header.targetHostId}`)
          if (capture.vmId !== header.sessionId) return yield* fail("receive", header.moveId, "capture is of another VM")
          const now = yield* Clock.currentTimeMillis
          const current = (yield* Ref.get(staging)).get(header.moveId)
          // A full round (re)starts the staging: a source that restarted the move begins again.
          if (capture.kind === "full") {
            yield* Ref.update(staging, (m) => new Map(m).set(header.moveId, { header, rounds: [capture], stagedAt: now }))
            return
          }
          if (current === undefined) return yield* fail("receive", header.moveId, `a ${capture.kind} round before the full round`)
          yield* Ref.update(staging, (m) => new Map(m).set(header.moveId, { ...current, rounds: [...current.rounds, capture] }))
        }),
      commit: (moveId) =>
        Effect.gen(function* () {
          const s = (yield* Ref.get(staging)).get(moveId)
          if (s === undefined) return yield* fail("commit", moveId, "nothing staged for this move")
          if (s.rounds.at(-1)?.kind !== "final") return yield* fail("commit", moveId, "the final round has not arrived")
          const spec = { vmId: s.header.sessionId, memMib: s.header.memMib, vcpus: s.header.vcpus }
          const restoreAndResume = runtime.restore(spec, s.rounds).pipe(Effect.andThen(runtime.resume(spec.vmId)))
          yield* restoreAndResume.pipe(
            Effect.catchTag("RuntimeError", (e) =>
              runtime.destroy(spec.vmId).pipe(Effect.andThen(fail("commit", moveId, `${e.op}: ${e.message}`))),
            ),
          )
          yield* residents.put({ ...spec, status: "running", reservationId: null, moveId })
          const at = yield* Clock.currentTimeMillis
          yield* Ref.update(committed, (m) => new Map(m).set(moveId, at))
          yield* drop(moveId)
        }),
      abort: (moveId) =>
        Effect.gen(function* () {
          yield* drop(moveId)
          for (const vm of yield* residents.all) {
            if (vm.moveId === moveId) {
              yield* runtime.destroy(vm.vmId)
              yield* residents.remove(vm.vmId)
            }
          }
        }),
      staged: Effect.map(Ref.get(staging), (m) => [...m.values()]),
      committedAt: (moveId) => Effect.map(Ref.get(committed), (m) => m.get(moveId)),
    }
    return target
  })
