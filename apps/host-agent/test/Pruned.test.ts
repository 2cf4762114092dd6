/**
 * A move the coordinator pruned while an agent was away (its retention, `ENGRAM_RETENTION_MS`,
 * deletes moves that ended long ago; a pending move never): back, the agent reads the move's 404
 * as "ended long ago" and lets the session's placement decide, as for an ended move, instead of
 * keeping a guest or a debt for ever. A 404 that does not name the move (a wrong coordinator
 * URL) says nothing: the guest is kept.
 *
 * A real coordinator (in-process, StoreSim) over real HTTP, the agents' own HTTP client, agents
 * on the TestClock (PatientClock): the agents' passes are driven by hand. The coordinator's
 * admin steps while the agent is away (beginning the move, pruning) go through its store.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Effect, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import { afterEach, beforeEach } from "vitest"
import { makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import type { PendingCommit } from "../src/LocalState.js"
import { makeMoveTarget, type MoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { effect } from "./support/PatientClock.js"
import { adminCall } from "./support/Admin.js"
import { onStore, realClient } from "./support/RealCoordinator.js"
import type { CoordinatorShape } from "../src/Coordinator.js"

const adminToken = "pruned-admin-token-0123456789"
let coordinator: RunningCoordinator
const tokens: Record<string, string> = {}

const admin = adminCall(() => coordinator.url, adminToken)

// A coordinator of its own for each case: what one case leaves running is not another's.
beforeEach(async () => {
  coordinator = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "None", config: { port: 0, adminToken, moveTimeoutMs: 600_000 } })
  for (const id of ["a", "b"]) {
    tokens[id] = (await admin("POST", "/v1/hosts", { id })).body.token as string
    // A host takes sessions and moves only once it has reported.
    assert.strictEqual((await admin("PUT", `/v1/hosts/${id}/report`, { totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 })).status, 200)
  }
})
afterEach(() => coordinator?.stop())

/** Host `hostId`'s coordinator client: the agent's own, its requests timed on the real clock. */
const clientOf = (hostId: string, url = coordinator.url) => realClient(url, hostId, tokens[hostId]!)

/** The coordinator's store, as the admin steps of a test use it. */
const store = onStore(() => coordinator)

/** Prunes every move (and ended session) that ended before now, as the leader's retention step does once they are older than it. */
const pruneEnded = (moveId: string) =>
  Effect.gen(function* () {
    const endedAt = (yield* store((s) => s.getMove(moveId))).endedAt
    assert.isNotNull(endedAt, "the move ended")
    // `endedBefore` is strict and must not be after the store's now: the next millisecond.
    while (Date.now() <= endedAt!) {
      // (sub-millisecond: the store's clock is the real one)
    }
    for (let i = 0; i < 2; i++) yield* store((s) => s.pruneHistory({ endedBefore: Date.now(), limit: 10_000 }))
    const read = yield* Effect.promise(() => admin("GET", `/v1/moves/${moveId}`))
    assert.deepInclude(read, { status: 404 }, "the move is pruned")
  })

const intent = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 } as const

