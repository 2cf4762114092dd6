/**
 * The agent's local state file: the VMs resident on the host, the reservation each holds, and
 * the moves whose outcome this agent (as their source) still owes: the target's commit not yet
 * confirmed, or the coordinator's acknowledgement not yet received; and the reports of lost
 * guests the coordinator has not heard yet (`lostReports`), and the sessions whose loss is
 * noted until their fresh guest runs (`lostNoted`). Written
 * atomically (a temp file, fsync, rename); a file that does not parse is quarantined (renamed
 * aside and logged), never trusted: the coordinator's view rebuilds what matters.
 */
import { readFile, rename } from "node:fs/promises"
import { Records } from "@engram/api"
import { Env } from "@engram/process"
import { Durable } from "@engram/runtime"
import { Data, Effect, Schema } from "effect"

export const ResidentVm = Schema.Struct({
  vmId: Schema.String,
  memMib: Schema.Number,
  vcpus: Schema.Number,
  status: Schema.Literals(["running", "paused"]),
  reservationId: Schema.NullOr(Schema.String),
  /** Set while the VM is (or arrived as) the incoming VM of a move not yet seen committed on the coordinator. */
  moveId: Schema.NullOr(Schema.String),
})
export type ResidentVm = typeof ResidentVm.Type

/** A committed move's phases (SPEC §5), ms. */
export const Phases = Schema.Struct({ downtimeMs: Schema.Number, captureMs: Schema.Number, sendMs: Schema.Number, commitMs: Schema.Number })
export type Phases = typeof Phases.Type

/**
 * Where a move's VM went: what the source needs to ask the target again. `peerUrl`: the URL the
 * source reached the target's agent at (absent: none known, or a file of an older agent), so a
 * restarted source can settle the move though no assignment names the target any more.
 */
export const MoveTargetRef = Schema.Struct({ targetHostId: Schema.String, memMib: Schema.Number, vcpus: Schema.Number, peerUrl: Schema.optionalKey(Schema.String) })
export type MoveTargetRef = typeof MoveTargetRef.Type

/** The pause of a move on the source's runtime clock (ms): the phases of a commit the target confirms late. */
export const PauseTimes = Schema.Struct({
  pausedAtMs: Schema.Number,
  /** Pause to the post-capture verdict (files of older agents: the runtime's capture alone). */
  captureMs: Schema.Number,
  /** Once the final round was sent. */
  sendMs: Schema.optionalKey(Schema.Number),
  sentAtMs: Schema.optionalKey(Schema.Number),
})
export type PauseTimes = typeof PauseTimes.Type

/**
 * A move whose final round the source took (the guest paused) and whose outcome it still owes. `phases` null:
 * the target's commit is not confirmed yet (the source keeps its copy paused and asks the
 * target again); set: the target runs the guest and the coordinator has not acknowledged the
 * commit yet. `target` and `pause` are absent in files written by agents before they existed.
 */
