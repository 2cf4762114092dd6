/**
 * The agent's record of what is resident on its host (VMs, their reservations, incoming VMs
 * of moves) and of the move outcomes it still owes. Every change is persisted through
 * `persist` (the state file in production, nothing in clock-driven tests). A write that fails
 * is logged and the change kept in memory (the next write, or the coordinator's view, restores
 * the file), except the debt a move's pause takes (`owePaused`): that one fails, and changes
 * nothing.
 */
import { Effect, Ref, Semaphore } from "effect"
import { empty, logFailed, type PendingCommit, type ResidentVm, type StateFile, type StateWriteError } from "./LocalState.js"

export interface Residents {
  readonly get: (vmId: string) => Effect.Effect<ResidentVm | undefined>
  readonly all: Effect.Effect<readonly ResidentVm[]>
  readonly put: (vm: ResidentVm) => Effect.Effect<void>
  readonly update: (vmId: string, f: (vm: ResidentVm) => ResidentVm) => Effect.Effect<void>
  readonly remove: (vmId: string) => Effect.Effect<void>
  readonly pendingCommits: Effect.Effect<readonly PendingCommit[]>
  readonly addPendingCommit: (c: PendingCommit) => Effect.Effect<void>
  /**
   * Owes a move's outcome and marks its (source) VM paused, in one write of the state file: at a
   * move's switchover this write is a part of the guest's pause, so it is one fsync, not two.
   * Fails when the write does, the record unchanged: a source that sends the guest's last round
   * without its debt on disk cannot tell, after a restart, that the guest may run elsewhere.
   */
  readonly owePaused: (c: PendingCommit) => Effect.Effect<void, StateWriteError>
  readonly removePendingCommit: (moveId: string) => Effect.Effect<void>
  readonly snapshot: Effect.Effect<StateFile>
}

export const makeResidents = (
  hostId: string,
  initial: StateFile | null,
  persist: (s: StateFile) => Effect.Effect<void, StateWriteError>,
): Effect.Effect<Residents> =>
  Effect.gen(function* () {
    const ref = yield* Ref.make<StateFile>(initial ?? empty(hostId))
    const lock = yield* Semaphore.make(1)
    // Persist inside the lock so the file never goes back in time.
    const change = (f: (s: StateFile) => StateFile) =>
      Effect.gen(function* () {
        const next = yield* Ref.updateAndGet(ref, f)
        yield* persist(next).pipe(Effect.catch((e) => logFailed(e, { hostId })))
      }).pipe(lock.withPermits(1))
    /** A change that holds only once written: a failed write leaves the record as it was, and fails. */
    const changeDurably = (f: (s: StateFile) => StateFile) =>
      Effect.gen(function* () {
        const next = f(yield* Ref.get(ref))
        yield* persist(next)
        yield* Ref.set(ref, next)
      }).pipe(lock.withPermits(1))
    return {
      get: (vmId) => Effect.map(Ref.get(ref), (s) => s.vms.find((v) => v.vmId === vmId)),
      all: Effect.map(Ref.get(ref), (s) => s.vms),
      put: (vm) => change((s) => ({ ...s, vms: [...s.vms.filter((v) => v.vmId !== vm.vmId), vm] })),
      update: (vmId, f) => change((s) => ({ ...s, vms: s.vms.map((v) => (v.vmId === vmId ? f(v) : v)) })),
      remove: (vmId) => change((s) => ({ ...s, vms: s.vms.filter((v) => v.vmId !== vmId) })),
      pendingCommits: Effect.map(Ref.get(ref), (s) => s.pendingCommits),
      addPendingCommit: (c) => change((s) => ({ ...s, pendingCommits: [...s.pendingCommits.filter((p) => p.moveId !== c.moveId), c] })),
      owePaused: (c) =>
        changeDurably((s) => ({
          ...s,
          vms: s.vms.map((v) => (v.vmId === c.sessionId ? { ...v, status: "paused" } : v)),
          pendingCommits: [...s.pendingCommits.filter((p) => p.moveId !== c.moveId), c],
        })),
      removePendingCommit: (moveId) => change((s) => ({ ...s, pendingCommits: s.pendingCommits.filter((p) => p.moveId !== moveId) })),
      snapshot: Ref.get(ref),
    }
  })
