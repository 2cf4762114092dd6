/**
 * End to end, over real HTTP to a real coordinator (in-process, StoreSim):
 * a move committed without its source's phases (an operator's word while the source was frozen)
 * whose final send failed leaves the source with the guest's only whole copy, paused, owing the
 * target a resend; then the target dies for good. The source's agent tells the coordinator of the
 * debt (`POST /v1/moves/{id}/resend`); the store's reclaim of the dead target's reservation sends
 * the session back to the source, heard and with room; the source's next pass resumes its paused
 * copy: the guest's CPU time (the simulated runtime's memory of its run) carries on, never booted
 * afresh. Without the source's word the same reclaim leaves the session `lost` (the target's own
 * resolution commit: it ran the guest, and the source's copy would be older).
 *
 * The source's state after the failed send (its copy paused, its `resend` debt written, the
 * coordinator told with the agent's own client) is set by hand, as the in-process
 * `CommittedSendFails` test reaches it through a real failed send. Passes of the source between
 * the debt and the reclaim (the target unanswering) read the session placed on the target: the
 * coordinator lets the source of its latest move read it (before, a 403 its agent took for "ended",
 * and its resend settling, then `settledByPlacement` (now `settleByPlacement`), destroyed the paused copy at the first pass).
 * The reclaim is the store's own pass (`reclaim`, as the reaper's leader runs it), called directly
 * so no reaper timing is involved. The stale window passes on the store's clock when the test
 * moves it (`skewedStore`), never waited out in real time: a loaded machine cannot make the
 * source, which reports just before the reclaim, look silent.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget, type MoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { effect } from "./support/PatientClock.js"
import { realClient, twoHostCoordinator } from "./support/RealCoordinator.js"

const adminToken = "dead-target-admin-token-0123456789"
const { measure, tokens, admin, url, store, pastWindow } = twoHostCoordinator(adminToken)

/** Host `hostId`'s coordinator client: the agent's own, its requests timed on the real clock. */
const clientOf = (hostId: string) => realClient(url(), hostId, tokens[hostId]!)

/** The source agent on the real coordinator; its peer link knows no target (`b` is gone: every call to it goes unanswered). */
const sourceAgent = Effect.gen(function* () {
  const client = yield* clientOf("a")
  const targets = new Map<string, MoveTarget>()
  const runtime = yield* SimRuntime.make({ startMs: 50 })
  const residents = yield* makeResidents("a", null, () => Effect.void)
  const target = yield* makeMoveTarget("a", runtime, residents)
  targets.set("a", target)
  const agent = yield* makeAgent(defaultAgentConfig("a"), {
    coordinator: client,
    runtime,
    measure: () => Effect.succeed(measure),
    residents,
    images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-a-"))),
    link: PeerLink.inMemory(targets),
    target,
  })
  /** One reconcile pass on the coordinator's view now, its actions run to their end (the test clock moving a second a step). */
  const pass = Effect.gen(function* () {
    yield* agent.reconcile(yield* client.assignments({ waitMs: 0, since: undefined }))
    for (let i = 0; i < 2000 && (yield* agent.busy); i++) {
      yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
      yield* TestClock.adjust("1 second")
    }
    assert.isFalse(yield* agent.busy, "a's actions finished")
  })
  const cpuMs = Effect.map(runtime.usage, (u) => u.find((v) => v.vmId === "s1")?.cpuMs ?? null)
  return { client, runtime, residents, pass, cpuMs }
})

/**
 * s1 booted on a and run a while; its move to b committed without phases past a's intent (the
 * operator's word), then a's copy paused owing the resend (its final send failed) when `owes`,
 * or, when not, the guest left to b (the target's own resolution: nothing owed on a).
 */
const movedToDeadTarget = (owes: boolean, sourcePassesWhileOwed = 0) =>
  Effect.gen(function* () {
    const a = yield* sourceAgent
    const created = yield* Effect.promise(() => admin("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["a"] }))
    assert.deepInclude(created.body, { hostId: "a" })
    yield* a.pass
    yield* a.pass
    assert.deepStrictEqual((yield* Effect.promise(() => admin("GET", "/v1/sessions/s1"))).body.state, "running")
    yield* TestClock.adjust("20 seconds")
    const ranMs = yield* a.cpuMs
    assert.isTrue(ranMs !== null && ranMs > 0, `the guest ran on a (${ranMs} ms)`)
    const move = yield* store((s) => s.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 5000 }))
    yield* a.client.round(move.id, { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })
    yield* store((s) => s.commitMove(move.id, null))
    if (owes) {
      yield* a.runtime.park("s1")
      yield* a.residents.update("s1", (v) => ({ ...v, status: "paused" }))
      // The word a's agent sends as it takes on the debt (`owedResend`), with its own client.
      assert.strictEqual(yield* a.client.resendOwed(move.id, true), "recorded")
      yield* a.residents.addPendingCommit({ moveId: move.id, sessionId: "s1", phases: null, target: { targetHostId: "b", memMib: 512, vcpus: 1 }, intentRecorded: true, resend: true, resendTold: true })
      // Passes of the source while the target does not answer its commit: it reads the session's
      // placement (still on b) to know whether its debt is over.
      for (let i = 0; i < sourcePassesWhileOwed; i++) yield* a.pass
    } else {
      yield* a.runtime.destroy("s1")
      yield* a.residents.remove("s1")
    }
    // b is gone for good: past the stale window (the store's clock moved on, not waited out) only a reports.
    pastWindow()
    yield* a.client.report(measure, [])
    return { a, ranMs: ranMs! }
  })

