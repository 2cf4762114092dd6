/**
 * A move an operator committed while its source was frozen (the coordinator heard nothing from it
 * past the stale window, so it took the commit: SPEC §13), whose source then thawed and went on,
 * and whose final round's send then failed (the link to the target dropped mid-send). The
 * coordinator places the session on the target, which holds no complete stream.
 *
 * Before: the runtime gave the pause back, the source abandoned the move (its abort refused, 409,
 * the move read committed), asked the target to commit, the target refused its incomplete stream,
 * and on the coordinator's "committed" alone the source destroyed its copy, the only one; the
 * target then booted the session afresh: the guest's memory lost. Now the source pauses its copy
 * again and owes the move with `resend`; the target refuses the commit saying that its stream
 * never completed (`noStream`), notes the move in its state file and boots nothing (a restart in
 * between included); a later pass of the source streams the paused copy again, the target resumes
 * the guest from that stream, and only then does the source's copy go.
 */
import { assert, describe } from "@effect/vitest"
import { Limits } from "@engram/core"
import { SimRuntime } from "@engram/runtime"
import { Clock, Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { resendWaitMs } from "../src/Agent.js"
import { resendGiveUpMs } from "../src/MoveSource.js"
import { CoordinatorError } from "../src/Coordinator.js"
import { type MoveHeader, PeerError } from "../src/MoveTarget.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet, moveBegunAToB, operatorCommitsAtIntent, type TestHost } from "./support/InProcess.js"
import { capture } from "./support/Logs.js"

/**
 * Hosts a and b; move m1 of s1 from a to b begun, an operator's commit landing with only the
 * intent recorded (as QEMU takes it, then the source frozen, unheard), and a's first final send
 * failing: a's copy paused again and owed with `resend`. `onlyB` runs b's pass alone.
 */
const committedThenSendFailedWith = (coordinatorOlderThanResend: boolean) => Effect.gen(function* () {
  const operator = operatorCommitsAtIntent()
  /** Hosts gone for good: their peer server answers nothing. */
  const dead = new Set<string>()
  /** Targets older than `noStream`: their refusals of a commit do not say it. */
  const olderTargets = new Set<string>()
  /** Hosts whose session reads hang until the client's own time-out (30 s), then fail unanswered. */
  const hungReads = new Set<string>()
  const fleet = yield* makeFleet(
    [
      { hostId: "a", sim: SimRuntime.defaultSimConfig },
      { hostId: "b", sim: SimRuntime.defaultSimConfig },
    ],
    {
      sendFails: (hostId) => (hostId === "a" ? 1 : 0),
      // As QEMU: the intent is taken before the first round; then the operator commits (the source frozen, unheard).
      intentFirst: operator.intentFirst,
      wrapLink: (link) => {
        const gone = (op: string, h: MoveHeader) => new PeerError({ op, moveId: h.moveId, message: `peer ${h.targetHostId} did not answer (its host is gone)`, refused: false })
        return {
          ...link,
          prepare: (h) => (dead.has(h.targetHostId) ? Effect.fail(gone("prepare", h)) : link.prepare(h)),
          commit: (h) =>
            dead.has(h.targetHostId)
              ? Effect.fail(gone("commit", h))
              : olderTargets.has(h.targetHostId)
                ? link.commit(h).pipe(Effect.mapError((e) => new PeerError({ op: e.op, moveId: e.moveId, message: e.message, refused: e.refused })))
                : link.commit(h),
          abort: (h) => (dead.has(h.targetHostId) ? Effect.fail(gone("abort", h)) : link.abort(h)),
        }
      },
      wrapCoordinator: (client, hostId) => ({
        ...client,
        getSession: (id) =>
          hungReads.has(hostId)
            ? Effect.sleep("30 seconds").pipe(Effect.andThen(Effect.fail(new CoordinatorError({ op: "getSession", status: null, message: "timed out" }))))
            : client.getSession(id),
      }),
    },
  )
  if (coordinatorOlderThanResend) yield* fleet.coordinator.olderThanResend(true)
  const { a, copies } = yield* moveBegunAToB(fleet)
  assert.deepStrictEqual(operator.seen.committedAt, ["intent"], "the operator's commit landed with only the intent recorded")
  // Before: { a: [] }: the source's copy destroyed on the coordinator's "committed" alone.
  assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]], "the source's copy paused again after the failed send")
  assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.resend, p.resendTold]), [["m1", true, undefined]], "owed, to be streamed again, the coordinator not told yet")
  // Before: marked at once, though the target may hold the whole stream (the send failing after
  // its last byte) and resume the guest itself: a way back would then resume this older copy.
  assert.isUndefined((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, "not marked before the target says that its stream never completed")
  const onlyB = Effect.gen(function* () {
    const b = fleet.hosts[1] as TestHost
    yield* b.agent.reconcile(yield* fleet.coordinator.assignmentsOf("b"))
    yield* fleet.quiesce
    return b
  })
  return { fleet, copies, onlyB, dead, olderTargets, hungReads }
})
const committedThenSendFailed = committedThenSendFailedWith(false)

