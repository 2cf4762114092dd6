/**
 * The handlers of `CoordinatorApi`. Each one authorizes (admin, or the host the resource
 * belongs to), calls the store, maps store errors to HTTP answers, wakes the agents whose
 * assignments changed, and drains the queue after anything that frees room. Every decision
 * about room is core's (ParkGate, Fleet, Placement, Headroom): no arithmetic here.
 */
import { Fleet, Headroom, ParkGate, Placement } from "@engram/core"
import { Store, Validate } from "@engram/store"
import type { HostView, Move, PlaceOutcome, Session, StoreError } from "@engram/store"
import { Clock, Effect, Layer, SchemaIssue } from "effect"
import { HttpServerResponse } from "effect/http"
import { HttpApiBuilder, HttpApiMiddleware, OpenApi } from "effect/http-api"
import { createHash, randomUUID } from "node:crypto"
import {
  BadRequest,
  ConflictError,
  CoordinatorApi,
  CurrentPrincipal,
  InputErrors,
  NotFoundError,
  ServiceUnavailable,
} from "./Api.js"
import { hashToken, newToken, requireAdmin, requireHostOrAdmin } from "./Auth.js"
import { Leader } from "./Leader.js"
import { Metrics } from "./Metrics.js"
import { hostTopic, moveTopic, Notifier } from "./Notifier.js"
import { drainQueue } from "./Reaper.js"
import { Settings } from "./Settings.js"

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

type ApiError = BadRequest | NotFoundError | ConflictError | ServiceUnavailable

/** One HTTP answer per store error (see the store's Errors.ts). */
export const toApiError = (e: StoreError): ApiError => {
  switch (e._tag) {
    case "InvalidInput":
      return new BadRequest({ error: "InvalidInput", field: e.field, rule: e.rule })
    case "NotFound":
      return new NotFoundError({ error: "NotFound", entity: e.entity, id: e.id, message: e.message })
    case "Conflict":
      return new ConflictError({ error: "Conflict", message: e.message, entity: e.entity, id: e.id })
    case "IllegalTransition":
      return new ConflictError({ error: "IllegalTransition", message: e.reason, id: e.sessionId, from: e.from, to: e.to })
    case "Refused":
      return new ConflictError({ error: "Refused", message: e.reason, check: e.check })
    case "Unavailable":
      return new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: e.retryAfterMs })
  }
}

/** Runs a store call and maps its errors to HTTP answers. */
const api = <A, E extends StoreError, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, ApiError, R | Metrics> =>
  eff.pipe(
    Effect.catch((e: E) =>
      Effect.gen(function* () {
        if (e._tag === "Unavailable") (yield* Metrics).inc("engram_http_store_unavailable_total")
        return yield* Effect.fail(toApiError(e))
      }),
    ),
  )

const badRequest = (field: string, rule: string) => new BadRequest({ error: "InvalidInput", field, rule })

// Request decode failures: 400 {error, field, rule}, the field as a dotted path.
const issueFormatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** `400 {error, field, rule}` for every request that fails its schema. */
export const InputErrorsLive = HttpApiMiddleware.layerSchemaErrorTransform(InputErrors, (error) => {
  if (error.kind === "ResponseHeaders") {
    return Effect.succeed(HttpServerResponse.jsonUnsafe({ error: "Internal", message: "response encoding failed" }, { status: 500 }))
  }
  const first = issueFormatter(error.cause.issue).issues[0]
  const path = first?.path?.map((p) => (typeof p === "object" && p !== null ? String((p as { key: unknown }).key) : String(p))) ?? []
  const where = error.kind === "Payload" || error.kind === "Body" ? "body" : error.kind === "Query" ? "query" : error.kind === "Params" ? "path" : "headers"
  const field = path.length > 0 ? path.join(".") : where
  const message = first?.message ?? "is invalid"
  const rule = message === "Missing key" ? "is required" : message
  return Effect.succeed(HttpServerResponse.jsonUnsafe({ error: "InvalidInput", field, rule, in: where }, { status: 400 }))
})

// ---------------------------------------------------------------------------------------------
// JSON views
// ---------------------------------------------------------------------------------------------

