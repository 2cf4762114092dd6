/**
 * The agent's record of what is resident on its host (VMs, their reservations, incoming VMs
 * of moves) and of the move outcomes it still owes. Every change is persisted through
 * `persist` (the state file in production, nothing in clock-driven tests). A change holds in
 * memory at once; its write follows. A write that fails is logged and the change kept (the next
 * write, or the coordinator's view, restores the file), except the debt a move's pause takes
 * (`owePaused`): that one fails, and changes nothing.
 *
 * A disk that hangs (a write that never returns) must not stall the agent: a change waits for
 * its write at most `writeWaitMs`, then goes on, the record in memory serving (logged once per
 * hang); while the write hangs later changes do not wait at all, and the file catches up with
 * the latest record when the disk answers. Only `owePaused` needs its write, and it fails at
 * once while one hangs.
 */
import { Clock, Data, Effect, Fiber, Semaphore } from "effect"
import { empty, logFailed, type LostReport, type PendingCommit, type ResidentVm, type StateFile, type StateWriteError, type UnfinishedMove } from "./LocalState.js"

/** How long a change waits for its state file write before the agent goes on without it (the disk hangs), ms. */
export const writeWaitMs = 10_000

/** The debt of a move cannot be written: a state file write has hung (not returned after `writeWaitMs`) and still has not returned. */
export class StateFileHangs extends Data.TaggedError("StateFileHangs")<{ readonly message: string; readonly hungForMs: number }> {}

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
   * Fails when the write does, or at once while a write hangs (`StateFileHangs`), the record
   * unchanged: a source that sends the guest's last round without its debt on disk cannot tell,
   * after a restart, that the guest may run elsewhere. Interrupted (a caller's bound), the record
   * stays unchanged too: a write not begun yet writes the record without the debt; one under way
   * goes on, and the change the caller makes next (`removePendingCommit`) queues a write after it.
   */
  readonly owePaused: (c: PendingCommit) => Effect.Effect<void, StateWriteError | StateFileHangs>
  readonly removePendingCommit: (moveId: string) => Effect.Effect<void>
  /** The reports of lost guests the coordinator has not heard yet (one per session). */
  readonly lostReports: Effect.Effect<readonly LostReport[]>
  /**
   * Drops `sessionId`'s report (told, refused, or its session no longer here); nothing when none.
   * With `told`: only while the report kept is that one (its generation and reason), not a later
   * loss that replaced it while it was told.
   */
  readonly removeLostReport: (sessionId: string, told?: LostReport) => Effect.Effect<void>
  /** The sessions whose guest's loss is noted (`noteLost`) and not forgotten yet: kept in the state file, so they outlive a restart. */
  readonly lostNoted: Effect.Effect<readonly string[]>
  /**
   * Notes `r`'s loss: keeps its report (replacing its session's) under a generation of its own
   * (higher than any the record held), written before the agent first tells it, and marks its
   * session noted, in one write. Nothing when the session's loss is noted already, unless
   * `again` (a new loss: its report replaces the one kept).
   */
  readonly noteLost: (r: { readonly sessionId: string; readonly reason: string }, again?: boolean) => Effect.Effect<void>
  /** Forgets that `sessionId`'s loss is noted (a fresh guest runs, or the session left this host); nothing, no write, when it is not. */
  readonly forgetLostNoted: (sessionId: string) => Effect.Effect<void>
  /** The moves whose stream never completed here, as a target (`LocalState.UnfinishedMove`): kept in the state file. */
  readonly unfinished: Effect.Effect<readonly UnfinishedMove[]>
  /** Notes `u` (replacing any note of its session); nothing, no write, when it is noted already as it is. */
  readonly noteUnfinished: (u: UnfinishedMove) => Effect.Effect<void>
  /** Forgets the note of `sessionId`; nothing, no write, when there is none. */
  readonly forgetUnfinished: (sessionId: string) => Effect.Effect<void>
  readonly snapshot: Effect.Effect<StateFile>
}

