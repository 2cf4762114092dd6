/** `/v1/sessions…`: create, list, read, wait, history, the agent's acknowledgements, idle, resume, end, move. */
import { ConflictError, CurrentPrincipal, EngramApi, ServiceUnavailable, WaitTimeout } from "@engram/api"
import { Move as CoreMove, Session } from "@engram/core"
import { Trigger } from "@engram/reaper"
import { Store, Validate } from "@engram/store"
import type { InvalidInput, Move, NotFound, Page, PlaceOutcome, Session as SessionRecord, SessionEvent, Unavailable } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { randomUUID } from "node:crypto"
import { requireHostOrAdmin, requireOwnHostList } from "../Auth.js"
import { Forwarder } from "../Forward.js"
import * as HandlerGroup from "../HandlerGroup.js"
import { api } from "../HttpErrors.js"
import { LongPolls } from "../LongPolls.js"
import { Metrics } from "../Metrics.js"
import { MoveWaiter } from "../MoveWaiter.js"
import type { MoveOutcome } from "../MoveWaiter.js"
import { endedTopics, hostTopic, Notifier, placedTopics, sessionTopic, withNotices } from "../Notifier.js"
import { Drainer } from "../Drainer.js"
import { SessionWaiter } from "../SessionWaiter.js"
import * as Tracing from "../Tracing.js"
import { eventJson, pageJson, placeAnswer, resumeAnswer, sessionDetail } from "../Views.js"

/** How long a wait for a state lasts when the caller does not say. */
const defaultWaitMs = 30_000

/** The `Retry-After` of a `MoveCommitPending` answer: when a re-read of the move may show its outcome. */
const commitPendingRetryAfterMs = 5000

/** The figures of a move committed on a resolution (the target's report, an operator's word): its pause was not measured. */
const unmeasured = { downtimeMs: null, captureMs: null, sendMs: null, commitMs: null } as const

/** A move's outcome as the HTTP answer: 200 with the figures (null when committed on a resolution), or 503 naming what happened. */
const moveAnswer = (o: MoveOutcome) => {
  const m = o.move
  // `retryAfterMs: null`: no retry hint, the same request gets the same answer.
  const fail = (error: string, message: string, extra: { readonly estimateMs?: number; readonly retryAfterMs?: number | null } = {}) =>
    Effect.fail(
      new ServiceUnavailable({
        error,
        message,
        ...(extra.retryAfterMs === null ? {} : { retryAfterMs: extra.retryAfterMs ?? 1000 }),
        moveId: m.id,
        maxDowntimeMs: m.maxDowntimeMs,
        ...(extra.estimateMs === undefined ? {} : { estimateMs: extra.estimateMs }),
      }),
    )
  switch (o._tag) {
    case "Committed":
      return Effect.succeed({ move: m, ...(o.phases ?? unmeasured) })
    case "Refused":
      return fail("ErrMoveDowntime", m.abortReason ?? "refused for downtime", { estimateMs: o.estimateMs, retryAfterMs: null })
    case "Aborted":
      return fail("MoveAborted", m.abortReason ?? "aborted")
    case "TimedOut":
      return fail("MoveTimeout", `no agent committed or aborted move ${m.id} within ${o.timeoutMs} ms; it was aborted`)
    case "CommitPending":
      return fail(
        "MoveCommitPending",
        `move ${m.id}: the source paused the guest and recorded the final round, but did not commit or abort within ${o.timeoutMs} ms. ` +
          `The move was not aborted (the target may already run the guest); it stays pending until the source agent settles it. GET /v1/moves/${m.id} shows the outcome`,
        { retryAfterMs: commitPendingRetryAfterMs },
      )
  }
}

