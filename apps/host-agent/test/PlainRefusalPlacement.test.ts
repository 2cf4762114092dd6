/**
 * A move's source owes the move (its target's commit never confirmed: the link went down after
 * the final round was sent), the coordinator holds the move committed (an operator's
 * `engram moves commit`), and the target refuses the source's commit without saying that its
 * stream never completed (`noStream`): an agent older than that word, or one that lost its state
 * file. The refusal alone does not say where the session is placed.
 *
 * Before: on that refusal the source read the move committed and destroyed its paused copy at
 * once (`confirmAtTarget`), without reading the session's placement: a session the coordinator
 * had meanwhile placed back on the source, or whose placement could not be read, lost the guest's
 * only copy. Now the placement decides, by the read a `resend` debt takes (`settleByPlacement`):
 * placed on this source → the copy resumes; not known (the coordinator's 403, or no answer) → the
 * copy stays paused and owed (`refusedSinceMs` written once), up to the give-up
 * (`resendGiveUpMs` from that time); placed on the target → destroyed, as before.
 */
import { assert, describe } from "@effect/vitest"
import { Limits } from "@engram/core"
import { SimRuntime } from "@engram/runtime"
import { Clock, Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { PeerError } from "../src/MoveTarget.js"
import { resendGiveUpMs } from "../src/MoveSource.js"
import { effect } from "./support/PatientClock.js"
import { copiesOn, makeFleet, type TestHost } from "./support/InProcess.js"
import { capture } from "./support/Logs.js"

/**
 * Hosts a and b; s1 on a, move m1 to b. The link's commit fails after the final round's send (no
 * answer), so a owes m1 with its copy paused; then an operator commits m1 (s1 placed on b) and
 * from then on b refuses the commit plainly (no `noStream`). Only a's passes run from there.
 */
const committedThenRefusedPlainly = Effect.gen(function* () {
  const link = { state: "up" as "up" | "down" | "refusing" }
  const fleet = yield* makeFleet(
    [
      { hostId: "a", sim: SimRuntime.defaultSimConfig },
      { hostId: "b", sim: SimRuntime.defaultSimConfig },
    ],
    {
      onSent: (_c, hostId) => Effect.sync(() => void (hostId === "a" && link.state === "up" && (link.state = "down"))),
      wrapLink: (l) => ({
        ...l,
        commit: (h) =>
          link.state === "down"
            ? Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message: "link down", refused: false }))
            : link.state === "refusing"
              ? Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message: "no incoming VM for this move", refused: true }))
              : l.commit(h),
      }),
    },
  )
  const [a, b] = fleet.hosts as [TestHost, TestHost]
  const copies = copiesOn(a, b)
  yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
  yield* fleet.settle()
  yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
  yield* fleet.settle(1)
  assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => [p.moveId, p.phases]), [["m1", null]], "the source owes the move, its commit unconfirmed")
  assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]])
  // The operator's commit (as `engram moves commit m1`): s1 placed on b.
  yield* Ref.update(fleet.coordinator.ref, (s) => ({
    ...s,
    moves: new Map(s.moves).set("m1", { ...s.moves.get("m1")!, state: "committed" }),
    sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: "res-move-m1" }),
  }))
  link.state = "refusing"
  const startsBefore = yield* Ref.get(a.runtime.starts)
  // The source as it runs now (a restart replaces it in `fleet.hosts`).
  const pass = Effect.gen(function* () {
    yield* (fleet.hosts[0] as TestHost).agent.reconcile(yield* fleet.coordinator.assignmentsOf("a"))
    yield* fleet.quiesce
  })
  return { fleet, a, copies, pass, startsBefore, link }
})

