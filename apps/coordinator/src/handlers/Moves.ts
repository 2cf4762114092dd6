/** `/v1/moves…`: list and read moves; the source agent's rounds, commit and abort; the resolution of an in-doubt move. */
import { CurrentPrincipal, EngramApi } from "@engram/api"
import { Move as CoreMove } from "@engram/core"
import { Conflict, nowOf, Store } from "@engram/store"
import type { Move } from "@engram/store"
import { Effect } from "effect"
import { HttpApiBuilder } from "effect/http-api"
import { requireHostOrAdmin, requireOwnHostList } from "../Auth.js"
import * as HandlerGroup from "../HandlerGroup.js"
import { api, badRequest } from "../HttpErrors.js"
import { hostTopic, moveTopic, Notifier, sessionTopic, withNotices } from "../Notifier.js"
import { Drainer } from "../Drainer.js"
import * as Tracing from "../Tracing.js"
import { pageJson } from "../Views.js"

/** The phases of a commit's payload (its guard report is kept apart). */
const phasesOf = (p: { readonly downtimeMs: number; readonly captureMs: number; readonly sendMs: number; readonly commitMs: number }) => ({
  downtimeMs: p.downtimeMs,
  captureMs: p.captureMs,
  sendMs: p.sendMs,
  commitMs: p.commitMs,
})