export const SessionsHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const forwarder = yield* Forwarder
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const drainer = yield* Drainer
    const waiter = yield* MoveWaiter
    const sessionWaiter = yield* SessionWaiter
    const trigger = yield* Trigger
    const longPolls = yield* LongPolls
    const span = yield* Tracing.spans
    const moveSpans = yield* Tracing.MoveSpans

    /**
     * An operator's move is begun to the host asked for, though it takes no moves (its agent
     * advertises no peer URL, core's `Move.takesMoves`: the reaper plans none there); said, as the
     * source then reaches it only at its own `ENGRAM_PEERS` entry. A failed read says nothing.
     */
    const warnIfUnreachable = (m: Move) =>
      store.getHost(m.targetHostId).pipe(
        Effect.flatMap((h) =>
          CoreMove.takesMoves(h.peerUrl)
            ? Effect.void
            : Effect.logWarning("move target advertises no peer URL: the source reaches it only at its own ENGRAM_PEERS entry, else the move aborts", {
                moveId: m.id,
                sessionId: m.sessionId,
                from: m.sourceHostId,
                to: m.targetHostId,
              }),
        ),
        Effect.ignore,
      )

    /** The session, once the caller may act for it (the admin, or its host's agent). */
    const sessionFor = (id: string) => api(store.getSession(id)).pipe(Effect.tap((s) => requireHostOrAdmin(s.hostId)))

    /**
     * The session's latest move, for the right to read it: the store's own read
     * (`Store.latestMove`), or on a store without it the same answer the slow way (its history's
     * newest `MoveBegun`, then that move, if still kept). Read only when the caller is a host's
     * agent and not the session's host.
     */
    const latestMove = (id: string): Effect.Effect<Move | null, NotFound | Unavailable | InvalidInput> =>
      store.latestMove !== undefined
        ? store.latestMove(id)
        : Effect.gen(function* () {
            let moveId: string | null = null
            let cursor: string | undefined = undefined
            do {
              const page: Page<SessionEvent> = yield* store.sessionEvents(id, { limit: Validate.maxPageLimit, cursor })
              moveId = Session.latestMoveIdOf(page.items.map((e) => e.event)) ?? moveId
              cursor = page.nextCursor ?? undefined
            } while (cursor !== undefined)
            return moveId === null ? null : yield* store.getMove(moveId).pipe(Effect.catchTag("NotFound", () => Effect.succeed(null)))
          })

    /**
     * The session, once the caller may read it: the admin; its host's agent; or the agent of the
     * source or the target of the session's latest move (`latestMove`), wherever the session is
     * now (on the other party, ended, lost, queued, descended): a move's source that owes its
     * target a resend tells "still placed on the target" from "no longer" by this read. Any other
     * host's token: 403, as for its other steps (`sessionFor`). The move is read only when the
     * first check fails.
     */
    const sessionToRead = (id: string) =>
      api(store.getSession(id)).pipe(
        Effect.tap((s) =>
          requireHostOrAdmin(s.hostId).pipe(
            Effect.catchTag("Forbidden", (refused) =>
              Effect.gen(function* () {
                const p = yield* CurrentPrincipal
                if (p._tag !== "Host") return yield* refused
                const m = yield* api(latestMove(s.id))
                if (m === null || (m.sourceHostId !== p.hostId && m.targetHostId !== p.hostId)) return yield* refused
              }),
            ),
          ),
        ),
      )

    /**
     * The caller's right to wait on the session: the admin's needs no read (the wait's own read
     * answers an unknown session 404, as this read would); a host's agent's is its session's host.
     */
    const mayWait = (id: string) => Effect.flatMap(Effect.service(CurrentPrincipal), (p) => (p._tag === "Admin" ? Effect.void : Effect.asVoid(sessionFor(id))))

    /** The session with where it stands in the queue, while it is queued. */
    const detailOf = (s: SessionRecord) =>
      s.state === "queued" ? api(store.queueStanding(s.id)).pipe(Effect.map((standing) => sessionDetail(s, standing))) : Effect.succeed(sessionDetail(s, null))

    /** Counts a create's or a cold resume's outcome and wakes who waits on it: its host's agent and its waiters. */
    const placed = (o: PlaceOutcome, source: "create" | "resume") =>
      Effect.gen(function* () {
        metrics.placements.inc({ outcome: o._tag === "Placed" ? "placed" : "queued", source })
        yield* notifier.notify(...placedTopics(o))
        // Queued without room: the park gate runs for it within one coalescing window, not at the next pass.
        if (o._tag === "Queued") yield* trigger.poke
      })

    return HttpApiBuilder.group(EngramApi, "sessions", (h) =>
      h
        .handle("create", ({ payload }) => {
          const id = payload.id ?? randomUUID()
          return withNotices(
            api(
              forwarder.create({
                id,
                budget: { memMib: payload.memMib, vcpus: payload.vcpus },
                affinity: payload.affinity,
                onNoRoom: payload.onNoRoom,
                idleTimeoutMs: payload.idleTimeoutMs,
                ttlMs: payload.ttlMs,
                template: payload.template,
              }),
            ).pipe(Effect.tap((o) => placed(o, "create"))),
          ).pipe(
            Effect.tap((o) =>
              Tracing.annotate(span, { "engram.session.id": o.session.id, "engram.outcome": o._tag === "Placed" ? "placed" : "queued", "engram.host.id": o.session.hostId ?? "" }),
            ),
            Effect.map(placeAnswer),
            // A create whose id this coordinator chose may have committed before its store call
            // failed or timed out: the 503 names that id, so a retry with it is answered, not repeated.
            Effect.mapError((e) =>
              payload.id === undefined && e instanceof ServiceUnavailable
                ? new ServiceUnavailable({ ...e, message: `${e.message}; this create's session id was ${id}: retry with "id": "${id}" so that a create that did commit is answered, not made twice` })
                : e,
            ),
            span("engram.session.create", { attributes: { "engram.budget.mem_mib": payload.memMib, "engram.budget.vcpus": payload.vcpus } }),
          )
        })
        .handle("list", ({ query }) =>
          Effect.gen(function* () {
            // A host agent may list its own host's sessions; anything else is the admin's.
            yield* requireOwnHostList(query.hostId, "sessions")
            const page = yield* api(store.pageSessions({ state: query.state, hostId: query.hostId }, { limit: query.limit, cursor: query.cursor }))
            return pageJson(page, (x) => x)
          }),
        )
        .handle("get", ({ params }) => sessionToRead(params.id).pipe(Effect.flatMap(detailOf)))
        .handle("wait", ({ params, query }) =>
          Effect.gen(function* () {
            // The caller's right to the session is read inside the long-poll's admission: a wait
            // refused by the caps (429) reads nothing from the store, and an admin's reads its
            // session once (the wait's own read).
            const outcome = yield* longPolls.run(mayWait(params.id).pipe(Effect.andThen(api(sessionWaiter.until(params.id, query.state, query.timeoutMs ?? defaultWaitMs)))))
            const s = outcome.session
            switch (outcome._tag) {
              case "Reached":
                return yield* detailOf(s)
              case "Unreachable":
                return yield* new ConflictError({
                  error: "Unreachable",
                  message: `session ${s.id} is ${s.state}: it can no longer become ${query.state}`,
                  id: s.id,
                  from: s.state,
                  to: query.state,
                })
              case "TimedOut":
                return yield* new WaitTimeout({
                  error: "WaitTimeout",
                  message: `session ${s.id} was still ${s.state}, not ${query.state}, after ${query.timeoutMs ?? defaultWaitMs} ms`,
                  state: s.state,
                })
            }
          }),
        )
        .handle("events", ({ params, query }) =>
          sessionFor(params.id).pipe(
            Effect.andThen(api(store.sessionEvents(params.id, { limit: query.limit, cursor: query.cursor }))),
            Effect.map((page) => pageJson(page, eventJson)),
          ),
        )
        .handle("idle", ({ params }) =>
          withNotices(Effect.gen(function* () {
            yield* Effect.interruptible(sessionFor(params.id))
            // The store's step decides park or descent with the configured park policy.
            const after = yield* api(store.idle(params.id))
            if (after.state === "parked") metrics.parks.inc()
            else metrics.descents.inc({ reason: "idle" })
            yield* notifier.notify(hostTopic(after.hostId), sessionTopic(after.id))
            return { id: after.id, state: after.state }
          })),
        )
        .handle("resume", ({ params }) =>
          withNotices(Effect.gen(function* () {
            const o = yield* api(store.resume(params.id))
            const answer = resumeAnswer(o)
            if (answer.resumed === "warm") {
              // A park running again where it is: its agent resumes the paused VM.
              metrics.resumes.inc({ resumed: "warm" })
              yield* notifier.notify(hostTopic(o.session.hostId), sessionTopic(o.session.id))
            } else {
              metrics.resumes.inc({ resumed: "cold" })
              yield* placed(o, "resume")
            }
            return answer
          })),
        )
        .handle("started", ({ params }) =>
          withNotices(
            Effect.gen(function* () {
              const before = yield* Effect.interruptible(sessionFor(params.id))
              const s = yield* api(store.markRunning(params.id))
              // Running again: the host that held its descent image no longer lists it (its agent removes the image).
              yield* notifier.notify(hostTopic(s.hostId), sessionTopic(s.id), before.imageHostId === s.hostId ? null : hostTopic(before.imageHostId))
              return s
            }),
          ),
        )
        .handle("descended", ({ params, query }) =>
          withNotices(
            Effect.gen(function* () {
              const before = yield* Effect.interruptible(sessionFor(params.id))
              // `image=none`: the descent left no image (its agent told the loss first); no host is named for it.
              const s = yield* api(store.finishDescent(params.id, { imageless: query.image === "none" }))
              yield* drainer.roomAppeared(hostTopic(before.hostId), sessionTopic(s.id))
              return s
            }),
          ),
        )
        .handle("end", ({ params }) =>
          withNotices(Effect.gen(function* () {
            // Read for the credential's check only: who is told comes from the end's own answer.
            yield* Effect.interruptible(sessionFor(params.id))
            const ended = yield* api(store.endSession(params.id))
            // The one rule of what an end changed (a TTL's end in a reaper pass tells the same).
            yield* drainer.roomAppeared(...endedTopics(ended.before, ended.closedMove))
            return ended.session
          })),
        )
        .handle("ttl", ({ params, payload }) =>
          withNotices(api(store.setTtl(params.id, payload.ttlMs)).pipe(Effect.tap((s) => notifier.notify(sessionTopic(s.id))))),
        )
        .handle("move", ({ params, payload }) =>
          Effect.gen(function* () {
            // Begun and announced whole; the wait for its outcome after is cut by the client's leaving.
            const begun = yield* withNotices(
              api(store.beginMove({ sessionId: params.id, targetHostId: payload.targetHostId, maxDowntimeMs: payload.maxDowntimeMs })).pipe(
                Effect.tap((m) => notifier.notify(hostTopic(m.sourceHostId), hostTopic(m.targetHostId), sessionTopic(m.sessionId))),
              ),
            )
            yield* Effect.logInfo("move begun", { moveId: begun.id, sessionId: begun.sessionId, from: begun.sourceHostId, to: begun.targetHostId })
            // After the notice (its host read does not delay the source's wake-up) and after the
            // move's span is open (the agent's first request joins its trace). A target the store
            // chose takes moves already (`Placement.Request.takesMovesOnly`); only one named is read.
            const warned = payload.targetHostId !== undefined ? warnIfUnreachable(begun) : Effect.void
            if (!Tracing.isTracing(span)) return yield* Effect.andThen(warned, api(waiter.outcome(begun))).pipe(Effect.flatMap(moveAnswer))
            // The agent's rounds, commit or abort (their own requests) join this span's trace.
            yield* Tracing.annotate(span, { "engram.move.id": begun.id, "engram.host.source": begun.sourceHostId, "engram.host.target": begun.targetHostId })
            yield* Effect.flatMap(Effect.currentSpan, (s) => moveSpans.open(begun.id, s)).pipe(Effect.ignore)
            const outcome = yield* Effect.andThen(
              warned,
              api(waiter.outcome(begun)).pipe(
                Effect.tap((o) => Tracing.annotate(span, { "engram.move.outcome": o._tag, ...(o._tag === "Committed" && o.phases !== null ? { "engram.move.downtime_ms": o.phases.downtimeMs } : {}) })),
                span("engram.move.wait"),
              ),
            ).pipe(Effect.ensuring(moveSpans.close(begun.id)))
            yield* Tracing.annotate(span, { "engram.move.outcome": outcome._tag })
            return yield* moveAnswer(outcome)
          }).pipe(span("engram.session.move", { attributes: { "engram.session.id": params.id, "engram.move.max_downtime_ms": payload.maxDowntimeMs } })),
        )
    )
  }),
)
