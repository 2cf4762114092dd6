/** `/livez`, `/healthz`, `/readyz`, `/openapi.json` and `/metrics`. */
import { EngramApi, ServiceUnavailable } from "@engram/api"
import { Fleet } from "@engram/core"
import type { ParkGate } from "@engram/core"
import { Changes, Store } from "@engram/store"
import { StorePg } from "@engram/store-pg"
import { Clock, Effect, Option } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import * as HandlerGroup from "../HandlerGroup.js"
import { AdminToken, sameHash } from "../Auth.js"
import { answerFor, openApiAnswer } from "../EncodedOnce.js"
import { api, writesRefusedError } from "../HttpErrors.js"
import { Leader } from "../Leader.js"
import { Metrics } from "../Metrics.js"
import type { StoreGaugeValue } from "../Metrics.js"
import { ruleNow } from "../Reaper.js"
import { Settings } from "../Settings.js"
import { bounded, probeTimedOut, readOnlyHoldMs, StoreHealth } from "../StoreBound.js"

/**
 * The store's gauges for one scrape: the fleet signal, the ledger's counts and the sessions by
 * state, as far as they could be read within `probeTimeoutMs` (the reads at once): a store that does not answer
 * leaves them out and `engram_store_up` 0, rather than the scrape waiting out the store's bound.
 * The queue without room is counted as the reaper's gate (`gate`: its options) counts it.
 */
const storeGauges = (probeTimeoutMs: number, gate: ParkGate.Options) => Effect.gen(function* () {
  const store = yield* Store
  const [fleet, ledger, sessions] = yield* Effect.all(
    [
      Effect.result(bounded(store.fleetView(), probeTimeoutMs, "the fleet read of a scrape", probeTimedOut)),
      Effect.result(bounded(store.metrics(), probeTimeoutMs, "the ledger read of a scrape", probeTimedOut)),
      Effect.result(bounded(store.countSessions(), probeTimeoutMs, "the session count of a scrape", probeTimedOut)),
    ],
    { concurrency: 3 },
  )
  const gauges: StoreGaugeValue[] = []
  if (fleet._tag === "Success") {
    const snap = Fleet.snapshot(fleet.success, store.limits(), fleet.success.readAt, gate)
    gauges.push(
      { name: "engram_queue_length", value: snap.queue.sessions },
      { name: "engram_queue_without_room", value: snap.queue.withoutRoom },
      { name: "engram_parks", value: snap.parks },
      { name: "engram_descents_running", value: snap.descentsRunning },
      { name: "engram_hosts", value: snap.hosts.total },
      { name: "engram_hosts_silent", value: snap.hosts.silent },
      { name: "engram_free_mib", value: snap.freeMib },
      { name: "engram_capacity_mib", value: snap.capacityMib },
      { name: "engram_free_vcpus", value: snap.freeVcpus },
      { name: "engram_unplaceable", value: snap.unplaceable.count },
    )
  }
  if (ledger._tag === "Success") {
    gauges.push({ name: "engram_reserve_failures", value: ledger.success.reserveFailures }, { name: "engram_ledger_active_entries", value: ledger.success.activeEntries })
  }
  return { up: fleet._tag === "Success", gauges, sessions: sessions._tag === "Success" ? sessions.success : undefined }
})

export const OpsHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const metrics = yield* Metrics
    const settings = yield* Settings
    const leader = yield* Leader
    // Whether other replicas' changes reach this one now (ChangesPg: its LISTEN connection is up).
    const changes = yield* Changes
    const health = yield* StoreHealth
    const ownFingerprint = (yield* AdminToken).fingerprint
    const gate = (yield* ruleNow).options
    /** Whether this replica's admin token is the leader's, when another leader is known (constant time). */
    const tokenMatch = (): { readonly adminTokenMatchesLeader?: boolean } => {
      const leaders = leader.isLeader() ? null : (leader.leaderAdminTokenHash?.() ?? null)
      return leaders === null ? {} : { adminTokenMatchesLeader: sameHash(leaders, ownFingerprint) }
    }
    // A store on PostgreSQL or PGlite counts its placements' version checks; another store does not.
    const stats = yield* Effect.serviceOption(StorePg.PlacementStats)
    // The document never changes while the process runs: encoded and tagged once, its bytes (or a
    // 304, to a client that holds them) for every request.
    const openApi = openApiAnswer()
    const alive = () => Effect.succeed({ ok: true })
    return HttpApiBuilder.group(EngramApi, "ops", (h) =>
      h
        .handle("livez", alive)
        .handle("healthz", alive)
        .handle("readyz", () =>
          Effect.flatMap(Clock.currentTimeMillis, (nowMs) => {
            // A read alone would say ready while every write fails (a full disk, a database that only reads).
            const refused = health.writesRefused(nowMs)
            return refused === null
              ? Effect.void
              : Effect.fail(
                  new ServiceUnavailable({
                    error: writesRefusedError[refused.kind],
                    message:
                      refused.kind === "disk_full"
                        ? `${refused.message}; not ready until a write succeeds again`
                        : `${refused.message}; not ready until a write succeeds again, or ${readOnlyHoldMs / 1000} s after the last write refused`,
                    retryAfterMs: refused.kind === "disk_full" ? 30_000 : 5_000,
                  }),
                )
          }).pipe(
            // A probe's own short bound: a readiness probe gives up after about a second.
            Effect.andThen(api(bounded(store.metrics(), settings.config.probeTimeoutMs, "a readiness check", probeTimedOut))),
            Effect.map(() => ({ ok: true, store: settings.backend, leader: leader.isLeader(), ...tokenMatch() })),
            Effect.mapError((e) => (e instanceof ServiceUnavailable ? e : new ServiceUnavailable({ error: "Unavailable", message: e.message, retryAfterMs: 1000 }))),
          ),
        )
        .handle("openapi", ({ request }) => Effect.succeed(answerFor(openApi, request.headers["if-none-match"])))
        .handle("metrics", () => storeGauges(settings.config.probeTimeoutMs, gate).pipe(
            Effect.provideService(Store, store),
            Effect.map((read) => ({ ...read, checks: Option.getOrUndefined(stats)?.checks(), listenerUp: changes.live() })),
            Effect.flatMap(metrics.scrape),
          ))
    )
  }),
)
