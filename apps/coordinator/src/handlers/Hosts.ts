/** `/v1/hosts…`: registration, removal, token rotation, report, heartbeat, administrative states, assignments. */
import { EngramApi } from "@engram/api"
import { Store, Validate } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import * as Allowances from "../Allowances.js"
import { Assignments } from "../Assignments.js"
import { hashToken, newToken, requireHostOrAdmin } from "../Auth.js"
import * as HandlerGroup from "../HandlerGroup.js"
import { api } from "../HttpErrors.js"
import { LongPolls } from "../LongPolls.js"
import { Settings } from "../Settings.js"
import { credentialTopic, fleetTopic, hostTopic, Notifier } from "../Notifier.js"
import { Drainer } from "../Drainer.js"
import { hostJson, pageJson } from "../Views.js"

export const HostsHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const notifier = yield* Notifier
    const drainer = yield* Drainer
    const assignments = yield* Assignments
    const longPolls = yield* LongPolls
    // The figures of each host's last report written through this process. An agent reports
    // the same figures every interval: such a report makes no room appear, so it sends no notice
    // and starts no drain (each notice is a transaction of its own on PostgreSQL). A queue that
    // room from elsewhere could serve is drained by the reaper's next pass anyway.
    const lastFigures = new Map<string, string>()
    // The peer URL of each host's last report seen here (a host not seen yet: unknown, so its
    // first report here counts as a change: another replica may have seen the one before).
    const lastPeerUrls = new Map<string, string | null>()
    const settings = yield* Settings

    /**
     * A host's agent now serves its peers at `peerUrl` (a restart on a new address, or none):
     * the sources of its pending moves have it in their assignments, so their topics are
     * notified (their copies dropped on every replica, their polls answered with the new URL).
     * Remembered once told; a failed read is tried again at the next report.
     */
    const peerUrlReported = (hostId: string, peerUrl: string | null) =>
      Effect.gen(function* () {
        if (lastPeerUrls.has(hostId) && lastPeerUrls.get(hostId) === peerUrl) return
        const pending = yield* Effect.result(store.listMoves({ hostId, state: "pending" }))
        if (pending._tag === "Failure") return
        const sources = pending.success.filter((m) => m.targetHostId === hostId).map((m) => hostTopic(m.sourceHostId))
        if (sources.length > 0) yield* notifier.notify(...sources)
        lastPeerUrls.set(hostId, peerUrl)
      })

    const setState = (id: string, state: "ready" | "cordoned" | "draining") =>
      Effect.gen(function* () {
        const view = yield* api(store.setHostState(id, state))
        // Uncordoned: room appeared. Cordoned or draining: only the host's own view changed.
        if (state === "ready") yield* drainer.roomAppeared(hostTopic(id))
        else yield* notifier.notify(hostTopic(id))
        return hostJson(view)
      })

    return HttpApiBuilder.group(EngramApi, "hosts", (h) =>
      h
        .handle("create", ({ payload }) =>
          Effect.gen(function* () {
            const token = newToken()
            const host = yield* api(store.registerHost({ id: payload.id, labels: payload.labels, tokenHash: hashToken(token) }))
            yield* Effect.logInfo("host registered", { hostId: host.id })
            // No drain: registration is not readiness, the host takes placements after its first report.
            return { id: host.id, token }
          }),
        )
        .handle("list", ({ query }) => api(store.pageHosts({ limit: query.limit, cursor: query.cursor })).pipe(Effect.map((page) => pageJson(page, hostJson))))
        .handle("remove", ({ params }) =>
          Effect.gen(function* () {
            const view = yield* api(store.getHost(params.id))
            yield* api(store.removeHost(params.id))
            lastFigures.delete(params.id)
            lastPeerUrls.delete(params.id)
            yield* Effect.logInfo("host removed", { hostId: params.id })
            // Its token stops working at once, its open long-polls with it (401), on every replica.
            yield* notifier.notify(hostTopic(params.id), credentialTopic(params.id))
            return hostJson(view)
          }),
        )
        .handle("rotateToken", ({ params }) =>
          Effect.gen(function* () {
            const token = newToken()
            yield* api(store.setHostTokenHash(params.id, hashToken(token)))
            // The old token's open long-polls end with 401 at once, on every replica.
            yield* notifier.notify(credentialTopic(params.id))
            yield* Effect.logInfo("host token rotated", { hostId: params.id })
            return { id: params.id, token }
          }),
        )
        .handle("get", ({ params }) => requireHostOrAdmin(params.id).pipe(Effect.andThen(api(store.getHost(params.id))), Effect.map(hostJson)))
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
            const view = yield* api(store.reportHost(params.id, report))
            yield* peerUrlReported(params.id, report.peerUrl)
            // Guest activity rides on the report (no request per session): it restarts those sessions' idle clocks.
            if (payload.activeSessions !== undefined && payload.activeSessions.length > 0) yield* api(store.recordActivity(params.id, payload.activeSessions))
            const figures = JSON.stringify(report)
            if (lastFigures.get(params.id) !== figures) {
              lastFigures.set(params.id, figures)
              yield* drainer.roomAppeared(fleetTopic)
            }
            return hostJson(view)
          }),
        )
        .handle("heartbeat", ({ params }) =>
          requireHostOrAdmin(params.id).pipe(
            Effect.andThen(api(store.heartbeatHost(params.id))),
            Effect.map((renewed) => ({ hostId: params.id, renewed })),
          ),
        )
        .handle("cordon", ({ params }) => setState(params.id, "cordoned"))
        .handle("uncordon", ({ params }) => setState(params.id, "ready"))
        .handle("drain", ({ params }) => setState(params.id, "draining"))
        .handle("assignments", ({ params, query }) =>
          requireHostOrAdmin(params.id).pipe(Effect.andThen(longPolls.run(api(assignments.poll(params.id, { waitMs: query.waitMs ?? 0, since: query.since }))))),
        )
    )
  }),
)
