/**
 * A host's assignments (its desired state: the sessions with work for its agent, its pending
 * moves, and the limits its move guard uses) and the agent's long-poll on them. The version is
 * a hash of the sessions and moves the agent acts on, so it changes exactly when they do (not
 * when a pending move's allowance does: see {@link versionOf}). A move's
 * rounds are not part of it (no agent acts on them, and a round does not notify the hosts'
 * topics): the moves of an answer may show fewer rounds than `GET /v1/moves/{id}`.
 *
 * A long-poll is woken by the change itself: every write that changes a host's assignments
 * notifies the host's topic (through any replica: `Changes`), which wakes its waiter and drops
 * the host's copy in memory (`TopicCache`). So a poll of an idle host reads the store neither
 * while it waits nor when it answers at its deadline: it answers the copy, which no change has
 * touched since it was read.
 */
import { Payloads, Records } from "@engram/api"
import { Store } from "@engram/store"
import type { NotFound, Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import { createHash } from "node:crypto"
import { hostTopic, Notifier } from "./Notifier.js"
import * as Allowances from "./Allowances.js"
import { Settings } from "./Settings.js"
import * as TopicCache from "./TopicCache.js"

/** The longest an assignments request may wait (`@engram/api`'s, which agents' poll waits are checked against). */
export const maxWaitMs = Payloads.maxAssignmentsWaitMs

/** The most hosts whose assignments are kept in memory (the oldest go first beyond it). */
export const maxCachedHosts = 100_000

/**
 * The version of a host's assignments: a hash of its sessions and moves, with the peer URL of
 * each target of its moves (`targetPeerUrl`: a target that reports a new one notifies the topics
 * of its pending moves' sources, so their polls answer it at once), and with the sessions whose
 * descent image it holds (`imageSessions`: a session that runs again elsewhere or ends notifies
 * its image host's topic, so the agent removes the image), and with the hosts holding the images
 * of its resumed sessions (`imageHosts`: an image host that reports a new peer URL, or is removed,
 * notifies the topics of the hosts its pending sessions are placed on, so their polls answer the
 * new URL, or the removal, at once). Not of the allowances:
 * they follow the clock and other pairs' commits, which notify no host's topic, so two replicas
 * (each with its own copy) may compute different ones for the same host, and an agent polling
 * both would see a new version on every poll. A move's allowance is the one read when the move
 * appeared (its id is in the version); the agent reads it when it starts the move.
 */
export const versionOf = (
  sessions: readonly Pick<Records.Session, "id" | "state" | "updatedAt">[],
  moves: readonly (Pick<Records.Move, "id" | "state"> & { readonly targetPeerUrl?: string | null | undefined })[],
  imageSessions: readonly string[] = [],
  imageHosts: readonly Records.ImageHost[] = [],
): string =>
  createHash("sha256")
    .update(
      JSON.stringify([
        sessions.map((s) => [s.id, s.state, s.updatedAt]),
        moves.map((m) => (m.targetPeerUrl === undefined ? [m.id, m.state] : [m.id, m.state, m.targetPeerUrl])),
        // Only when there are any: a host holding no image keeps the version it had before image lists.
        ...(imageSessions.length === 0 ? [] : [imageSessions]),
        // Likewise (an object: never taken for the list above).
        ...(imageHosts.length === 0 ? [] : [{ imageHosts: imageHosts.map((h) => [h.hostId, h.peerUrl, h.removed === true]) }]),
      ]),
    )
    .digest("base64url")
    .slice(0, 22)

export interface AssignmentsShape {
  /** The host's assignments now (404 for an unknown host). */
  readonly read: (hostId: string) => Effect.Effect<Records.Assignments, NotFound | Unavailable>
  /**
   * Waits up to `waitMs` (capped at 30 s) for assignments whose version differs from `since`
   * (or from the version when the call began), and answers the latest.
   */
  readonly poll: (hostId: string, options: { readonly waitMs: number; readonly since: string | undefined }) => Effect.Effect<Records.Assignments, NotFound | Unavailable>
}

export class Assignments extends Context.Service<Assignments, AssignmentsShape>()("@engram/coordinator/Assignments") {
  static readonly layer = Layer.effect(
    Assignments,
    Effect.gen(function* () {
      const store = yield* Store
      const notifier = yield* Notifier
      const settings = yield* Settings
      const cache = yield* TopicCache.make<Records.Assignments, NotFound | Unavailable>({ maxEntries: maxCachedHosts })
      /**
       * Where each host's agent serves its peers (its last report's `peerUrl`), and whether it was
       * removed (no such host now). Read only for the targets of this host's pending moves and the
       * hosts holding its pending sessions' images (few, and only while they are pending); a host
       * removed since serves none.
       */
      const peersOf = (ids: readonly string[]) =>
        Effect.map(
          Effect.forEach([...new Set(ids)], (id) =>
            store.getHost(id).pipe(
              Effect.map((h) => [id, { peerUrl: h.peerUrl, removed: false }] as const),
              Effect.catchTag("NotFound", () => Effect.succeed([id, { peerUrl: null, removed: true }] as const)),
            ),
          ),
          (pairs) => new Map<string, { readonly peerUrl: string | null; readonly removed: boolean }>(pairs),
        )
      const load = (hostId: string) =>
        Effect.gen(function* () {
          // One read: the host (NotFound when unknown), its sessions in the assigned states and
          // its pending moves where it is the source or the target, each oldest first.
          const { sessions, moves, imageSessionIds } = yield* store.hostAssignments(hostId)
          // The limits an agent's move guard uses come from here, so agents and coordinator agree;
          // so does the allowance learned for each move it is the source of.
          const priorMs = settings.config.limits.commitAllowanceMs
          const targets = moves.filter((m) => m.sourceHostId === hostId).map((m) => m.targetHostId)
          const allowances = yield* Allowances.forTargets(store, { priorMs, horizonMs: settings.config.allowanceHorizonMs }, hostId, targets).pipe(
            Effect.catchTag("InvalidInput", (e) => Effect.die(e)),
          )
          // The hosts holding the images of the resumed sessions placed here (few: only while they are pending).
          const imageHostIds = [...new Set(sessions.flatMap((s) => (s.state === "pending" && s.imageHostId != null && s.imageHostId !== hostId ? [s.imageHostId] : [])))]
          const peers = yield* peersOf([...targets, ...imageHostIds])
          // The source learns where to reach each move's target with the move: no static list of peers on every host.
          const assigned = moves.map((m) => (m.sourceHostId === hostId ? { ...m, targetPeerUrl: peers.get(m.targetHostId)?.peerUrl ?? null } : m))
          // An image host removed from the fleet is said to be (its images never come: the agent
          // boots fresh at once rather than waiting out its fetch deadline).
          const imageHosts = imageHostIds.map((id): Records.ImageHost => {
            const p = peers.get(id)
            return p?.removed === true ? { hostId: id, peerUrl: null, removed: true } : { hostId: id, peerUrl: p?.peerUrl ?? null }
          })
          return {
            hostId,
            version: versionOf(sessions, assigned, imageSessionIds, imageHosts),
            sessions,
            moves: assigned,
            // The stale window too: an agent whose own setting is longer heartbeats within this one.
            limits: { commitAllowanceMs: priorMs, heartbeatStaleWindowMs: settings.config.limits.heartbeatStaleWindowMs },
            allowances: allowances.map(Records.assignedAllowance),
            ...(imageHosts.length === 0 ? {} : { imageHosts }),
            imageSessions: imageSessionIds,
          }
        })
      const read = (hostId: string) => cache.get(hostTopic(hostId) as string, load(hostId))
      const poll: AssignmentsShape["poll"] = (hostId, { waitMs, since }) =>
        // Watching before the first read: a change made while it runs wakes the wait below.
        notifier.withWatch([hostTopic(hostId) as string], (watch) =>
          Effect.gen(function* () {
            let latest = yield* read(hostId)
            const wait = Math.min(waitMs, maxWaitMs)
            if (wait <= 0) return latest
            const baseline = since ?? latest.version
            const deadline = (yield* Clock.currentTimeMillis) + wait
            while (latest.version === baseline) {
              const remaining = deadline - (yield* Clock.currentTimeMillis)
              if (remaining <= 0) break
              // Nothing changed by the deadline (or the poll was ended: its credential revoked):
              // what was read last is still the latest.
              const why = yield* watch.next(remaining)
              if (why === "timeout" || why === "ended") break
              latest = yield* read(hostId)
            }
            return latest
          }),
        )
      return Assignments.of({ read, poll })
    }),
  )
}