export const makeResidents = (
  hostId: string,
  initial: StateFile | null,
  persist: (s: StateFile) => Effect.Effect<void, StateWriteError>,
  options: { readonly writeWaitMs?: number } = {},
): Effect.Effect<Residents> =>
  Effect.gen(function* () {
    const waitMs = options.writeWaitMs ?? writeWaitMs
    // Plain variables (one thread), each read and set within one step.
    let state: StateFile = initial ?? empty(hostId)
    /** The write not begun yet: it writes the record as it is when it begins, so it serves every change made before. */
    let queued: { fiber: Fiber.Fiber<void, StateWriteError> | undefined } | undefined
    /** When the write under way began (undefined: none is under way). */
    let writingSinceMs: number | undefined
    /** When the write under way began, once a change has waited `waitMs` for it (undefined: none hangs). */
    let hungSinceMs: number | undefined
    // One write at a time, each to its end: a write overtaken by a later one would take the file
    // back in time (and `Durable.replace` has one temporary file per process).
    const lock = yield* Semaphore.make(1)

    const ended = Effect.flatMap(Clock.currentTimeMillis, (t) =>
      Effect.suspend(() => {
        const since = hungSinceMs
        writingSinceMs = undefined
        hungSinceMs = undefined
        return since === undefined ? Effect.void : Effect.logWarning("state file write returned after hanging; the file is written again from the record", { hostId, hungForMs: t - since })
      }),
    )
    /**
     * Writes `next()` (read as the write begins) holding the lock, then runs `written` (still in
     * the lock) once it is on disk; logs its failure when `logsFailure` (once, however many
     * changes the write serves). In a fiber of its own, detached: a caller that stops waiting
     * does not cut the write, nor does the agent's stop (a rename half done is no concern, but a
     * file written after a later one would be).
     */
    const writeAlone = (next: () => StateFile, written: () => void, logsFailure: boolean) =>
      Effect.forkDetach(
        lock.withPermits(1)(
          Effect.flatMap(Clock.currentTimeMillis, (t) => {
            writingSinceMs = t
            return persist(next())
          }).pipe(
            Effect.andThen(Effect.sync(written)),
            Effect.tapError((e) => (logsFailure ? logFailed(e, { hostId }) : Effect.void)),
            Effect.ensuring(ended),
          ),
        ),
      )
    /** The write that will hold the record as it is now: the one queued, or a new one. */
    const queueWrite: Effect.Effect<Fiber.Fiber<void, StateWriteError>> = Effect.suspend(() => {
      if (queued?.fiber !== undefined) return Effect.succeed(queued.fiber)
      const w: { fiber: Fiber.Fiber<void, StateWriteError> | undefined } = { fiber: undefined }
      queued = w
      const take = () => {
        if (queued === w) queued = undefined
        return state
      }
      return Effect.map(writeAlone(take, () => undefined, true), (fiber) => (w.fiber = fiber))
    })
    /** A write has not returned after `waitMs`: the agent goes on without it, said once per hang. */
    const hangs = Effect.suspend(() => {
      if (hungSinceMs !== undefined || writingSinceMs === undefined) return Effect.void
      hungSinceMs = writingSinceMs
      return Effect.logError(
        `state file write has not returned for ${waitMs} ms (its disk may hang): the agent goes on from its record in memory, written when the disk answers; no move takes its final round from this host until then`,
        { hostId, waitedMs: waitMs },
      )
    })
    /** The last generation given a lost guest's report (`noteLost`). */
    let lostGeneration = 0
    /** `s` with `r` kept as its session's report, under a new generation. */
    const withReport = (s: StateFile, r: { readonly sessionId: string; readonly reason: string }): StateFile => {
      // Never a generation handed out before in this run (a report removed while its call hangs leaves no trace in the record).
      const kept = s.lostReports ?? []
      lostGeneration = Math.max(lostGeneration, ...kept.map((x) => x.generation ?? 0)) + 1
      return { ...s, lostReports: [...kept.filter((x) => x.sessionId !== r.sessionId), { sessionId: r.sessionId, reason: r.reason, generation: lostGeneration }] }
    }
    /** Changes the record at once; waits for its write at most `waitMs`, and not at all while a write hangs. */
    const change = (f: (s: StateFile) => StateFile) =>
      Effect.gen(function* () {
        yield* Effect.sync(() => {
          state = f(state)
        })
        const write = yield* queueWrite
        if (hungSinceMs !== undefined) return
        const waited = yield* Fiber.await(write).pipe(Effect.timeoutOption(waitMs))
        if (waited._tag === "None") yield* hangs
      })
    /** A change that holds only once written: a failed write (or a caller that stops waiting) leaves the record as it was. */
    const changeDurably = (f: (s: StateFile) => StateFile): Effect.Effect<void, StateWriteError | StateFileHangs> =>
      Effect.suspend((): Effect.Effect<void, StateWriteError | StateFileHangs> => {
        if (hungSinceMs !== undefined) {
          const since = hungSinceMs
          return Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.fail(new StateFileHangs({ message: `a state file write has not returned for ${t - since} ms (its disk may hang)`, hungForMs: t - since })))
        }
        let waiting = true
        // Applied in the lock, before the next write reads the record: that one holds it too.
        const written = () => {
          if (waiting) state = f(state)
        }
        // A debt given up before its write begins writes the record as it is (without the debt):
        // a change made after that may have joined a write queued ahead of this one.
        return Effect.flatMap(writeAlone(() => (waiting ? f(state) : state), written, false), Fiber.join).pipe(
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              waiting = false
            }),
          ),
        )
      })
    return {
      get: (vmId) => Effect.sync(() => state.vms.find((v) => v.vmId === vmId)),
      all: Effect.sync(() => state.vms),
      put: (vm) => change((s) => ({ ...s, vms: [...s.vms.filter((v) => v.vmId !== vm.vmId), vm] })),
      update: (vmId, f) => change((s) => ({ ...s, vms: s.vms.map((v) => (v.vmId === vmId ? f(v) : v)) })),
      remove: (vmId) => change((s) => ({ ...s, vms: s.vms.filter((v) => v.vmId !== vmId) })),
      pendingCommits: Effect.sync(() => state.pendingCommits),
      addPendingCommit: (c) => change((s) => ({ ...s, pendingCommits: [...s.pendingCommits.filter((p) => p.moveId !== c.moveId), c] })),
      owePaused: (c) =>
        changeDurably((s) => ({
          ...s,
          vms: s.vms.map((v) => (v.vmId === c.sessionId ? { ...v, status: "paused" } : v)),
          pendingCommits: [...s.pendingCommits.filter((p) => p.moveId !== c.moveId), c],
        })),
      removePendingCommit: (moveId) => change((s) => ({ ...s, pendingCommits: s.pendingCommits.filter((p) => p.moveId !== moveId) })),
      lostReports: Effect.sync(() => state.lostReports ?? []),
      removeLostReport: (sessionId, told) =>
        Effect.suspend(() => {
          const isIt = (x: LostReport) => x.sessionId === sessionId && (told === undefined || (x.generation === told.generation && x.reason === told.reason))
          if (!(state.lostReports ?? []).some(isIt)) return Effect.void
          return change((s) => ({ ...s, lostReports: (s.lostReports ?? []).filter((x) => !isIt(x)) }))
        }),
      lostNoted: Effect.sync(() => state.lostNoted ?? []),
      noteLost: (r, again = false) =>
        Effect.suspend(() => {
          if (!again && (state.lostNoted ?? []).includes(r.sessionId)) return Effect.void
          return change((s) => {
            const noted = s.lostNoted ?? []
            return { ...withReport(s, r), lostNoted: noted.includes(r.sessionId) ? noted : [...noted, r.sessionId] }
          })
        }),
      forgetLostNoted: (sessionId) =>
        Effect.suspend(() => {
          if (!(state.lostNoted ?? []).includes(sessionId)) return Effect.void
          return change((s) => {
            const noted = (s.lostNoted ?? []).filter((x) => x !== sessionId)
            const { lostNoted: _, ...rest } = s
            return noted.length === 0 ? rest : { ...rest, lostNoted: noted }
          })
        }),
      unfinished: Effect.sync(() => state.unfinished ?? []),
      noteUnfinished: (u) =>
        Effect.suspend(() => {
          if ((state.unfinished ?? []).some((x) => x.sessionId === u.sessionId && x.moveId === u.moveId && x.notedAt === u.notedAt && x.expired === u.expired)) return Effect.void
          return change((s) => ({ ...s, unfinished: [...(s.unfinished ?? []).filter((x) => x.sessionId !== u.sessionId), u] }))
        }),
      forgetUnfinished: (sessionId) =>
        Effect.suspend(() => {
          if (!(state.unfinished ?? []).some((x) => x.sessionId === sessionId)) return Effect.void
          return change((s) => {
            const left = (s.unfinished ?? []).filter((x) => x.sessionId !== sessionId)
            const { unfinished: _, ...rest } = s
            return left.length === 0 ? rest : { ...rest, unfinished: left }
          })
        }),
      snapshot: Effect.sync(() => state),
    }
  })
