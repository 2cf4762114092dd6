/**
 * The agent's view of the coordinator: the few agent-facing endpoints, as a service so tests
 * can swap the HTTP client for an in-memory fake. Over HTTP it is `@engram/api`'s typed client
 * (`HttpApiClient` over `EngramApi`, with the host token): the records and their schemas are the
 * API's, nothing is re-declared here. Level-triggered: the assignments are the commands, the
 * CAS endpoints are the acknowledgements, and a 409 from one (a repeat, or a state that already
 * moved on) is `Conflict`, which the agent treats as done. Given several replicas' URLs it talks
 * to one at a time and moves to the next when that one is unreachable or hung (`Failover`).
 */
import { Session } from "@engram/core"
import { Client, Errors as ApiErrors, Payloads } from "@engram/api"
import type { ApiError, Records } from "@engram/api"
import { Clock, Context, Duration, Effect, Layer, Schema } from "effect"
import type { Redacted } from "effect"
import { FetchHttpClient, HttpClient, HttpClientRequest } from "effect/http"
import * as Failover from "./Failover.js"
import * as Pacing from "./Pacing.js"
import type { HostReport } from "./Measure.js"

/** A session's state. */
export type SessionState = Records.SessionState

/**
 * A session as the agent needs it (the API's record has more). `template`: the template it
 * starts from, when the coordinator's records carry one. `createdAt` and `lastActiveAt` tell a
 * session that ran before (`ranBefore`); optional only so a fake coordinator may leave them out.
 */
export type AssignedSession = Pick<Records.Session, "id" | "state" | "budget" | "hostId" | "reservationId"> &
  Partial<Pick<Records.Session, "createdAt" | "lastActiveAt">> & {
    readonly template?: string | null | undefined
    /** The host whose agent holds its descent image (a cold resume placed elsewhere fetches it from there). */
    readonly imageHostId?: string | null | undefined
  }

/**
 * Whether the session ran before: its `lastActiveAt` ("when the session last began to run", or
 * later activity) is after its creation, which sets both. A `pending` session that ran before
 * was resumed from its descent (the only way back to `pending`), so it must come back from its
 * image. Without the figures (a fake coordinator), or begun within the millisecond of its
 * creation: false.
 */
export const ranBefore = (s: AssignedSession): boolean =>
  s.createdAt !== undefined && s.lastActiveAt !== undefined && s.lastActiveAt > s.createdAt

/**
 * Whether the session certainly never ran: both figures given and equal (creation sets both). An
 * image under its id is then another session's, one of the same id that ended before it (ids are
 * free again once an ended session is pruned): never restored into this one.
 */
export const neverRan = (s: AssignedSession): boolean => s.createdAt !== undefined && s.lastActiveAt !== undefined && s.lastActiveAt <= s.createdAt

/**
 * A move as the agent needs it. `targetPeerUrl`: where the target's agent serves its peers, sent
 * to the source with the move (absent from an older coordinator, and from a fake's).
 */
export type AssignedMove = Pick<Records.AssignedMove, "id" | "sessionId" | "sourceHostId" | "targetHostId" | "maxDowntimeMs" | "state"> & {
  readonly targetPeerUrl?: string | null | undefined
}

/** A move as `GET /v1/moves/{id}` shows it, as far as the agent reads it. */
export type MoveView = AssignedMove & Pick<Records.Move, "abortReason" | "rounds" | "resendClears">

/** The coordinator's limits that the agent's move guard uses (its `commitAllowanceMs`). */
export type AssignedLimits = Records.AgentLimits

/**
 * `GET /v1/hosts/{id}/assignments` as far as the agent reads it. `version` and `limits` are
 * optional here only so a fake coordinator can play an older one (no long-poll, no limits).
 */