/** One agent built on the real coordinator (no loops: tests drive its passes); `targets` is the fleet's in-memory peer link. */
const hostOf = (hostId: string, targets: Map<string, MoveTarget>, coordinator?: CoordinatorShape) =>
  Effect.gen(function* () {
    const client = coordinator ?? (yield* clientOf(hostId))
    const runtime = yield* SimRuntime.make({ startMs: 50 })
    const residents = yield* makeResidents(hostId, null, () => Effect.void)
    const target = yield* makeMoveTarget(hostId, runtime, residents)
    targets.set(hostId, target)
    const agent = yield* makeAgent(defaultAgentConfig(hostId), {
      coordinator: client,
      runtime,
      measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
      residents,
      images: ImageStore.directory(mkdtempSync(join(tmpdir(), `engram-images-${hostId}-`))),
      link: PeerLink.inMemory(targets),
      target,
    })
    /** Runs `eff` to its end, moving the test clock while it waits on it (the simulated runtime's durations). */
    const onClock = <A, E>(eff: Effect.Effect<A, E>) =>
      Effect.gen(function* () {
        const fiber = yield* Effect.forkChild(eff)
        for (let i = 0; i < 100 && fiber.pollUnsafe() === undefined; i++) {
          yield* Effect.promise(() => new Promise<void>((resolve) => setImmediate(resolve)))
          yield* TestClock.adjust("1 second")
        }
        return yield* Fiber.join(fiber)
      })
    /**
     * One reconcile pass on the coordinator's view now, then its actions to their end: the test
     * clock moves a second at a time while one is in flight, each step after a turn of real time
     * (the HTTP answers). Bounded (about 20 s of real time at most).
     */
    const pass = Effect.gen(function* () {
      yield* agent.reconcile(yield* client.assignments({ waitMs: 0, since: undefined }))
      for (let i = 0; i < 2000 && (yield* agent.busy); i++) {
        yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
        yield* TestClock.adjust("1 second")
      }
      assert.isFalse(yield* agent.busy, `${hostId}'s actions finished`)
    })
    return { hostId, client, agent, runtime, residents, target, onClock, pass }
  })
type Host = Effect.Success<ReturnType<typeof hostOf>>

/** A guest of `memMib` running on `h` (as `status`): its VM in the runtime, its record resident. */
const residentGuest = (h: Host, vmId: string, o: { readonly status: "running" | "paused"; readonly moveId: string | null }) =>
  Effect.gen(function* () {
    const spec = { vmId, memMib: 512, vcpus: 1 }
    yield* h.onClock(h.runtime.start(spec))
    if (o.status === "paused") yield* h.onClock(h.runtime.park(vmId))
    yield* h.residents.put({ ...spec, status: o.status, reservationId: null, moveId: o.moveId })
  })

