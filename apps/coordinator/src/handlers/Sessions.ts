/** `/v1/sessions…`: create, read, the agent's acknowledgements, idle, resume, end, move. */
import { CurrentPrincipal, EngramApi, Forbidden, ServiceUnavailable } from "@engram/api"
import { ParkGate } from "@engram/core"
import { Store } from "@engram/store"
import type { PlaceOutcome } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { randomUUID } from "node:crypto"
import { requireHostOrAdmin } from "../Auth.js"
import { api } from "../HttpErrors.js"
import { Metrics } from "../Metrics.js"
import { MoveWaiter } from "../MoveWaiter.js"
import type { MoveOutcome } from "../MoveWaiter.js"
import { hostTopic, moveTopic, Notifier } from "../Notifier.js"
import { Room } from "../Room.js"
import { placeAnswer } from "../Views.js"

/** The `Retry-After` of a `MoveCommitPending` answer: when a re-read of the move may show its outcome. */
const commitPendingRetryAfterMs = 5000

/** A move's outcome as the HTTP answer: 200 with the figures, or 503 naming what happened. */
const moveAnswer = (o: MoveOutcome) => {
  const m = o.move
  const fail = (error: string, message: string, extra: { readonly estimateMs?: number; readonly retryAfterMs?: number } = {}) =>
    Effect.fail(
      new ServiceUnavailable({
        error,
        message,
        retryAfterMs: extra.retryAfterMs ?? 1000,
        moveId: m.id,
        maxDowntimeMs: m.maxDowntimeMs,
        ...(extra.estimateMs === undefined ? {} : { estimateMs: extra.estimateMs }),
      }),
    )
  switch (o._tag) {
    case "Committed":
      return Effect.succeed({ move: m, ...o.phases })
    case "Refused":
      return fail("ErrMoveDowntime", m.abortReason ?? "refused for downtime", { estimateMs: o.estimateMs })
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

export const SessionsHandlers = HttpApiBuilder.group(EngramApi, "sessions", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const room = yield* Room
    const waiter = yield* MoveWaiter

    /** The session, once the caller may act for it (the admin, or its host's agent). */
    const sessionFor = (id: string) => api(store.getSession(id)).pipe(Effect.tap((s) => requireHostOrAdmin(s.hostId)))

    const placed = (o: PlaceOutcome, source: "create" | "resume") =>
      Effect.gen(function* () {
        metrics.inc("engram_placements_total", { outcome: o._tag === "Placed" ? "placed" : "queued", source })
        if (o._tag === "Placed") yield* notifier.notify(hostTopic(o.session.hostId))
        return placeAnswer(o)
      })

    return h
      .handle("create", ({ payload }) =>
        api(store.createSession({ id: payload.id ?? randomUUID(), budget: { memMib: payload.memMib, vcpus: payload.vcpus }, affinity: payload.affinity })).pipe(
          Effect.flatMap((o) => placed(o, "create")),
        ),
      )
      .handle("list", ({ query }) =>
        Effect.gen(function* () {
          const p = yield* CurrentPrincipal
          // A host agent may list its own host's sessions; anything else is the admin's.
          if (p._tag === "Host" && query.hostId !== p.hostId) {
            return yield* new Forbidden({ error: "Forbidden", message: `a host token lists only its own host's sessions (?hostId=${p.hostId})` })
          }
          return yield* api(store.listSessions({ state: query.state, hostId: query.hostId }))
        }),
      )
      .handle("get", ({ params }) => sessionFor(params.id))
      .handle("idle", ({ params }) =>
        Effect.gen(function* () {
          const s = yield* sessionFor(params.id)
          // The gate decides: park only on a measured host while no queued session is without room.
          const fleet = yield* api(store.fleetView())
          const mayPark = s.hostId !== null && ParkGate.mayPark(fleet, s.hostId, store.limits())
          const after = yield* api(store.idle(params.id, mayPark))
          if (after.state === "parked") metrics.inc("engram_parks_total")
          else metrics.inc("engram_descents_total", { reason: "idle" })
          yield* notifier.notify(hostTopic(after.hostId))
          return { id: after.id, state: after.state }
        }),
      )
      .handle("resume", ({ params }) => api(store.resume(params.id)).pipe(Effect.flatMap((o) => placed(o, "resume"))))
      .handle("started", ({ params }) =>
        sessionFor(params.id).pipe(
          Effect.andThen(api(store.markRunning(params.id))),
          Effect.tap((s) => notifier.notify(hostTopic(s.hostId))),
        ),
      )
      .handle("descended", ({ params }) =>
        Effect.gen(function* () {
          const before = yield* sessionFor(params.id)
          const s = yield* api(store.finishDescent(params.id))
          yield* room.appeared(hostTopic(before.hostId))
          return s
        }),
      )
      .handle("end", ({ params }) =>
        Effect.gen(function* () {
          const before = yield* sessionFor(params.id)
          const open = yield* api(store.openMove(params.id))
          const s = yield* api(store.endSession(params.id))
          yield* room.appeared(hostTopic(before.hostId), open === null ? null : hostTopic(open.targetHostId), open === null ? null : moveTopic(open.id))
          return s
        }),
      )
      .handle("move", ({ params, payload }) =>
        Effect.gen(function* () {
          const begun = yield* api(store.beginMove({ sessionId: params.id, targetHostId: payload.targetHostId, maxDowntimeMs: payload.maxDowntimeMs }))
          yield* Effect.logInfo("move begun", { moveId: begun.id, sessionId: begun.sessionId, from: begun.sourceHostId, to: begun.targetHostId })
          yield* notifier.notify(hostTopic(begun.sourceHostId), hostTopic(begun.targetHostId))
          return yield* api(waiter.outcome(begun)).pipe(Effect.flatMap(moveAnswer))
        }),
      )
  }),
)