/** A host as the API shows it: capacity after policy beside the figure the host reported. */
export const hostJson = (h: HostView) => ({
  id: h.id,
  labels: h.labels,
  state: h.state,
  measured: h.measured,
  report: h.report,
  reportedAt: h.reportedAt,
  createdAt: h.createdAt,
  allocatableMib: h.headroom.allocatableMib,
  reportedAllocatableMib: h.report?.allocatableMib ?? null,
  reservedMib: h.headroom.reserved.memMib,
  freeMib: Headroom.freeMib(h.headroom),
  cpuBudget: h.headroom.cpuBudget,
  reservedVcpus: h.headroom.reserved.vcpus,
  freeVcpus: Headroom.freeVcpus(h.headroom),
  entries: h.entries,
  parks: h.parks,
  descentsRunning: h.descentsRunning,
})

const placeAnswer = (o: PlaceOutcome) =>
  o._tag === "Placed" && o.session.hostId !== null
    ? { id: o.session.id, state: o.session.state, hostId: o.session.hostId }
    : { id: o.session.id, state: o.session.state, position: o._tag === "Queued" ? o.position : 0, noFit: o._tag === "Queued" ? o.noFit : [] }

/** The states in which a session has work for its host's agent. */
const assignedStates = new Set(["pending", "running", "parked", "descending", "moving"])

// ---------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------

const HealthLive = HttpApiBuilder.group(CoordinatorApi, "health", (h) => Effect.succeed(h.handle("healthz", () => Effect.succeed({ ok: true }))))

const OpsLive = HttpApiBuilder.group(CoordinatorApi, "ops", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const settings = yield* Settings
    const leader = yield* Leader
    const spec = OpenApi.fromApi(CoordinatorApi)
    return h
      .handle("readyz", () =>
        api(store.metrics()).pipe(
          Effect.map(() => ({ ok: true, store: settings.backend, leader: leader.isLeader() })),
          Effect.mapError((e) =>
            e instanceof ServiceUnavailable ? e : new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: 1000 }),
          ),
        ),
      )
      .handle("metrics", () =>
        Effect.gen(function* () {
          const fleet = yield* Effect.result(store.fleetView())
          const ledger = yield* Effect.result(store.metrics())
          const extra: { name: string; help: string; value: number }[] = [
            { name: "engram_store_up", help: "1 when the last store read for this scrape succeeded.", value: fleet._tag === "Success" ? 1 : 0 },
          ]
          if (fleet._tag === "Success") {
            const snap = Fleet.snapshot(fleet.success, store.limits())
            extra.push(
              { name: "engram_queue_length", help: "Sessions queued for room.", value: snap.queue.sessions },
              { name: "engram_queue_without_room", help: "Queued sessions that fit on no candidate host.", value: snap.queue.withoutRoom },
              { name: "engram_parks", help: "Parked sessions now.", value: snap.parks },
              { name: "engram_descents_running", help: "Descents running now.", value: snap.descentsRunning },
              { name: "engram_hosts", help: "Registered hosts.", value: snap.hosts.total },
              { name: "engram_free_mib", help: "Free RAM over measured ready hosts.", value: snap.freeMib },
            )
          }
          if (ledger._tag === "Success") {
            extra.push(
              { name: "engram_reserve_failures", help: "Ledger reserve refusals (cumulative, from the store).", value: ledger.success.reserveFailures },
              { name: "engram_ledger_active_entries", help: "Reservations held now.", value: ledger.success.activeEntries },
            )
          }
          return metrics.render(extra)
        }),
      )
      .handle("openapi", () => Effect.succeed(spec as unknown))
  }),
)

