/**
 * End to end, over real HTTP to a real coordinator (in-process, StoreSim):
 * a move committed without its source's phases (an operator's word) whose first stream never
 * completed at the target; the source holds the guest's only whole copy, paused, has marked the
 * move `resendOwed`, and streams the copy again. The target resumes a stream sent again only once
 * the coordinator says so (`MoveTarget`'s `ResendCheck`): the move's resend mark cleared (its
 * host token may clear it, never set it), then the session read placed on it.
 *
 * - The rollback: the target resumes the stream sent again, the source never gets its answer,
 *   then the target dies for good. Before, the mark was still set: the reclaim sent the session
 *   back to the source, which resumed its older copy, the guest rolled back past what it ran on
 *   the target. Now the target cleared the mark first: the session is lost, never rolled back.
 * - The target cannot reach the coordinator: it does not resume (the incoming VM stays paused,
 *   the source's commit answered "not yet"), and resumes on a later ask once it can.
 * - The way back happened between the stream sent again and its commit: the target reads the
 *   session placed on the source, drops the stream, and the source resumes its copy.
 * - A coordinator that refuses the source its read of the session (403, older than that rule):
 *   the source streams again on the target's `noStream` all the same, since this target checks.
 * - The source's stream fails partway on two passes: on the second the target cleared the mark,
 *   then found the first stream incomplete (`noStream`). The source sets the mark again on every
 *   `noStream` (before, only once: the mark stayed cleared, and the target's death left the
 *   session lost and the source destroyed the guest's only whole copy).
 * - The target cleared the mark, then could not read the placement: its "not yet" says that it
 *   resumed nothing (`notResumed`), and the source sets the mark again (before, it took the 503
 *   for no answer: the mark stayed cleared, the session lost with the target).
 *
 * The stale window (long, so a stall of the machine never makes the source look silent) passes
 * on the store's clock when the test moves it (`skewedStore`), never waited out.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { ImageStore, RuntimeError, SimRuntime, SimWire } from "@engram/runtime"
import { Clock, Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { type CoordinatorShape, CoordinatorError, notVisible } from "../src/Coordinator.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget, PeerError } from "../src/MoveTarget.js"
import type { PeerLink } from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { effect } from "./support/PatientClock.js"
import { realClient, twoHostCoordinator } from "./support/RealCoordinator.js"

const adminToken = "resend-check-admin-token-0123456789"
const { measure, tokens, admin, url, store, pastWindow } = twoHostCoordinator(adminToken)

interface Faults {
  /** The target's calls to the coordinator fail unanswered (it is cut off from it). */
  targetCutOff: boolean
  /** The source's read of the session answers 403 (a coordinator older than letting a move's source read it). */
  sourceReadRefused: boolean
  /** Run before the target gets the commit of a stream sent again (the pass's second commit). */
  beforeResentCommit: Effect.Effect<void>
  /** The answer of the commit of a stream sent again is lost on its way back to the source. */
  loseResentAnswer: boolean
  /** The source's stream of its copy fails (the runtime's migrate: the stream cut partway). */
  streamFails: boolean
  /** The target's read of the session fails unanswered (its clear of the mark went through). */
  targetReadFails: boolean
  /** The source's tell of the mark (`resendOwed` true) goes unanswered. */
  tellFails: boolean
  /**
   * The source's tells of the mark (`resendOwed` true) are held on their way (its client gives up
   * on them: unanswered), kept here to reach the coordinator when the test says (`late`).
   */
  tellLate: boolean
  /** Between the source's read of the move and its tell of the mark, the mark is cleared (as the target does before it resumes). */
  clearAfterRead: boolean
  /** The target does not answer its peer link at all (it died). */
  targetDown: boolean
}

/**
 * s1 ran on a; its move m to b committed without phases (the operator's word) and b noted it
 * `unfinished` (its first stream never completed there): a holds the guest's only whole copy,
 * paused, owes the resend, and has marked it at the coordinator.
 */
