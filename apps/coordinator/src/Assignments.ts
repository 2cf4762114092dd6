/**
 * A host's assignments (its desired state: the sessions with work for its agent, its pending
 * moves, and the limits its move guard uses) and the agent's long-poll on them. The version is
 * a hash of what the agent acts on, so it changes exactly when the assignments do. A waiter is
 * woken by the notifier (on PostgreSQL, by a change made through any replica: LISTEN/NOTIFY);
 * on a shared store it also re-reads the store every `storePollMs`, the fallback for a
 * notification lost with the listening connection.
 */
import type { Records } from "@engram/api"
import { Store } from "@engram/store"
import type { NotFound, Unavailable } from "@engram/store"
import { Clock, Context, Effect, Layer } from "effect"
import { createHash } from "node:crypto"
import { hostTopic, Notifier } from "./Notifier.js"
import { Settings } from "./Settings.js"

/** The states in which a session has work for its host's agent. */
const assignedStates: ReadonlySet<string> = new Set(["pending", "running", "parked", "descending", "moving"])

/** The longest an assignments request may wait. */
export const maxWaitMs = 30_000

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
  static readonly layer: Layer.Layer<Assignments, never, Store | Notifier | Settings> = Layer.effect(
    Assignments,
    Effect.gen(function* () {
      const store = yield* Store
      const notifier = yield* Notifier
      const settings = yield* Settings
      const current = (hostId: string) =>
        Effect.gen(function* () {
          const sessions = (yield* store.listSessions({ hostId })).filter((s) => assignedStates.has(s.state))
          // Pending moves where the host is the source or the target, oldest first.
          const moves = yield* store.listMoves({ hostId, state: "pending" })
          const version = createHash("sha256")
            .update(JSON.stringify([sessions.map((s) => [s.id, s.state, s.updatedAt]), moves.map((m) => [m.id, m.state, m.rounds.length])]))
            .digest("base64url")
            .slice(0, 22)
          // The limits an agent's move guard uses come from here, so agents and coordinator agree.
          return { hostId, version, sessions, moves, limits: { commitAllowanceMs: settings.config.limits.commitAllowanceMs } }
        })
      const read = (hostId: string) => store.getHost(hostId).pipe(Effect.andThen(current(hostId)))
      const poll: AssignmentsShape["poll"] = (hostId, { waitMs, since }) =>
        Effect.gen(function* () {
          let latest = yield* read(hostId)
          const wait = Math.min(waitMs, maxWaitMs)
          if (wait <= 0) return latest
          const baseline = since ?? latest.version
          const deadline = (yield* Clock.currentTimeMillis) + wait
          while (latest.version === baseline) {
            const remaining = deadline - (yield* Clock.currentTimeMillis)
            if (remaining <= 0) break
            // The fallback for a notification lost with a listening connection: re-read every storePollMs.
            const slice = settings.sharedStore ? Math.min(remaining, settings.config.storePollMs) : remaining
            yield* notifier.wait([hostTopic(hostId) as string], slice)
            latest = yield* current(hostId)
          }
          return latest
        })
      return Assignments.of({ read, poll })
    }),
  )
}