export interface Assignments {
  readonly version?: string | undefined
  readonly sessions: readonly AssignedSession[]
  readonly moves: readonly AssignedMove[]
  readonly limits?: AssignedLimits | undefined
  /** The learned allowance of each move this host is the source of; absent from a coordinator that does not learn it. */
  readonly allowances?: readonly AssignedAllowance[] | undefined
  /**
   * Where the agents holding the descent images of this host's resumed sessions serve their peers
   * (`removed`: the host was removed from the fleet, its images never come); absent from an older coordinator.
   */
  readonly imageHosts?: readonly { readonly hostId: string; readonly peerUrl: string | null; readonly removed?: boolean | undefined }[] | undefined
  /** The sessions whose descent image this host holds; absent from an older coordinator (nothing is removed then). */
  readonly imageSessions?: readonly string[] | undefined
}

/** One pre-copy round as the source reports it. */
export type RoundReport = Records.MoveRound

/**
 * A round as the source posts it: the figures and its position `seq` (how many records the move
 * held before it, the intent included), so that a retry of a round whose answer was lost is
 * recorded once (the store holds a repeat of a recorded position with the same figures).
 */
export type NumberedRound = RoundReport & { readonly seq?: number }

/** The phases of a committed move. */
export type PhasesReport = Records.MovePhases

/** What the source's guard decided a committed move on, posted with the commit. */
export type GuardReport = Records.MoveGuardReport

/**
 * The guard's commit allowance of a move from this host, as the coordinator learned it: a pooled
 * one is `learned` with its `pool` (`Records.pairAllowanceOf` gives back `target` or `fleet`).
 */
export type AssignedAllowance = Records.AssignedAllowance

/** 409: the coordinator's state already moved past this step; the agent treats it as done. */
export class Conflict extends Schema.TaggedError<Conflict>()("Conflict", { op: Schema.String, message: Schema.String }) {}

/**
 * Any other failure: the request may be retried (level-triggered, the next pass retries).
 * `retryAfterMs`: how long the coordinator asked to wait first (a 429's or 503's `retryAfterMs`,
 * or a `Retry-After` header on an answer the API does not describe); the agent waits at least that.
 * `notFound`: the API's own 404 (`NotFoundError`) named this record: it does not exist (never
 * did, or was deleted, e.g. a move pruned by the coordinator's retention). A 404 without it (a
 * wrong coordinator URL, a proxy) says nothing about any record (`isNotFound`).
 */
export class CoordinatorError extends Schema.TaggedError<CoordinatorError>()("CoordinatorError", {
  op: Schema.String,
  status: Schema.NullOr(Schema.Number),
  message: Schema.String,
  retryAfterMs: Schema.optionalKey(Schema.Number),
  notFound: Schema.optionalKey(Schema.Struct({ entity: Schema.String, id: Schema.String })),
  /** A 400's field: the path of the value the API refused (`seq` where an older coordinator does not know round positions). */
  field: Schema.optionalKey(Schema.String),
}) {}

/**
 * Whether `e` is the coordinator's word that the record `entity` `id` does not exist (its API's
 * 404 naming it), not any other 404 (a wrong URL answers one for every path).
 */
export const isNotFound = (e: { readonly _tag: string }, entity: "move" | "session", id: string): boolean => {
  if (e._tag !== "CoordinatorError") return false
  const named = (e as CoordinatorError).notFound
  return named !== undefined && named.entity === entity && named.id === id
}

type Fx<A> = Effect.Effect<A, Conflict | CoordinatorError>

/**
 * The answer of `getSession` when the coordinator refuses this host the read (its 403): the
 * session is not placed on this host, and this host took no part in its latest move (a
 * coordinator older than that rule refuses every session placed elsewhere, or on no host). It
 * is not "ended": the session may still be placed on another host.
 */
export const notVisible = "notVisible" as const
export type NotVisible = typeof notVisible

/** The session `read` answered, placed on `hostId` holding a reservation there (core's `Session.holdsReservation`). */
export const placedOn = (read: AssignedSession | null | NotVisible, hostId: string): boolean =>
  read !== null && read !== notVisible && read.hostId === hostId && Session.holdsReservation(read.state)

