/**
 * The agent's record of what is resident on its host (VMs, their reservations, incoming VMs
 * of moves) and of the move outcomes it still owes. Every change is persisted through
 * `persist` (the state file in production, nothing in clock-driven tests).
 */
import { Effect, Ref, Semaphore } from "effect"
import { empty, type PendingCommit, type ResidentVm, type StateFile } from "./LocalState.js"

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
   */
  readonly owePaused: (c: PendingCommit) => Effect.Effect<void>
  readonly removePendingCommit: (moveId: string) => Effect.Effect<void>
  readonly snapshot: Effect.Effect<StateFile>
}

export const makeResidents = (
  hostId: string,
  initial: StateFile | null,
  persist: (s: StateFile) => Effect.Effect<void>,
): Effect.Effect<Residents> =>
  Effect.gen(function* () {
    const ref = yield* Ref.make<StateFile>(initial ?? empty(hostId))
    const lock = yield* Semaphore.make(1)
    // Persist inside the lock so the file never goes back in time.
    const change = (f: (s: StateFile) => StateFile) =>
      Effect.gen(function* () {
        const next = yield* Ref.updateAndGet(ref, f)
        yield* persist(next)
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
        change((s) => ({
          ...s,
          vms: s.vms.map((v) => (v.vmId === c.sessionId ? { ...v, status: "paused" } : v)),
          pendingCommits: [...s.pendingCommits.filter((p) => p.moveId !== c.moveId), c],
        })),
      removePendingCommit: (moveId) => change((s) => ({ ...s, pendingCommits: s.pendingCommits.filter((p) => p.moveId !== moveId) })),
      snapshot: Ref.get(ref),
    }
  })