/** A session `id` running on host a, and its move to b begun, past its point of no return (a recorded its intent). */
const movingToB = (a: Host, id: string) =>
  Effect.gen(function* () {
    const created = yield* Effect.promise(() => admin("POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: ["a"] }))
    assert.deepInclude(created.body, { hostId: "a" })
    yield* a.client.started(id)
    const move = yield* store((s) => s.beginMove({ sessionId: id, targetHostId: "b", maxDowntimeMs: 5000 }))
    yield* a.client.round(move.id, intent)
    return move.id
  })

/** The debt of a source whose target committed the move (the guest runs there) and whose commit the coordinator has not acknowledged. */
const owedCommit = (moveId: string, sessionId: string): PendingCommit => ({
  moveId,
  sessionId,
  phases: { downtimeMs: 100, captureMs: 10, sendMs: 20, commitMs: 60 },
  target: { targetHostId: "b", memMib: 512, vcpus: 1 },
  pause: { pausedAtMs: 0, captureMs: 10, sendMs: 20, sentAtMs: 30 },
  final: { kind: "final", wireBytes: 1_000_000, apparentBytes: 1_000_000, sendMs: 20, captureMs: 10 },
  finalRecorded: true,
  intentRecorded: true,
})

/** Collects log lines (level and text). */
const capturingLogs = Effect.sync(() => {
  const lines: { readonly level: string; readonly text: string }[] = []
  return { lines, layer: Logger.layer([Logger.make((o) => void lines.push({ level: o.logLevel, text: JSON.stringify(o.message) }))]) }
})
const vmsOf = (h: Host) => Effect.map(h.runtime.list, (vms) => vms.map((v) => [v.vmId, v.status]))

describe("a target back after its move was pruned", () => {
  effect("the guest it ran for a move that ended (its session ended too) and was pruned is dropped, not kept for ever", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      yield* Effect.gen(function* () {
        const targets = new Map<string, MoveTarget>()
        const a = yield* hostOf("a", targets)
        const b = yield* hostOf("b", targets)
        const moveId = yield* movingToB(a, "t1")
        // b resumed the guest (the source's commit reached it); then b is cut off.
        yield* residentGuest(b, "t1", { status: "running", moveId })
        // Meanwhile the session is ended (its move aborted), and both are pruned in time.
        assert.strictEqual((yield* Effect.promise(() => admin("DELETE", "/v1/sessions/t1"))).status, 200)
        yield* pruneEnded(moveId)
        assert.deepInclude(yield* Effect.promise(() => admin("GET", "/v1/sessions/t1")), { status: 404 }, "the session is pruned")

        // b is back: its staging grace runs from its first pass; then its passes read the move.
        yield* b.pass
        yield* TestClock.adjust(defaultAgentConfig("b").stagingGraceMs + 1000)
        yield* b.pass
        assert.deepStrictEqual(yield* vmsOf(b), [], "the guest of the pruned move is no longer on b")
        assert.deepStrictEqual(yield* b.residents.all, [])
        assert.isTrue(logs.lines.some((l) => l.text.includes("dropped the VM of a move no longer pending")), JSON.stringify(logs.lines))
        const before = logs.lines.length
        yield* b.pass
        assert.deepStrictEqual(logs.lines.slice(before).filter((l) => l.level === "Warn" || l.level === "Error"), [])
      }).pipe(Effect.provide(logs.layer))
    }))

  effect("a 404 that does not name the move (a wrong coordinator URL answers one for every path) is no answer: the guest is kept", () =>
    Effect.gen(function* () {
      const targets = new Map<string, MoveTarget>()
      const a = yield* hostOf("a", targets)
      const right = yield* clientOf("b")
      const wrong = yield* clientOf("b", `${coordinator.url}/not-the-coordinator`)
      const b = yield* hostOf("b", targets, { ...right, getMove: wrong.getMove })
      const moveId = yield* movingToB(a, "t2")
      yield* residentGuest(b, "t2", { status: "running", moveId })
      assert.strictEqual((yield* Effect.promise(() => admin("DELETE", "/v1/sessions/t2"))).status, 200)
      yield* pruneEnded(moveId)
      // The client tells the two 404s apart: the coordinator's names the move, the wrong URL's does not.
      const pruned = yield* Effect.result(right.getMove(moveId))
      assert.deepInclude(pruned._tag === "Failure" ? pruned.failure : pruned, { _tag: "CoordinatorError", status: 404, notFound: { entity: "move", id: moveId } })
      const elsewhere = yield* Effect.result(wrong.getMove(moveId))
      assert.isTrue(elsewhere._tag === "Failure" && elsewhere.failure._tag === "CoordinatorError" && elsewhere.failure.status === 404, JSON.stringify(elsewhere))
      assert.isFalse(elsewhere._tag === "Failure" && elsewhere.failure._tag === "CoordinatorError" && elsewhere.failure.notFound?.entity === "move", JSON.stringify(elsewhere))

      yield* b.pass
      yield* TestClock.adjust(defaultAgentConfig("b").stagingGraceMs + 1000)
      yield* b.pass
      yield* b.pass
      assert.deepStrictEqual(yield* vmsOf(b), [["t2", "running"]], "a guest that ran here goes only on the coordinator's word")
    }))
})