/** The agent-facing coordinator API. */
export interface CoordinatorShape {
  /** The host's measurement, with the sessions whose guest was active since the last report (none: omitted). */
  readonly report: (r: HostReport, activeSessions?: readonly string[]) => Fx<void>
  readonly heartbeat: Fx<number>
  readonly assignments: (opts: { readonly waitMs: number; readonly since: string | undefined }) => Fx<Assignments>
  readonly started: (sessionId: string) => Fx<void>
  /**
   * The session's descent is done. `imageless`: it left no image (no guest, no image here; the
   * loss told first), so the coordinator names no image host for it (`?image=none`; one older
   * than the word refuses it, and hears the call again without it).
   */
  readonly descended: (sessionId: string, options?: { readonly imageless?: boolean }) => Fx<void>
  /** Records a round at its position (`seq`; without one it is appended). */
  readonly round: (moveId: string, round: NumberedRound) => Fx<void>
  /** `guard`: posted only to a coordinator that keeps it (one that sends `allowances`; an older one refuses the key). */
  readonly commit: (moveId: string, phases: PhasesReport, guard?: GuardReport) => Fx<void>
  readonly abort: (moveId: string, reason: string, estimateMs?: number) => Fx<void>
  /**
   * `POST /v1/moves/{id}/resolve` with `commit`: this host, the move's target, runs its guest
   * (SPEC §13: the target's report commits an in-doubt move whose source is silent).
   */
  readonly reportRunning: (moveId: string, reason: string) => Fx<void>
  /**
   * `POST /v1/moves/{id}/resend`: this host, the move's source, owes its target a resend (`owed`
   * true: it holds the guest's only whole copy, paused) or no longer does (false). `unknown`: a
   * coordinator older than the call (its 404 of the route, not of the move, or a 400): the way back
   * to this source stays closed there, the session is lost should the target die, as before.
   * `seenClears`: the move's `resendClears` read before the tell (sent when given); `stale`: the
   * coordinator answered the mark clear after a tell (`owed` true), the mark cleared since that
   * read (the target cleared it before it resumed), so nothing changed. A coordinator older than
   * the count ignores it and sets the mark (`recorded`), as before.
   */
  readonly resendOwed: (moveId: string, owed: boolean, seenClears?: number) => Fx<"recorded" | "unknown" | "stale">
  /**
   * `POST /v1/hosts/{id}/guest-lost`: this host lost the session's guest (`reason`: how, cut to
   * the API's length by `fitReason`) and boots a fresh one; the coordinator keeps it in the
   * session's history. A 409 (the session ended, or is no longer on this host) is `Conflict`.
   */
  readonly guestLost: (sessionId: string, reason: string) => Fx<void>
  /** `GET /v1/moves/{id}` (this host is its source or target). */
  readonly getMove: (moveId: string) => Fx<MoveView>
  /**
   * `GET /v1/sessions/{id}`; null when the session is unknown (the API's 404 of the session: never
   * created, or ended and pruned); `notVisible` when this host may not read it (403: it is not
   * placed on this host, and this host is neither the source nor the target of its latest move).
   * Any other 404 is a `CoordinatorError`. `notVisible` says the session is not on this host, and
   * nothing of where it is: never read it as "ended".
   */
  readonly getSession: (sessionId: string) => Fx<AssignedSession | null | NotVisible>
  /**
   * The agent's heartbeat interval changed (it learned the coordinator's stale window): later
   * calls are bounded, and state their bound, by `Failover.callTimeoutFor` of it, as at start, never
   * above the bound the client was made with. Answers the ordinary call's bound from now on.
   * Optional: a fake coordinator (tests) has no bound to follow.
   */
  readonly followHeartbeat?: (heartbeatIntervalMs: number) => Effect.Effect<number>
}

export class Coordinator extends Context.Service<Coordinator, CoordinatorShape>()("@engram/host-agent/Coordinator") {}