const HostsLive = HttpApiBuilder.group(CoordinatorApi, "hosts", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    const notifier = yield* Notifier
    const settings = yield* Settings
    const setState = (id: string, state: "ready" | "cordoned" | "draining") =>
      Effect.gen(function* () {
        yield* requireAdmin
        const view = yield* api(store.setHostState(id, state))
        if (state === "ready") yield* drainQueue
        yield* notifier.notify(hostTopic(id))
        return hostJson(view)
      })

    const assignments = (hostId: string) =>
      Effect.gen(function* () {
        const sessions = (yield* api(store.listSessions({ hostId }))).filter((s) => assignedStates.has(s.state))
        // Pending moves where the host is the source or the target, oldest first.
        const moves = yield* api(store.listMoves({ hostId, state: "pending" }))
        const version = createHash("sha256")
          .update(JSON.stringify([sessions.map((s) => [s.id, s.state, s.updatedAt]), moves.map((m) => [m.id, m.state, m.rounds.length])]))
          .digest("base64url")
          .slice(0, 22)
        // The limits an agent's move guard uses come from here, so agents and coordinator agree.
        return { hostId, version, sessions, moves, limits: { commitAllowanceMs: settings.config.limits.commitAllowanceMs } }
      })

    return h
      .handle("create", ({ payload }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          const token = newToken()
          const tokenHash = hashToken(token)
          const host = yield* api(store.registerHost({ id: payload.id, labels: payload.labels, tokenHash }))
          yield* Effect.logInfo("host registered", { hostId: host.id })
          yield* drainQueue
          return { id: host.id, token }
        }),
      )
      .handle("list", () =>
        Effect.gen(function* () {
          yield* requireAdmin
          return (yield* api(store.listHosts())).map(hostJson)
        }),
      )
      .handle("get", ({ params }) =>
        Effect.gen(function* () {
          yield* requireHostOrAdmin(params.id)
          return hostJson(yield* api(store.getHost(params.id)))
        }),
      )
      .handle("report", ({ params, payload }) =>
        Effect.gen(function* () {
          yield* requireHostOrAdmin(params.id)
          const view = yield* api(store.reportHost(params.id, payload))
          yield* drainQueue
          return hostJson(view)
        }),
      )
      .handle("heartbeat", ({ params }) =>
        Effect.gen(function* () {
          yield* requireHostOrAdmin(params.id)
          const renewed = yield* api(store.heartbeatHost(params.id))
          return { hostId: params.id, renewed }
        }),
      )
      .handle("cordon", ({ params }) => setState(params.id, "cordoned"))
      .handle("uncordon", ({ params }) => setState(params.id, "ready"))
      .handle("drain", ({ params }) => setState(params.id, "draining"))
      .handle("assignments", ({ params, query }) =>
        Effect.gen(function* () {
          yield* requireHostOrAdmin(params.id)
          yield* api(store.getHost(params.id))
          let current = yield* assignments(params.id)
          const waitMs = Math.min(query.waitMs ?? 0, 30_000)
          if (waitMs === 0) return current
          const baseline = query.since ?? current.version
          const deadline = (yield* Clock.currentTimeMillis) + waitMs
          while (current.version === baseline) {
            const remaining = deadline - (yield* Clock.currentTimeMillis)
            if (remaining <= 0) break
            // Other replicas do not notify this one: re-read the store every storePollMs then.
            const slice = settings.sharedStore ? Math.min(remaining, settings.config.storePollMs) : remaining
            yield* notifier.wait([hostTopic(params.id) as string], slice)
            current = yield* assignments(params.id)
          }
          return current
        }),
      )
  }),
)

/** The `Retry-After` of a `MoveCommitPending` answer: when a re-read of the move may show its outcome. */
const commitPendingRetryAfterMs = 5000

