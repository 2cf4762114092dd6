/**
 * The host agent: measures and reports its host, heartbeats the reservations resident on it,
 * and reconciles its VMs with the coordinator's assignments.
 *
 * Commands are pulled (a long-poll of `GET /v1/hosts/{id}/assignments`), not pushed: an agent
 * behind NAT or a firewall only needs to reach the coordinator; coordinator replicas stay
 * stateless (no connection registry, any replica answers); and the assignments are the desired
 * state, so a missed wake-up, a lost answer or an agent restart is healed by the next pass.
 * Each pass compares what the coordinator believes with what is resident and acts on each
 * difference once: one fiber per session at a time, and the acknowledgement is a CAS on the
 * coordinator whose 409 (already done) counts as done.
 */
import { Limits } from "@engram/core"
import { Clock, Effect, FiberMap, Ref, type Result, type Scope } from "effect"
import type { Assignments, AssignedMove, AssignedSession, Conflict, CoordinatorError, CoordinatorShape } from "./Coordinator.js"
import type { ImageStore } from "./ImageStore.js"
import type { HostReport } from "./Measure.js"
import type { MoveTarget } from "./MoveTarget.js"
import type { PendingCommit } from "./LocalState.js"
import { type MoveOutcome, runSource, settleCommit } from "./MoveSource.js"
import type { PeerLink } from "./PeerLink.js"
import type { Residents } from "./Residents.js"
import type { VmRuntimeShape, VmSpec } from "./Runtime.js"

/** The agent's timing and move policy. Durations in ms. */
export interface AgentConfig {
  readonly hostId: string
  /** Default: a third of the coordinator's heartbeat stale window. */
  readonly heartbeatIntervalMs: number
  readonly reportIntervalMs: number
  /** How long one assignments long-poll may wait on the coordinator. */
  readonly pollWaitMs: number
  /** Pause after a failed poll or action before the next try. */
  readonly retryDelayMs: number
  readonly maxPreCopyRounds: number
  /** How long a target keeps staged rounds (or a committed VM) the coordinator does not show. */
  readonly stagingGraceMs: number
}

export interface AgentDeps {
  readonly coordinator: CoordinatorShape
  readonly runtime: VmRuntimeShape
  readonly measure: (residentMib: number) => Effect.Effect<HostReport>
  readonly residents: Residents
  readonly images: ImageStore
  readonly link: PeerLink
  readonly target: MoveTarget
}

/** What an agent shows on its status endpoint and to tests. */
export interface AgentStatus {
  readonly hostId: string
  readonly vms: readonly { readonly vmId: string; readonly status: string; readonly memMib: number; readonly moveId: string | null }[]
  readonly staged: readonly { readonly moveId: string; readonly rounds: number }[]
  readonly pendingCommits: readonly string[]
  readonly moves: readonly ({ readonly moveId: string } & MoveOutcome)[]
  readonly lastReport: HostReport | null
}

export interface Agent {
  /** One reconcile pass over an assignments answer (starts the actions it needs; does not wait for them). */
  readonly reconcile: (a: Assignments) => Effect.Effect<void>
  /** Waits until no action is in flight. */
  readonly idle: Effect.Effect<void>
  /** Report, heartbeat and poll loops, forever. */
  readonly run: Effect.Effect<never>
  readonly reportOnce: Effect.Effect<void>
  readonly status: Effect.Effect<AgentStatus>
}

