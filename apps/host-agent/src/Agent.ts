/**
 * The host agent: measures and reports its host, heartbeats the reservations resident on it,
 * and reconciles its VMs with the coordinator's assignments.
 *
 * Commands are pulled (a long-poll of `GET /v1/hosts/{id}/assignments`), not pushed: an agent
 * behind NAT or a firewall only needs to reach the coordinator; coordinator replicas stay
 * stateless (no connection registry, any replica answers); and the assignments are the desired
 * state, so a missed wake-up, a lost answer or an agent restart is healed by the next pass.
 * Each pass compares what the coordinator believes with what is resident and acts on each
 * difference once: one fiber per session at a time, and the acknowledgement is a CAS on the
 * coordinator whose 409 (already done) counts as done.
 */
import { Records } from "@engram/api"
import { Downtime, Lifetime, Limits, Names } from "@engram/core"
import type { ImageStore, Launch, RuntimeInfo, TemplateInfo, TemplateSpec, VmRuntimeShape, VmSpec, VmUsage } from "@engram/runtime"
import { nowMs } from "@engram/runtime"
import { Clock, Deferred, Effect, Fiber, FiberHandle, FiberMap, Option, Ref, type Result, type Scope, Semaphore } from "effect"
import { type Assignments, type AssignedMove, type AssignedSession, type Conflict, type CoordinatorError, type CoordinatorShape, isNotFound, neverRan, notVisible, placedOn, ranBefore, refusedInput } from "./Coordinator.js"
import type * as ImageFetch from "./ImageFetch.js"
import type { HostReport } from "./Measure.js"
import type { MoveTarget } from "./MoveTarget.js"
import * as Pacing from "./Pacing.js"
import type { PendingCommit } from "./LocalState.js"
import { type MoveOutcome, resendWaitMs, runSource, settleCommit } from "./MoveSource.js"
import type { PeerLink } from "./PeerLink.js"
import type { Residents } from "./Residents.js"
import * as Templates from "./Templates.js"

/** The agent's timing and move policy. Durations in ms. */
export interface AgentConfig {
  readonly hostId: string
  /**
   * The longest between two heartbeats (each interval is drawn in 90-100 % of it, `Pacing`).
   * Default: a third of the coordinator's heartbeat stale window.
   */
  readonly heartbeatIntervalMs: number
  /**
   * The coordinator's heartbeat stale window (`ENGRAM_HEARTBEAT_STALE_WINDOW_MS`): with no
   * heartbeat answered for longer, this host's reservations were reclaimed (its log says so).
   * Default: three heartbeat intervals.
   */
  readonly heartbeatStaleWindowMs?: number | undefined
  /** The longest between two periodic reports (drawn as the heartbeat's). */
  readonly reportIntervalMs: number
  /** How long one assignments long-poll may wait on the coordinator. */
  readonly pollWaitMs: number
  /**
   * The first pause after a failed poll or action before the next try: consecutive failures back
   * off from it, drawn, up to `Pacing.capFactor` times it (`Pacing.backoffOf`).
   */
  readonly retryDelayMs: number
  readonly maxPreCopyRounds: number
  /** How long a target keeps an incoming VM (or a committed one) of a move the coordinator does not show pending. */
  readonly stagingGraceMs: number
  /**
   * How long a target that runs a moved guest waits for its source's commit before it reports
   * the guest running itself (SPEC §13: that report commits the in-doubt move).
   */
  readonly reportRunningAfterMs: number
  /**
   * Whether a source records its move's intent (the point of no return) with the coordinator
   * before the pause (`ENGRAM_AGENT_MOVE_INTENT=1`; needs a coordinator that accepts intent
   * rounds). Off: the final round's record is the point of no return, taken in the pause.
   */
  readonly moveIntent: boolean
  /**
   * Whether this agent still speaks the move token of agents before tokens were bound to their
   * operation (`MoveToken.oldMoveToken`): as a target it takes one (from an older source), as a
   * source it sends one to a target that refuses the new token (401: an older target). On (the
   * default) for a rolling upgrade; off (`ENGRAM_AGENT_OLD_MOVE_TOKENS=0`) once every agent of the
   * fleet runs this version, so a token seen for one operation authorizes no other.
   */
  readonly oldMoveTokens: boolean
  /** Templates this host builds at start (in the background) unless its runtime holds them. */
  readonly templates: readonly TemplateSpec[]
  /**
   * How old a descent image must be (since its image file was written) before the agent removes
   * it for a session the coordinator no longer lists as this host's (`imageSessions`): an answer
   * read just before a descent's report must not remove the image it wrote. Null (the default):
   * the agent removes no image. Removal is opt-in: it must not run with an image directory
   * several hosts share (each would remove the others' images), nor while replicas older than
   * this one still write descents (they leave the session's image host unset), and an image is
   * judged by its file's age, not by how long it has been missing from the list.
   */
  readonly imageGraceMs: number | null
  /**
   * How long a resumed session placed here waits, pending, for its descent image from the host
   * holding it (`ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS`), counted from the first try: a fetch that
   * fails without the image host's word that it has no such image (a frozen, unreachable or
   * failing host, a peer URL not known yet) fails the session's action, retried on a later pass.
   * Past it the agent gives up: it boots a fresh guest and tells the coordinator the memory is
   * lost (`guest-lost`). 0: gives up at the first failure (as before).
   */
  readonly imageFetchDeadlineMs: number
}

/** The default of `imageFetchDeadlineMs`: 10 minutes. */
export const defaultImageFetchDeadlineMs = 10 * 60_000

/**
 * The most heartbeats an agent has open at once (sent, not answered): a heartbeat that hangs
 * does not hold back the next (`every` sends on schedule), and past this many the oldest is given
 * up. Three: a heartbeat still unanswered three intervals after its send (the default stale window)
 * has missed its use.
 */
export const maxHeartbeatsInFlight = 3

/** How a session's action fails (retried on a later pass). */
type ActionError = { readonly _tag: string; readonly message?: string }

/**
 * The most reads of a session's state an agent has open at once to confirm that a VM an
 * assignments answer left out is not this host's before destroying it (`destroyIfNotMine`).
 */
export const sessionReadsAtOnce = 4

/**
 * How long a pass waits for the runtime's VM list (`forgetVanished`) before it goes on without
 * looking for vanished guests: the runtimes answer it from memory, so this only bounds one that
 * would not.
 */
export const listWaitMs = 1_000

/**
 * The reason told the coordinator of a lost guest (`POST /v1/hosts/{id}/guest-lost`): how
 * (`exited`: its VM ended by itself while the agent ran, `forgetVanished`; `notFound`: no VM
 * where the session runs, as at start after it ended while the agent was away), and what follows.
 */
export const lostReasonOf = (how: "exited" | "notFound", state: string): string =>
  `${how === "exited" ? "VM exited while the agent ran (its hypervisor crashed or was killed)" : "VM not found (it ended while the agent was away, as found at start)"}; ${
    state === "descending" ? "descended without an image: a resume boots fresh" : "booted fresh"
  }`

/**
 * The reason told the coordinator of a guest lost because its descent image could not be fetched
 * from `imageHostId` within the deadline (`AgentConfig.imageFetchDeadlineMs`): the memory is
 * intact there, maybe, but this session boots fresh.
 */
export const imageLostReasonOf = (imageHostId: string, deadlineMs: number, why: string): string =>
  `descent image not fetched from host ${imageHostId} within ${deadlineMs} ms (ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS; last: ${why}); booted fresh: the resumed session's memory is lost`

/**
 * The reason told the coordinator of a guest lost because the host holding its descent image,
 * `imageHostId`, was removed from the fleet (the assignments' `imageHosts` say `removed`).
 */
export const imageHostRemovedReasonOf = (imageHostId: string): string =>
  `descent image held by host ${imageHostId}, which was removed from the fleet; booted fresh: the resumed session's memory is lost`

/**
 * The reason told the coordinator of a guest lost because the host the coordinator names as
 * holding its descent image, `imageHostId`, has no such image (`why`: its own word, its listing's
 * 404, or this host's image store when it is this host): wiped, pruned, or a new data dir. A
 * descent that left no image names no image host (`descended?image=none`, its loss told then),
 * so this is a loss of its own, not the same one told twice.
 */
export const imageAbsentReasonOf = (imageHostId: string, why: string): string =>
  `descent image not on host ${imageHostId}, which the coordinator names as holding it (${why}); booted fresh: the resumed session's memory is lost`

/** The agent defaults (SPEC §9 for the shared ones): the heartbeat interval a third of the stale window. */
export const defaultAgentConfig = (hostId: string, heartbeatStaleWindowMs = Limits.defaults.heartbeatStaleWindowMs): AgentConfig => {
  const thirdMs = Math.max(1, Math.floor(heartbeatStaleWindowMs / 3))
  return {
    hostId,
    heartbeatIntervalMs: thirdMs,
    heartbeatStaleWindowMs,
    // Below the stale window (30 s, or a third of a shorter window): a host that reports less often looks silent (`Placement.isSilent`).
    reportIntervalMs: Math.min(30_000, thirdMs),
    pollWaitMs: 20_000,
    retryDelayMs: 1_000,
    maxPreCopyRounds: 6,
    stagingGraceMs: 60_000,
    reportRunningAfterMs: 10_000,
    moveIntent: false,
    oldMoveTokens: true,
    templates: [],
    imageGraceMs: null,
    imageFetchDeadlineMs: defaultImageFetchDeadlineMs,
  }
}

export interface AgentDeps {
  readonly coordinator: CoordinatorShape
  readonly runtime: VmRuntimeShape
  /** Measures the host given the RAM its resident VMs hold (their RSS, MiB). */
  readonly measure: (residentMib: number) => Effect.Effect<HostReport>
  readonly residents: Residents
  readonly images: ImageStore.ImageStore
  readonly link: PeerLink
  readonly target: MoveTarget
  /** The peer server's URL this agent advertises with its reports (null: none); omitted: none. */
  readonly peerUrl?: Effect.Effect<string | null>
  /**
   * Fetches a session's descent image into `images` from the agent of `imageHostId` (reached at
   * the coordinator's `peerUrl` for it, unless the operator's `ENGRAM_PEERS` names another);
   * omitted: images are never fetched (a resume placed elsewhere boots fresh).
   */
  readonly fetchImage?: (sessionId: string, imageHostId: string, peerUrl: string | null, memMib: number) => Effect.Effect<ImageFetch.Fetched, ImageFetch.ImageFetchError>
  /**
   * Hashes a session's descent image into its sidecar (`ImageFetch.warmHashes`), run in the
   * background once a descent's image and tag are written, one at a time, so the first listing
   * of it to a fetching peer answers at once; omitted: the first listing hashes it. It asks
   * `goOn` before each file and stops (`stopped`) when it answers false: the session is no
   * longer descended with its image here (restored, running elsewhere, its image removed).
   */
  readonly warmImage?: (sessionId: string, goOn: Effect.Effect<boolean>) => Effect.Effect<{ readonly files: number; readonly bytes: number; readonly stopped: boolean }, ImageFetch.ImageHashError>
}

/** What an agent shows on its status endpoint and to tests. */
export interface AgentStatus {
  readonly hostId: string
  /** Which runtime runs the guests, its accelerator and why. */
  readonly runtime: RuntimeInfo
  readonly vms: readonly { readonly vmId: string; readonly status: string; readonly memMib: number; readonly moveId: string | null }[]
  /** The runtime's resident VMs as measured: RSS (bytes) and the hypervisor process. */
  readonly usage: readonly { readonly vmId: string; readonly status: string; readonly rssBytes: number | null; readonly ramBytes: number | null; readonly pid: number | null }[]
  /** Incoming VMs of moves to this host, not committed yet. */
  readonly incoming: readonly { readonly moveId: string; readonly vmId: string }[]
  /** Moves whose outcome this host (their source) still owes. */
  readonly pendingCommits: readonly string[]
  readonly moves: readonly ({ readonly moveId: string } & MoveOutcome)[]
  /** The templates this host holds. */
  readonly templates: readonly TemplateInfo[]
  /** The guard's commit allowance per target host, learned from this host's recent commits to it. */
  readonly allowances: readonly ({ readonly targetHostId: string } & Downtime.Allowance)[]
  readonly lastReport: HostReport | null
}

export interface Agent {
  /** One reconcile pass over an assignments answer (starts the actions it needs; does not wait for them). */
  readonly reconcile: (a: Assignments) => Effect.Effect<void>
  /** Waits until no action is in flight. */
  readonly idle: Effect.Effect<void>
  /** Report, heartbeat and poll loops, forever. */
  readonly run: Effect.Effect<never>
  readonly reportOnce: Effect.Effect<void>
  /** One heartbeat, as the loop sends it (its failure logged). */
  readonly heartbeatOnce: Effect.Effect<void>
  readonly status: Effect.Effect<AgentStatus>
  /** Whether an action, or the image scan beside the reconcile, is in flight (tests driving the clock poll it). */
  readonly busy: Effect.Effect<boolean>
  /**
   * Whether an action is in flight (the image scan beside the reconcile aside): what waits on the
   * clock (a runtime's durations); the scan is file I/O alone, so a test driving the clock lets it
   * finish without moving the clock.
   */
  readonly acting: Effect.Effect<boolean>
}

