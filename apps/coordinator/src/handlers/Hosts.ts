/** `/v1/hosts…`: registration, removal, token rotation, report, heartbeat, administrative states, assignments. */
import { EngramApi } from "@engram/api"
import { nowOf, Store, Validate } from "@engram/store"
import type { HostView } from "@engram/store"
import { Effect, Scope } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import * as AgentBound from "../AgentBound.js"
import * as Allowances from "../Allowances.js"
import { Assignments } from "../Assignments.js"
import { hashToken, newToken, requireHostOrAdmin } from "../Auth.js"
import * as HandlerGroup from "../HandlerGroup.js"
import { api } from "../HttpErrors.js"
import { LongPolls } from "../LongPolls.js"
import * as ParkedPoll from "../ParkedPoll.js"
import * as Parking from "../Parking.js"
import { Settings } from "../Settings.js"
import { Metrics } from "../Metrics.js"
import { credentialTopic, fleetTopic, hostTopic, Notifier, sessionTopic, withNotices } from "../Notifier.js"
import { Drainer } from "../Drainer.js"
import { hostJson, pageJson } from "../Views.js"

export const HostsHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const notifier = yield* Notifier
    const metrics = yield* Metrics
    const drainer = yield* Drainer
    const assignments = yield* Assignments
    const longPolls = yield* LongPolls
    const assignmentsPoll = ParkedPoll.make(notifier, longPolls, (hostId) => api(assignments.read(hostId)))
    // Hosts whose new peer URL their moves' sources have not been told yet (the pending-moves
    // read failed): told at their next report, changed or not. What a report changed is the
    // store's answer (judged inside its write), so no other memory of reports is kept here.
    const peerUrlOwed = new Set<string>()
    const settings = yield* Settings
    const scope = yield* Scope.Scope
    /** Now on the store's clock (the database's on PostgreSQL: the one its report times were stamped on), else this replica's. */
    const storeNow = nowOf(store)
    /** A host as answered: whether its agent is silent is judged now, on the store's clock, against the store's window. */
    const shown = (view: HostView) => Effect.map(storeNow, (now) => hostJson(view, { now, limits: store.limits() }))
    // An agent's heartbeat and report answer within the bound it states (503 StoreStalled past it).
    const withinAgentBound = yield* AgentBound.make

    /**
     * A report whose write timed out or whose client left: it may still commit after the answer
     * (a grouped statement waits its turn, then runs up to `ENGRAM_STORE_TIMEOUT_MS`), and the
     * agent's retry, through any replica, would then see no change. Its host is owed a look here
     * at its next report, and one after twice the store's bound in any case (a notice too many is
     * harmless: it answers no poll whose version did not change), with a drain.
     */
    const outcomeUnknown = (hostId: string) =>
      Effect.gen(function* () {
        peerUrlOwed.add(hostId)
        yield* Effect.sleep(2 * settings.config.storeTimeoutMs).pipe(
          Effect.andThen(Effect.suspend(() => (peerUrlOwed.has(hostId) ? peerUrlReported(hostId) : Effect.void))),
          Effect.andThen(drainer.roomAppeared(fleetTopic)),
          Effect.forkIn(scope),
        )
      })

    /**
     * The topics of the hosts whose pending sessions' descent image `hostId` holds: their
     * assignments name it (`imageHosts`, its peer URL, or that it was removed).
     */
    const fetchersOf = (hostId: string) =>
      Effect.map(store.listSessions({ state: "pending", imageHostId: hostId }), (ss) =>
        ss.flatMap((x) => (x.hostId !== null && x.hostId !== hostId ? [hostTopic(x.hostId)] : [])),
      )

    /**
     * A host's agent now serves its peers elsewhere (a restart on a new address, or none): the
     * sources of its pending moves, and the hosts fetching a descent image from it (their pending
     * sessions' image host), have it in their assignments, so their topics are notified (their
     * copies dropped on every replica, their polls answered with the new URL). A failed read
     * leaves the host owed, tried again at its next report.
     */
    const peerUrlReported = (hostId: string) =>
      Effect.gen(function* () {
        const pending = yield* Effect.result(Effect.all([store.listMoves({ hostId, state: "pending" }), fetchersOf(hostId)]))
        if (pending._tag === "Failure") {
          peerUrlOwed.add(hostId)
          return
        }
        peerUrlOwed.delete(hostId)
        const [moves, fetchers] = pending.success
        const sources = moves.filter((m) => m.targetHostId === hostId).map((m) => hostTopic(m.sourceHostId))
        const told = [...new Set([...sources, ...fetchers])]
        if (told.length > 0) yield* notifier.notify(...told)
      })

    const setState = (id: string, state: "ready" | "cordoned" | "draining") =>
      withNotices(Effect.gen(function* () {
        const view = yield* api(store.setHostState(id, state))
        // Uncordoned: room appeared. Cordoned or draining: only the host's own view changed.
        if (state === "ready") yield* drainer.roomAppeared(hostTopic(id))
        else yield* notifier.notify(hostTopic(id))
        return yield* shown(view)
      }))

    return HttpApiBuilder.group(EngramApi, "hosts", (h) =>
      h
        .handle("create", ({ payload }) =>
          withNotices(Effect.gen(function* () {
            const token = newToken()
            const host = yield* api(store.registerHost({ id: payload.id, labels: payload.labels, tokenHash: hashToken(token) }))
            // A credential was issued: every replica drops the tokens it keeps as finding no host
            // (`Credentials`), so the new one authenticates at once wherever the agent calls.
            yield* notifier.notify(credentialTopic(host.id))
            yield* Effect.logInfo("host registered", { hostId: host.id })
            // No drain: registration is not readiness, the host takes placements after its first report.
            return { id: host.id, token }
          })),
        )
        .handle("list", ({ query }) => api(store.pageHosts({ limit: query.limit, cursor: query.cursor })).pipe(
            Effect.flatMap((page) => Effect.map(storeNow, (now) => pageJson(page, (h) => hostJson(h, { now, limits: store.limits() })))),
          ),
        )
        .handle("remove", ({ params }) =>
          withNotices(Effect.gen(function* () {
            const view = yield* Effect.interruptible(api(store.getHost(params.id)))
            yield* api(store.removeHost(params.id))
            peerUrlOwed.delete(params.id)
            yield* Effect.logInfo("host removed", { hostId: params.id })
            // Its token stops working at once, its open long-polls with it (401), on every replica.
            yield* notifier.notify(hostTopic(params.id), credentialTopic(params.id))
            // The hosts fetching a descent image from it learn it is gone (`imageHosts`' `removed`)
            // and boot those sessions fresh now rather than at their fetch deadline. Read after
            // the removal: a resume placed since names a removed host. Best effort: a failed read
            // leaves them to their deadline (or to their next change).
            const fetchers = yield* Effect.result(fetchersOf(params.id))
            if (fetchers._tag === "Success" && fetchers.success.length > 0) yield* notifier.notify(...new Set(fetchers.success))
            if (fetchers._tag === "Failure") {
              yield* Effect.logWarning("the hosts fetching descent images from a removed host were not told: they boot those sessions fresh at their fetch deadline", {
                hostId: params.id,
                error: fetchers.failure.reason,
              })
            }
            return yield* shown(view)
          })),
        )
        .handle("rotateToken", ({ params }) =>
          withNotices(Effect.gen(function* () {
            const token = newToken()
            yield* api(store.setHostTokenHash(params.id, hashToken(token)))
            // The old token's open long-polls end with 401 at once, on every replica, and each drops
            // the tokens it keeps as finding no host (the new one authenticates at once).
            yield* notifier.notify(credentialTopic(params.id))
            yield* Effect.logInfo("host token rotated", { hostId: params.id })
            return { id: params.id, token }
          })),
        )
        .handle("get", ({ params }) => requireHostOrAdmin(params.id).pipe(Effect.andThen(api(store.getHost(params.id))), Effect.flatMap(shown)))
        .handle("allowances", ({ params, query }) =>
          Effect.gen(function* () {
            yield* requireHostOrAdmin(params.id)
            yield* api(store.getHost(params.id))
            const priorMs = settings.config.limits.commitAllowanceMs
            const horizonMs = settings.config.allowanceHorizonMs
            const items = yield* api(Allowances.histories(store, { priorMs, horizonMs }, params.id, query.targetHostId))
            return { hostId: params.id, priorMs, horizonMs, items }
          }),
        )
        .handle("report", ({ params, payload }) =>
          Effect.gen(function* () {
            yield* requireHostOrAdmin(params.id)
            // A bad activity list refuses the whole report before anything is written.
            const badActivity = payload.activeSessions === undefined ? null : Validate.activity(payload.activeSessions)
            if (badActivity) yield* api(Effect.fail(badActivity))
            const report = {
              totalMib: payload.totalMib ?? null,
              allocatableMib: payload.allocatableMib ?? null,
              totalVcpus: payload.totalVcpus ?? null,
              templates: payload.templates ?? [],
              // Each report says where its agent serves peers now (none: null), so a restart's new URL replaces the old.
              peerUrl: payload.peerUrl ?? null,
            }
            // The store says what this report changed, against the host as stored (whichever
            // replica wrote the last report; a host's first report changes everything). Only the
            // request that wrote a change is told of it: once written, its notices are sent even if
            // the client leaves (uninterruptible), and before anything else that may fail.
            const view = yield* Effect.uninterruptibleMask((restore) =>
              restore(store.reportHost(params.id, report)).pipe(
                // Interrupted (the client left) or timed out: the write may still commit after this answer.
                Effect.onInterrupt(() => outcomeUnknown(params.id)),
                Effect.tapError((e) => (e._tag === "Unavailable" ? outcomeUnknown(params.id) : Effect.void)),
                Effect.tap((written) =>
                  Effect.gen(function* () {
                    // A store that does not say (older than `ReportedHost`'s flags) is taken as changed.
                    if (written.peerUrlChanged !== false || peerUrlOwed.has(params.id)) yield* peerUrlReported(params.id)
                    // The same figures again (every report interval) make no room appear: no notice (a
                    // transaction of its own on PostgreSQL), no drain. A queue that room from elsewhere
                    // could serve is drained by the reaper's next pass anyway.
                    // A report that ends a silence (`wasSilent`: the host took nothing while its agent was
                    // silent) makes its room appear again, as a first report does.
                    if (written.figuresChanged !== false || written.wasSilent === true) yield* drainer.roomAppeared(fleetTopic)
                  }),
                ),
              ),
            ).pipe(api)
            // Guest activity rides on the report (no request per session): it restarts those sessions' idle clocks.
            if (payload.activeSessions !== undefined && payload.activeSessions.length > 0) yield* api(store.recordActivity(params.id, payload.activeSessions))
            return yield* shown(view)
          }).pipe((work) => withinAgentBound(work, "reportHost")),
        )
        .handle("heartbeat", ({ params }) =>
          requireHostOrAdmin(params.id).pipe(
            Effect.andThen(api(store.heartbeatHost(params.id))),
            Effect.map((renewed) => ({ hostId: params.id, renewed })),
            (work) => withinAgentBound(work, "heartbeatHost"),
          ),
        )
        .handle("guestLost", ({ params, payload }) =>
          withNotices(
            Effect.gen(function* () {
              yield* requireHostOrAdmin(params.id)
              const s = yield* api(store.recordGuestLost(params.id, payload.sessionId, payload.reason))
              metrics.guestsLost.inc()
              yield* Effect.logWarning(
                s.hostId === params.id
                  ? "a host's agent lost a session's guest and booted a fresh one: the session's memory state is gone"
                  : "a host's agent lost a session's guest before a move took the session away (its report came after the move): the session's memory state is gone",
                { hostId: params.id, sessionId: s.id, state: s.state, sessionHostId: s.hostId, reason: payload.reason },
              )
              // Its history grew: whoever follows the session hears of it.
              yield* notifier.notify(sessionTopic(s.id))
              return s
            }),
          ),
        )
        .handle("cordon", ({ params }) => setState(params.id, "cordoned"))
        .handle("uncordon", ({ params }) => setState(params.id, "ready"))
        .handle("drain", ({ params }) => setState(params.id, "draining"))
        // Parks no fiber while it waits (`ParkedPoll`) when the edge holds the request (it holds
        // every request whose URL names assignments); else it waits in the request's fiber.
        .handle("assignments", ({ params, query, request }) =>
          requireHostOrAdmin(params.id).pipe(
            Effect.andThen(Parking.isHeld),
            Effect.flatMap((held) =>
              held
                ? assignmentsPoll(request, params.id, { waitMs: query.waitMs ?? 0, since: query.since })
                : longPolls.run(api(assignments.poll(params.id, { waitMs: query.waitMs ?? 0, since: query.since }))),
            ),
          ),
        )
    )
  }),
)
