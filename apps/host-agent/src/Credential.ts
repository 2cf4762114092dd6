/**
 * Whether the coordinator takes this agent's host token. A refused token is not a passing
 * trouble that a retry heals: it is a wrong `ENGRAM_HOST_TOKEN` (or `ENGRAM_HOST_ID`), or a
 * token rotated since. So the agent checks it before it says it is ready, and a 401 on any
 * later call ends the agent with a clear error instead of warning on every heartbeat.
 */
import { Deferred, Effect } from "effect"
import type { CoordinatorError, CoordinatorShape } from "./Coordinator.js"
import * as Pacing from "./Pacing.js"

/** Why the coordinator refuses this agent's credential, in one line. */
export const refusal = (status: number, hostId: string, url: string): string | null => {
  if (status === 401) return `the coordinator at ${url} refused this host's token (ENGRAM_HOST_TOKEN): it is wrong, the host ${hostId} (ENGRAM_HOST_ID) is not registered, or its token was rotated. Register the host (engram hosts add) or rotate its token, and start the agent with the token it prints`
  if (status === 403) return `the token in ENGRAM_HOST_TOKEN does not belong to host ${hostId} (ENGRAM_HOST_ID) at ${url}`
  return null
}

/**
 * Waits until the coordinator answers a heartbeat for this host: a refused token fails with
 * its one-line reason; an unreachable coordinator is retried (it may start after the agent, or
 * a whole fleet may boot with it), from `retryMs` backing off with jitter (`Pacing`), never
 * sooner than it asked, with a warning now and then.
 */
export const verify = (coordinator: CoordinatorShape, hostId: string, url: string, retryMs = 1000): Effect.Effect<void, string> =>
  Effect.gen(function* () {
    for (let attempt = 0; ; attempt++) {
      const r = yield* Effect.result(coordinator.heartbeat)
      if (r._tag === "Success") return
      const e = r.failure
      const reason = e._tag === "CoordinatorError" && e.status !== null ? refusal(e.status, hostId, url) : null
      if (reason !== null) return yield* Effect.fail(reason)
      if (attempt % 10 === 0) yield* Effect.logWarning(`waiting for the coordinator at ${url}`, { hostId, error: e.message })
      yield* Effect.sleep(yield* Pacing.retryDelayMs(Pacing.backoffOf(retryMs), attempt + 1, Pacing.retryAfterOf(e)))
    }
  })

/**
 * The coordinator client, watched: the first call answered 401 completes `refused` with its
 * reason (the agent's main ends on it). A 403 is not watched here: a session that moved to
 * another host answers its old host's acknowledgement with one. Every call answers as before.
 */
export const guard = (coordinator: CoordinatorShape, hostId: string, url: string, refused: Deferred.Deferred<string>): CoordinatorShape => {
  const watch = <A, E extends { readonly _tag: string }>(eff: Effect.Effect<A, E>): Effect.Effect<A, E> =>
    Effect.tapError(eff, (e) => {
      const status = e._tag === "CoordinatorError" ? (e as unknown as CoordinatorError).status : null
      const reason = status === 401 ? refusal(status, hostId, url) : null
      return reason === null ? Effect.void : Deferred.succeed(refused, reason)
    })
  return {
    report: (r, activeSessions) => watch(coordinator.report(r, activeSessions)),
    heartbeat: watch(coordinator.heartbeat),
    assignments: (o) => watch(coordinator.assignments(o)),
    started: (id) => watch(coordinator.started(id)),
    descended: (id, options) => watch(coordinator.descended(id, options)),
    round: (id, round) => watch(coordinator.round(id, round)),
    commit: (id, phases, guard) => watch(coordinator.commit(id, phases, guard)),
    abort: (id, reason, estimateMs) => watch(coordinator.abort(id, reason, estimateMs)),
    reportRunning: (id, reason) => watch(coordinator.reportRunning(id, reason)),
    resendOwed: (id, owed) => watch(coordinator.resendOwed(id, owed)),
    guestLost: (id, reason) => watch(coordinator.guestLost(id, reason)),
    getMove: (id) => watch(coordinator.getMove(id)),
    getSession: (id) => watch(coordinator.getSession(id)),
  }
}