export const PendingCommit = Schema.Struct({
  moveId: Schema.String,
  sessionId: Schema.String,
  phases: Schema.NullOr(Phases),
  target: Schema.optionalKey(MoveTargetRef),
  pause: Schema.optionalKey(PauseTimes),
  /**
   * The final round (its measured figures once sent), and whether the coordinator holds it: it
   * is recorded once the guest runs on the target, before the commit. Absent in files of older
   * agents, which recorded it before writing the file.
   */
  final: Schema.optionalKey(Records.MoveRound),
  /**
   * The records not known to be recorded when the guest paused (pre-copy rounds measured only at
   * the pause, and those whose record was still in flight), recorded before the final one.
   */
  lateRounds: Schema.optionalKey(Schema.Array(Records.MoveRound)),
  /**
   * The position (`seq`) the first of `lateRounds` took: the move holds every record before it.
   * A restarted source sends them again at their positions, so none is recorded twice. Absent in
   * files of older agents: their late rounds go after what the move holds, unless it holds the last of them.
   */
  lateSeq: Schema.optionalKey(Schema.Number.check(Schema.isInt(), Schema.isGreaterThanOrEqualTo(0))),
  finalRecorded: Schema.optionalKey(Schema.Boolean),
  /**
   * Whether the coordinator is known to hold the move's intent (its point of no return): true
   * when it was recorded before the pause or once recorded beside the send. False: an agent that
   * stopped records it (or learns the move ended) before the target may run the guest. Absent in
   * files of older agents: their `finalRecorded` stands for it.
   */
  intentRecorded: Schema.optionalKey(Schema.Boolean),
  /** What the guard decided on, posted with the commit to a coordinator that keeps it (absent: it does not). */
  guard: Schema.optionalKey(Records.MoveGuardReport),
  /**
   * The source ended the move without a commit, its abort was refused (409: the move is no longer
   * pending, so aborted or committed) and the move could not be read: which is not known. The
   * source copy is paused; settling reads the move first: committed → the target's word decides
   * as for any owed outcome; aborted → the target is told to drop what it got and the copy
   * resumes here; still pending → the abort is asked again. Absent in every other debt.
   */
  abandoned: Schema.optionalKey(Schema.Boolean),
  /**
   * The move is committed on the coordinator (an operator's word while the source was not heard)
   * but its stream never completed at the target (the final round's send failed, or the target
   * refused its commit saying so: `noStream`): the source copy, paused, is the guest's only
   * memory. Settling streams it again (a new prepare at the target, a migration of the paused
   * copy over any budget, the target's commit); the copy goes only once the target runs the
   * guest. Absent in every other debt.
   */
  resend: Schema.optionalKey(Schema.Boolean),
  /**
   * Whether the coordinator was told of the `resend` debt (`POST /v1/moves/{id}/resend`), or
   * answered that it does not know the call (older): told once. The mark opens the way back to
   * this source should the target die (the coordinator places the session here). Absent: not yet
   * (nothing owed: the target has not said that it runs nothing). False: a tell owed went
   * unanswered: told on every later pass, before the target is asked anything (an older agent
   * reads false as absent).
   */
  resendTold: Schema.optionalKey(Schema.Boolean),
  /**
   * When (ms, the agent's clock) the `resend` debt began: past the target's own wait
   * (`resendWaitMs`) and one stale window more, a debt whose session's placement cannot be read
   * (not visible to this host, or unreadable) destroys the copy. Absent in files of older agents:
   * set on the next pass.
   */
  resendSinceMs: Schema.optionalKey(Schema.Number),
  /**
   * When (ms, the agent's clock) the target first refused the commit of the move, committed on
   * the coordinator, without `noStream` (an older agent, or one without its state file) while
   * the session's placement could not be read (not visible to this host, or unreadable): the
   * copy stays paused and owed until a read places the session, or past `resendGiveUpMs` from
   * this time. Set: the move is known committed (it is not asked to abort again). Absent in every
   * other debt, and in files of older agents: set on the first pass that needs it.
   */
  refusedSinceMs: Schema.optionalKey(Schema.Number),
})
export type PendingCommit = typeof PendingCommit.Type

/**
 * A guest lost on this host (its VM ended by itself, or was not found) that the coordinator has
 * not heard of yet (`POST /v1/hosts/{id}/guest-lost`): written before the first try, removed once
 * the coordinator answers or refuses it, or once its session is no longer assigned here, so an
 * agent restarted meanwhile still tells it.
 */
export const LostReport = Schema.Struct({
  sessionId: Schema.String,
  reason: Schema.String,
  /**
   * Which loss of the session this is (the record's counter, higher for a later one): a loss
   * noted while an earlier one is being told replaces it, and the earlier one's answer removes
   * only itself. Absent in files of older agents.
   */
  generation: Schema.optionalKey(Schema.Number.check(Schema.isInt(), Schema.isGreaterThanOrEqualTo(0))),
})
export type LostReport = typeof LostReport.Type

/**
 * A move whose commit this target refused because its stream never completed here (`noStream`):
 * its session's memory is in its source's paused copy, so the session is not booted afresh here
 * while the coordinator places it here; its source streams it again. Forgotten once a commit of
 * the move resumes the guest here, when a prepare of another move of the session comes, or once
 * the session is no longer assigned here.
 */
export const UnfinishedMove = Schema.Struct({
  sessionId: Schema.String,
  moveId: Schema.String,
  /**
   * When (ms, the agent's clock) the move was noted: past the agent's wait for its source
   * (`Agent.resendWaitMs`) the session is booted afresh here, its loss told (a source that never
   * comes back, or a stream this host cannot resume).
   */
  notedAt: Schema.Number,
  /** The wait is over and the session is being booted afresh here: the move's prepares are refused from now on. */
  expired: Schema.optionalKey(Schema.Boolean),
})
export type UnfinishedMove = typeof UnfinishedMove.Type