describe("a committed move whose final round's send fails", () => {
  effect("the source keeps its copy paused and streams it again; the target resumes the guest from that stream, never booted afresh, a restart of either in between included", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      // The target alone: its own commit of the move (committed, its session placed there) finds the stream incomplete.
      let b = yield* onlyB
      assert.deepStrictEqual((yield* b.residents.unfinished).map((u) => [u.sessionId, u.moveId]), [["s1", "m1"]], "the target noted the move in its state file")
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "nothing runs on the target")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the target did not boot the session afresh")
      // Both agents restart (from their state files) before the source streams again.
      yield* fleet.restart("b")
      yield* fleet.restart("a")
      yield* onlyB
      b = yield* onlyB
      // Before (had the copy been kept): the restarted target, its memory of the move gone, booted the session afresh.
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the restarted target did not boot the session afresh")
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "the source's copy still the guest's only memory")
      assert.isTrue(errors.lines.some((l) => l.message.includes("not booted afresh") && l.fields["hostId"] === "b"), "the target said why it boots nothing")
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "one running copy, where the coordinator places the session")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest resumed from the stream sent again, not booted: its memory kept")
      assert.deepStrictEqual(yield* fleet.hosts[0]!.residents.pendingCommits, [])
      assert.deepStrictEqual(yield* b.residents.unfinished, [], "the note forgotten once the guest runs")
      assert.deepStrictEqual((yield* b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]])
      assert.strictEqual((yield* fleet.coordinator.get).moves.get("m1")?.state, "committed")
      // Before: still marked, so a later death of b would send the session back to a, which holds no copy.
      assert.strictEqual((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, false, "the mark cleared once the target runs the guest")
    }).pipe(Effect.provide(errors.layer))
  })
  effect("a coordinator older than the resend mark (its 404 of the route): the source asks once, then settles the debt as before", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailedWith(true)
      yield* onlyB
      yield* fleet.settle()
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "the target resumed the guest from the stream sent again")
      assert.deepStrictEqual(yield* fleet.hosts[0]!.residents.pendingCommits, [])
      const calls = (yield* fleet.coordinator.get).calls.filter((c) => c.startsWith("resendOwed"))
      assert.deepStrictEqual(calls, ["resendOwed m1 true (unknown)", "resendOwed m1 false (unknown)"], "told once, its clear once: never asked again on every pass")
      assert.isUndefined((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed)
    }),
  )
  effect("a source that never streams again: the target waits twice the stale window from its note, then boots the session afresh and tells the loss", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const waitMs = resendWaitMs(Limits.defaults.heartbeatStaleWindowMs)
      // The source's host is gone for good: only the target's passes run from here.
      let b = yield* onlyB
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "not booted at once: the source may stream again")
      const notedAt = (yield* b.residents.unfinished)[0]!.notedAt
      // A pass of b a second before the wait ends (its action run to its end, the clock held): still waiting.
      yield* TestClock.adjust(notedAt + waitMs - 1000 - (yield* Clock.currentTimeMillis))
      yield* b.agent.reconcile(yield* fleet.coordinator.assignmentsOf("b"))
      for (let i = 0; i < 2000 && (yield* b.agent.busy); i++) yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
      assert.isFalse(yield* b.agent.busy)
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "still waiting, within the wait")
      assert.deepStrictEqual((yield* copies).b, [])
      // Past it.
      b = yield* onlyB
      // Before the wait existed here: never booted (the session placed on b, no guest, for ever).
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 1, "booted afresh past the wait")
      assert.deepStrictEqual((yield* copies).b, [["s1", "running"]])
      assert.deepStrictEqual(yield* b.residents.unfinished, [], "the note forgotten")
      assert.deepStrictEqual(
        (yield* fleet.coordinator.get).guestsLost.map((l) => [l.hostId, l.sessionId]),
        [["b", "s1"]],
        "the loss told, once, by the host the session is placed on",
      )
    }),
  )
  effect("the target gone for good and the coordinator placing the session back on the source (its reclaim): the source resumes its paused copy, the guest's memory kept", () =>
    Effect.gen(function* () {
      const { fleet, copies, dead } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      dead.add("b")
      // The coordinator's reclaim of b (core's `Reclaim.wayBackOf`): s1 running on a, on a new reservation.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "a", reservationId: "back-s1" }) }))
      yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
      yield* fleet.quiesce
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the paused copy resumed on the source")
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1, "never booted again on the source: only its first start")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [], "no loss told")
    }),
  )
  effect("the source marks the move only once the target says that its stream never completed", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      assert.isUndefined((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, "not marked on the failed send alone")
      yield* onlyB
      // a's pass: b answers noStream (marked then), a streams again, b resumes the guest (cleared).
      yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
      yield* fleet.quiesce
      assert.deepStrictEqual(yield* copies, { a: [], b: [["s1", "running"]] }, "streamed again, the guest resumed on b")
      const calls = (yield* fleet.coordinator.get).calls.filter((c) => c.startsWith("resendOwed"))
      assert.deepStrictEqual(calls, ["resendOwed m1 true", "resendOwed m1 false"], "marked once the target answered noStream, cleared once it runs the guest")
      assert.strictEqual((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, false, "cleared once the target runs the guest")
    }),
  )
  effect("the session sent back to the source while its target was silent, the target answering `noStream` before its own reconcile: the source resumes its copy, never streams it to the target", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      const b = yield* onlyB
      assert.deepStrictEqual((yield* b.residents.unfinished).map((u) => u.moveId), ["m1"], "the target noted the move: it answers noStream")
      // The target silent past the stale window: the coordinator's reclaim sends s1 back to a. The
      // target, back, has not reconciled yet (its note stands) when a's pass asks it to commit.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "a", reservationId: "back-s1" }) }))
      yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
      yield* fleet.quiesce
      // Before: a streamed its copy to b, b resumed it, a destroyed its copy ({ a: [], b: running }),
      // then a booted the session afresh where it is placed and b's reconcile destroyed its copy.
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the paused copy resumed where the session is placed, nothing streamed to the target")
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1, "never booted afresh on the source")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      yield* onlyB
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the target runs nothing once it reconciles")
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [], "no loss told")
    }),
  )
  for (const older of [false, true])
    effect(
      `the target unanswering while the session is still placed on it${older ? " (a coordinator older than letting a move's source read its session: 403)" : ""}: the source keeps its paused copy and the debt, pass after pass`,
      () =>
        Effect.gen(function* () {
          const { fleet, copies, dead } = yield* committedThenSendFailed
          const a = fleet.hosts[0] as TestHost
          if (older) yield* fleet.coordinator.olderThanMoveReads(true)
          dead.add("b")
          const passes = Effect.gen(function* () {
            for (let i = 0; i < 3; i++) {
              yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
              yield* fleet.quiesce
            }
          })
          yield* passes
          // Before: { a: [] } at the first pass: the read of the session placed on b (the
          // coordinator's 403) answered null, taken for "ended", and the copy was destroyed.
          assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "the guest's only whole copy kept, paused")
          assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.resend]), [["m1", true]], "still owed")
          assert.isUndefined((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, "never marked: b never said that its stream never completed (it may run the guest)")
          // The client ends the session, b still unanswering.
          yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "ended", hostId: null, reservationId: null }) }))
          yield* passes
          if (!older) {
            // The source of the session's latest move reads it ended: the debt is over.
            assert.deepStrictEqual(yield* copies, { a: [], b: [] }, "the copy destroyed once the session reads ended")
            assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
            assert.notStrictEqual((yield* fleet.coordinator.get).moves.get("m1")?.resendOwed, true, "no mark left")
            return
          }
          // Not visible says nothing of where the session is: kept until the coordinator answers
          // that the session is unknown (its end pruned), never on a 403.
          assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "kept while the session cannot be read")
          yield* Ref.update(fleet.coordinator.ref, (s) => {
            const sessions = new Map(s.sessions)
            sessions.delete("s1")
            return { ...s, sessions }
          })
          yield* passes
          assert.deepStrictEqual(yield* copies, { a: [], b: [] }, "destroyed once the session is unknown")
          assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
        }),
    )
  effect("the session never readable (403) and the target unanswering: the source destroys its copy past the target's own wait and a stale window from the debt's start, not holding it for ever", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fleet, copies, dead } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      yield* fleet.coordinator.olderThanMoveReads(true)
      dead.add("b")
      const pass = Effect.gen(function* () {
        yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
        yield* fleet.quiesce
      })
      yield* pass
      const sinceMs = (yield* a.residents.pendingCommits)[0]!.resendSinceMs
      assert.isNumber(sinceMs, "the debt's start written")
      const giveUpMs = resendGiveUpMs(Limits.defaults.heartbeatStaleWindowMs)
      yield* TestClock.adjust(sinceMs! + giveUpMs - 1000 - (yield* Clock.currentTimeMillis))
      yield* pass
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "kept within the bound")
      yield* TestClock.adjust(2000)
      yield* pass
      // Before: kept paused for ever, outside the ledger.
      assert.deepStrictEqual(yield* copies, { a: [], b: [] }, "destroyed past the bound")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt dropped")
      assert.isTrue(errors.lines.some((l) => l.message.includes("past the target's own wait") && l.fields["hostId"] === "a"), "an error names why")
    }).pipe(Effect.provide(errors.layer))
  })
  effect("the target refusing without `noStream` (its note forgotten once the session went back to the source) while the coordinator does not answer the source: the copy is kept, and resumed once the session reads placed here", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      yield* onlyB
      // a's view before the way back: s1 placed on b. From here a's coordinator does not answer,
      // so a's passes run on this view.
      const stale = yield* fleet.coordinator.assignmentsOf("a")
      // The coordinator's way back (b silent past the stale window): s1 placed on a; b, back,
      // reconciles and forgets its note (the session left it): it refuses m1's commit plainly.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "a", reservationId: "back-s1" }) }))
      const b = yield* onlyB
      assert.deepStrictEqual(yield* b.residents.unfinished, [], "the target forgot its note: it refuses without noStream")
      yield* fleet.coordinator.silence("a", true)
      for (let i = 0; i < 3; i++) {
        yield* a.agent.reconcile(stale)
        yield* fleet.quiesce
      }
      // Before: { a: [] } at the first pass: the refusal without noStream destroyed the copy though
      // the placement could not be read; the way back then found none and booted s1 afresh.
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "the guest's only whole copy kept while its placement cannot be read")
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.resend]), [["m1", true]], "still owed")
      yield* fleet.coordinator.silence("a", false)
      yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
      yield* fleet.quiesce
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "the paused copy resumed where the session is placed")
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1, "never booted afresh on the source")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [], "no loss told")
    }),
  )
  for (const [target, coordinator] of [
    ["unanswering", "refuses every call (cut off)"],
    ["unanswering", "hangs on every session read"],
    ["older than `noStream` (refusing plainly)", "refuses every call (cut off)"],
    ["older than `noStream` (refusing plainly)", "answers 403"],
  ] as const)
    effect(`the target ${target} and the coordinator ${coordinator} for the whole window: the copy is kept until the give-up, then destroyed with an error naming why`, () => {
      const errors = capture("Error")
      return Effect.gen(function* () {
        const { fleet, copies, dead, olderTargets, hungReads } = yield* committedThenSendFailed
        const a = fleet.hosts[0] as TestHost
        if (target === "unanswering") dead.add("b")
        else olderTargets.add("b")
        if (coordinator === "refuses every call (cut off)") yield* fleet.coordinator.silence("a", true)
        else if (coordinator === "hangs on every session read") hungReads.add("a")
        else yield* fleet.coordinator.olderThanMoveReads(true)
        const pass = Effect.gen(function* () {
          yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
          yield* fleet.quiesce
        })
        const sinceMs = (yield* a.residents.pendingCommits)[0]!.resendSinceMs
        assert.isNumber(sinceMs, "the debt's start written")
        const giveUpMs = resendGiveUpMs(Limits.defaults.heartbeatStaleWindowMs)
        const endMs = sinceMs! + giveUpMs
        // Pass after pass through the window (each moves the clock a minute, a hung read's pass
        // more): every one that ends before the window's end finds the copy kept.
        let lastKeptAtMs = 0
        for (let i = 0; i < 20 && (yield* copies).a.length > 0; i++) {
          yield* pass
          const nowMs = yield* Clock.currentTimeMillis
          if (nowMs >= endMs) continue
          // Before (a refusal without noStream): { a: [] } at the first pass, the placement unread.
          assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] }, "kept within the window")
          assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.resend]), [["m1", true]], "still owed within the window")
          assert.isFalse(errors.lines.some((l) => l.fields["hostId"] === "a" && l.message.includes("destroyed")), "nothing destroyed within the window")
          lastKeptAtMs = nowMs
        }
        assert.isAtLeast(lastKeptAtMs, endMs - 4 * 60_000, "kept until a few minutes before the window's end at least (a pass spans at most three)")
        assert.deepStrictEqual(yield* copies, { a: [], b: [] }, "destroyed past the window")
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt dropped")
        assert.isTrue(errors.lines.some((l) => l.message.includes("past the target's own wait") && l.fields["hostId"] === "a"), "an error names why")
      }).pipe(Effect.provide(errors.layer))
    })
  effect("placed back on a source that no longer holds the copy: it boots the session afresh and tells the loss, not waiting for ever", () =>
    Effect.gen(function* () {
      const { fleet, copies, dead } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      dead.add("b")
      // The copy gone from a (its VM ended by itself), the debt still written.
      yield* a.runtime.destroy("s1")
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "a", reservationId: "back-s1" }) }))
      for (let i = 0; i < 3; i++) {
        yield* a.agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
        yield* fleet.quiesce
      }
      assert.deepStrictEqual(yield* copies, { a: [["s1", "running"]], b: [] }, "booted afresh on the source")
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 2, "its first start, then the fresh boot")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost.map((l) => [l.hostId, l.sessionId]), [["a", "s1"]], "the loss told by the source")
    }),
  )
  effect("a session the coordinator descends meanwhile is not descended as lost while its memory may still come", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const b = yield* onlyB
      assert.deepStrictEqual((yield* b.residents.unfinished).map((u) => u.moveId), ["m1"])
      // Idle on b (it reports no activity: it runs nothing), the coordinator has it descend there.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "descending" }) }))
      yield* onlyB
      // Before: b found neither guest nor image, told the loss and reported the descent without an image.
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [], "no loss told")
      assert.strictEqual((yield* fleet.coordinator.get).sessions.get("s1")?.state, "descending", "not reported descended")
      assert.deepStrictEqual(yield* copies, { a: [["s1", "paused"]], b: [] })
    }),
  )

  effect("a session that ends while the source owes its stream: the source's paused copy is destroyed and the debt dropped", () =>
    Effect.gen(function* () {
      const { fleet, copies, onlyB } = yield* committedThenSendFailed
      const a = fleet.hosts[0] as TestHost
      yield* onlyB
      // The client ends the session (DELETE) before the source streams again.
      yield* Ref.update(fleet.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "ended", hostId: null, reservationId: null }) }))
      // b forgets its note (the session left it); a's next settle asks b to commit, which refuses without noStream.
      yield* onlyB
      yield* fleet.settle()
      // Before: the copy stayed paused and owed for ever (every pass a warning).
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt dropped")
      assert.deepStrictEqual(yield* copies, { a: [], b: [] }, "no copy left anywhere")
    }),
  )
})