const resendOwed = Effect.gen(function* () {
  const faults: Faults = { targetCutOff: false, sourceReadRefused: false, beforeResentCommit: Effect.void, loseResentAnswer: false, streamFails: false, targetReadFails: false, tellFails: false, tellLate: false, clearAfterRead: false, targetDown: false }
  const wire = SimWire.inMemory()
  const aReal = yield* realClient(url(), "a", tokens["a"]!)
  const bReal = yield* realClient(url(), "b", tokens["b"]!)
  /** The source's tells held on their way (`tellLate`), each as it would reach the coordinator. */
  const late: Effect.Effect<"recorded" | "unknown" | "stale", unknown>[] = []
  const aClient: CoordinatorShape = {
    ...aReal,
    resendOwed: (id, owed, seenClears) => {
      if (faults.tellFails && owed) return Effect.fail(new CoordinatorError({ op: "resendOwed", status: null, message: "connection refused" }))
      if (faults.tellLate && owed) {
        late.push(aReal.resendOwed(id, owed, seenClears))
        return Effect.fail(new CoordinatorError({ op: "resendOwed", status: null, message: "the request timed out" }))
      }
      return aReal.resendOwed(id, owed, seenClears)
    },
    getMove: (id) => Effect.tap(aReal.getMove(id), () => (faults.clearAfterRead ? Effect.orDie(bReal.resendOwed(id, false)) : Effect.void)),
    getSession: (id) => (faults.sourceReadRefused ? Effect.succeed(notVisible) : aReal.getSession(id)),
  }
  const cut = (op: string) => Effect.fail(new CoordinatorError({ op, status: null, message: "connection refused" }))
  const bClient = {
    resendOwed: (id: string, owed: boolean, seenClears?: number) => (faults.targetCutOff ? cut("resendOwed") : bReal.resendOwed(id, owed, seenClears)),
    getSession: (id: string) => (faults.targetCutOff || faults.targetReadFails ? cut("getSession") : bReal.getSession(id)),
  }
  const bRuntime = yield* SimRuntime.make({ startMs: 50 }, wire)
  const bResidents = yield* makeResidents("b", null, () => Effect.void)
  const bTarget = yield* makeMoveTarget("b", bRuntime, bResidents, bClient)
  let commits = 0
  const link: PeerLink = {
    prepare: (h) => bTarget.prepare(h),
    commit: (h) =>
      Effect.gen(function* () {
        if (faults.targetDown) return yield* new PeerError({ op: "commit", moveId: h.moveId, message: "the target does not answer", refused: false })
        commits++
        const resent = commits % 2 === 0
        if (resent) yield* faults.beforeResentCommit
        const answer = yield* bTarget.commit(h)
        if (resent && faults.loseResentAnswer) return yield* new PeerError({ op: "commit", moveId: h.moveId, message: "the answer was lost", refused: false })
        return answer
      }),
    abort: (h) => Effect.asVoid(bTarget.abort(h.moveId)),
  }
  const simRuntime = yield* SimRuntime.make({ startMs: 50 }, wire)
  /** The source's streams of its copy (`migrate` calls) so far. */
  const streams = { count: 0 }
  const runtime: typeof simRuntime = {
    ...simRuntime,
    migrate: (vmId, options) => {
      streams.count++
      return faults.streamFails ? Effect.fail(new RuntimeError({ op: "migrate", vmId, message: "the stream was cut partway" })) : simRuntime.migrate(vmId, options)
    },
  }
  const residents = yield* makeResidents("a", null, () => Effect.void)
  const agent = yield* makeAgent(defaultAgentConfig("a"), {
    coordinator: aClient,
    runtime,
    measure: () => Effect.succeed(measure),
    residents,
    images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-a-"))),
    link,
    target: yield* makeMoveTarget("a", runtime, residents),
  })
  /** One reconcile pass of a on the coordinator's view now, its actions run to their end. */
  const pass = Effect.gen(function* () {
    commits = 0
    yield* agent.reconcile(yield* aClient.assignments({ waitMs: 0, since: undefined }))
    for (let i = 0; i < 2000 && (yield* agent.busy); i++) {
      yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
      yield* TestClock.adjust("1 second")
    }
    assert.isFalse(yield* agent.busy, "a's actions finished")
  })
  const vms = (rt: typeof runtime) => Effect.map(rt.list, (l) => l.map((v) => [v.vmId, v.status]))
  const cpuMs = (rt: typeof runtime) => Effect.map(rt.usage, (u) => u.find((v) => v.vmId === "s1")?.cpuMs ?? null)

  assert.deepInclude((yield* Effect.promise(() => admin("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["a"] }))).body, { hostId: "a" })
  yield* pass
  yield* pass
  yield* TestClock.adjust("20 seconds")
  const ranMs = (yield* cpuMs(runtime))!
  assert.isTrue(ranMs > 0, "the guest ran on a")
  const move = yield* store((s) => s.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 5000 }))
  yield* aClient.round(move.id, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
  yield* store((s) => s.commitMove(move.id, null))
  yield* runtime.park("s1")
  yield* residents.update("s1", (v) => ({ ...v, status: "paused" }))
  assert.strictEqual(yield* aClient.resendOwed(move.id, true), "recorded")
  yield* residents.addPendingCommit({ moveId: move.id, sessionId: "s1", phases: null, target: { targetHostId: "b", memMib: 512, vcpus: 1 }, intentRecorded: true, resend: true, resendTold: true })
  yield* bResidents.noteUnfinished({ sessionId: "s1", moveId: move.id, notedAt: yield* Clock.currentTimeMillis })
  /** b is gone for good: past the stale window on the store's clock (moved, never waited out) only a reports; then the reaper's pass. */
  const targetDies = Effect.gen(function* () {
    pastWindow()
    yield* aClient.report(measure, [])
    return yield* store((s) => s.reclaim())
  })
  const markSet = Effect.map(store((s) => s.getMove(move.id)), (m) => m.resendOwed === true)
  /** b dies: the reclaim sends the session back to a (nothing lost), and a's next pass resumes its paused copy, the debt over. */
  const wayBackResumes = Effect.gen(function* () {
    const result = yield* targetDies
    assert.deepStrictEqual(result.lostSessions, [])
    assert.deepStrictEqual(result.returned, [{ sessionId: "s1", hostId: "a" }], "the way back to the source")
    yield* pass
    assert.deepStrictEqual(yield* vms(runtime), [["s1", "running"]], "the source's paused copy resumed")
    assert.deepStrictEqual(yield* residents.pendingCommits, [])
  })
  /** The pass just run streamed once (`why`), the target runs the guest, the source's copy and debt are gone. */
  const streamedOnceAndRunOnTarget = (why: string) =>
    Effect.gen(function* () {
      assert.strictEqual(streams.count, 1, why)
      assert.deepStrictEqual(yield* vms(bRuntime), [["s1", "running"]], "the target runs the guest")
      assert.deepStrictEqual(yield* vms(runtime), [], "the source's copy goes once the target runs the guest")
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
    })
  return { faults, late, streams, pass, a: { runtime, residents }, b: { runtime: bRuntime, residents: bResidents }, vms, cpuMs, ranMs, targetDies, wayBackResumes, streamedOnceAndRunOnTarget, markSet, moveId: move.id }
})

describe("a stream sent again resumes on the target only once the coordinator says so", () => {
  effect("the target resumes, its answer is lost, then it dies: the mark was cleared first, so the session is lost, never rolled back to the source's older copy", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.loseResentAnswer = true
      yield* t.pass
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [["s1", "running"]], "the target resumed the stream sent again")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source, without the answer, keeps its copy paused")
      const result = yield* t.targetDies
      // Before: returned [{ sessionId: "s1", hostId: "a" }] (the mark still set), and a's next pass resumed its older copy.
      assert.deepStrictEqual(result.lostSessions, ["s1"], "the session is lost with its target")
      assert.isUndefined(result.returned, "never sent back to the source's older copy")
      yield* t.pass
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [], "the source's older copy is not resumed: it goes")
      assert.deepStrictEqual(yield* t.a.residents.pendingCommits, [])
    }),
  )
  effect("a target cut off from the coordinator does not resume the stream sent again: its VM stays paused, the source's copy too; once it reaches the coordinator, it resumes", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.targetCutOff = true
      yield* t.pass
      // Before: the target resumed at once, unasked, and the source dropped its copy.
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [], "nothing resumed on the target")
      assert.deepStrictEqual((yield* t.b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "paused", t.moveId]], "the move's incoming VM kept, paused")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source keeps its copy")
      assert.deepStrictEqual((yield* t.a.residents.pendingCommits).map((p) => p.resend), [true], "still owed")
      t.faults.targetCutOff = false
      yield* t.pass
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [["s1", "running"]], "resumed once the coordinator answered")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [], "the source's copy goes once the target runs the guest")
      assert.deepStrictEqual(yield* t.a.residents.pendingCommits, [])
      // The mark cleared: b's death now leaves the session lost.
      const result = yield* t.targetDies
      assert.deepStrictEqual(result.lostSessions, ["s1"])
    }),
  )
  effect("the way back placed the session on the source before the commit of the stream sent again: the target drops that stream and the source resumes its copy", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.beforeResentCommit = Effect.gen(function* () {
        const result = yield* Effect.orDie(t.targetDies)
        assert.deepStrictEqual(result.returned, [{ sessionId: "s1", hostId: "a" }], "the way back to the source")
      })
      yield* t.pass
      // Before: the target resumed the stream (the guest ran on b, off its placement) and the source destroyed its copy.
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [], "the target dropped the stream sent again")
      assert.deepStrictEqual(yield* t.b.residents.unfinished, [], "and its note of the move")
      t.faults.beforeResentCommit = Effect.void
      yield* t.pass
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "running"]], "the source's paused copy resumed, where the session is placed")
      const now = yield* t.cpuMs(t.a.runtime)
      assert.isTrue(now !== null && now >= t.ranMs, `the guest's run carried on (${now} ms after ${t.ranMs} ms), not booted afresh`)
      assert.deepStrictEqual(yield* t.a.residents.pendingCommits, [])
    }),
  )
  effect("a coordinator that refuses the source its read of the session (403): the source streams again on the target's noStream all the same, the target checking the placement itself", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.sourceReadRefused = true
      yield* t.pass
      // Before: never streamed on a 403 (the known limit), the copy kept until the give-up.
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [["s1", "running"]], "streamed again and resumed on the target")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [], "the source's copy goes once the target runs the guest")
      assert.deepStrictEqual(yield* t.a.residents.pendingCommits, [])
    }),
  )
  effect("a stream sent again fails partway on two passes (the second after the target cleared the mark and found the first incomplete), then the target dies: the mark is set again, so the session goes back to the source and its copy resumes", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.streamFails = true
      yield* t.pass
      assert.deepStrictEqual((yield* t.b.residents.all).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "the target holds the incomplete stream")
      // The second pass: the target clears the mark, finds the stream incomplete, answers noStream; the stream fails again.
      yield* t.pass
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source keeps its copy")
      assert.isTrue(yield* t.markSet, "the mark set again after the target's noStream")
      // Before: lostSessions ["s1"] (the mark left cleared by the target), and a's next pass destroyed the guest's only whole copy.
      yield* t.wayBackResumes
      const now = yield* t.cpuMs(t.a.runtime)
      assert.isTrue(now !== null && now >= t.ranMs, `the guest's run carried on (${now} ms after ${t.ranMs} ms), not booted afresh`)
    }),
  )
  effect("the target clears the mark but cannot read the placement (its \"not yet\" says it resumed nothing): the source sets the mark again without streaming again, and the target's death sends the session back to it", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.targetReadFails = true
      yield* t.pass
      assert.deepStrictEqual((yield* t.b.residents.all).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "nothing resumed on the target: its incoming VM kept, paused")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source keeps its copy")
      // Before: false (the target's clear stood, its 503 taken for no answer).
      assert.isTrue(yield* t.markSet, "the mark set again after the target's \"not yet\"")
      // A pass on the same answer: the target still holds the stream, nothing streamed again.
      const streamed = t.streams.count
      yield* t.pass
      assert.strictEqual(t.streams.count, streamed, "not streamed again")
      assert.deepStrictEqual((yield* t.b.residents.all).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
      assert.isTrue(yield* t.markSet)
      yield* t.wayBackResumes
    }),
  )
  for (const variant of ["noStream", "notResumed"] as const)
    effect(`the source's tell of the mark after the target's ${variant} goes unanswered, then the target stops answering and dies: the tell is made again on the next pass (before the target is asked anything), so the session goes back to the source`, () =>
      Effect.gen(function* () {
        const t = yield* resendOwed
        if (variant === "noStream") {
          // A stream cut partway: on the next pass the target clears the mark, finds it incomplete, answers noStream.
          t.faults.streamFails = true
          yield* t.pass
          t.faults.tellFails = true
        } else {
          // The stream sent again arrives whole (the mark told before it); the target clears the mark, cannot read the placement, answers "not yet".
          t.faults.targetReadFails = true
          t.faults.beforeResentCommit = Effect.sync(() => void (t.faults.tellFails = true))
        }
        yield* t.pass
        assert.isFalse(yield* t.markSet, `the target cleared the mark and the source's tell after its ${variant} went unanswered`)
        assert.deepStrictEqual((yield* t.a.residents.pendingCommits).map((p) => [p.resend, p.resendTold]), [[true, false]], "the tell owed, in the state file")
        t.faults.tellFails = false
        t.faults.targetDown = true
        yield* t.pass
        // Before: false for every pass the target did not answer (the tell owed was never made), and the session lost.
        assert.isTrue(yield* t.markSet, "told on the next pass, the target unanswering")
        yield* t.wayBackResumes
      }),
    )
  effect("the source's tell of the mark before a stream sent again goes unanswered: nothing is streamed on that pass (the target would clear the mark before it resumes); told on the next pass, the stream goes and the target runs the guest", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.tellFails = true
      yield* t.pass
      // Before (streamed whatever the tell's answer): one stream, resumed by the target, with a tell that could land after its clear.
      assert.strictEqual(t.streams.count, 0, "not streamed while the tell is unanswered")
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [], "nothing resumed on the target")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source keeps its copy")
      assert.deepStrictEqual((yield* t.a.residents.pendingCommits).map((p) => [p.resend, p.resendTold]), [[true, false]], "the tell owed")
      t.faults.tellFails = false
      yield* t.pass
      yield* t.streamedOnceAndRunOnTarget("streamed once told")
    }),
  )
  effect("the mark is cleared between the source's read of it and its tell (the answer says so: stale): the source takes it as not told, streams nothing on that pass, asks the target first on the next, and is told and streams then", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.clearAfterRead = true
      yield* t.pass
      assert.strictEqual(t.streams.count, 0, "not streamed while the mark is not known set")
      assert.isFalse(yield* t.markSet, "the stale tell set nothing")
      assert.deepStrictEqual((yield* t.a.residents.pendingCommits).map((p) => [p.resend, p.resendTold]), [[true, undefined]], "not told, and no tell owed first: the target is asked first")
      assert.deepStrictEqual(yield* t.vms(t.a.runtime), [["s1", "paused"]], "the source keeps its copy")
      t.faults.clearAfterRead = false
      yield* t.pass
      yield* t.streamedOnceAndRunOnTarget("the target said again that it runs nothing: told, then streamed")
    }),
  )
  effect("the source's tell of the mark before a stream sent again is given up on by its client but reaches the coordinator after the target cleared the mark and resumed: it sets nothing (it names the clears the source read), so the target's death leaves the session lost, never sent back to the source's older copy", () =>
    Effect.gen(function* () {
      const t = yield* resendOwed
      t.faults.tellLate = true
      yield* t.pass
      assert.strictEqual(t.streams.count, 0, "not streamed while the tell is unanswered")
      assert.isAbove(t.late.length, 0, "the tells held on their way")
      t.faults.tellLate = false
      yield* t.pass
      assert.strictEqual(t.streams.count, 1, "streamed once told")
      assert.deepStrictEqual(yield* t.vms(t.b.runtime), [["s1", "running"]], "the target cleared the mark and resumed the guest")
      assert.isFalse(yield* t.markSet, "the mark clear while the target runs the guest")
      // The tells given up on reach the coordinator now, late.
      for (const tell of t.late) assert.strictEqual(yield* Effect.orDie(tell), "stale", "answered with the mark clear: a clear came since the source read it")
      // Before (the tell named nothing): the late tell set the mark again while the target ran the guest.
      assert.isFalse(yield* t.markSet, "a late tell sets nothing")
      const result = yield* t.targetDies
      assert.deepStrictEqual(result.lostSessions, ["s1"], "the session is lost with its target")
      assert.isUndefined(result.returned, "never sent back to the source, which holds no copy")
    }),
  )
})