/**
 * How long a target waits for a complete stream of a committed move whose first stream never
 * completed here (`MoveTarget.unfinished`, from the note: its first refusal of the move's
 * commit), before it boots the session afresh, its loss told: twice the heartbeat stale window.
 * The operator committed the move because the source was not heard for a stale window; a source
 * whose stream has not come twice as long after is taken for lost (its host gone for good, or a
 * stream this host cannot resume), and the session runs again, fresh, rather than never.
 */
export { resendWaitMs }

/** Builds an agent; its action fibers live in the current scope. */
export const makeAgent = (config: AgentConfig, deps: AgentDeps): Effect.Effect<Agent, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { coordinator, runtime, residents, images, target } = deps
    const me = config.hostId
    const scope = yield* Effect.scope
    /** The agent's own idea of the coordinator's stale window (its setting, else three heartbeat intervals). */
    const ownStaleWindowMs = config.heartbeatStaleWindowMs ?? 3 * config.heartbeatIntervalMs
    /**
     * The heartbeat interval: the agent's own, until the coordinator sends a shorter window than
     * the agent's with the assignments (`limits.heartbeatStaleWindowMs`); then at most a third of
     * that window (`learnStaleWindow`).
     */
    let heartbeatIntervalMs = config.heartbeatIntervalMs
    /** The coordinator's window as last sent (undefined: none yet), and what a heartbeat wait listens to for a shorter interval. */
    let coordinatorWindowMs: number | undefined = undefined
    /**
     * The window the coordinator judges this host's heartbeats and reports by: its own once it
     * sent it (longer or shorter than the agent's), the agent's until then. What the agent says
     * of a silence (reservations reclaimed as stale, a host judged silent) is judged by it; the
     * cadence by the shorter of both.
     */
    const staleWindowMs = () => coordinatorWindowMs ?? ownStaleWindowMs
    let cadenceChanged = Deferred.makeUnsafe<void>()
    /**
     * Takes the coordinator's stale window from an assignments answer: the agent heartbeats
     * within a third of the shorter of its own and the coordinator's (a host heartbeating less
     * often than the coordinator's window goes stale between heartbeats, and its guests are
     * reclaimed). One warning each time the coordinator's window differs from the agent's own.
     */
    const learnStaleWindow = (windowMs: number | undefined): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (windowMs === undefined || !Number.isFinite(windowMs) || windowMs < 1 || windowMs === coordinatorWindowMs) return Effect.void
        coordinatorWindowMs = windowMs
        const interval = Math.min(config.heartbeatIntervalMs, Math.max(1, Math.floor(Math.min(ownStaleWindowMs, windowMs) / 3)))
        const shortened = interval < heartbeatIntervalMs
        const changed = interval !== heartbeatIntervalMs
        heartbeatIntervalMs = interval
        if (shortened) {
          const was = cadenceChanged
          cadenceChanged = Deferred.makeUnsafe<void>()
          Deferred.doneUnsafe(was, Effect.void)
        }
        // The client's call bound follows the cadence (`Failover.callTimeoutFor` of the interval, as at
        // start): a call hung on a frozen replica is given up, and the next replica tried, within the
        // learned window, not the start's (with a 15 s window, a 30 s bound outlived it).
        const follow = changed && coordinator.followHeartbeat !== undefined ? coordinator.followHeartbeat(interval) : Effect.succeed(undefined)
        return Effect.flatMap(follow, (callTimeoutMs) => {
          if (windowMs === ownStaleWindowMs) return Effect.void
          const bounded = callTimeoutMs === undefined ? "" : `, each coordinator call bounded by ${callTimeoutMs} ms`
          return Effect.logWarning(
            windowMs < ownStaleWindowMs
              ? `the coordinator's heartbeat stale window (${windowMs} ms) is shorter than this agent's (${ownStaleWindowMs} ms, ENGRAM_HEARTBEAT_STALE_WINDOW_MS or three ENGRAM_AGENT_HEARTBEAT_MS): heartbeating every ${interval} ms at most${bounded} so this host does not go stale; set both alike`
              : `the coordinator's heartbeat stale window (${windowMs} ms) is longer than this agent's (${ownStaleWindowMs} ms, ENGRAM_HEARTBEAT_STALE_WINDOW_MS or three ENGRAM_AGENT_HEARTBEAT_MS): the agent keeps its own heartbeat interval (${interval} ms)${bounded}; set both alike`,
            { hostId: me, coordinatorStaleWindowMs: windowMs, agentStaleWindowMs: ownStaleWindowMs, heartbeatIntervalMs: interval, ...(callTimeoutMs === undefined ? {} : { callTimeoutMs }) },
          )
        })
      })
    /**
     * When a heartbeat was last answered (from the start), and the last gap between two answered
     * heartbeats longer than the stale window, until a reconcile has looked at it: the host's
     * reservations were reclaimed meanwhile (the agent or its host frozen, or cut off).
     */
    let beatAnsweredMs = yield* Clock.currentTimeMillis
    let staleGap: { readonly fromMs: number; readonly toMs: number } | null = null
    const inflight = yield* FiberMap.make<string>()
    /** The one retry pass (after a failed action): failures before its next read share it. */
    const retryPass = yield* FiberHandle.make()
    /**
     * The pass's state, plain variables (one thread): `wanted`, a failure since the pass last
     * began a read asks for another round; `running`, a pass runs and will look at `wanted`
     * before it ends (it stops looking in the same step that clears this); `rounds`, the rounds
     * since the trouble began (the pauses back off; a failure that comes after actions succeeded
     * for a healthy period, `Pacing.healedBy`, starts them again from the first, and so does one
     * that comes more than the back-off's cap after the last pass ended; one action that succeeds
     * among failures does not); `answeredSinceMs`, when the first action that succeeded since the
     * last failure did (undefined until one does); `endedAt`, when the last pass ended (the
     * clock's ms); `retryAfterMs`, the longest wait the coordinator asked for in a failure since
     * the last pause began.
     *
     * The rounds are not reset when a pass ends: a pass ends as soon as its reconcile has forked
     * the actions, before a failing one answers (an HTTP round trip later), so each failure of an
     * action that keeps failing starts a new pass, and a reset there would never back off.
     */
    const retry: { wanted: boolean; running: boolean; rounds: number; answeredSinceMs: number | undefined; endedAt: number; retryAfterMs: number | undefined } = {
      wanted: false,
      running: false,
      rounds: 0,
      answeredSinceMs: undefined,
      endedAt: Number.NEGATIVE_INFINITY,
      retryAfterMs: undefined,
    }
    const backoff = Pacing.backoffOf(config.retryDelayMs)
    const outcomes = yield* Ref.make<readonly ({ readonly moveId: string } & MoveOutcome)[]>([])
    const lastReport = yield* Ref.make<HostReport | null>(null)
    /** The commit phases of the recent moves from this host, by target host (the guard learns its allowance from them). */
    const commits = yield* Ref.make(new Map<string, readonly number[]>())
    // A template just built is reported at once (reportOnce, below, answers its own failures), in
    // the background: a session starting from it, and the next build, do not wait on the coordinator.
    const templates = yield* Templates.make(me, runtime, () => Effect.asVoid(Effect.forkIn(Effect.suspend(() => reportOnce), scope)))
    const log = (msg: string, fields: Record<string, unknown> = {}) => Effect.logInfo(msg, { hostId: me, ...fields })
    /** Where each image host's agent serves its peers, as the last assignments said (`imageHosts`). */
    const imageHostUrls = new Map<string, string | null>()
    /** The image hosts the last assignments said were removed from the fleet (`imageHosts`' `removed`). */
    const removedImageHosts = new Set<string>()
    // A restarted source reaches the targets of the moves it owes where it reached them before:
    // once a move has ended no assignment names its target (the operator's ENGRAM_PEERS still wins).
    if (deps.link.pin !== undefined) {
      for (const owed of yield* residents.pendingCommits) if (owed.target?.peerUrl !== undefined) yield* deps.link.pin(owed.moveId, owed.target.peerUrl)
    }

    /**
     * The guests lost on this host that the coordinator has not heard of yet are kept in the
     * agent's record (`residents.lostReports`: session id and how, `lostReasonOf`), so in its
     * state file: written before the first try, told by `telling`, again on each pass until the
     * coordinator answers; dropped once it answers or refuses (the session ended, or left this
     * host other than by its last move), also when the session is no longer assigned here (a move
     * that took it away while the report was out: the coordinator records the copy lost here). A
     * restarted agent tells what it finds there.
     */
    const untold = (sessionId: string) => Effect.map(residents.lostReports, (rs) => rs.find((r) => r.sessionId === sessionId)?.reason)
    /**
     * Notes `sessionId`'s lost guest (its report kept, written before it is told); nothing if this
     * loss is noted already. The sessions whose loss is noted (its report kept, or told) are in the
     * agent's record (`residents.lostNoted`, so in its state file): a vanish a pass noticed
     * (`forgetVanished`), a guest found gone by a boot or a descent. A retried boot or descent,
     * in this run or after a restart, does not report the same loss again; forgotten once a
     * fresh guest runs, or the session leaves this host. (Before, the set was in memory: an agent
     * restarted between a told report and the fresh boot or `descended` told the loss again, a
     * second `guest_lost` in the session's history.)
     */
    const noteLost = (sessionId: string, reason: string) => residents.noteLost({ sessionId, reason })
    /** Tells the coordinator of `sessionId`'s lost guest, if one is untold; fails (kept, retried) only when the coordinator did not answer. */
    const tellLost = (sessionId: string): Effect.Effect<void, Conflict | CoordinatorError> =>
      Effect.flatMap(residents.lostReports, (reports) => {
        const report = reports.find((r) => r.sessionId === sessionId)
        if (report === undefined) return Effect.void
        const { reason } = report
        // Only the report told: a later loss noted while the call was out (the fresh guest lost
        // again) replaced it and is still untold.
        const drop = () => residents.removeLostReport(sessionId, report)
        return coordinator.guestLost(sessionId, reason).pipe(
          Effect.andThen(drop),
          Effect.andThen(log("told the coordinator that the session's guest was lost here (booted fresh)", { sessionId, reason })),
          Effect.catchIf(
            // Refused for good: the session ended or left this host other than by its last move (409; an older coordinator: any way), is gone (its 404), or a
            // coordinator older than the report (no such route: a bare 404) or that refuses its input.
            (e) => e._tag === "Conflict" || isNotFound(e, "session", sessionId) || e.status === 404 || refusedInput(e),
            (e) =>
              Effect.andThen(
                drop(),
                e._tag === "Conflict" || isNotFound(e, "session", sessionId)
                  ? // Said at info, with what was lost: the loss is not in the session's history.
                    Effect.logInfo("lost guest's report refused and dropped: its session ended, or left this host other than by its last move (or the coordinator is older than such reports)", {
                      hostId: me,
                      sessionId,
                      reason,
                      why: e.message,
                    })
                  : Effect.logWarning("the coordinator does not take the report of a lost guest (older than it, or it refused it); dropped", { hostId: me, sessionId, reason, error: e.message }),
              ),
          ),
          // A later loss noted meanwhile is told now, in this same fiber (one telling at a time).
          Effect.andThen(Effect.suspend(() => tellLost(sessionId))),
        )
      })
    /** The key a session's report is told under in `inflight`: its own, not the session's. */
    const lostKey = (sessionId: string) => `lost:${sessionId}`
    /**
     * Tells `sessionId`'s untold report in a fiber of its own (`lostKey`), unless one tells it
     * already; answers that fiber (undefined: nothing untold). Not in the session's slot: a
     * coordinator that takes the call and never answers holds no action of the session (a park,
     * a move) for the call's bound; one telling at a time, so a report goes once. A failure is
     * an action's (logged, a later pass tells it again, backing off).
     */
    const telling = (sessionId: string) =>
      Effect.gen(function* () {
        if ((yield* untold(sessionId)) === undefined) return undefined
        const open = yield* FiberMap.get(inflight, lostKey(sessionId))
        if (Option.isSome(open)) return open.value
        return yield* FiberMap.run(inflight, lostKey(sessionId), { onlyIfMissing: true })(asAction({ sessionId, lostReport: true }, tellLost(sessionId)))
      })
    /**
     * Waits until `sessionId`'s lost guest is told (starting its telling unless one runs); fails
     * when it is still untold after (the call failed, or was given up: a later pass tries both
     * again). A descent waits for it: once descended the session is no longer on this host and
     * the report would be refused; its history must show the loss first. Bounded by the call's
     * own bound (the client's, `Failover.callTimeoutFor`).
     */
    const toldFirst = (sessionId: string): Effect.Effect<void, ActionError> =>
      Effect.gen(function* () {
        const fiber = yield* telling(sessionId)
        if (fiber === undefined) return
        yield* Fiber.await(fiber)
        if ((yield* untold(sessionId)) !== undefined)
          return yield* Effect.fail({ _tag: "GuestLostUntold", message: "the lost guest's report is not told yet; the descent waits for it (tried again on a later pass)" })
      })
    /**
     * `action` with the session's lost guest told beside it. A descending session's before its
     * action (`toldFirst`). Every other session's in its own fiber, once the action ends (what
     * the action found too: a guest not found, booted fresh), not awaited: a coordinator that
     * hangs holds neither the fresh boot nor the session's next action.
     */
    const withLostReport = <A, E>(s: AssignedSession, action: Effect.Effect<A, E>) =>
      Effect.gen(function* () {
        if (s.state === "descending") yield* toldFirst(s.id)
        yield* action
        yield* telling(s.id)
      })

    const done = <A>(eff: Effect.Effect<A, { readonly _tag: string }>) =>
      eff.pipe(Effect.catchTag("Conflict" as never, () => Effect.void)) as Effect.Effect<unknown, { readonly _tag: string; readonly message?: string }>

    const specOf = (s: AssignedSession): VmSpec => ({ vmId: s.id, memMib: s.budget.memMib, vcpus: s.budget.vcpus })

    /** Runs `eff` and logs `msg` with how long it took (ms, the runtime's clock). */
    const timedLog = <A, E>(msg: string, fields: Record<string, unknown>, eff: Effect.Effect<A, E>) =>
      Effect.gen(function* () {
        const t0 = yield* nowMs
        const a = yield* eff
        yield* log(msg, { ...fields, ms: Math.round(((yield* nowMs) - t0) * 100) / 100 })
        return a
      })

    /** How a VM came to run, for the log: from what, mapped or streamed, and ready how soon (SPEC §13). */
    const launchFields = (l: Launch) => ({ from: l.from, method: l.method, template: l.template, readyMs: Math.round(l.readyMs), readiness: l.readiness, detail: l.detail })

    /**
     * Starts a new session's VM: from its template when it names one (built here first when
     * this host does not hold it), else booted. A template of another size is not used.
     */
    const startNew = (s: AssignedSession, spec: VmSpec) =>
      Effect.gen(function* () {
        const name = s.template ?? null
        if (name === null) return yield* runtime.start(spec)
        const held = yield* templates.ensure({ name, memMib: spec.memMib, vcpus: spec.vcpus }).pipe(Effect.result)
        if (held._tag === "Success" && held.success.memMib === spec.memMib && held.success.vcpus === spec.vcpus) return yield* runtime.start(spec, { template: name })
        yield* Effect.logWarning("the session's template cannot start it here; booting instead", {
          hostId: me,
          sessionId: s.id,
          template: name,
          why: held._tag === "Failure" ? held.failure.message : `the template is ${held.success.memMib} MiB / ${held.success.vcpus} vCPUs`,
        })
        return yield* runtime.start(spec)
      })

    /**
     * The descent's tag beside its image: the session's `createdAt` and `lastActiveAt` as the
     * descending assignment carried them. A cold resume changes neither (and nothing else does
     * while a session is descended), so a restore can tell its own descent from another one under
     * the same id without comparing clocks. Best effort: without a tag the restore falls back to
     * `neverRan`.
     */
    const writeDescentTag = (s: AssignedSession) =>
      s.createdAt === undefined || s.lastActiveAt === undefined || images.writeTag === undefined
        ? Effect.void
        : images.writeTag(s.id, { createdAt: s.createdAt, lastActiveAt: s.lastActiveAt }).pipe(
            Effect.catch((e) => Effect.logWarning("descent tag not written; a restore will judge the image by the session's figures", { hostId: me, sessionId: s.id, error: String(e) })),
          )
    /** Whether the tag beside `s`'s image names its last descent (its figures), not merely passes for it. */
    const tagNamesDescent = (s: AssignedSession, tag: unknown) => {
      if (typeof tag !== "object" || tag === null) return false
      const t = tag as { readonly createdAt?: unknown; readonly lastActiveAt?: unknown }
      return t.createdAt === s.createdAt && t.lastActiveAt === s.lastActiveAt
    }
    /**
     * Whether the image under `s`'s id, held by `heldBy` (this host, or the image host it was just
     * fetched from), is of its last descent: its tag names it; or, without figures, any image; or,
     * with no tag (an older agent's image) or a cleared one (a descent began and its capture may
     * have failed), when the session ran before and the coordinator names no other host as holding
     * its last descent's image (`imageHostId`: none, or `heldBy`). A tag-less image beside a
     * session whose last descent's image is on another host is older than that descent (the
     * session ran again since, elsewhere): restored, the guest would silently go back.
     */
    const isThisDescent = (s: AssignedSession, heldBy: string = me): Effect.Effect<boolean> =>
      Effect.gen(function* () {
        if (s.createdAt === undefined || s.lastActiveAt === undefined) return true
        const tag = images.readTag === undefined ? undefined : yield* images.readTag(s.id)
        if (typeof tag !== "object" || tag === null) return taglessIsThisDescent(s, heldBy)
        return tagNamesDescent(s, tag)
      })
    /** A tag-less image held by `heldBy` is of `s`'s last descent: `s` ran before and no other host is named as holding that image. */
    const taglessIsThisDescent = (s: AssignedSession, heldBy: string): boolean => !neverRan(s) && (s.imageHostId == null || s.imageHostId === heldBy)

    /**
     * The resumed sessions whose image fetch has not succeeded yet: since when (the first try, the
     * clock's ms), from which image host, and whether the agent gave up (`imageFetchDeadlineMs`
     * passed: the session boots fresh and no fetch is tried again). Dropped once a guest runs, or
     * the session is no longer assigned here. In memory: a restart counts the deadline afresh.
     */
    const fetchTries = new Map<string, { readonly from: string; readonly sinceMs: number; gaveUp: boolean }>()
    /**
     * A resumed session's image fetched from the host that holds it, when the coordinator placed
     * the resume here and says the image is elsewhere (`imageHostId`); undefined when there is
     * none to fetch, the image host says it has no such image, the coordinator says the image
     * host was removed from the fleet (`imageHosts`' `removed`: told as a loss at once, as when
     * the agent gives up), or the agent gave up (logged: the guest then boots fresh). Any other failure (the image host frozen, unreachable, answering
     * 5xx, its peer URL not known yet) fails with `ImageNotFetched`: the session stays pending and
     * its action is retried on a later pass, backing off, until `imageFetchDeadlineMs` has passed
     * since the first try; then the agent gives up, says so, and the coordinator is told the
     * memory is lost (`guest-lost`, with the session's work).
     */
    const fetchedImage = (s: AssignedSession) =>
      Effect.gen(function* () {
        const from = s.imageHostId ?? null
        if (deps.fetchImage === undefined || from === null || from === me || s.state !== "pending" || !ranBefore(s)) return undefined
        const startMs = yield* Clock.currentTimeMillis
        const known = fetchTries.get(s.id)
        const tries = known !== undefined && known.from === from ? known : { from, sinceMs: startMs, gaveUp: false }
        fetchTries.set(s.id, tries)
        if (tries.gaveUp) return undefined
        // The image host was removed from the fleet: its image never comes, no fetch is tried
        // and no deadline waited out; as given up, told to the coordinator.
        if (removedImageHosts.has(from)) {
          tries.gaveUp = true
          yield* Effect.logWarning("the host holding the session's descent image was removed from the fleet; booting a fresh guest, the session's memory is lost (the coordinator is told)", {
            hostId: me,
            sessionId: s.id,
            imageHostId: from,
          })
          yield* noteLost(s.id, imageHostRemovedReasonOf(from))
          return undefined
        }
        const t0 = yield* nowMs
        const got = yield* deps.fetchImage(s.id, from, imageHostUrls.get(from) ?? null, s.budget.memMib).pipe(Effect.result)
        if (got._tag === "Success") {
          fetchTries.delete(s.id)
          yield* log("descent image fetched from the host holding it", { sessionId: s.id, imageHostId: from, files: got.success.files, imageBytes: got.success.bytes, ms: Math.round((yield* nowMs) - t0) })
          return yield* images.get(s.id)
        }
        const why = got.failure.message
        if (got.failure.absent === true) {
          fetchTries.delete(s.id)
          yield* Effect.logWarning("descent image could not be fetched from the host holding it: it has no such image; booting a fresh guest, the session's memory is lost (the coordinator is told)", {
            hostId: me,
            sessionId: s.id,
            imageHostId: from,
            why,
          })
          // Told beside the session's work, once: a descent that left no image names no image
          // host (its loss told at the descent), so this is not that loss again.
          yield* noteLost(s.id, imageAbsentReasonOf(from, why))
          return undefined
        }
        const failingMs = (yield* Clock.currentTimeMillis) - tries.sinceMs
        const deadlineMs = config.imageFetchDeadlineMs
        if (failingMs < deadlineMs) {
          yield* Effect.logWarning("descent image could not be fetched from the host holding it; the session stays pending and the fetch is tried again", {
            hostId: me,
            sessionId: s.id,
            imageHostId: from,
            why,
            failingMs,
            deadlineMs,
          })
          return yield* Effect.fail({ _tag: "ImageNotFetched", message: `descent image not fetched from host ${from} yet (${failingMs} of ${deadlineMs} ms): ${why}` })
        }
        tries.gaveUp = true
        yield* Effect.logWarning(
          "descent image could not be fetched from the host holding it within ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS; giving up: booting a fresh guest, the session's memory is lost (the coordinator is told)",
          { hostId: me, sessionId: s.id, imageHostId: from, why, failingMs, deadlineMs },
        )
        // Told to the coordinator beside the session's work (`withLostReport`), once.
        yield* noteLost(s.id, imageLostReasonOf(from, deadlineMs, why))
        return undefined
      })

    /**
     * Removes the descent images this host no longer holds for anyone: of a session that is not
     * among the sessions the coordinator lists as holding their image here (`imageSessions`),
     * not assigned here, not resident and not being acted on, written more than `imageGraceMs`
     * ago. Such a session ended, or runs again on another host (restored there from a fetched
     * copy, or booted fresh). Nothing without the list (an older coordinator). Best effort: a
     * failure is logged and tried again on a later pass.
     *
     * Off the reconcile: an image directory on a disk that hangs (a listing or an `rm` that never
     * returns) holds neither the pass nor the next ones. One scan at a time (`imageScan`: a pass
     * while one still runs starts none); each removal is an action of its session's (keyed by its
     * id in `inflight`), judged again by the last assignments when it runs: no action of that
     * session starts while its image goes, and a hung removal holds up only that session.
     */
    const imageScan = yield* FiberHandle.make()
    /** Whether `a` keeps `vmId`'s image here: listed as held here, or assigned (or no list: an older coordinator). */
    const keeps = (a: Assignments, vmId: string) => a.imageSessions === undefined || a.imageSessions.includes(vmId) || a.sessions.some((s) => s.id === vmId)
    const removeReleasedImages = Effect.gen(function* () {
      const a = yield* Ref.get(lastAssignments)
      if (config.imageGraceMs === null || a === null || a.imageSessions === undefined || images.list === undefined) return
      const t = yield* Clock.currentTimeMillis
      for (const img of yield* images.list) {
        if (keeps(a, img.vmId) || t - img.writtenAtMs < config.imageGraceMs) continue
        if ((yield* residents.get(img.vmId)) !== undefined || (yield* FiberMap.has(inflight, img.vmId))) continue
        yield* FiberMap.run(inflight, img.vmId, { onlyIfMissing: true })(removeReleasedImage(img.vmId))
      }
    }).pipe(Effect.catchCause((cause) => Effect.logWarning("descent images not cleaned up; tried again on the next pass", { hostId: me, error: String(cause) })))
    /** Removes `vmId`'s image unless the last assignments keep it, or its VM is resident here. */
    const removeReleasedImage = (vmId: string) =>
      Effect.gen(function* () {
        const a = yield* Ref.get(lastAssignments)
        if (a === null || keeps(a, vmId)) return
        if ((yield* residents.get(vmId)) !== undefined) return
        yield* images.remove(vmId)
        yield* log("descent image removed: its session ended or runs on another host", { sessionId: vmId, imagePath: images.pathFor(vmId) })
      }).pipe(Effect.catchCause((cause) => Effect.logWarning("descent image not removed; tried again on the next pass", { hostId: me, sessionId: vmId, error: String(cause) })))

    /**
     * Whether the session's newer state is settled here: the coordinator has the session running
     * or parked here (its start recorded: a restore's, a fresh boot's, a move's commit), and its
     * guest is resident here, the session's (no move's VM, no move outcome owed for it). Its memory
     * is then in that guest: a later restore needs a later descent, which writes its own image
     * (here over any one under its id, or on another host, named by the coordinator), and no host
     * is named as holding an image of it (a start clears that). Never while the session is pending
     * here: until its start is recorded its image may be the only copy of its memory (a guest that
     * vanishes before is restored from it again).
     */
    const settledHere = (s: AssignedSession | undefined) =>
      Effect.gen(function* () {
        if (s === undefined || s.hostId !== me || (s.state !== "running" && s.state !== "parked")) return false
        const vm = yield* residents.get(s.id)
        if (vm === undefined || vm.moveId !== null) return false
        return !(yield* residents.pendingCommits).some((p) => p.sessionId === s.id)
      })
    /**
     * Whether the image under `s`'s id is known superseded by its tag: a tag that names another
     * descent than the one `s`'s figures name (an earlier descent's, restored here or not of the
     * last descent; an ended session's of the same id) or marks the image superseded. An image
     * without a tag, or with a cleared one, is known by nothing (a restore tags the one it takes):
     * kept.
     */
    const tagSupersedes = (s: AssignedSession) =>
      Effect.gen(function* () {
        if (images.readTag === undefined) return false
        const tag = yield* images.readTag(s.id)
        return typeof tag === "object" && tag !== null && !tagNamesDescent(s, tag)
      })
    /**
     * Whether the image under `s`'s id here goes once `s`'s start is recorded: it is of this descent
     * (`isThisDescent`) or known superseded by its tag (`tagSupersedes`), read with one look at
     * the tag. A tag names this descent or another, so any tagged image goes; so does any image
     * when `s` carries no figures; a tag-less one only when `isThisDescent` takes it (the session
     * ran before, no other host named as holding its last descent's image).
     */
    const goneOnceStarted = (s: AssignedSession): Effect.Effect<boolean> =>
      Effect.gen(function* () {
        if (s.createdAt === undefined || s.lastActiveAt === undefined) return true
        const tag = images.readTag === undefined ? undefined : yield* images.readTag(s.id)
        return (typeof tag === "object" && tag !== null) || taglessIsThisDescent(s, me)
      })
    /** Removes the image under `sessionId`'s id here, said when there was one (`why`: what superseded it). */
    const removeSuperseded = (sessionId: string, why: string) =>
      Effect.gen(function* () {
        if ((yield* images.get(sessionId)) === undefined) return
        yield* images.remove(sessionId)
        yield* log(`descent image removed: superseded (${why})`, { sessionId, imagePath: images.pathFor(sessionId) })
      })
    /**
     * The sessions looked at while their guest runs here, by figures (`figuresOf`): an image
     * appears under a running session's id only by a descent or a resume, after which its start
     * changes its figures, so each stint is looked at once. In memory: a restart looks again.
     */
    const stintsLookedAt = new Map<string, string>()
    /**
     * Removes the images superseded where their session's guest runs here (`settledHere`,
     * `tagSupersedes`): beside the reconcile, as the released ones, each removal an action of its
     * session's (keyed by its id in `inflight`: no descent or move of it runs meanwhile), judged
     * again by the last assignments when it runs. What the removal after `started` leaves: its
     * answer lost, the agent stopped before it. On by default (it removes only images no restore
     * can take); a failure is logged and tried again on the next pass.
     */
    const removeSupersededImages = Effect.gen(function* () {
      const a = yield* Ref.get(lastAssignments)
      if (a === null) return
      const here = new Map(a.sessions.filter((s) => s.hostId === me && (s.state === "running" || s.state === "parked")).map((s) => [s.id, s]))
      for (const id of stintsLookedAt.keys()) if (here.get(id) === undefined || stintsLookedAt.get(id) !== figuresOf(here.get(id)!)) stintsLookedAt.delete(id)
      for (const s of here.values()) {
        if (stintsLookedAt.get(s.id) === figuresOf(s)) continue
        if ((yield* FiberMap.has(inflight, s.id)) || !(yield* settledHere(s))) continue
        if ((yield* images.get(s.id)) === undefined || !(yield* tagSupersedes(s))) {
          if (s.createdAt !== undefined && s.lastActiveAt !== undefined) stintsLookedAt.set(s.id, figuresOf(s))
          continue
        }
        yield* FiberMap.run(inflight, s.id, { onlyIfMissing: true })(
          Effect.gen(function* () {
            const last = yield* Ref.get(lastAssignments)
            const now = last?.sessions.find((x) => x.id === s.id)
            if (now === undefined || !(yield* settledHere(now)) || !(yield* tagSupersedes(now))) return
            yield* removeSuperseded(s.id, "the session runs here again: its start was recorded")
          }).pipe(Effect.catchCause((cause) => Effect.logWarning("superseded descent image not removed; tried again on the next pass", { hostId: me, sessionId: s.id, error: String(cause) }))),
        )
      }
    }).pipe(Effect.catchCause((cause) => Effect.logWarning("superseded descent images not cleaned up; tried again on the next pass", { hostId: me, error: String(cause) })))

    /**
     * A session placed here by a move whose commit this host refused, its stream never complete
     * here (the coordinator holds the move committed on an operator's word given while the source
     * was not heard): the guest's memory is in the source's paused copy, which the source streams
     * again (see README, "The move protocol", step 8). Neither booted afresh nor descended as
     * lost meanwhile (`what`): the action fails and is tried again. A source that never streams
     * again (its host lost for good), or a stream this host cannot resume, is waited for
     * `resendWaitMs` from the note; then the wait ends (`MoveTarget.endWait`, under the move's
     * lock: its prepares refused from then on) and the session goes on as one whose guest
     * vanished (booted afresh or descended without an image, its loss told), as before the wait
     * existed. The note goes once a fresh guest is recorded, or the session leaves this host.
     */
    const streamAwaited = (s: AssignedSession, what: string) =>
      Effect.gen(function* () {
        const unfinished = s.state === "pending" ? undefined : yield* target.unfinished(s.id)
        if (unfinished === undefined) return
        const waitMs = resendWaitMs(staleWindowMs())
        const waitedMs = (yield* nowMs) - unfinished.notedAt
        if (waitedMs < waitMs) {
          yield* Effect.logError(`session placed here by move ${unfinished.moveId}, committed on the coordinator, whose stream never completed here (this host refused its commit): its guest's memory is in the source's paused copy, which the source streams again; not ${what} (for ${Math.ceil((waitMs - waitedMs) / 1000)} s more at most)`, {
            hostId: me,
            sessionId: s.id,
            moveId: unfinished.moveId,
            state: s.state,
          })
          return yield* Effect.fail({ _tag: "MoveStreamIncomplete", message: `session ${s.id}: placed here by move ${unfinished.moveId}, whose stream never completed here; its memory is on the source, not ${what}` })
        }
        if (!(yield* target.endWait(s.id, unfinished.moveId))) {
          return yield* Effect.fail({ _tag: "MoveStreamIncomplete", message: `session ${s.id}: an incoming VM of move ${unfinished.moveId} came first; its stream decides` })
        }
        yield* Effect.logError(`session placed here by move ${unfinished.moveId}, whose stream never completed here: no complete stream of it came within ${waitMs} ms (twice the stale window); its memory is lost`, {
          hostId: me,
          sessionId: s.id,
          moveId: unfinished.moveId,
          waitedMs,
        })
      })

    /** Makes the session's VM resident and running: unparked, restored from its descent image, or started. */
    const ensureRunning = (s: AssignedSession) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        if (vm === undefined) {
          // Placed here by a move whose commit this host refused (`streamAwaited`): not booted
          // afresh while its source may stream the guest's memory again.
          yield* streamAwaited(s, "booted afresh")
          const spec = specOf(s)
          // The image here if it is of the session's last descent; else the one its image host
          // holds (fetched over any older one here); else whatever is here, judged below.
          const local = yield* images.get(s.id)
          const localOurs = local !== undefined && (yield* isThisDescent(s))
          const found = localOurs ? local : ((yield* fetchedImage(s)) ?? local)
          // An image of another descent (an earlier session of the same id, or an earlier descent
          // of this one restored elsewhere since) is not this session's memory. A fetched one is
          // judged as held by the host it came from (a tag-less one there is that host's descent).
          const ours = found === undefined ? true : found === local ? localOurs : yield* isThisDescent(s, s.imageHostId ?? me)
          if (!ours) {
            yield* Effect.logWarning("an image under this session's id is not of its last descent (another session of the same id, or an earlier descent); booting fresh, the image is not used", {
              hostId: me,
              sessionId: s.id,
              imagePath: images.pathFor(s.id),
            })
          }
          const image = ours ? found : undefined
          if (image !== undefined) {
            // A tag-less image (an older agent's, or one whose tag was cleared) taken for this
            // descent's gets its tag: once the start is recorded it is known superseded
            // (`tagSupersedes`), removed even if the answer to `started` is lost.
            const tag = images.readTag === undefined ? undefined : yield* images.readTag(s.id)
            if (typeof tag !== "object" || tag === null) yield* writeDescentTag(s)
            const back = yield* runtime.restore(spec, image)
            yield* log("restored from its descent image", { sessionId: s.id, imageBytes: image.bytes, ...launchFields(back.launch) })
          } else {
            // Resumed from its descent, and its image is not here: the coordinator names no other
            // host holding it, that host said it has none, or its fetch failed past the deadline
            // (`fetchedImage`; a fetch that merely failed fails this action instead, retried).
            // The guest boots fresh, but not silently.
            const imageMissing = s.state === "pending" && ranBefore(s)
            // The coordinator has it running or parked here, and no VM is: its QEMU ended while
            // the agent was away (a reboot, a restart that took the guests with it) or by itself.
            const vanished = s.state !== "pending"
            // Told to the coordinator beside the session's work (`withLostReport`), once per loss: a
            // loss already noted (the pass noticed the vanish, or an earlier try of this boot
            // failed) keeps its report and its reason.
            if (vanished) yield* noteLost(s.id, lostReasonOf("notFound", s.state))
            if (vanished) {
              yield* Effect.logError("session's guest is gone from this host (its VM ended while the agent was away, or by itself); booting a fresh guest in its place: its memory is lost", {
                hostId: me,
                sessionId: s.id,
                state: s.state,
              })
            }
            // This host is the one the coordinator names as holding the image, and it has none
            // (its image directory wiped or pruned): lost here, told as a fetch's 404 would be.
            if (imageMissing && s.imageHostId === me && local === undefined) yield* noteLost(s.id, imageAbsentReasonOf(me, "not in this host's image store"))
            if (imageMissing) {
              yield* Effect.logError("resumed session's descent image is not on this host; booting a fresh guest in its place: its memory is not restored", {
                hostId: me,
                sessionId: s.id,
                imagePath: images.pathFor(s.id),
              })
            }
            const started = yield* startNew(s, spec)
            yield* log("started", { sessionId: s.id, state: s.state, ...(imageMissing ? { imageMissing } : {}), ...(vanished ? { vanished } : {}), ...launchFields(started.launch) })
          }
          yield* residents.put({ ...spec, status: "running", reservationId: s.reservationId ?? null, moveId: null })
          // A note of an unfinished move whose wait ended (above) is over: a guest runs here.
          yield* residents.forgetUnfinished(s.id)
          // The loss is over (a fresh guest runs): a later one is another (its report, if untold, stays).
          yield* residents.forgetLostNoted(s.id)
          fetchTries.delete(s.id)
        } else if (vm.status === "paused") {
          yield* timedLog("unparked", { sessionId: s.id }, runtime.unpark(s.id))
          yield* residents.update(s.id, (v) => ({ ...v, status: "running" }))
        }
      })

    const park = (s: AssignedSession) =>
      Effect.gen(function* () {
        yield* ensureRunning(s)
        yield* timedLog("parked", { sessionId: s.id }, runtime.park(s.id))
        yield* residents.update(s.id, (v) => ({ ...v, status: "paused" }))
      })

    /** One descent image hashed at a time (a host descending many guests reads one image at once). */
    const warming = yield* Semaphore.make(1)
    /** The coordinator's last assignments (what `stillDescendedHere` judges by); null before the first. */
    const lastAssignments = yield* Ref.make<Assignments | null>(null)
    /**
     * Whether `sessionId` is still descended with its image here: not resident (restored here),
     * its image in the store, and by the last assignments neither assigned here in another state
     * than descending, nor assigned to another host, nor left out of the images this host holds.
     */
    const stillDescendedHere = (sessionId: string) =>
      Effect.gen(function* () {
        if ((yield* residents.get(sessionId)) !== undefined) return false
        if ((yield* images.get(sessionId)) === undefined) return false
        const a = yield* Ref.get(lastAssignments)
        if (a === null) return true
        const assigned = a.sessions.find((x) => x.id === sessionId)
        if (assigned !== undefined) return assigned.hostId === me && assigned.state === "descending"
        return a.imageSessions === undefined || a.imageSessions.includes(sessionId)
      }).pipe(Effect.catchCause(() => Effect.succeed(true)))
    /**
     * Hashes `s`'s descent image in the background (`warmImage`), in the agent's scope: the
     * descent's report does not wait for it, and a failure only means the first listing hashes.
     */
    const warmImage = (s: AssignedSession) =>
      deps.warmImage === undefined
        ? Effect.void
        : Effect.asVoid(
            Effect.forkIn(
              Effect.gen(function* () {
                const t0 = yield* nowMs
                const hashed = yield* deps.warmImage!(s.id, stillDescendedHere(s.id))
                if (hashed.stopped) yield* Effect.logDebug("descent image hashing stopped: its session is no longer descended with its image here", { hostId: me, sessionId: s.id })
                else yield* Effect.logDebug("descent image hashed for its listing", { hostId: me, sessionId: s.id, files: hashed.files, imageBytes: hashed.bytes, ms: Math.round((yield* nowMs) - t0) })
              }).pipe(
                warming.withPermits(1),
                Effect.catch((e) => Effect.logWarning("descent image not hashed; its first listing to a fetching host will hash it", { hostId: me, sessionId: s.id, why: e.message })),
              ),
              scope,
            ),
          )

    /** The descents whose image this agent wrote and has not reported yet: session id to its figures (`figuresOf`). In memory. */
    const descentsWritten = new Map<string, string>()
    const figuresOf = (s: AssignedSession) => `${s.createdAt}/${s.lastActiveAt}`
    /**
     * What the image under `s`'s id is to its descent when no VM of it is resident here (a retry
     * after the VM went, or a guest that vanished before or during the descent): `none` (no
     * image), `ours` (this descent wrote it: its tag names this descent, or this agent wrote it
     * and its tag did not land) or `stale` (an earlier image: a tag of another descent, the tag a
     * descent cleared and never wrote because its capture failed, or none on a session that never
     * ran). Without the session's figures or a tag store nothing tells them apart: `ours`, as before.
     */
    const imageOfDescent = (s: AssignedSession): Effect.Effect<"none" | "ours" | "stale"> =>
      Effect.gen(function* () {
        if ((yield* images.get(s.id)) === undefined) return "none"
        if (s.createdAt === undefined || s.lastActiveAt === undefined || images.readTag === undefined || images.writeTag === undefined) return "ours"
        const tag = yield* images.readTag(s.id)
        if (tagNamesDescent(s, tag)) return "ours"
        // Written by this agent, its tag not (best effort): written now, so a restore takes the image.
        if (descentsWritten.get(s.id) === figuresOf(s)) {
          yield* writeDescentTag(s)
          return "ours"
        }
        // No tag at all (an agent before tags): judged by the figures, as a restore judges it.
        if (tag === undefined) return neverRan(s) ? "stale" : "ours"
        return "stale"
      })

    const descend = (s: AssignedSession) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        // Never descended as lost while the guest's memory may still be streamed here.
        if (vm === undefined) yield* streamAwaited(s, "descended as lost")
        if (vm !== undefined) {
          // The image is a file of the image store; when `descend` answers, the VM and its RAM are gone.
          const path = yield* images.prepare(s.id)
          // An earlier descent's tag (its image kept) must not stand beside this one's image if the
          // new tag is not written: cleared first. A cleared tag says a descent began here and its
          // capture may have failed (the earlier image then still lies here): a retry without the
          // VM does not take it for this descent's (`imageOfDescent`).
          if (images.writeTag !== undefined) yield* images.writeTag(s.id, null).pipe(Effect.ignore)
          const image = yield* timedLog("descended to its image", { sessionId: s.id }, runtime.descend(s.id, path))
          descentsWritten.set(s.id, figuresOf(s))
          yield* writeDescentTag(s)
          yield* residents.remove(s.id)
          // Once the VM is no longer resident here: the hashing stops when it is again (restored).
          yield* warmImage(s)
          yield* log("descent image written", { sessionId: s.id, imageBytes: image.bytes, method: image.method, detail: image.detail })
        }
        // No guest and no image of this descent: the descent leaves none, and says so (the session
        // then names no image host: its resume boots fresh, and a named host without the image is
        // another loss). An earlier image under its id (of an earlier descent of this session,
        // restored here since, or of another session of the same id) is not this guest's memory:
        // reported with it, a resume would restore an older guest, silently.
        const found = vm === undefined ? yield* imageOfDescent(s) : "ours"
        const imageless = found !== "ours"
        if (found === "stale") {
          // A restore must not take it either (a cleared tag or none would pass for this descent's):
          // tagged as superseded before the descent is reported (a failure fails the action, retried).
          if ((yield* isThisDescent(s)) && images.writeTag !== undefined) {
            yield* images.writeTag(s.id, { supersededBy: { createdAt: s.createdAt, lastActiveAt: s.lastActiveAt } }).pipe(
              Effect.mapError((e) => ({ _tag: "ImageNotSuperseded", message: `the earlier image under this session's id could not be tagged as superseded: ${String(e)}` })),
            )
          }
          yield* Effect.logWarning("descending session has no resident VM, and the image under its id is not of this descent (an earlier one's, kept); reporting it descended without an image", {
            hostId: me,
            sessionId: s.id,
            imagePath: images.pathFor(s.id),
          })
        }
        if (found === "none") yield* Effect.logWarning("descending session has no resident VM and no image; reporting it descended without an image", { hostId: me, sessionId: s.id })
        if (imageless) {
          // Its guest is lost: told before the descent (on a later try if this one's report
          // fails), once: a retry after `descended` failed finds the loss noted.
          yield* noteLost(s.id, lostReasonOf("notFound", s.state))
          yield* toldFirst(s.id)
        }
        yield* done(coordinator.descended(s.id, imageless ? { imageless } : {}))
        descentsWritten.delete(s.id)
        // The earlier image, marked superseded above, once the descent without it is recorded: no
        // restore takes it and no host is named as holding it (a crash before leaves the mark).
        if (found === "stale" && (yield* tagSupersedes(s))) yield* removeSuperseded(s.id, "a later descent of the session was recorded without it")
        yield* log("descended", { sessionId: s.id })
      })

    /** The coordinator's commit allowance (SPEC §5): the prior of the learned one; the SPEC §9 default from a coordinator too old to send it. */
    const commitAllowanceOf = (a: Assignments) =>
      a.limits !== undefined
        ? Effect.succeed(a.limits.commitAllowanceMs)
        : Effect.logWarning("the coordinator sent no limits with the move; using the default commitAllowanceMs", {
            hostId: me,
            commitAllowanceMs: Limits.defaults.commitAllowanceMs,
          }).pipe(Effect.as(Limits.defaults.commitAllowanceMs))

    /**
     * The guard's allowance for a move to `targetHostId` (SPEC §13): the coordinator's, learned
     * from the pair's recent commits on every agent and replica; from a coordinator that does not
     * send it, learned from this agent's own recent commits (lost when it restarts).
     */
    const allowanceFor = (a: Assignments, targetHostId: string) =>
      Effect.gen(function* () {
        const sent = a.allowances?.find((x) => x.sourceHostId === me && x.targetHostId === targetHostId)
        if (sent !== undefined) {
          // A pooled allowance travels as `learned` with its pool (the literals older agents decode).
          const { allowanceMs, source, samples } = Records.pairAllowanceOf(sent)
          return { allowance: { allowanceMs, source, samples }, fromCoordinator: true }
        }
        const priorMs = yield* commitAllowanceOf(a)
        const own = Downtime.commitAllowance((yield* Ref.get(commits)).get(targetHostId) ?? [], { priorMs })
        return { allowance: own, fromCoordinator: false }
      })

    /** Settles an owed move; still owed is a failure, so the action is retried (after `retryDelayMs`, backing off). */
    const settle = (owed: PendingCommit) =>
      settleCommit({ hostId: me, coordinator, residents, runtime, link: deps.link, staleWindowMs: staleWindowMs() }, owed).pipe(
        Effect.flatMap((r) => (r._tag === "Owed" ? Effect.fail({ _tag: "MoveOutcomeOwed", message: r.reason }) : Effect.void)),
      )

    const moveSource = (s: AssignedSession, move: AssignedMove, a: Assignments) =>
      Effect.gen(function* () {
        const { allowance, fromCoordinator } = yield* allowanceFor(a, move.targetHostId)
        yield* log("move: source starts", {
          moveId: move.id,
          sessionId: s.id,
          target: move.targetHostId,
          maxDowntimeMs: move.maxDowntimeMs,
          commitAllowanceMs: allowance.allowanceMs,
          allowance:
            allowance.source === "prior"
              ? "the coordinator's prior (no recent commits to this host, too few into it or anywhere)"
              : allowance.source === "target"
                ? `learned from ${allowance.samples} recent commits into this host (too few from this one)`
                : allowance.source === "fleet"
                  ? `learned from ${allowance.samples} recent commits of the fleet (too few from this one or into it)`
                  : `learned from the last ${allowance.samples} commits to this host${fromCoordinator ? "" : " (this agent's own: the coordinator sent none)"}`,
        })
        const outcome = yield* runSource(move, {
          hostId: me,
          runtime,
          coordinator,
          link: deps.link,
          residents,
          maxPreCopyRounds: config.maxPreCopyRounds,
          allowance,
          coordinatorKeepsGuard: fromCoordinator,
          moveIntent: config.moveIntent,
        })
        if (outcome._tag === "Committed") yield* Ref.update(commits, (m) => new Map(m).set(move.targetHostId, [...(m.get(move.targetHostId) ?? []), outcome.phases.commitMs].slice(-Downtime.defaultAllowancePolicy.window)))
        yield* Ref.update(outcomes, (o) => [...o.slice(-49), { moveId: move.id, ...outcome }])
        yield* log(`move: ${outcome._tag}`, { moveId: move.id, ...outcome })
        // An abort the coordinator did not acknowledge is asked again by the retry pass (backing off).
        if (outcome._tag === "Failed" && outcome.abortOwed === true) yield* Effect.fail({ _tag: "MoveAbortOwed", message: `move ${move.id}: its abort is not acknowledged yet` })
      })

    /** The resident VM of `s` is the session's as the coordinator holds it: its reservation, and no move's. */
    const adoptAsSessions = (s: AssignedSession) => residents.update(s.id, (v) => ({ ...v, reservationId: s.reservationId ?? null, moveId: null }))

    /**
     * Commits here the incoming VM of a move the coordinator holds committed while this target
     * never got the source's commit: the guest resumes from its stream (the target's commit,
     * which refuses an incomplete stream), then the VM is the session's like any other. A move
     * still pending, or a read that fails: the VM is kept as it is (the action fails and is
     * retried); the source keeps its paused copy while it owes the move. A move aborted, or gone
     * (the coordinator's 404 of it: it ended longer ago than the coordinator keeps history): the
     * incoming VM is dropped as the target's abort does, and the session is then handled like
     * any other (`otherwise`: a pending one placed here starts).
     */
    const commitIncomingHere = (
      s: AssignedSession,
      moveId: string,
      vm: { readonly memMib: number; readonly vcpus: number },
      otherwise: Effect.Effect<void, ActionError>,
    ): Effect.Effect<void, ActionError> =>
      Effect.gen(function* () {
        const read = yield* coordinator.getMove(moveId).pipe(Effect.result)
        if (read._tag === "Failure" && !isNotFound(read.failure, "move", moveId)) return yield* Effect.fail(read.failure)
        const m = read._tag === "Success" ? read.success : null
        if (m !== null && m.state === "pending") {
          return yield* Effect.fail({ _tag: "IncomingNotCommitted", message: `the incoming VM of move ${moveId} was never committed here and the move is still pending; kept paused` })
        }
        // The move's first stream never completed here and its source streams it again into
        // this VM: the source's commit resumes it once that stream is complete (one of ours now
        // would find it incomplete, drop it and cut the source's stream).
        if (m !== null && m.state === "committed" && (yield* target.unfinished(s.id))?.moveId === moveId) {
          return yield* Effect.fail({ _tag: "IncomingNotCommitted", message: `the incoming VM of move ${moveId} is being streamed again by its source (its first stream never completed here); kept paused until the source's commit` })
        }
        if (m === null || m.state !== "committed") {
          // Seen incoming: a source's commit that resumed it meanwhile leaves a guest that runs here,
          // kept (the session placed here takes it as its own: `actionFor`).
          const aborted = yield* target.abort(moveId, { incomingOnly: true })
          yield* log(
            aborted === "kept-running"
              ? "move: the incoming VM of a move that ended was resumed by its source's commit meanwhile; kept, the session is handled as any other"
              : "move: dropped the incoming VM of a move that ended without this target's commit; the session is handled as any other",
            { sessionId: s.id, moveId, moveState: m === null ? "gone" : m.state, state: s.state },
          )
          return yield* otherwise
        }
        yield* Effect.logWarning("move: committed on the coordinator without this target's commit (an operator's, or the source's commit lost); resuming the incoming VM here", {
          hostId: me,
          sessionId: s.id,
          moveId,
        })
        // The VM becomes the session's in the commit's own turn: a source's abort after it finds
        // nothing of the move, where it would destroy the guest the coordinator places here.
        yield* target.commit({ moveId, sessionId: s.id, sourceHostId: m.sourceHostId, targetHostId: me, memMib: vm.memMib, vcpus: vm.vcpus }, { adopt: { reservationId: s.reservationId ?? null } })
        yield* log("move: the incoming VM resumed here", { sessionId: s.id, moveId })
      })
    /** The action `s` needs now, run (nothing when it needs none): what follows a dropped incoming VM. */
    const actNow = (s: AssignedSession, a: Assignments): Effect.Effect<void, ActionError> =>
      Effect.flatMap(actionFor(s, a), (action) => (action === null ? Effect.void : Effect.asVoid(action as Effect.Effect<unknown, ActionError>)))

    /** The action a session needs, or null when it is as the coordinator says. */
    const actionFor = (s: AssignedSession, a: Assignments) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        // An incoming VM never committed here (paused, its move's) while the coordinator places
        // its session here: the move was committed without this target's commit (an operator's
        // word on an in-doubt move, the source's commit lost). Its move is not cleared and the VM
        // not unparked as if it ran: it is committed here (resumed from its stream), or kept (its
        // move still pending), or dropped (its move aborted or gone) and the session handled anew.
        if (vm !== undefined && vm.moveId !== null && vm.status === "paused" && s.state !== "moving") return commitIncomingHere(s, vm.moveId, vm, Effect.suspend(() => actNow(s, a)))
        if (vm !== undefined && (vm.reservationId !== (s.reservationId ?? null) || vm.moveId !== null) && s.state !== "moving") {
          // The coordinator's view wins: e.g. a VM that arrived by a move now holds the session's reservation.
          yield* adoptAsSessions(s)
        }
        // A move outcome owed for this session comes first: until it settles, the paused local
        // copy is neither resumed nor moved again (the target may run the guest).
        const owed = (yield* residents.pendingCommits).find((p) => p.sessionId === s.id)
        if (owed !== undefined) return settle(owed)
        switch (s.state) {
          case "pending":
            return ensureRunning(s).pipe(
              Effect.andThen(done(coordinator.started(s.id))),
              // Its start recorded, the session's memory is in the guest that runs here: the image
              // under its id here goes when it was restored (of this descent) or is known
              // superseded by its tag (`tagSupersedes`: one not of the last descent, kept until
              // now). Judged again here, not by the pass that booted the guest: a retry finds it
              // resident. One left by a lost answer goes by the scan (`removeSupersededImages`).
              Effect.andThen(
                Effect.flatMap(goneOnceStarted(s), (gone) =>
                  gone ? removeSuperseded(s.id, "the session runs here: its start was recorded") : Effect.void,
                ),
              ),
            )
          case "running":
            return vm === undefined || vm.status === "paused" ? ensureRunning(s) : null
          case "parked":
            return vm === undefined || vm.status === "running" ? park(s) : null
          case "descending":
            return descend(s)
          case "moving": {
            const move = a.moves.find((m) => m.sessionId === s.id && m.state === "pending" && m.sourceHostId === me)
            if (move === undefined) return null
            // A VM that came here by an earlier move whose id this host has not cleared yet (the
            // coordinator moved the session on before a pass saw it placed here): that move is over
            // (one open move per session). One still incoming (paused: never resumed here) is
            // committed here first, from its stream, or dropped (`commitIncomingHere`), never moved
            // on or unparked as if it ran; this move runs on a later pass. One that ran here is the
            // session's: its id is cleared before it leaves, or the source would keep its paused
            // copy once this move commits (it drops only one that is no move's) and the reconcile
            // take it for the earlier move's VM.
            if (vm !== undefined && vm.moveId !== null && vm.status === "paused") return commitIncomingHere(s, vm.moveId, vm, Effect.void)
            if (vm !== undefined && vm.moveId !== null) yield* adoptAsSessions(s)
            return moveSource(s, move, a)
          }
          default:
            return null
        }
      })

    /** Reports a guest this target runs for a still-open move (once at a time per move; a 409 is an answer). */
    const forkReportRunning = (vmId: string, moveId: string) =>
      FiberMap.run(inflight, `report:${moveId}`, { onlyIfMissing: true })(
        Effect.gen(function* () {
          yield* log("move: the guest runs here and its source has not committed; reporting it running", { sessionId: vmId, moveId })
          yield* coordinator.reportRunning(moveId, "the target runs the guest").pipe(
            Effect.catch((e) => Effect.logWarning("move: report of the running guest not recorded; asked again on a later pass", { hostId: me, moveId, error: e.message })),
          )
        }),
      )

    /**
     * Whether a guest that ran here for `moveId` may go: its move is aborted, or committed (or no
     * longer on the coordinator) and its session no longer here (ended, lost or elsewhere since).
     * The coordinator's 404 of the move is an answer: a pending move is never pruned, so the move
     * ended longer ago than the coordinator keeps history (`ENGRAM_RETENTION_MS`), either way.
     * Unreadable (any other failure, a 404 that does not name the move): no.
     */
    const explicitlyGone = (vmId: string, moveId: string) =>
      Effect.gen(function* () {
        const m = yield* coordinator.getMove(moveId).pipe(Effect.result)
        if (m._tag === "Failure" ? !isNotFound(m.failure, "move", moveId) : m.success.state === "pending") return false
        if (m._tag === "Success" && m.success.state === "aborted") return true
        const s = yield* coordinator.getSession(vmId).pipe(Effect.option)
        // Not visible (403): not on this host, as another host's placement is.
        return s._tag === "Some" && (s.value === null || s.value === notVisible || s.value.hostId !== me)
      })

    /** The reads of `destroyIfNotMine` open at once, at most `sessionReadsAtOnce`. */
    const sessionReads = yield* Semaphore.make(sessionReadsAtOnce)
    /**
     * Destroys a resident VM (no move's) that an assignments answer left out, once a fresh read
     * of its session from the coordinator confirms it is not this host's: unknown, another
     * host's, or ended (or lost) here. An answer is a view read at some instant, and nothing
     * orders the retry pass's reads with the poll's: one read before a move to this host
     * committed can come after a newer one, and it leaves out the guest the move brought here,
     * the only copy. The read costs one call per VM an answer drops (rare: a session ended, lost
     * or moved away). Unreadable: the VM is kept, looked at again on a later pass. At most
     * `sessionReadsAtOnce` of these reads are open at once (`sessionReads`): a host whose sessions
     * all went at once (made lost while it was cut off) does not send one read per VM together,
     * again on every pass while they fail.
     */
    const destroyIfNotMine = (vmId: string) =>
      Effect.gen(function* () {
        const fresh = yield* sessionReads.withPermits(1)(coordinator.getSession(vmId)).pipe(Effect.result)
        if (fresh._tag === "Failure") {
          yield* Effect.logWarning("a VM no longer in this host's assignments is kept: its session could not be read to confirm it; asked again on a later pass", {
            hostId: me,
            sessionId: vmId,
            error: fresh.failure.message,
          })
          return
        }
        const s = fresh.success
        if (s !== null && s !== notVisible && placedOn(s, me)) {
          yield* log("kept: an assignments answer left this VM out, but the coordinator's session says it is this host's (the answer was older)", { sessionId: vmId, state: s.state })
          return
        }
        // Still resident, no move's and owed by no move (the read took a round trip).
        const vm = yield* residents.get(vmId)
        if (vm === undefined || vm.moveId !== null) return
        if ((yield* residents.pendingCommits).some((p) => p.sessionId === vmId)) return
        yield* runtime.destroy(vmId)
        yield* residents.remove(vmId)
        yield* log("destroyed: no longer assigned to this host", { sessionId: vmId, ...(s === null ? {} : s === notVisible ? { state: "not visible to this host" } : { state: s.state, sessionHostId: s.hostId }) })
      })

    /**
     * The retry pass: rounds of pause, fresh read, reconcile, while a failure asked for one. Its
     * pauses back off (an action failing again and again is an outage, or a peer away) until an
     * action succeeds (`retry.rounds`); a read that fails is tried again, backing off too, its
     * count going on from the pass's rounds.
     */
    const retryRounds = Effect.whileLoop({
      while: () => {
        if (retry.wanted) return true
        retry.running = false
        return false
      },
      body: () =>
        Effect.suspend(() => {
          const asked = retry.retryAfterMs
          retry.retryAfterMs = undefined
          return Effect.flatMap(Pacing.retryDelayMs(backoff, ++retry.rounds, asked), (ms) => Effect.sleep(ms))
        }).pipe(
          // Cleared as the read begins: a failure during the pause is served by this read.
          Effect.andThen(Effect.sync(() => (retry.wanted = false))),
          // The read's own retries go on from the pass's rounds (read when it runs): a coordinator
          // that fails the read after each pause is not read again at the first delays each round.
          Effect.andThen(Effect.suspend(() => readAssignments({ waitMs: 0, since: undefined }).pipe(Effect.retry({ schedule: Pacing.retrySchedule(backoff, true, retry.rounds) })))),
          // Dropped (it overlapped an answer applied meanwhile, maybe older than it): one more round.
          Effect.flatMap((read) => Effect.flatMap(reconcileRead(read.answer, read.sent, read.arrived), (applied) => Effect.sync(() => (applied ? undefined : (retry.wanted = true))))),
          // A defect ends no pass: it would leave `running` set and no retry after it.
          Effect.catchDefect((defect) => Effect.logError("retry pass failed; retried on the next round", { hostId: me, error: String(defect) })),
        ),
      step: () => undefined,
    }).pipe(Effect.andThen(Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => (retry.endedAt = t)))))
    /** Asks for a retry round (after `retryAfterMs` at least, when the coordinator asked); starts the pass unless one runs that will still look. */
    const wantRetry = (retryAfterMs: number | undefined, failedCallSentMs: number) => Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.suspend(() => {
      retry.wanted = true
      if (retryAfterMs !== undefined) retry.retryAfterMs = Math.max(retry.retryAfterMs ?? 0, retryAfterMs)
      // Healthy up to when the failing call was sent, not when its failure came back: the time a
      // call hung before failing is not time the coordinator answered.
      const healed = Pacing.healedBy(backoff, retry.answeredSinceMs, failedCallSentMs)
      retry.answeredSinceMs = undefined
      if (retry.running) return Effect.void
      retry.running = true
      // A failure after a healthy period, or long after the last pass ended, is a new trouble: its pauses start from the first.
      if (healed || t - retry.endedAt > backoff.capMs) retry.rounds = 0
      // Not onlyIfMissing: a pass that stopped looking but has not ended yet is replaced.
      return Effect.asVoid(FiberHandle.run(retryPass)(retryRounds))
    }))

    /**
     * Reconciles are serialized, and an answer is applied only if its read was sent after the
     * answer last applied arrived: the retry pass and the poll read the assignments each on its
     * own, and an answer whose read overlapped the one applied (sent before that one's answer
     * arrived) may have been served before or after it, so it may be older than the view applied
     * (a retry's read served before a change that woke the open long-poll, whose answer came back
     * first). `tick` counts every send and every arrival of a read; `appliedArrival` is the
     * arrival tick of the answer last applied.
     */
    const reconciling = yield* Semaphore.make(1)
    let tick = 0
    let appliedArrival = 0
    /** One assignments read, with the ticks of its send and of its answer's arrival. */
    const readAssignments = (opts: { readonly waitMs: number; readonly since: string | undefined }) =>
      Effect.suspend(() => {
        const sent = ++tick
        return Effect.flatMap(coordinator.assignments(opts), (answer) =>
          Effect.as(learnStaleWindow(answer.limits?.heartbeatStaleWindowMs), { answer, sent, arrived: ++tick }),
        )
      })
    /** Reconciles the answer of a read sent at tick `sent` unless an answer that arrived after that was applied already; answers whether it did. */
    const reconcileRead = (a: Assignments, sent: number, arrived: number): Effect.Effect<boolean> =>
      reconciling.withPermits(1)(
        Effect.suspend(() => {
          if (sent < appliedArrival) return Effect.as(Effect.logDebug("an assignments answer whose read overlapped the one last applied is dropped (their order is unknown)", { hostId: me, sent, arrived, appliedArrival }), false)
          appliedArrival = arrived
          return Effect.as(reconcileNow(a), true)
        }),
      )
    /** An answer given from outside (tests): reconciled as a read sent and answered now. */
    const reconcile = (a: Assignments): Effect.Effect<void> => Effect.asVoid(Effect.suspend(() => reconcileRead(a, ++tick, ++tick)))

    /**
     * Drops the VM of a move no longer pending that came here by it (the reconcile, past the
     * staging grace). A guest that ran here goes only on an explicit word: its move aborted (or
     * its session ended or went elsewhere after the commit, or after the move was pruned).
     * Unknown: kept, asked again on a later pass. One seen incoming goes only while it still is: a
     * commit that resumed it meanwhile made it a guest that ran here, judged by the rule above on
     * a later pass.
     */
    const dropIncoming = (vmId: string, moveId: string, status: string) =>
      Effect.gen(function* () {
        if (status === "running" && !(yield* sessionReads.withPermits(1)(explicitlyGone(vmId, moveId)))) return
        const aborted = yield* target.abort(moveId, { incomingOnly: status === "paused" })
        if (aborted === "dropped") yield* log("dropped the VM of a move no longer pending", { sessionId: vmId, moveId })
      })

    /** What the pass does about a session whose guest vanished, by the coordinator's state of it (null: not assigned here). */
    const afterVanish = (state: string | null) => {
      switch (state) {
        case "running":
        case "pending":
          return "booting a fresh guest in its place: its memory is lost"
        case "parked":
          return "booting a fresh guest in its place and parking it: its memory is lost"
        case "descending":
          return "reporting it descended without writing its image: its memory is lost, a resume boots fresh"
        case "moving":
          return "aborting its move (no source VM), then booting a fresh guest in its place: its memory is lost"
        case null:
          return "dropping it from the record: the coordinator no longer places it here"
        default:
          return "dropping it from the record"
      }
    }

    /**
     * Forgets the resident VMs that vanished from the runtime since the agent put them in its
     * record (a QEMU that crashed or was killed, or exited during a background attach after a
     * restart): the session's own VMs (no move's, owed by no move) no action is changing, absent
     * from `runtime.list`. Each is logged as an error with what follows; the pass then finds no VM
     * for its session and takes the path of a guest lost while the agent was away (`ensureRunning`
     * boots a fresh one). The coordinator is told (`POST /v1/hosts/{id}/guest-lost`, in the
     * session's history) in a fiber of its own, started by this pass (a descent waits for it).
     *
     * Read in this order: the actions in flight, then the record (with its debts, in one read),
     * then the runtime. An action changes the runtime first and the record second (a start puts
     * the VM, then the record; a destroy ends the VM, then drops it), so a VM absent from the
     * runtime and present in an earlier record is one of an action, or vanished; only this pass
     * starts actions, after this. An incoming VM of a move (`moveId`) is left out: its record is
     * written before its runtime prepares it.
     */
    const forgetVanished = (a: Assignments) =>
      Effect.gen(function* () {
        const acting = yield* Effect.sync(() => new Set(Array.from(inflight, ([key]) => key)))
        const record = yield* residents.snapshot
        const listed = yield* runtime.list.pipe(Effect.timeoutOption(listWaitMs))
        if (Option.isNone(listed)) {
          return yield* Effect.logWarning(`the runtime's VM list did not answer within ${listWaitMs} ms; vanished guests are looked for on a later pass`, { hostId: me })
        }
        const alive = new Set(listed.value.map((v) => v.vmId))
        const owed = new Set(record.pendingCommits.map((p) => p.sessionId))
        for (const vm of record.vms) {
          if (vm.moveId !== null || owed.has(vm.vmId) || acting.has(vm.vmId) || alive.has(vm.vmId)) continue
          const s = a.sessions.find((x) => x.id === vm.vmId && x.hostId === me)
          yield* Effect.logError(`session's guest vanished from this host (its VM ended by itself: its hypervisor crashed or was killed); ${afterVanish(s?.state ?? null)}`, {
            hostId: me,
            sessionId: vm.vmId,
            status: vm.status,
            state: s?.state ?? null,
          })
          yield* residents.remove(vm.vmId)
          // The coordinator hears of it beside the session's next work (it boots the fresh guest); not assigned here: nobody to tell.
          if (s !== undefined) {
            // A vanish is a new loss, even of a session whose earlier one is noted (its report
            // not told yet: this one's reason replaces it).
            yield* residents.noteLost({ sessionId: vm.vmId, reason: lostReasonOf("exited", s.state) }, true)
          }
        }
      })

    /**
     * `action` as a pass runs it in its fiber: one that succeeds starts a healthy period; one that
     * fails is logged (with `fields`) and asks for a retry pass.
     */
    const asAction = (fields: Record<string, unknown>, action: Effect.Effect<unknown, unknown>): Effect.Effect<void> =>
      Effect.flatMap(Clock.currentTimeMillis, (startedMs) =>
        (action as Effect.Effect<unknown, { readonly _tag: string; readonly message?: string }>).pipe(
          // An action that succeeds starts a healthy period, from its answer (the back-off starts again once it lasted: `wantRetry`).
          Effect.tap(() => Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => (retry.answeredSinceMs ??= t)))),
          Effect.asVoid,
          Effect.catch((e) =>
            Effect.gen(function* () {
              yield* Effect.logWarning("action failed; retried on a later pass", { hostId: me, ...fields, error: e.message ?? e._tag })
              // Level-triggered: look again after a pause even if nothing changes on the
              // coordinator, on its view read then. The last poll's may be older than the
              // failure (polls fail through a coordinator outage): from it the retry would
              // run again an action that ended since, say a move already aborted. A read
              // that fails is tried again after each pause. One pass serves every failure
              // that comes while it waits (it reconciles the whole view): an outage that
              // fails many actions costs one read per pause, not one per action. A failure
              // while the pass reads or reconciles asks it for one more round.
              yield* wantRetry(Pacing.retryAfterOf(e), startedMs)
            }),
          ),
        ),
      )

    const reconcileNow = (a: Assignments): Effect.Effect<void> =>
      Effect.gen(function* () {
        const nowMs = yield* Clock.currentTimeMillis
        // Where to reach each target of a move from here, before any move starts (an older coordinator sends none).
        if (deps.link.learn !== undefined) {
          for (const m of a.moves) if (m.sourceHostId === me && m.targetPeerUrl !== undefined) yield* deps.link.learn(m.targetHostId, m.targetPeerUrl)
        }
        for (const h of a.imageHosts ?? []) {
          imageHostUrls.set(h.hostId, h.peerUrl)
          if (h.removed === true) removedImageHosts.add(h.hostId)
          else removedImageHosts.delete(h.hostId)
        }
        yield* Ref.set(lastAssignments, a)
        yield* FiberHandle.run(imageScan, { onlyIfMissing: true })(Effect.andThen(removeSupersededImages, removeReleasedImages))
        // Before any action is chosen: a session whose VM vanished is then one with no VM here.
        yield* forgetVanished(a)
        const mine = a.sessions.filter((s) => s.hostId === me)
        const mineIds = new Set(mine.map((s) => s.id))
        for (const id of fetchTries.keys()) if (!mineIds.has(id)) fetchTries.delete(id)
        // A session no longer here: a loss here is no longer noted (a later stint is another). Its
        // untold report is still told, in its own fiber: a move may have taken the session away
        // while the report was out (the coordinator records the copy lost here, before the move);
        // the coordinator refuses it when the session ended or left otherwise, and it is dropped.
        // (Before, it was dropped here: a loss before a move was missing from the session's history.)
        for (const id of yield* residents.lostNoted) if (!mineIds.has(id)) yield* residents.forgetLostNoted(id)
        // A move whose stream never completed here (`MoveTarget.unfinished`) whose session is no
        // longer here (its move aborted, the session ended or placed elsewhere): nothing to keep.
        for (const u of yield* residents.unfinished) if (!mineIds.has(u.sessionId)) yield* residents.forgetUnfinished(u.sessionId)
        for (const r of yield* residents.lostReports) if (!mineIds.has(r.sessionId)) yield* telling(r.sessionId)
        for (const s of mine) {
          // An untold report is told in its own fiber, whatever the session's slot holds (a descent waits for it there).
          yield* telling(s.id)
          if (yield* FiberMap.has(inflight, s.id)) continue
          const found = yield* actionFor(s, a)
          if (found === null) continue
          // Every action tells the session's lost guest beside it (a descent's first).
          yield* FiberMap.run(inflight, s.id, { onlyIfMissing: true })(asAction({ sessionId: s.id, state: s.state }, withLostReport(s, found as Effect.Effect<unknown, unknown>)))
        }

        // What is resident but no longer the coordinator's on this host: ended, lost, or moved
        // away. A move's VM (incoming, or committed here) is kept while its move is pending, and
        // for the grace after this target last acted for it (the assignments may lag behind a
        // source that already prepared it here; a committed VM waits for the coordinator's view).
        const onHost = new Set(mine.map((s) => s.id))
        const pendingMoves = new Set(a.moves.filter((m) => m.state === "pending").map((m) => m.id))
        // No heartbeat answered for longer than the stale window (now, or in a gap since the last
        // look): the sessions this host ran and no longer has were reclaimed as stale, not ended.
        const windowMs = staleWindowMs()
        const gap = staleGap ?? (nowMs - beatAnsweredMs > windowMs ? { fromMs: beatAnsweredMs, toMs: nowMs } : null)
        staleGap = null
        if (gap !== null) {
          const taken: string[] = []
          for (const vm of yield* residents.all)
            if (vm.moveId === null && !onHost.has(vm.vmId) && !(yield* FiberMap.has(inflight, vm.vmId)) && !(yield* residents.pendingCommits).some((p) => p.sessionId === vm.vmId)) taken.push(vm.vmId)
          if (taken.length > 0)
            yield* Effect.logWarning(
              `this host's reservations were reclaimed as stale: no heartbeat of this agent was answered for ${gap.toMs - gap.fromMs} ms, longer than the coordinator's stale window (${windowMs} ms; the agent or its host was frozen, or cut off); its sessions here are lost and their VMs are destroyed`,
              { hostId: me, sessions: taken, silentMs: gap.toMs - gap.fromMs, staleWindowMs: windowMs },
            )
        }
        // A source's paused copy of a move whose outcome this host owes goes only by settling the
        // debt (the target may not run the guest: its commit never confirmed), never here.
        const owedSessions = new Set((yield* residents.pendingCommits).map((p) => p.sessionId))
        for (const vm of yield* residents.all) {
          if (onHost.has(vm.vmId) || (yield* FiberMap.has(inflight, vm.vmId))) continue
          if (vm.moveId === null && owedSessions.has(vm.vmId)) continue
          if (vm.moveId !== null) {
            const quietMs = nowMs - (yield* target.lastActivity(vm.moveId))
            if (pendingMoves.has(vm.moveId)) {
              // Running here while its move is still open: the source has not recorded the
              // commit (frozen, crashed, cut off). After a while this target says so itself.
              if (vm.status === "running" && quietMs >= config.reportRunningAfterMs) yield* forkReportRunning(vm.vmId, vm.moveId)
              continue
            }
            if (quietMs < config.stagingGraceMs) continue
            // In a fiber of its own, as every action: the read and the destroy (a QEMU that quits
            // slowly, a disk that hangs) hold up neither this pass nor the next answers.
            yield* FiberMap.run(inflight, vm.vmId, { onlyIfMissing: true })(dropIncoming(vm.vmId, vm.moveId, vm.status))
            continue
          }
          // Confirmed first by a fresh read of the session (below): an answer read before a move
          // here committed may be reconciled after a newer one, and the guest it leaves out would
          // be the only copy (its source dropped its own).
          yield* FiberMap.run(inflight, vm.vmId, { onlyIfMissing: true })(destroyIfNotMine(vm.vmId))
        }
        // A debt of a session no longer here is settled in the session's own slot: never beside
        // its action (its move, or its settle from before it left), which may be settling the same
        // debt; the next pass finds it settled, or settles what is left of it.
        for (const owed of yield* residents.pendingCommits) {
          if (!(yield* FiberMap.has(inflight, owed.sessionId)) && !onHost.has(owed.sessionId)) {
            yield* FiberMap.run(inflight, owed.sessionId, { onlyIfMissing: true })(settle(owed))
          }
        }
      })

    /**
     * The RAM the resident VMs hold that MemAvailable does not count, MiB (SPEC §1: allocatable =
     * MemAvailable + this): their anonymous and shared memory; a guest RAM file on disk is page
     * cache, already in MemAvailable. The RSS where a runtime cannot tell them apart.
     */
    const residentMibOf = (vms: readonly VmUsage[]) => vms.reduce((n, v) => n + (v.ramBytes ?? v.rssBytes ?? 0), 0) / (1024 * 1024)

    // Each VM's CPU time at the last report, to tell which guests did work since (core's `Lifetime.wasActive`).
    let cpuSeen = new Map<string, { readonly cpuMs: number; readonly at: number }>()
    /** The running sessions whose guest was active since the last report; remembers this reading. */
    const activeSince = (vms: readonly VmUsage[], t: number): string[] => {
      const active: string[] = []
      const next = new Map<string, { readonly cpuMs: number; readonly at: number }>()
      for (const v of vms) {
        // A runtime's own guests (template builds) are no sessions; a guest it cannot measure reports nothing.
        if (v.cpuMs === null || v.cpuMs === undefined || !Names.isId(v.vmId)) continue
        const before = cpuSeen.get(v.vmId)
        if (v.status === "running" && before !== undefined && Lifetime.wasActive(before.cpuMs, v.cpuMs, t - before.at)) active.push(v.vmId)
        next.set(v.vmId, { cpuMs: v.cpuMs, at: t })
      }
      cpuSeen = next
      return active
    }

    const agentStartMs = yield* Clock.currentTimeMillis
    /**
     * A periodic call's failures in a row (reports, heartbeats, polls): `failed` counts one and,
     * for reports, warns once the reports have not landed for longer than a third of the stale
     * window and again past the whole window (what the coordinator then does with this host);
     * `answered` says once, at info, that the call is answered again after failures, how many
     * and for how long (from the last answer before them).
     */
    const streakOf = (what: string, back: string | ((failingForMs: number) => string), warnings: readonly { readonly afterMs: () => number; readonly message: (silentMs: number) => string }[] = []) => {
      let answeredMs = agentStartMs
      let failures = 0
      let warned = 0
      return {
        failed: (error: string) =>
          Effect.gen(function* () {
            const t = yield* Clock.currentTimeMillis
            failures++
            const due = warnings.filter((w) => t - answeredMs > w.afterMs()).length
            if (due <= warned) return
            warned = due
            const beatAgoMs = t - beatAnsweredMs
            yield* Effect.logWarning(warnings[due - 1]!.message(t - answeredMs), {
              hostId: me,
              [`${what}Failures`]: failures,
              silentForMs: t - answeredMs,
              staleWindowMs: staleWindowMs(),
              heartbeatAnsweredAgoMs: beatAgoMs,
              error,
            })
          }),
        answered: Effect.gen(function* () {
          const t = yield* Clock.currentTimeMillis
          if (failures > 0) yield* log(typeof back === "string" ? back : back(t - answeredMs), { [`${what}Failures`]: failures, failingForMs: t - answeredMs })
          answeredMs = t
          failures = 0
          warned = 0
        }),
      }
    }
    // The coordinator judges a host by its last report (`reportedAt`): one not reported for the
    // stale window is silent and takes no placements, even while its heartbeats are answered.
    const reports = streakOf("report", (ms) => (ms > staleWindowMs() ? "reports landing again (a host the coordinator judged silent takes placements again)" : "reports landing again"), [
      {
        afterMs: () => Math.floor(staleWindowMs() / 3),
        message: (ms) =>
          `no report of this host has landed for ${ms} ms, more than a third of the coordinator's stale window (${staleWindowMs()} ms): once the window passes without one, the coordinator will treat this host as silent and place nothing on it`,
      },
      {
        afterMs: staleWindowMs,
        message: (ms) =>
          `no report of this host has landed for ${ms} ms, longer than the coordinator's stale window (${staleWindowMs()} ms): the coordinator treats this host as silent and places nothing on it until a report lands`,
      },
    ])
    const heartbeats = streakOf("heartbeat", "heartbeats answered again")
    const polls = streakOf("poll", "assignments poll answered again")

    // One report at a time: a report read before a template was built cannot land after the one
    // that carries it (and two reports never share the activity meter, `cpuSeen`).
    const reporting = yield* Semaphore.make(1)
    /** One report; answers how long the coordinator asked to wait when it failed. */
    const reportAsked: Effect.Effect<number | undefined> = Effect.gen(function* () {
      const vms = yield* runtime.usage
      // The templates held ride on the report: the coordinator prefers this host for sessions that name one.
      const held = (yield* templates.held).map((t) => ({ name: t.name, memMib: t.memMib, vcpus: t.vcpus }))
      // So does where this agent serves its peers: the coordinator gives it to the sources of moves
      // here. None is no key (the coordinator clears the host's; an older coordinator refuses the key).
      const peerUrl = deps.peerUrl === undefined ? null : yield* deps.peerUrl
      const report = { ...(yield* deps.measure(residentMibOf(vms))), templates: held, ...(peerUrl === null ? {} : { peerUrl }) }
      const active = activeSince(vms, yield* Clock.currentTimeMillis)
      yield* Ref.set(lastReport, report)
      return yield* coordinator.report(report, active).pipe(
        Effect.andThen(reports.answered),
        Effect.as(undefined),
        Effect.catch((e) =>
          Effect.logWarning("report failed", { hostId: me, error: e.message }).pipe(Effect.andThen(reports.failed(e.message)), Effect.as(Pacing.retryAfterOf(e))),
        ),
      )
    }).pipe(reporting.withPermits(1))
    const reportOnce: Effect.Effect<void> = Effect.asVoid(reportAsked)
    const heartbeatAsked: Effect.Effect<number | undefined> = coordinator.heartbeat.pipe(
      Effect.andThen(Clock.currentTimeMillis),
      Effect.map((t) => {
        if (t - beatAnsweredMs > staleWindowMs()) staleGap = { fromMs: beatAnsweredMs, toMs: t }
        beatAnsweredMs = t
        return undefined
      }),
      Effect.tap(() => heartbeats.answered),
      Effect.catch((e) => Effect.logWarning("heartbeat failed", { hostId: me, error: e.message }).pipe(Effect.andThen(heartbeats.failed(e.message)), Effect.as(Pacing.retryAfterOf(e)))),
    )

    /** `call`, and how long it took (ms, the clock's). */
    const timed = (call: Effect.Effect<number | undefined>) =>
      Effect.gen(function* () {
        const t0 = yield* Clock.currentTimeMillis
        const asked = yield* call
        return { asked, tookMs: (yield* Clock.currentTimeMillis) - t0 }
      })
    /**
     * Calls `call` every `intervalMs`, measured from one send to the next (a call that hangs until
     * its timeout does not stretch the gap): the first time at a random point within one interval
     * of the send just before, then each interval shortened by up to a tenth, drawn (`Pacing`), so
     * agents started at one instant (a fleet rebooted at once) spread out and stay spread. Never
     * later than the interval for a heartbeat (`adviceCapMs` undefined), whatever the coordinator
     * asked; a report waits what it asked up to `adviceCapMs`, plus up to half. `first`: the call
     * just before.
     */
    const every = (
      intervalMs: () => number,
      call: Effect.Effect<number | undefined>,
      first: { readonly asked: number | undefined; readonly tookMs: number },
      adviceCapMs?: number,
      shortened?: () => Deferred.Deferred<void>,
    ) =>
      Effect.gen(function* () {
        let last = first
        let delayMs = yield* Pacing.firstTickMs(intervalMs(), last.asked, adviceCapMs)
        // When the call just before was sent.
        let sentMs = (yield* Clock.currentTimeMillis) - last.tookMs
        while (true) {
          const waitMs = Math.max(0, sentMs + delayMs - (yield* Clock.currentTimeMillis))
          if (shortened === undefined) yield* Effect.sleep(waitMs)
          else if (yield* Effect.raceFirst(Effect.as(Effect.sleep(waitMs), false), Effect.as(Deferred.await(shortened()), true))) {
            // The interval shortened during the wait: the next call within the new one of the last send.
            delayMs = Math.min(delayMs, yield* Pacing.nextTickMs(intervalMs(), last.asked, adviceCapMs))
            continue
          }
          sentMs = yield* Clock.currentTimeMillis
          last = yield* timed(call)
          delayMs = yield* Pacing.nextTickMs(intervalMs(), last.asked, adviceCapMs)
        }
      })
    /**
     * The heartbeats not answered yet, oldest first. A heartbeat is waited for only until the next
     * is due (the interval): one that hangs (to the client's bound, 30 s with one coordinator URL,
     * whatever the interval) stays open in the background while the next goes out on time, so a
     * short stale window does not lapse behind one hung call. At most `maxHeartbeatsInFlight`
     * are open: with that many, the oldest is given up (interrupted, counted failed) to send the
     * next, so a hung coordinator holds no more than these calls of this agent's.
     */
    const openBeats: { fiber: Fiber.Fiber<number | undefined> | undefined }[] = []
    const heartbeatSent: Effect.Effect<number | undefined> = Effect.gen(function* () {
      while (openBeats.length >= maxHeartbeatsInFlight) {
        const oldest = openBeats.shift()!
        const message = `heartbeat not answered after ${maxHeartbeatsInFlight} intervals (${maxHeartbeatsInFlight * heartbeatIntervalMs} ms); given up, the next one is sent`
        yield* Effect.logWarning(message, { hostId: me })
        yield* heartbeats.failed(message)
        if (oldest.fiber !== undefined) yield* Fiber.interrupt(oldest.fiber)
      }
      const slot: (typeof openBeats)[number] = { fiber: undefined }
      openBeats.push(slot)
      const beat = yield* Effect.forkIn(
        heartbeatAsked.pipe(
          Effect.ensuring(
            Effect.sync(() => {
              const i = openBeats.indexOf(slot)
              if (i >= 0) openBeats.splice(i, 1)
            }),
          ),
        ),
        scope,
      )
      slot.fiber = beat
      // Its advice (a `retryAfterMs`) when it answers before the next is due.
      return Option.getOrUndefined(yield* Fiber.join(beat).pipe(Effect.timeoutOption(heartbeatIntervalMs)))
    })
    // A heartbeat at once on start (a restarted agent renews its reservations at once), then every interval.
    const heartbeatLoop = Effect.flatMap(timed(heartbeatSent), (first) => every(() => heartbeatIntervalMs, heartbeatSent, first, undefined, () => cadenceChanged))
    const pollLoop = Effect.gen(function* () {
      // The version of the assignments last reconciled: each poll waits for a version other than
      // it. None yet (a start): the first poll reads at once (a long-poll without `since` waits
      // for the next change, so a session placed here while the agent was down would wait for it
      // or for the poll's 20 s). Kept through failures: the versions are hashes of the
      // assignments, the same on every replica and across restarts, so the poll after an outage
      // or a failover answers at once when anything changed meanwhile, and waits when nothing did.
      let since: string | undefined = undefined
      // Failed polls since the back-off last started again: its attempt. Polls answered start it
      // again only after a healthy period (`Pacing.healedBy`: from the answer of the first poll
      // answered since a failure to the send of the poll that failed, so neither a poll held for
      // its wait nor one that hung before failing counts): one answer among failures does not.
      let failures = 0
      let answeredSinceMs: number | undefined = undefined
      while (true) {
        const sentMs = yield* Clock.currentTimeMillis
        const answer: Result.Result<{ readonly answer: Assignments; readonly sent: number; readonly arrived: number }, Conflict | CoordinatorError> = yield* readAssignments({
          waitMs: since === undefined ? 0 : config.pollWaitMs,
          since,
        }).pipe(Effect.result)
        if (answer._tag === "Failure") {
          yield* Effect.logWarning("assignments poll failed", { hostId: me, error: answer.failure.message })
          yield* polls.failed(answer.failure.message)
          if (Pacing.healedBy(backoff, answeredSinceMs, sentMs)) failures = 0
          answeredSinceMs = undefined
          yield* Effect.sleep(yield* Pacing.retryDelayMs(backoff, ++failures, Pacing.retryAfterOf(answer.failure)))
          continue
        }
        answeredSinceMs ??= yield* Clock.currentTimeMillis
        yield* polls.answered
        const got: Assignments = answer.success.answer
        const unchanged = since !== undefined && got.version === since
        if (!(yield* reconcileRead(got, answer.success.sent, answer.success.arrived))) {
          // The retry pass's answer arrived (and was applied) while this read was open: this one
          // may be older or newer than it. Read again at once (waitMs 0, not waiting on a version):
          // such a read is dropped only if a retry read's answer is applied while it is open, and
          // the retry pass reads once per pause.
          since = undefined
          continue
        }
        since = got.version
        // A coordinator without long-poll support answers at once: do not spin.
        // Drawn (`Pacing.pollPauseMs`): agents answered together do not poll again together.
        if (unchanged || got.version === undefined) yield* Effect.sleep(yield* Pacing.pollPauseMs(config.retryDelayMs))
      }
    })

    /** The configured templates this host does not hold yet, built one by one in the background. */
    const buildTemplates = Effect.forEach(
      config.templates,
      // A failed build is logged where it fails (Templates.ts), with when it is tried again.
      (t) => templates.ensure(t).pipe(Effect.ignore),
      { discard: true },
    )

    const run = Effect.gen(function* () {
      const first = yield* timed(reportAsked)
      yield* log("agent running")
      if (config.oldMoveTokens)
        yield* Effect.logWarning(
          "move tokens: the old token (one for a move's prepare, commit and abort) is still taken and sent, for a rolling upgrade; set ENGRAM_AGENT_OLD_MOVE_TOKENS=0 on every agent once all run this version, so a token seen for one operation authorizes no other",
          { hostId: me },
        )
      yield* Effect.forkIn(buildTemplates, scope)
      const reportLoop = every(() => config.reportIntervalMs, reportAsked, first, backoff.capMs)
      yield* Effect.all([reportLoop, heartbeatLoop, pollLoop], { concurrency: "unbounded", discard: true })
      return yield* Effect.never
    }) as Effect.Effect<never>

    const idle = Effect.gen(function* () {
      while ((yield* FiberMap.size(inflight)) > 0) yield* FiberMap.awaitEmpty(inflight).pipe(Effect.ignore)
    })

    const status = Effect.gen(function* () {
      const snap = yield* residents.snapshot
      return {
        hostId: me,
        runtime: yield* runtime.info,
        vms: snap.vms.map((v) => ({ vmId: v.vmId, status: v.status, memMib: v.memMib, moveId: v.moveId })),
        usage: (yield* runtime.usage).map((u) => ({ vmId: u.vmId, status: u.status, rssBytes: u.rssBytes, ramBytes: u.ramBytes, pid: u.pid })),
        incoming: yield* target.incoming,
        pendingCommits: snap.pendingCommits.map((p) => p.moveId),
        moves: yield* Ref.get(outcomes),
        templates: yield* templates.held,
        allowances: [...(yield* Ref.get(commits)).entries()].map(([targetHostId, history]) => ({ targetHostId, ...Downtime.commitAllowance(history) })),
        lastReport: yield* Ref.get(lastReport),
      } satisfies AgentStatus
    })

    // The image scan beside the reconcile counts: the removals it finds start as actions of their sessions when it ends.
    const busy = Effect.zipWith(FiberMap.size(inflight), FiberHandle.get(imageScan), (n, scan) => n > 0 || Option.isSome(scan))

    const acting = Effect.map(FiberMap.size(inflight), (n) => n > 0)

    return { reconcile, idle, run, reportOnce, heartbeatOnce: Effect.asVoid(heartbeatAsked), status, busy, acting }
  })