describe("a session whose move's target died, over a real coordinator", () => {
  effect("the source that owes the resend gets the session back and resumes its paused copy: the guest's run carries on", () =>
    Effect.gen(function* () {
      const { a, ranMs } = yield* movedToDeadTarget(true)
      const result = yield* store((s) => s.reclaim())
      // Before (a commit without phases alone, or no way back at all): lostSessions ["s1"], and a destroyed its copy.
      assert.deepStrictEqual(result.lostSessions, [])
      assert.deepStrictEqual(result.returned, [{ sessionId: "s1", hostId: "a" }])
      assert.deepInclude((yield* Effect.promise(() => admin("GET", "/v1/sessions/s1"))).body, { state: "running", hostId: "a" })
      yield* a.pass
      assert.deepStrictEqual(yield* Effect.map(a.runtime.list, (vms) => vms.map((v) => [v.vmId, v.status])), [["s1", "running"]], "the paused copy resumed on a")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      const now = yield* a.cpuMs
      assert.isTrue(now !== null && now >= ranMs, `the guest's run carried on (${now} ms after ${ranMs} ms before the move), not booted afresh`)
      const events = ((yield* Effect.promise(() => admin("GET", "/v1/sessions/s1/events"))).body.items as { kind: string }[]).map((e) => e.kind)
      assert.notInclude(events, "guest-lost")
    }),
  )
  effect("a source's passes while the target does not answer keep its paused copy (it reads the session placed on the target, as the move's source), and the way back then resumes it", () =>
    Effect.gen(function* () {
      const { a, ranMs } = yield* movedToDeadTarget(true, 2)
      // Before: the source's read of the session placed on b was the coordinator's 403, taken for
      // "ended or not visible": the first pass destroyed the guest's only whole copy (and cleared the mark).
      assert.deepStrictEqual(yield* Effect.map(a.runtime.list, (vms) => vms.map((v) => [v.vmId, v.status])), [["s1", "paused"]], "the paused copy kept through the passes")
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => p.resend), [true], "still owed")
      const result = yield* store((s) => s.reclaim())
      assert.deepStrictEqual(result.returned, [{ sessionId: "s1", hostId: "a" }], "the mark kept: the session sent back to the source")
      yield* a.pass
      assert.deepStrictEqual(yield* Effect.map(a.runtime.list, (vms) => vms.map((v) => [v.vmId, v.status])), [["s1", "running"]], "the paused copy resumed on a")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      const now = yield* a.cpuMs
      assert.isTrue(now !== null && now >= ranMs, `the guest's run carried on (${now} ms after ${ranMs} ms before the move), not booted afresh`)
    }),
  )
  effect("a draining source gets the session back too and its pass resumes the paused copy: a return is no new placement, and nothing in the agent refuses a guest on a draining host", () =>
    Effect.gen(function* () {
      const { a, ranMs } = yield* movedToDeadTarget(true)
      assert.strictEqual((yield* Effect.promise(() => admin("POST", "/v1/hosts/a/drain"))).status, 200)
      const result = yield* store((s) => s.reclaim())
      // Before: a draining (or cordoned) source had no room for placement, so lostSessions ["s1"], and a destroyed its copy.
      assert.deepStrictEqual(result.lostSessions, [])
      assert.deepStrictEqual(result.returned, [{ sessionId: "s1", hostId: "a" }])
      yield* a.pass
      assert.deepStrictEqual(yield* Effect.map(a.runtime.list, (vms) => vms.map((v) => [v.vmId, v.status])), [["s1", "running"]], "the paused copy resumed on the draining a")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      const now = yield* a.cpuMs
      assert.isTrue(now !== null && now >= ranMs, `the guest's run carried on (${now} ms after ${ranMs} ms before the move), not booted afresh`)
      assert.deepInclude((yield* Effect.promise(() => admin("GET", "/v1/hosts/a"))).body, { state: "draining" })
    }),
  )
  effect("without the source's word (the target resolved the move itself: it ran the guest) the session is lost, never sent back to an older copy", () =>
    Effect.gen(function* () {
      yield* movedToDeadTarget(false)
      const result = yield* store((s) => s.reclaim())
      assert.deepStrictEqual(result.lostSessions, ["s1"])
      assert.isUndefined(result.returned)
      assert.deepInclude((yield* Effect.promise(() => admin("GET", "/v1/sessions/s1"))).body, { state: "lost" })
    }),
  )
})