const SessionsLive = HttpApiBuilder.group(CoordinatorApi, "sessions", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const notifier = yield* Notifier
    const settings = yield* Settings

    const sessionFor = (id: string) =>
      Effect.gen(function* () {
        const s = yield* api(store.getSession(id))
        yield* requireHostOrAdmin(s.hostId)
        return s
      })

    const placed = (o: PlaceOutcome, source: "create" | "resume") =>
      Effect.gen(function* () {
        metrics.inc("engram_placements_total", { outcome: o._tag === "Placed" ? "placed" : "queued", source })
        if (o._tag === "Placed") yield* notifier.notify(hostTopic(o.session.hostId))
        return placeAnswer(o)
      })

    const moveOutcome = (m: Move) =>
      Effect.gen(function* () {
        if (m.state === "committed" && m.phases !== null) {
          metrics.inc("engram_moves_total", { outcome: "committed" })
          return { move: m, ...m.phases }
        }
        const reason = m.abortReason ?? "aborted"
        const downtime = reason.startsWith("ErrMoveDowntime")
        const timeout = reason === "timeout"
        metrics.inc("engram_moves_total", { outcome: downtime ? "downtime" : timeout ? "timeout" : "aborted" })
        const estimateMs = m.abortEstimateMs ?? undefined
        return yield* new ServiceUnavailable({
          retryAfterMs: 1000,
          error: downtime ? "ErrMoveDowntime" : timeout ? "MoveTimeout" : "MoveAborted",
          message: timeout ? `no agent committed or aborted move ${m.id} within ${settings.config.moveTimeoutMs} ms; it was aborted` : reason,
          moveId: m.id,
          maxDowntimeMs: m.maxDowntimeMs,
          ...(estimateMs === undefined ? {} : { estimateMs }),
        })
      })

    return h
      .handle("create", ({ payload }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          const outcome = yield* api(
            store.createSession({
              id: payload.id ?? randomUUID(),
              budget: { memMib: payload.memMib, vcpus: payload.vcpus },
              affinity: payload.affinity,
            }),
          )
          return yield* placed(outcome, "create")
        }),
      )
      .handle("list", ({ query }) =>
        Effect.gen(function* () {
          const p = yield* CurrentPrincipal
          // A host agent may list its own host's sessions.
          if (!(p._tag === "Host" && query.hostId === p.hostId)) yield* requireAdmin
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
      .handle("resume", ({ params }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* placed(yield* api(store.resume(params.id)), "resume")
        }),
      )
      .handle("started", ({ params }) =>
        Effect.gen(function* () {
          yield* sessionFor(params.id)
          const s = yield* api(store.markRunning(params.id))
          yield* notifier.notify(hostTopic(s.hostId))
          return s
        }),
      )
      .handle("descended", ({ params }) =>
        Effect.gen(function* () {
          const before = yield* sessionFor(params.id)
          const s = yield* api(store.finishDescent(params.id))
          yield* notifier.notify(hostTopic(before.hostId))
          yield* drainQueue
          return s
        }),
      )
      .handle("end", ({ params }) =>
        Effect.gen(function* () {
          const before = yield* sessionFor(params.id)
          const open = yield* api(store.openMove(params.id))
          const s: Session = yield* api(store.endSession(params.id))
          yield* notifier.notify(hostTopic(before.hostId), open === null ? null : hostTopic(open.targetHostId), open === null ? null : moveTopic(open.id))
          yield* drainQueue
          return s
        }),
      )
      .handle("move", ({ params, payload }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          const begun = yield* api(store.beginMove({ sessionId: params.id, targetHostId: payload.targetHostId, maxDowntimeMs: payload.maxDowntimeMs }))
          yield* Effect.logInfo("move begun", { moveId: begun.id, sessionId: begun.sessionId, from: begun.sourceHostId, to: begun.targetHostId })
          yield* notifier.notify(hostTopic(begun.sourceHostId), hostTopic(begun.targetHostId))
          const deadline = (yield* Clock.currentTimeMillis) + settings.config.moveTimeoutMs
          // Level-triggered: the source agent sees the pending move in its assignments, runs the
          // rounds and commits or aborts it; this request waits for that outcome.
          for (;;) {
            const m = yield* api(store.getMove(begun.id))
            if (m.state !== "pending") return yield* moveOutcome(m)
            const remaining = deadline - (yield* Clock.currentTimeMillis)
            if (remaining <= 0) break
            yield* notifier.wait([moveTopic(begun.id)], Math.min(remaining, settings.sharedStore ? settings.config.storePollMs : 1000))
          }
          // Timed out. Abort only while the source has not recorded its final round: after that
          // the guest has paused and the target may already run it (SPEC §5: no second check
          // after the final round is sent), so the agent's commit or abort must settle the move.
          // The store decides atomically (`onlyBeforeFinalRound`), so a final round recorded
          // through any replica wins over this abort or loses to it, never both. A Conflict
          // means the move is no longer abortable: a final round is recorded (it stays pending),
          // or the agent settled it meanwhile; the re-read tells which.
          const decided = yield* store.abortMove(begun.id, "timeout", { onlyBeforeFinalRound: true }).pipe(
            Effect.catchTag("Conflict", () => store.getMove(begun.id)),
            (eff) => api(eff),
          )
          if (decided.state === "pending") {
            metrics.inc("engram_moves_total", { outcome: "commit_pending" })
            yield* Effect.logWarning("move wait timed out after the final round; left pending for the source's commit", {
              moveId: decided.id,
              sessionId: decided.sessionId,
              from: decided.sourceHostId,
              to: decided.targetHostId,
            })
            return yield* new ServiceUnavailable({
              error: "MoveCommitPending",
              message:
                `move ${decided.id}: the source paused the guest and recorded the final round, but did not commit or abort within ` +
                `${settings.config.moveTimeoutMs} ms. The move was not aborted (the target may already run the guest); ` +
                `it stays pending until the source agent settles it. GET /v1/moves/${decided.id} shows the outcome`,
              retryAfterMs: commitPendingRetryAfterMs,
              moveId: decided.id,
              maxDowntimeMs: decided.maxDowntimeMs,
            })
          }
          if (decided.state === "aborted" && decided.abortReason === "timeout") {
            yield* notifier.notify(hostTopic(begun.sourceHostId), hostTopic(begun.targetHostId))
            yield* drainQueue
          }
          return yield* moveOutcome(decided)
        }),
      )
  }),
)