describe("a committed move whose target refuses the source's commit without `noStream`", () => {
  effect("the coordinator has placed the session back on the source: the paused copy resumes there, never destroyed and booted afresh", () =>
    Effect.gen(function* () {
      const { fleet, a, copies, pass, startsBefore } = yield* committedThenRefusedPlainly
      yield* fleet.coordinator.place("s1", "a", "running")
      yield* pass
      // Before: the copy destroyed on the refusal and the move's "committed" alone; the session,
      // placed here, then booted afresh: its memory lost.
      assert.strictEqual(yield* Ref.get(a.runtime.starts), startsBefore, "never booted afresh on the source")
      assert.deepStrictEqual((yield* copies).a, [["s1", "running"]], "the paused copy resumed")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt is over")
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [], "no loss told")
    }),
  )

  for (const coordinator of ["answers 403 (older than letting a move's source read its session; the source's agent restarted in between)", "answers 403, then is cut off from the source"] as const)
    effect(`the coordinator ${coordinator}: the copy is kept paused and owed until the give-up, then destroyed with an error naming why`, () => {
      const errors = capture("Error")
      return Effect.gen(function* () {
        const { fleet, copies, pass } = yield* committedThenRefusedPlainly
        yield* fleet.coordinator.olderThanMoveReads(true)
        yield* pass
        const a = coordinator.startsWith("answers 403 (") ? yield* fleet.restart("a") : (fleet.hosts[0] as TestHost)
        // Before: { a: [] } at this first pass: destroyed on the refusal, its placement unread.
        assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]], "kept while where the session is placed is not known")
        const owed = yield* a.residents.pendingCommits
        assert.deepStrictEqual(owed.map((p) => [p.moveId, p.phases, p.resend]), [["m1", null, undefined]], "still owed, not as a resend")
        const sinceMs = owed[0]!.refusedSinceMs
        assert.isNumber(sinceMs, "the wait's start written (the state file: a restarted agent counts on from it)")
        if (coordinator === "answers 403, then is cut off from the source") yield* fleet.coordinator.silence("a", true)
        const endMs = sinceMs! + resendGiveUpMs(Limits.defaults.heartbeatStaleWindowMs)
        yield* TestClock.adjust(endMs - 5 * 60_000 - (yield* Clock.currentTimeMillis))
        yield* pass
        assert.isBelow(yield* Clock.currentTimeMillis, endMs, "this pass ended within the bound")
        assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]], "kept within the bound")
        assert.strictEqual((yield* a.residents.pendingCommits)[0]?.refusedSinceMs, sinceMs, "the start written once")
        assert.isFalse(errors.lines.some((l) => l.fields["hostId"] === "a" && l.message.includes("destroyed")), "nothing destroyed within the bound")
        yield* TestClock.adjust(endMs + 1000 - (yield* Clock.currentTimeMillis))
        yield* pass
        assert.deepStrictEqual((yield* copies).a, [], "destroyed past the bound")
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "the debt dropped")
        assert.isTrue(errors.lines.some((l) => l.fields["hostId"] === "a" && l.message.includes("past the target's own wait")), "an error names why")
      }).pipe(Effect.provide(errors.layer))
    })

  effect("the session not readable, then read placed back on the source: the copy kept meanwhile resumes", () =>
    Effect.gen(function* () {
      const { fleet, a, copies, pass, startsBefore } = yield* committedThenRefusedPlainly
      yield* fleet.coordinator.olderThanMoveReads(true)
      yield* pass
      yield* pass
      assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]], "kept while not visible")
      yield* fleet.coordinator.olderThanMoveReads(false)
      yield* fleet.coordinator.place("s1", "a", "running")
      yield* pass
      assert.deepStrictEqual((yield* copies).a, [["s1", "running"]], "resumed where the session is placed")
      assert.strictEqual(yield* Ref.get(a.runtime.starts), startsBefore, "never booted afresh")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }),
  )

  effect("the session read placed on the target: the copy is destroyed, as before (the target boots it afresh there)", () =>
    Effect.gen(function* () {
      const { a, copies, pass } = yield* committedThenRefusedPlainly
      yield* pass
      assert.deepStrictEqual((yield* copies).a, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }),
  )

  effect("refused plainly while the placement was not known, then the target stops answering and the session reads placed on it: the copy is destroyed (the target boots it afresh there), not kept for as long as the link is down", () =>
    Effect.gen(function* () {
      const { fleet, a, copies, pass, link } = yield* committedThenRefusedPlainly
      yield* fleet.coordinator.olderThanMoveReads(true)
      yield* pass
      assert.deepStrictEqual((yield* copies).a, [["s1", "paused"]], "kept while not visible")
      assert.isNumber((yield* a.residents.pendingCommits)[0]?.refusedSinceMs)
      yield* fleet.coordinator.olderThanMoveReads(false)
      link.state = "down"
      yield* pass
      // Before: kept paused and owed on every pass the target did not answer, the give-up never counting (the placement known).
      assert.deepStrictEqual((yield* copies).a, [], "destroyed: the session is placed on the target, which said it boots it afresh")
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }),
  )
})