/** Where the coordinator is and who this agent is. */
export interface CoordinatorTarget {
  /** The coordinator's URL, or its replicas' in the order tried (`Failover`). */
  readonly url: string | readonly string[]
  readonly hostId: string
  readonly hostToken: string | Redacted.Redacted<string>
  /** The replica (index in `url`) the client starts on; 0 when missing. The agent's is `Failover.startIndex` of its host id. */
  readonly startIndex?: number
  /**
   * How long one ordinary call may take before its replica counts as hung (the agent's:
   * `Failover.callTimeoutFor`); a long-poll gets its wait and `Failover.pollTimeoutMs`'s margin.
   * Default `Failover.maxCallTimeoutMs`. The bound at start: a shorter heartbeat interval the
   * agent learns later lowers it by the same rule (`followHeartbeat`), never above this.
   */
  readonly callTimeoutMs?: number
}

/**
 * A `Retry-After` header in ms: delta-seconds, or an HTTP date (from `nowMs`); undefined when
 * absent or unreadable.
 */
export const retryAfterHeaderMs = (value: string | undefined, nowMs: number): number | undefined => {
  if (value === undefined) return undefined
  const text = value.trim()
  if (/^\d+$/.test(text)) return Number(text) * 1000
  const at = Date.parse(text)
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs)
}

/** What went wrong, in the port's two words: a 409 is `Conflict`, anything else `CoordinatorError`. */
const toPortError = (op: string, e: { readonly _tag: string; readonly message: string }, nowMs: number): Conflict | CoordinatorError => {
  if (e._tag === "ConflictError") return new Conflict({ op, message: e.message })
  if (Object.hasOwn(ApiErrors.statuses, e._tag)) {
    // A 429 or 503 of the API carries `retryAfterMs` in its body (its `Retry-After` header is the same, in whole seconds).
    const asked = (e as { readonly retryAfterMs?: unknown }).retryAfterMs
    return new CoordinatorError({
      op,
      status: ApiErrors.statusOf(e as ApiError),
      message: e.message,
      ...(typeof asked === "number" && Number.isFinite(asked) ? { retryAfterMs: asked } : {}),
      ...(e._tag === "NotFoundError" ? { notFound: { entity: (e as ApiErrors.NotFoundError).entity, id: (e as ApiErrors.NotFoundError).id } } : {}),
      ...(e._tag === "BadRequest" ? { field: (e as ApiErrors.BadRequest).field } : {}),
    })
  }
  // Transport failures, an answer the API does not describe (a proxy's 502 or 503), or one that does not decode.
  const response = (e as { readonly response?: { readonly status?: number; readonly headers?: Readonly<Record<string, string | undefined>> } }).response
  const asked = retryAfterHeaderMs(response?.headers?.["retry-after"], nowMs)
  return new CoordinatorError({
    op,
    status: response?.status ?? null,
    // `UndecodableAnswer`: an answer that does not decode; `SchemaError`: a request that does not encode (nothing sent).
    message: e._tag === "UndecodableAnswer" ? `bad answer: ${e.message}` : e._tag === "SchemaError" ? `bad request, not sent: ${e.message}` : e.message,
    ...(asked === undefined ? {} : { retryAfterMs: asked }),
  })
}

/** The API's 400: the request's input refused, naming the field (a proxy's 400 names none). */
export const refusedInput = (e: { readonly _tag: string }): e is CoordinatorError =>
  e._tag === "CoordinatorError" && (e as CoordinatorError).status === 400 && (e as CoordinatorError).field !== undefined

/**
 * The API's 400 naming `key`: how a coordinator older than a key refuses it (an unknown key, under
 * its strict decoding), so a newer agent sends the request again without it.
 */
export const refusesKey = (e: { readonly _tag: string }, key: string): boolean => refusedInput(e) && e.field === key