const MovesLive = HttpApiBuilder.group(CoordinatorApi, "moves", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    const notifier = yield* Notifier
    const moveFor = (id: string, who: "source" | "either") =>
      Effect.gen(function* () {
        const m = yield* api(store.getMove(id))
        yield* who === "source" ? requireHostOrAdmin(m.sourceHostId) : requireHostOrAdmin(m.sourceHostId, m.targetHostId)
        return m
      })
    const changed = (m: Move) => notifier.notify(moveTopic(m.id), hostTopic(m.sourceHostId), hostTopic(m.targetHostId))
    return h
      .handle("get", ({ params }) => moveFor(params.id, "either"))
      .handle("round", ({ params, payload }) =>
        Effect.gen(function* () {
          yield* moveFor(params.id, "source")
          // Once a final round is recorded, the store refuses the waiter's timeout abort
          // (`abortMove(…, {onlyBeforeFinalRound})`): the record is the point of no return.
          const m = yield* api(store.recordRound(params.id, payload))
          yield* changed(m)
          return m
        }),
      )
      .handle("commit", ({ params, payload }) =>
        Effect.gen(function* () {
          yield* moveFor(params.id, "source")
          const m = yield* api(store.commitMove(params.id, payload))
          yield* changed(m)
          yield* drainQueue
          return m
        }),
      )
      .handle("abort", ({ params, payload }) =>
        Effect.gen(function* () {
          yield* moveFor(params.id, "source")
          if (payload.reason.trim() === "") return yield* badRequest("reason", "must be a non-empty string")
          // The estimate is kept on the move record, so a waiter on any replica can answer it.
          const m = yield* api(store.abortMove(params.id, payload.reason, { estimateMs: payload.estimateMs }))
          yield* changed(m)
          yield* drainQueue
          return m
        }),
      )
  }),
)

const FleetLive = HttpApiBuilder.group(CoordinatorApi, "fleet", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    return h
      .handle("snapshot", () =>
        Effect.gen(function* () {
          yield* requireAdmin
          const fleet = yield* api(store.fleetView())
          return { ...Fleet.snapshot(fleet, store.limits()), readAt: fleet.readAt }
        }),
      )
      .handle("noFit", ({ query }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          const budget = { memMib: query.memMib, vcpus: query.vcpus }
          const bad = Validate.budget(budget)
          if (bad !== null) return yield* badRequest(bad.field, bad.rule)
          const fleet = yield* api(store.fleetView())
          const limits = store.limits()
          return {
            fits: Placement.pick(fleet.hosts, { budget }, limits) !== null,
            hosts: Placement.noFit(fleet.hosts, { budget }, limits),
          }
        }),
      )
  }),
)

const LedgerLive = HttpApiBuilder.group(CoordinatorApi, "ledger", (h) =>
  Effect.gen(function* () {
    const store = yield* Store
    return h
      .handle("reserve", ({ payload }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* api(store.reserve({ ...payload, id: payload.id ?? randomUUID() }))
        }),
      )
      .handle("list", ({ query }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* api(store.listReservations({ hostId: query.hostId }))
        }),
      )
      .handle("get", ({ params }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* api(store.getReservation(params.id))
        }),
      )
      .handle("release", ({ params }) =>
        Effect.gen(function* () {
          yield* requireAdmin
          const r = yield* api(store.release(params.id))
          yield* drainQueue
          return r
        }),
      )
      .handle("heartbeat", ({ params }) =>
        Effect.gen(function* () {
          const r = yield* api(store.getReservation(params.id))
          yield* requireHostOrAdmin(r.hostId)
          return yield* api(store.heartbeat(params.id))
        }),
      )
      .handle("summary", () =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* api(store.clusterSummary())
        }),
      )
      .handle("metrics", () =>
        Effect.gen(function* () {
          yield* requireAdmin
          return yield* api(store.metrics())
        }),
      )
  }),
)

/** Every group's handlers; needs the shared services (store, metrics, notifier, leader, settings, host tokens). */
export const HandlersLive = Layer.mergeAll(HealthLive, OpsLive, HostsLive, SessionsLive, MovesLive, FleetLive, LedgerLive)
