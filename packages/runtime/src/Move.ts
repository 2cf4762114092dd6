/**
 * A whole live move between two runtimes of one process (tests, benches, examples), in the
 * order the agents run it across hosts: the target prepares an incoming VM, the source migrates
 * to its endpoint under the guard, the final round is switched over, the target commits (resumes
 * the VM), the source drops its paused copy. Between hosts the agent puts its peer protocol and
 * the coordinator's records between these steps; the steps and the phase arithmetic are these.
 */
import { Effect } from "effect"
import { type MoveBudget, type MoveRound, nowMs, type RuntimeError, type VmRuntimeShape } from "./Runtime.js"

/** The phases of a committed move's pause (SPEC §5), in ms. */
export interface Phases {
  readonly downtimeMs: number
  readonly captureMs: number
  readonly sendMs: number
  readonly commitMs: number
}

/**
 * The phases from the times one clock observed: the pause, the final round captured and
 * checked (`captureMs`: pause to the post-capture verdict), its send as the runtime measured it,
 * and the guest running on the target. `commitMs` is the rest of the pause: whatever happens
 * after the check that is not the send (making the outcome durable, recording the final round
 * where that outlasts the send, the target's commit). So the phases name every part of the
 * pause and sum to `downtimeMs` (computed as their sum: the store checks the same expression).
 */
export const phases = (t: { readonly pausedAtMs: number; readonly checkedAtMs: number; readonly sendMs: number; readonly runningAtMs: number }): Phases => {
  const captureMs = t.checkedAtMs - t.pausedAtMs
  const commitMs = t.runningAtMs - t.checkedAtMs - t.sendMs
  return { downtimeMs: captureMs + t.sendMs + commitMs, captureMs, sendMs: t.sendMs, commitMs }
}

/** How a move between two runtimes ended. */
export type Outcome =
  | {
      readonly _tag: "Committed"
      readonly phases: Phases
      readonly rounds: readonly MoveRound[]
      /** The source's post-capture estimate that let it switch over. */
      readonly estimateMs: number
      /** The hypervisor's own downtime figure, when it reports one (QEMU). */
      readonly runtimeDowntimeMs: number | null
      readonly selfConverged: boolean
    }
  | {
      readonly _tag: "Refused"
      readonly stage: "pre-pause" | "post-capture"
      readonly estimateMs: number
      readonly reason: string
      readonly rounds: readonly MoveRound[]
      /** Whether the guest paused before the refusal (post-capture: yes, for `pausedMs`). */
      readonly pausedMs: number | null
    }

/** Moves `vmId` from `source` to `target`; the source's copy is destroyed once the target runs it. */
export const between = (
  source: VmRuntimeShape,
  target: VmRuntimeShape,
  vmId: string,
  options: { readonly moveId: string; readonly budget: MoveBudget; readonly onRound?: (r: MoveRound) => Effect.Effect<void> },
): Effect.Effect<Outcome, RuntimeError> =>
  Effect.gen(function* () {
    const spec = (yield* source.list).find((v) => v.vmId === vmId)
    if (spec === undefined) return yield* Effect.die(new Error(`no VM ${vmId} on the source`))
    const endpoint = yield* target.prepareIncoming({ vmId, memMib: spec.memMib, vcpus: spec.vcpus }, options.moveId)
    const result = yield* source
      .migrate(vmId, { moveId: options.moveId, endpoint, budget: options.budget, onRound: options.onRound ?? (() => Effect.void) })
      .pipe(Effect.tapError(() => target.destroy(vmId)))
    if (result._tag !== "AtSwitchover") {
      yield* target.destroy(vmId)
      return {
        _tag: "Refused",
        stage: result.stage,
        estimateMs: result.estimateMs,
        reason: result.reason,
        rounds: result.rounds,
        pausedMs: result._tag === "Aborted" ? result.pausedMs : null,
      } as Outcome
    }
    const checkedAtMs = yield* nowMs
    for (const r of result.unreported) yield* (options.onRound ?? (() => Effect.void))(r)
    const sent = yield* result.switchover.pipe(Effect.tapError(() => target.destroy(vmId)))
    yield* target.commitIncoming(vmId).pipe(Effect.tapError(() => source.unpark(vmId).pipe(Effect.ignore)))
    const runningAtMs = yield* nowMs
    yield* source.destroy(vmId)
    return {
      _tag: "Committed",
      phases: phases({ pausedAtMs: result.pausedAtMs, checkedAtMs, sendMs: sent.sendMs, runningAtMs }),
      rounds: [...result.rounds, { ...result.final, wireBytes: sent.finalWireBytes, sendMs: sent.sendMs }],
      estimateMs: result.estimateMs,
      runtimeDowntimeMs: sent.runtimeDowntimeMs,
      selfConverged: result.selfConverged,
    } as Outcome
  })