export const StateFile = Schema.Struct({
  version: Schema.Literal(1),
  hostId: Schema.String,
  vms: Schema.Array(ResidentVm),
  pendingCommits: Schema.Array(PendingCommit),
  /** Absent in files of older agents (and while none is untold). */
  lostReports: Schema.optionalKey(Schema.Array(LostReport)),
  /**
   * The sessions whose guest's loss is noted (its report kept, or told already) and whose fresh
   * guest does not run yet: a retried boot or descent, in this run or after a restart, does not
   * report the same loss again. Absent in files of older agents (which ignore it: they decode
   * the keys they know) and while none is noted.
   */
  lostNoted: Schema.optionalKey(Schema.Array(Schema.String)),
  /** The moves whose stream never completed here (`UnfinishedMove`). Absent in files of older agents and while none is noted. */
  unfinished: Schema.optionalKey(Schema.Array(UnfinishedMove)),
})
export type StateFile = typeof StateFile.Type

export const empty = (hostId: string): StateFile => ({ version: 1, hostId, vms: [], pendingCommits: [] })

/** What loading found. */
export type Loaded =
  | { readonly _tag: "Loaded"; readonly state: StateFile }
  | { readonly _tag: "Missing" }
  | { readonly _tag: "Quarantined"; readonly movedTo: string; readonly reason: string }

/**
 * Reads the state file; quarantines a corrupt one or one written for another host. Only a file
 * that does not exist is `Missing`: one that cannot be read (no permission, an I/O error, a
 * directory) fails the start naming `ENGRAM_AGENT_STATE_FILE`, since starting empty would
 * write over the VMs it records.
 */
export const load = (path: string, hostId: string): Effect.Effect<Loaded, Env.ConfigInvalid> =>
  Effect.gen(function* () {
    const read = yield* Effect.tryPromise({ try: () => readFile(path, "utf8"), catch: (e) => e }).pipe(Effect.result)
    if (read._tag === "Failure") {
      const code = (read.failure as NodeJS.ErrnoException | undefined)?.code
      if (code === "ENOENT") return { _tag: "Missing" } as const
      return yield* new Env.ConfigInvalid({
        component: "host agent",
        issues: [{ variable: "ENGRAM_AGENT_STATE_FILE", rule: `cannot be read (${code ?? String(read.failure)}: ${path}); the agent starts without a state file only when none exists, since it would write over the VMs it records` }],
      })
    }
    const text = read.success
    let reason: string | null = null
    let state: StateFile | null = null
    try {
      const decoded = Schema.decodeUnknownExit(StateFile)(JSON.parse(text))
      if (decoded._tag === "Success") state = decoded.value
      else reason = "does not match the state schema"
    } catch (e) {
      reason = `not JSON: ${String(e)}`
    }
    if (state !== null && state.hostId !== hostId) {
      reason = `written for host ${state.hostId}`
      state = null
    }
    if (state !== null) return { _tag: "Loaded", state } as const
    const ts = yield* Effect.clockWith((c) => c.currentTimeMillis)
    const movedTo = `${path}.corrupt-${ts}`
    yield* Effect.tryPromise(() => rename(path, movedTo)).pipe(Effect.ignore)
    yield* Effect.logWarning("state file quarantined", { path, movedTo, reason })
    return { _tag: "Quarantined", movedTo, reason: reason ?? "unknown" } as const
  })

/** The state file could not be written (a full disk, an I/O error): the file holds the state before. */
export class StateWriteError extends Data.TaggedError("StateWriteError")<{ readonly path: string; readonly message: string }> {}

/** Writes the state atomically and durably (`Durable.replace`); fails when it could not. */
export const write = (path: string, state: StateFile): Effect.Effect<void, StateWriteError> =>
  Effect.tryPromise({
    try: () => Durable.replace(path, JSON.stringify(state, null, 2)),
    catch: (e) => new StateWriteError({ path, message: e instanceof Error ? e.message : String(e) }),
  })

/** Logs a write that failed (the state kept in memory; a later write, or the coordinator's view, restores the file). */
export const logFailed = (e: StateWriteError, fields: Readonly<Record<string, unknown>> = {}): Effect.Effect<void> =>
  Effect.logError("state file write failed", { ...fields, path: e.path, error: e.message })

/** `write`, a failure logged: for a state that a later write or the coordinator's view restores. */
export const save = (path: string, state: StateFile): Effect.Effect<void> => write(path, state).pipe(Effect.catch((e) => logFailed(e)))