export const MovesHandlers = HandlerGroup.make(
  Effect.gen(function* () {
    const store = yield* Store
    const notifier = yield* Notifier
    const drainer = yield* Drainer
    const span = yield* Tracing.spans
    const moveSpans = yield* Tracing.MoveSpans
    const step = (name: string, moveId: string, attributes: Record<string, unknown> = {}) => Tracing.moveStep(span, moveSpans, name, moveId, attributes)
    /** The move, once the caller may act for it: its source (or, to read it, its target) or the admin. */
    const moveFor = (id: string, who: "source" | "either") =>
      api(store.getMove(id)).pipe(Effect.tap((m) => (who === "source" ? requireHostOrAdmin(m.sourceHostId) : requireHostOrAdmin(m.sourceHostId, m.targetHostId))))
    /** Now on the store's clock (the one its report times were stamped on). */
    const storeNow = nowOf(store)
    /**
     * An operator's commit, judged as core's `Move.refuseOperatorCommit` does: before the final
     * round, refused (409) while the move's source is heard (its last report within the stale
     * window): it is still sending the move and the target may hold no complete copy. A
     * source removed or never reported is not heard. The store judges it with the commit, in one
     * step (`Store.commitMoveByOperator`); a store without it is judged here on a read of the
     * source host, then committed: two steps (a source heard between them is not refused).
     */
    const operatorCommit = (m: Move) =>
      store.commitMoveByOperator !== undefined
        ? store.commitMoveByOperator(m.id)
        : Effect.gen(function* () {
            if (!CoreMove.finalRoundRecorded(m)) {
              const source = yield* Effect.interruptible(store.getHost(m.sourceHostId).pipe(Effect.catchTag("NotFound", () => Effect.succeed(null))))
              const refused = CoreMove.refuseOperatorCommit(m, source, yield* storeNow, store.limits())
              if (refused !== null) return yield* new Conflict({ entity: "move", id: m.id, reason: refused.reason })
            }
            return yield* store.commitMove(m.id, null, null, "operator")
          })
    const topics = (m: Move) => [moveTopic(m.id), hostTopic(m.sourceHostId), hostTopic(m.targetHostId), sessionTopic(m.sessionId)] as const
    return HttpApiBuilder.group(EngramApi, "moves", (h) =>
      h
        .handle("list", ({ query }) =>
          Effect.gen(function* () {
            // A host agent may list its own host's moves; anything else is the admin's.
            yield* requireOwnHostList(query.hostId, "moves")
            const page = yield* api(store.pageMoves({ hostId: query.hostId, state: query.state }, { limit: query.limit, cursor: query.cursor }))
            return pageJson(page, (m) => m)
          }),
        )
        .handle("get", ({ params }) => moveFor(params.id, "either"))
        .handle("round", ({ params, payload }) =>
          withNotices(
            Effect.interruptible(moveFor(params.id, "source")).pipe(
              // Once a final round is recorded, the store refuses the waiter's timeout abort: the record is the point of no return.
              Effect.andThen(api(store.recordRound(params.id, payload))),
              // Only the move's and the session's watchers (and the dashboard's): a round changes
              // nothing an agent acts on, so it does not wake the hosts' long polls. Their reads
              // (a store read each) would queue beside this move's next record, which may be the
              // final round's, recorded while the guest is paused.
              Effect.tap((m) => notifier.notify(moveTopic(m.id), sessionTopic(m.sessionId))),
            ),
          ).pipe(
            step("engram.move.round", params.id, {
              "engram.round.kind": payload.kind,
              "engram.round.wire_bytes": payload.wireBytes,
              "engram.round.apparent_bytes": payload.apparentBytes,
              "engram.round.send_ms": payload.sendMs,
            }),
          ),
        )
        .handle("commit", ({ params, payload }) =>
          withNotices(
            Effect.interruptible(moveFor(params.id, "source")).pipe(
              Effect.andThen(api(store.commitMove(params.id, phasesOf(payload), payload.guard ?? null, "source"))),
              Effect.tap((m) => drainer.roomAppeared(...topics(m))),
            ),
          ).pipe(
            step("engram.move.commit", params.id, {
              "engram.move.downtime_ms": payload.downtimeMs,
              "engram.move.capture_ms": payload.captureMs,
              "engram.move.send_ms": payload.sendMs,
              "engram.move.commit_ms": payload.commitMs,
              ...(payload.guard === undefined ? {} : { "engram.move.allowance_ms": payload.guard.allowanceMs, "engram.move.allowance_source": payload.guard.allowanceSource }),
            }),
          ),
        )
        .handle("resolve", ({ params, payload }) =>
          withNotices(Effect.gen(function* () {
            const m = yield* Effect.interruptible(api(store.getMove(params.id)))
            // The target's agent may report only that it runs the guest; an abort is the admin's word.
            if (payload.outcome === "commit") yield* requireHostOrAdmin(m.targetHostId)
            else yield* requireHostOrAdmin()
            if (payload.reason.trim() === "") return yield* badRequest("reason", "must be a non-empty string")
            const p = yield* CurrentPrincipal
            const by = p._tag === "Admin" ? "operator" : `host ${p.hostId}`
            // The target's report says it runs the guest (from a complete stream); an operator's word is judged against the source.
            const resolved = yield* api(
              payload.outcome === "abort"
                ? store.abortMove(params.id, `resolved by ${by}: ${payload.reason}`)
                : p._tag === "Admin"
                  ? operatorCommit(m)
                  : store.commitMove(params.id, null, null, "target"),
            )
            yield* Effect.logWarning(`in-doubt move resolved: ${payload.outcome}`, { moveId: m.id, sessionId: m.sessionId, by, reason: payload.reason })
            yield* drainer.roomAppeared(...topics(resolved))
            return resolved
          })),
        )
        .handle("resend", ({ params, payload }) =>
          Effect.gen(function* () {
            // The source marks and clears; the target may only clear, before it resumes a stream
            // sent again (so its death after that never sends the session back to an older copy).
            const m = yield* Effect.interruptible(moveFor(params.id, payload.owed ? "source" : "either"))
            // A store without the mark (`Store.markResendOwed` is optional) keeps none: refused by
            // name, a 400 the source's agent takes as a coordinator older than the mark (it asks
            // once, then settles its debt as before); its reclaim sends no session back.
            const mark = store.markResendOwed
            if (mark === undefined) return yield* badRequest("owed", "this coordinator's store keeps no resend mark (its backend has no markResendOwed): a session reclaimed from the move's target ends lost, never sent back to the source")
            // A tell naming fewer clears than the move holds changes nothing (core's
            // `Move.resendTellStale`, judged by the store with its write): answered with the move as it is.
            const marked = yield* api(mark(params.id, payload.owed, payload.seenClears))
            if (payload.owed && !marked.resendOwed) {
              yield* Effect.logWarning("a move's source told a resend owed after a clear it had not seen (a tell that came late): the mark stays clear", { moveId: m.id, sessionId: m.sessionId, seenClears: payload.seenClears, resendClears: marked.resendClears })
              return marked
            }
            yield* payload.owed
              ? Effect.logWarning("a move's source owes its target a resend: it holds the guest's only whole copy, paused; should the target die, the session goes back to the source", { moveId: m.id, sessionId: m.sessionId, source: m.sourceHostId, target: m.targetHostId })
              : Effect.logInfo("a move's resend is settled", { moveId: m.id, sessionId: m.sessionId })
            return marked
          }).pipe(step("engram.move.resend", params.id, { "engram.move.resend_owed": payload.owed })),
        )
        .handle("abort", ({ params, payload }) =>
          withNotices(Effect.gen(function* () {
            yield* Effect.interruptible(moveFor(params.id, "source"))
            if (payload.reason.trim() === "") return yield* badRequest("reason", "must be a non-empty string")
            // The estimate is kept on the move record, so a waiter on any replica can answer it.
            const m = yield* api(store.abortMove(params.id, payload.reason, { estimateMs: payload.estimateMs }))
            yield* drainer.roomAppeared(...topics(m))
            return m
          })).pipe(step("engram.move.abort", params.id, { "engram.move.abort_reason": payload.reason, ...(payload.estimateMs === undefined ? {} : { "engram.move.estimate_ms": payload.estimateMs }) })),
        )
    )
  }),
)