/** Builds an agent; its action fibers live in the current scope. */
export const makeAgent = (config: AgentConfig, deps: AgentDeps): Effect.Effect<Agent, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { coordinator, runtime, residents, images, target } = deps
    const me = config.hostId
    const scope = yield* Effect.scope
    const inflight = yield* FiberMap.make<string>()
    const latest = yield* Ref.make<Assignments | null>(null)
    const outcomes = yield* Ref.make<readonly ({ readonly moveId: string } & MoveOutcome)[]>([])
    const lastReport = yield* Ref.make<HostReport | null>(null)
    const log = (msg: string, fields: Record<string, unknown> = {}) => Effect.logInfo(msg, { hostId: me, ...fields })

    const done = <A>(eff: Effect.Effect<A, { readonly _tag: string }>) =>
      eff.pipe(Effect.catchTag("Conflict" as never, () => Effect.void)) as Effect.Effect<unknown, { readonly _tag: string; readonly message?: string }>

    const specOf = (s: AssignedSession): VmSpec => ({ vmId: s.id, memMib: s.budget.memMib, vcpus: s.budget.vcpus })

    /** Makes the session's VM resident and running: resumed, restored from its image, or booted. */
    const ensureRunning = (s: AssignedSession) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        if (vm === undefined) {
          const spec = specOf(s)
          const image = yield* images.get(s.id)
          if (image !== undefined) {
            yield* runtime.restore(spec, [image])
            yield* runtime.resume(s.id)
            yield* log("restored from its descent image", { sessionId: s.id })
          } else {
            yield* runtime.start(spec)
            yield* log("started", { sessionId: s.id, state: s.state })
          }
          yield* residents.put({ ...spec, status: "running", reservationId: s.reservationId ?? null, moveId: null })
        } else if (vm.status === "paused") {
          yield* runtime.resume(s.id)
          yield* residents.update(s.id, (v) => ({ ...v, status: "running" }))
          yield* log("resumed", { sessionId: s.id })
        }
      })

    const pause = (s: AssignedSession) =>
      Effect.gen(function* () {
        yield* ensureRunning(s)
        yield* runtime.pause(s.id)
        yield* residents.update(s.id, (v) => ({ ...v, status: "paused" }))
        yield* log("parked", { sessionId: s.id })
      })

    const descend = (s: AssignedSession) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        if (vm !== undefined) {
          const capture = yield* runtime.fullCapture(s.id)
          yield* runtime.stopTracking(s.id)
          yield* images.put(capture)
          yield* runtime.destroy(s.id)
          yield* residents.remove(s.id)
        } else {
          yield* Effect.logWarning("descending session has no resident VM; reporting it descended", { hostId: me, sessionId: s.id })
        }
        yield* done(coordinator.descended(s.id))
        yield* log("descended", { sessionId: s.id })
      })

    /** The coordinator's commit allowance (SPEC §5); the SPEC §9 default from a coordinator too old to send it. */
    const commitAllowanceOf = (a: Assignments) =>
      a.limits !== undefined
        ? Effect.succeed(a.limits.commitAllowanceMs)
        : Effect.logWarning("the coordinator sent no limits with the move; using the default commitAllowanceMs", {
            hostId: me,
            commitAllowanceMs: Limits.defaults.commitAllowanceMs,
          }).pipe(Effect.as(Limits.defaults.commitAllowanceMs))

    const settle = (owed: PendingCommit) => settleCommit({ hostId: me, coordinator, residents, runtime, link: deps.link }, owed)

    const moveSource = (s: AssignedSession, move: AssignedMove, a: Assignments) =>
      Effect.gen(function* () {
        const commitAllowanceMs = yield* commitAllowanceOf(a)
        yield* log("move: source starts", { moveId: move.id, sessionId: s.id, target: move.targetHostId, maxDowntimeMs: move.maxDowntimeMs, commitAllowanceMs })
        const outcome = yield* runSource(move, {
          hostId: me,
          runtime,
          coordinator,
          link: deps.link,
          residents,
          maxPreCopyRounds: config.maxPreCopyRounds,
          commitAllowanceMs,
        })
        yield* Ref.update(outcomes, (o) => [...o.slice(-49), { moveId: move.id, ...outcome }])
        yield* log(`move: ${outcome._tag}`, { moveId: move.id, ...outcome })
      })

    /** The action a session needs, or null when it is as the coordinator says. */
    const actionFor = (s: AssignedSession, a: Assignments) =>
      Effect.gen(function* () {
        const vm = yield* residents.get(s.id)
        if (vm !== undefined && (vm.reservationId !== (s.reservationId ?? null) || vm.moveId !== null) && s.state !== "moving") {
          // The coordinator's view wins: e.g. a VM that arrived by a move now holds the session's reservation.
          yield* residents.update(s.id, (v) => ({ ...v, reservationId: s.reservationId ?? null, moveId: null }))
        }
        // A commit owed for this session comes first: until it settles, the paused local copy is
        // neither resumed nor moved again (the target may run the guest).
        const owed = (yield* residents.pendingCommits).find((p) => p.sessionId === s.id)
        if (owed !== undefined) return settle(owed)
        switch (s.state) {
          case "pending":
            return ensureRunning(s).pipe(
              Effect.andThen(done(coordinator.started(s.id))),
              Effect.andThen(images.remove(s.id)),
            )
          case "running":
            return vm === undefined || vm.status === "paused" ? ensureRunning(s) : null
          case "parked":
            return vm === undefined || vm.status === "running" ? pause(s) : null
          case "descending":
            return descend(s)
          case "moving": {
            const move = a.moves.find((m) => m.sessionId === s.id && m.state === "pending" && m.sourceHostId === me)
            if (move === undefined) return null
            return moveSource(s, move, a)
          }
          default:
            return null
        }
      })

    const reconcile = (a: Assignments): Effect.Effect<void> =>
      Effect.gen(function* () {
        yield* Ref.set(latest, a)
        const nowMs = yield* Clock.currentTimeMillis
        const mine = a.sessions.filter((s) => s.hostId === me)
        for (const s of mine) {
          if (yield* FiberMap.has(inflight, s.id)) continue
          const action = yield* actionFor(s, a)
          if (action === null) continue
          yield* FiberMap.run(inflight, s.id, { onlyIfMissing: true })(
            (action as Effect.Effect<unknown, { readonly _tag: string; readonly message?: string }>).pipe(
              Effect.catch((e) =>
                Effect.gen(function* () {
                  yield* Effect.logWarning("action failed; retried on a later pass", { hostId: me, sessionId: s.id, state: s.state, error: e.message ?? e._tag })
                  // Level-triggered: look again after a pause even if nothing changes on the coordinator.
                  yield* Effect.sleep(config.retryDelayMs).pipe(
                    Effect.andThen(Ref.get(latest)),
                    Effect.flatMap((l) => (l === null ? Effect.void : reconcile(l))),
                    Effect.forkIn(scope),
                  )
                }),
              ),
            ),
          )
        }

        // What is resident but no longer the coordinator's on this host: ended, lost, or moved away.
        const onHost = new Set(mine.map((s) => s.id))
        const pendingMoves = new Set(a.moves.filter((m) => m.state === "pending").map((m) => m.id))
        for (const vm of yield* residents.all) {
          if (onHost.has(vm.vmId) || (yield* FiberMap.has(inflight, vm.vmId))) continue
          if (vm.moveId !== null) {
            const at = yield* target.committedAt(vm.moveId)
            if (pendingMoves.has(vm.moveId) || (at !== undefined && nowMs - at < config.stagingGraceMs)) continue
          }
          yield* runtime.destroy(vm.vmId)
          yield* residents.remove(vm.vmId)
          yield* log("destroyed: no longer assigned to this host", { sessionId: vm.vmId })
        }
        for (const s of yield* target.staged) {
          if (!pendingMoves.has(s.header.moveId) && nowMs - s.stagedAt > config.stagingGraceMs) {
            yield* target.abort(s.header.moveId)
            yield* log("dropped staged rounds of a move no longer pending", { moveId: s.header.moveId })
          }
        }
        for (const owed of yield* residents.pendingCommits) {
          const key = `commit:${owed.moveId}`
          if (!(yield* FiberMap.has(inflight, key)) && !onHost.has(owed.sessionId)) {
            yield* FiberMap.run(inflight, key, { onlyIfMissing: true })(settle(owed))
          }
        }
      })

    const reportOnce = Effect.gen(function* () {
      const report = yield* deps.measure(yield* residents.residentMib)
      yield* Ref.set(lastReport, report)
      yield* coordinator.report(report).pipe(Effect.catch((e) => Effect.logWarning("report failed", { hostId: me, error: e.message })))
    })

    const reportLoop = Effect.forever(Effect.sleep(config.reportIntervalMs).pipe(Effect.andThen(reportOnce)))
    const heartbeatLoop = Effect.forever(
      coordinator.heartbeat.pipe(
        Effect.catch((e) => Effect.logWarning("heartbeat failed", { hostId: me, error: e.message })),
        Effect.andThen(Effect.sleep(config.heartbeatIntervalMs)),
      ),
    )
    const pollLoop = Effect.gen(function* () {
      let since: string | undefined = undefined
      while (true) {
        const answer: Result.Result<Assignments, Conflict | CoordinatorError> = yield* coordinator.assignments({ waitMs: config.pollWaitMs, since }).pipe(Effect.result)
        if (answer._tag === "Failure") {
          yield* Effect.logWarning("assignments poll failed", { hostId: me, error: answer.failure.message })
          since = undefined
          yield* Effect.sleep(config.retryDelayMs)
          continue
        }
        const unchanged = since !== undefined && answer.success.version === since
        since = answer.success.version
        yield* reconcile(answer.success)
        // A coordinator without long-poll support answers at once: do not spin.
        if (unchanged || answer.success.version === undefined) yield* Effect.sleep(Math.min(config.retryDelayMs, 1000))
      }
    })

    const run = Effect.gen(function* () {
      yield* reportOnce
      yield* log("agent running")
      yield* Effect.all([reportLoop, heartbeatLoop, pollLoop], { concurrency: "unbounded", discard: true })
      return yield* Effect.never
    }) as Effect.Effect<never>

    const idle = Effect.gen(function* () {
      while ((yield* FiberMap.size(inflight)) > 0) yield* FiberMap.awaitEmpty(inflight).pipe(Effect.ignore)
    })

    const status = Effect.gen(function* () {
      const snap = yield* residents.snapshot
      return {
        hostId: me,
        vms: snap.vms.map((v) => ({ vmId: v.vmId, status: v.status, memMib: v.memMib, moveId: v.moveId })),
        staged: (yield* target.staged).map((s) => ({ moveId: s.header.moveId, rounds: s.rounds.length })),
        pendingCommits: snap.pendingCommits.map((p) => p.moveId),
        moves: yield* Ref.get(outcomes),
        lastReport: yield* Ref.get(lastReport),
      } satisfies AgentStatus
    })

    return { reconcile, idle, run, reportOnce, status }
  })