/** A reason as the API takes it: at most `Payloads.maxReasonLength` characters (a long error's tail cut, marked; never half a surrogate pair). */
export const fitReason = (reason: string): string => {
  if (reason.length <= Payloads.maxReasonLength) return reason
  const cut = reason.slice(0, Payloads.maxReasonLength - 1)
  return `${/[\uD800-\uDBFF]$/.test(cut) ? cut.slice(0, -1) : cut}…`
}

/**
 * Whether a call that timed out after `tookMs` (wall clock, send to time-out) for a bound of
 * `boundMs` timed out because this process was paused (SIGSTOP, a frozen VM or host, a blocked
 * event loop): its timer fired far later than set, at least the bound itself (and 1 s) late. A
 * replica that hangs times out on time.
 */
export const pausedThrough = (tookMs: number, boundMs: number): boolean => tookMs - boundMs >= Math.max(1000, boundMs)

/**
 * The coordinator over HTTP, through the API's typed client. Needs an `HttpClient`. With several
 * URLs, one replica at a time: a call that finds it unreachable (`Failover.unreachable`) moves
 * the client to the next and is tried there at once, each replica at most once per call.
 */
export const makeHttp = (t: CoordinatorTarget): Effect.Effect<CoordinatorShape, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const given: readonly string[] = typeof t.url === "string" ? [t.url] : t.url
    // A program's list gets the environment's rules (`ENGRAM_COORDINATOR_URL`'s): a bad one is a defect, named.
    const parsed = Failover.parseUrls(given.join(","))
    if (!("urls" in parsed)) return yield* Effect.die(new Error(`coordinator url ${JSON.stringify(Failover.redactUrl(given.join(",")))}: ${parsed.problem}`))
    const urls = parsed.urls
    const startCallMs = t.callTimeoutMs ?? Failover.maxCallTimeoutMs
    /**
     * The bound of one ordinary call: `startCallMs` until the agent's heartbeat interval changes
     * (`followHeartbeat`), then `Failover.callTimeoutFor` of the new interval (never above
     * `startCallMs`). Read by each try as it is sent, so a call made after the change is bounded
     * by the new one: a replica that hangs is left within the learned cadence, not the start's.
     */
    let callMs = startCallMs
    // Every call states the agent's bound as it is when sent: the coordinator answers a heartbeat or a report whose
    // database stalls within it (503 StoreStalled), before the agent would give up on the replica.
    const http = yield* HttpClient.HttpClient
    const stating = HttpClient.mapRequest(http, (request) => HttpClientRequest.setHeader(request, ApiErrors.agentCallTimeoutHeader, String(callMs)))
    const apis = yield* Effect.forEach(urls, (url) =>
      Client.make({ baseUrl: Failover.baseUrlOf(url), token: t.hostToken }).pipe(Effect.provideService(HttpClient.HttpClient, stating)),
    )
    const replica = yield* Failover.makeSticky(urls.length, (t.startIndex ?? 0) % urls.length)
    const host = { id: t.hostId }
    type Raw<A> = Effect.Effect<A, { readonly _tag: string; readonly message: string }>
    /**
     * One try on the replica in use; on to the next when it is unreachable, `left` more times. A
     * try still open when the client leaves its replica (another call found it unreachable) is
     * interrupted and made at once on the replica switched to (it counts as a try): a long-poll
     * open on a hung replica does not wait out its own bound once the heartbeat has moved on.
     * `boundOf`: the try's bound from the ordinary call's bound as it is when the try is sent.
     */
    const attempt = <A>(op: string, request: (api: Client.Client) => Raw<A>, boundOf: (callMs: number) => number, left: number): Fx<A> =>
      Effect.gen(function* () {
        const timeoutMs = boundOf(callMs)
        const { index, movedAway } = yield* replica.use
        const sentMs = yield* Clock.currentTimeMillis
        const outcome = yield* request(apis[index]!).pipe(
          Effect.timeout(Duration.millis(timeoutMs)),
          Effect.result,
          Effect.map((result) => ({ _tag: "Done" as const, result })),
          Effect.raceFirst(Effect.map(movedAway, (to) => ({ _tag: "Moved" as const, to }))),
        )
        if (outcome._tag === "Moved") {
          const moved = { hostId: t.hostId, from: urls[index], to: urls[outcome.to] }
          if (left === 0) return yield* Effect.fail(new CoordinatorError({ op, status: null, message: `the agent left ${moved.from} for ${moved.to} while this call was open there, and had tried every replica` }))
          // Said for the long-poll only: the other calls are short, and the move itself is warned of by the call that made it.
          if (op === "assignments") {
            yield* Effect.logInfo(`assignments poll moved to ${moved.to}`, moved)
            yield* Effect.sleep(yield* Pacing.moveSpreadMs())
          }
          return yield* attempt(op, request, boundOf, left - 1)
        }
        const result = outcome.result
        if (result._tag === "Success") return result.success
        const e = result.failure
        const message = e._tag === "TimeoutError" ? "timed out" : e.message
        // The database stalls for every replica (a lock held): said, and the agent stays.
        if (Failover.storeStalled(e))
          yield* Effect.logWarning("the coordinator's database is not answering (the same on every replica); the agent stays on this one and retries", {
            hostId: t.hostId,
            op,
            replica: urls[index],
            error: message,
          })
        if (urls.length > 1 && Failover.unreachable(e)) {
          const to = yield* replica.leave(index)
          if (to !== undefined) {
            const tookMs = (yield* Clock.currentTimeMillis) - sentMs
            yield* e._tag === "TimeoutError" && pausedThrough(tookMs, timeoutMs)
              ? Effect.logWarning(
                  `a coordinator call timed out because this agent was paused: the clock moved ${tookMs} ms for a bound of ${timeoutMs} ms (the process or its host was frozen or starved), not because the replica hung; the agent moves to the next all the same`,
                  { hostId: t.hostId, op, from: urls[index], to: urls[to], error: message, tookMs },
                )
              : Effect.logWarning("coordinator replica unreachable; the agent moves to the next", { hostId: t.hostId, op, from: urls[index], to: urls[to], error: message })
          }
          if (left > 0) {
            // A long-poll only: every agent of a replica that went away moves at once (`Pacing.moveSpreadMs`).
            if (op === "assignments") yield* Effect.sleep(yield* Pacing.moveSpreadMs())
            return yield* attempt(op, request, boundOf, left - 1)
          }
        }
        if (e._tag === "TimeoutError") return yield* Effect.fail(new CoordinatorError({ op, status: null, message }))
        return yield* Effect.fail(toPortError(op, e, yield* Clock.currentTimeMillis))
      })
    const call = <A>(op: string, request: (api: Client.Client) => Raw<A>, boundOf: (callMs: number) => number = (ms) => ms): Fx<A> =>
      attempt(op, request, boundOf, urls.length - 1)
    const sendReport = (r: HostReport, activeSessions: readonly string[]) =>
      call("report", (api) => api.hosts.report({ params: host, payload: activeSessions.length === 0 ? r : { ...r, activeSessions } }))
    let saidPeerUrlRefused = false
    return {
      report: (r, activeSessions = []) =>
        sendReport(r, activeSessions).pipe(
          // A coordinator older than peer URLs refuses the key (400 naming it): the report goes
          // again without it, so agents may be upgraded first; said once.
          Effect.catchIf(
            (e) => r.peerUrl !== undefined && refusesKey(e, "peerUrl"),
            () =>
              Effect.gen(function* () {
                if (!saidPeerUrlRefused) {
                  saidPeerUrlRefused = true
                  yield* Effect.logWarning(
                    "the coordinator refused this agent's peer URL (400 naming peerUrl: it is older than peer URLs, or the URL breaks its rule); reports go without it, and moves to this host need the sources' ENGRAM_PEERS",
                    { hostId: t.hostId, peerUrl: r.peerUrl },
                  )
                }
                const { peerUrl: _peerUrl, ...without } = r
                return yield* sendReport(without, activeSessions)
              }),
          ),
          Effect.asVoid,
        ),
      heartbeat: call("heartbeat", (api) => api.hosts.heartbeat({ params: host })).pipe(Effect.map((b) => b.renewed)),
      assignments: ({ waitMs, since }) =>
        call("assignments", (api) => api.hosts.assignments({ params: host, query: since === undefined ? { waitMs } : { waitMs, since } }), (ms) =>
          Failover.pollTimeoutMs(waitMs, ms, urls.length),
        ),
      started: (id) => call("started", (api) => api.sessions.started({ params: { id } })).pipe(Effect.asVoid),
      descended: (id, options = {}) => {
        const plain = call("descended", (api) => api.sessions.descended({ params: { id }, query: {} }))
        if (options.imageless !== true) return Effect.asVoid(plain)
        return call("descended", (api) => api.sessions.descended({ params: { id }, query: { image: "none" } })).pipe(
          // A coordinator older than the word refuses it (400 naming image): told again without
          // it, the session names this host as its image's (a resume elsewhere then reports the
          // loss again when this host answers it has no such image).
          Effect.catchIf(
            (e) => refusesKey(e, "image"),
            (e) =>
              Effect.andThen(
                Effect.logWarning("the coordinator refused the word that the descent left no image (older than it); reporting the descent without it", { sessionId: id, error: e.message }),
                plain,
              ),
          ),
          Effect.asVoid,
        )
      },
      round: (id, round) => call("round", (api) => api.moves.round({ params: { id }, payload: round })).pipe(Effect.asVoid),
      commit: (id, phases, guard) =>
        call("commit", (api) => api.moves.commit({ params: { id }, payload: guard === undefined ? phases : { ...phases, guard } })).pipe(Effect.asVoid),
      abort: (id, why, estimateMs) => {
        const reason = fitReason(why)
        return call("abort", (api) => api.moves.abort({ params: { id }, payload: estimateMs === undefined ? { reason } : { reason, estimateMs } })).pipe(Effect.asVoid)
      },
      reportRunning: (id, why) => call("reportRunning", (api) => api.moves.resolve({ params: { id }, payload: { outcome: "commit", reason: fitReason(why) } })).pipe(Effect.asVoid),
      resendOwed: (id, owed, seenClears) =>
        call("resendOwed", (api) => api.moves.resend({ params: { id }, payload: seenClears === undefined ? { owed } : { owed, seenClears } })).pipe(
          Effect.map((m): "recorded" | "stale" => (owed && m.resendOwed === false ? "stale" : "recorded")),
          Effect.catchIf(
            (e) => e._tag === "CoordinatorError" && ((e.status === 404 && e.notFound === undefined) || e.status === 405 || e.status === 400),
            () => Effect.succeed("unknown" as const),
          ),
        ),
      guestLost: (id, why) => call("guestLost", (api) => api.hosts.guestLost({ params: host, payload: { sessionId: id, reason: fitReason(why) } })).pipe(Effect.asVoid),
      getMove: (id) => call("getMove", (api) => api.moves.get({ params: { id } })),
      getSession: (id) =>
        call("getSession", (api) => api.sessions.get({ params: { id } })).pipe(
          Effect.catchIf(
            (e) => e._tag === "CoordinatorError" && (e.status === 403 || isNotFound(e, "session", id)),
            (e): Effect.Effect<null | NotVisible> => Effect.succeed(e._tag === "CoordinatorError" && e.status === 403 ? notVisible : null),
          ),
        ),
      followHeartbeat: (intervalMs) =>
        Effect.sync(() => {
          callMs = Math.min(startCallMs, Failover.callTimeoutFor(urls.length, intervalMs))
          return callMs
        }),
    } satisfies CoordinatorShape
  })

/** The coordinator over HTTP (`fetch`) as a layer. */
export const layerHttp = (t: CoordinatorTarget): Layer.Layer<Coordinator> => Layer.effect(Coordinator, makeHttp(t).pipe(Effect.provide(FetchHttpClient.layer)))