describe("a source back after its move was pruned, its commit still owed", () => {
  effect("the move committed on the target's report and was pruned: the commit's 404 settles the debt, the paused copy is destroyed, no more warnings", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      yield* Effect.gen(function* () {
        const targets = new Map<string, MoveTarget>()
        const a = yield* hostOf("a", targets)
        const b = yield* hostOf("b", targets)
        const moveId = yield* movingToB(a, "c1")
        // a paused its copy and the target runs the guest; a is cut off before its commit lands.
        yield* residentGuest(a, "c1", { status: "paused", moveId: null })
        yield* a.residents.addPendingCommit(owedCommit(moveId, "c1"))
        // Meanwhile the target reports the guest running (SPEC §13): the move commits, later pruned.
        yield* b.client.reportRunning(moveId, "the target runs the guest")
        yield* pruneEnded(moveId)

        yield* a.pass
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt of the pruned move is settled")
        assert.deepStrictEqual(yield* vmsOf(a), [], "the paused copy is destroyed: the session runs on b")
        assert.deepStrictEqual(yield* a.residents.all, [])
        const before = logs.lines.length
        yield* a.pass
        yield* a.pass
        assert.deepStrictEqual(logs.lines.slice(before).filter((l) => l.level === "Warn" || l.level === "Error"), [], "no more warnings")
      }).pipe(Effect.provide(logs.layer))
    }))

  effect("the move was aborted (the session back on the source) and pruned: the target's copy is destroyed first, then the paused copy resumes; never twice", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      yield* Effect.gen(function* () {
        const targets = new Map<string, MoveTarget>()
        const a = yield* hostOf("a", targets)
        const b = yield* hostOf("b", targets)
        const moveId = yield* movingToB(a, "r1")
        yield* residentGuest(a, "r1", { status: "paused", moveId: null })
        yield* a.residents.addPendingCommit(owedCommit(moveId, "r1"))
        yield* residentGuest(b, "r1", { status: "running", moveId })
        // What a's copy was when the target was told to destroy its own.
        const sourceAtAbort: unknown[] = []
        targets.set("b", { ...b.target, abort: (id) => Effect.flatMap(vmsOf(a), (vms) => Effect.sync(() => void sourceAtAbort.push(vms))).pipe(Effect.andThen(b.target.abort(id))) })
        // Meanwhile an operator aborts the move: the coordinator places the session on a again.
        const resolved = yield* Effect.promise(() => admin("POST", `/v1/moves/${moveId}/resolve`, { outcome: "abort", reason: "the source is away" }))
        assert.deepInclude(resolved.body, { state: "aborted" })
        yield* pruneEnded(moveId)
        assert.deepInclude((yield* Effect.promise(() => admin("GET", "/v1/sessions/r1"))).body, { state: "running", hostId: "a" })

        yield* a.pass
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt of the pruned move is settled")
        assert.deepStrictEqual(yield* vmsOf(b), [], "the target's copy is destroyed")
        assert.deepStrictEqual(yield* vmsOf(a), [["r1", "running"]], "the source's copy resumed")
        assert.deepStrictEqual(sourceAtAbort, [[["r1", "paused"]]], "the target's copy went while the source's was still paused")
        assert.deepStrictEqual((yield* a.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["r1", "running", null]])
        const before = logs.lines.length
        yield* a.pass
        yield* a.pass
        assert.deepStrictEqual(logs.lines.slice(before).filter((l) => l.level === "Warn" || l.level === "Error"), [], "no more warnings")
        assert.deepStrictEqual(yield* vmsOf(a), [["r1", "running"]])
      }).pipe(Effect.provide(logs.layer))
    }))

  effect("the target's commit was never confirmed (nothing runs there) and the move was aborted and pruned: the abort's 404 settles the debt, the paused copy resumes", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      yield* Effect.gen(function* () {
        const targets = new Map<string, MoveTarget>()
        const a = yield* hostOf("a", targets)
        const b = yield* hostOf("b", targets)
        const moveId = yield* movingToB(a, "u1")
        yield* residentGuest(a, "u1", { status: "paused", moveId: null })
        // Paused, the final round sent, the target's commit not confirmed (the link went down).
        yield* a.residents.addPendingCommit({ ...owedCommit(moveId, "u1"), phases: null })
        const resolved = yield* Effect.promise(() => admin("POST", `/v1/moves/${moveId}/resolve`, { outcome: "abort", reason: "the source is away" }))
        assert.deepInclude(resolved.body, { state: "aborted" })
        yield* pruneEnded(moveId)

        // Back: the target refuses the commit (it holds nothing); the source's abort gets the 404.
        yield* a.pass
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt of the pruned move is settled")
        assert.deepStrictEqual(yield* vmsOf(a), [["u1", "running"]], "the source's copy resumed")
        assert.deepStrictEqual(yield* vmsOf(b), [])
        const before = logs.lines.length
        yield* a.pass
        yield* a.pass
        assert.deepStrictEqual(logs.lines.slice(before).filter((l) => l.level === "Warn" || l.level === "Error"), [], "no more warnings")
      }).pipe(Effect.provide(logs.layer))
    }))
})
