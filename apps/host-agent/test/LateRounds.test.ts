/**
 * The pre-copy rounds a source's runtime measured only at the pause (its late rounds, QEMU's last
 * pass read after the fact) are recorded once, at their positions, though the source's agent
 * restarts in the pause between their records: the restarted source sends again only what the
 * move does not hold, at the positions the records took on the first run. So is a pre-copy round
 * whose record was still in flight at the pause. In process, on the
 * TestClock (`InProcess`); the restart closes the agent's scope and starts it again from its
 * state file, on the same runtime.
 */
import { assert, describe } from "@effect/vitest"
import type { MoveRound } from "@engram/runtime"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { effect } from "./support/PatientClock.js"
import { makeFleet } from "./support/InProcess.js"

/** Two late rounds, figures none of the simulated rounds has. */
const late: MoveRound[] = [
  { kind: "delta", wireBytes: 3_000_001, apparentBytes: 3_100_001, sendMs: 7, captureMs: 2 },
  { kind: "delta", wireBytes: 1_000_003, apparentBytes: 1_100_003, sendMs: 3, captureMs: 1 },
]

/**
 * Runs a move from a to b whose source is stopped in the pause: the record at position `heldSeq`
 * never answers on the first run, which goes no further than the final round's send (the guest
 * paused, the stream complete). Then a's agent starts again from its state file and the fleet
 * settles. Answers the move's records at the stop and at the end.
 */
const restartedInThePause = (moveIntent: boolean, heldSeq: number, selfConverge = false) =>
  Effect.gen(function* () {
    const first = { holding: true, heldAsked: false, sent: false }
    const fleet = yield* makeFleet([{ hostId: "a" }, { hostId: "b" }], {
      moveIntent,
      selfConverge,
      lateRounds: (hostId) => (hostId === "a" ? late : []),
      wrapCoordinator: (client, hostId) =>
        hostId !== "a"
          ? client
          : { ...client, round: (id, r) => (first.holding && r.seq === heldSeq ? Effect.andThen(Effect.sync(() => void (first.heldAsked = true)), Effect.never) : client.round(id, r)) },
      onSent: (_coordinator, hostId) => (hostId === "a" && first.holding ? Effect.andThen(Effect.sync(() => void (first.sent = true)), Effect.never) : Effect.void),
    })
    const settle = fleet.settle()
    yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
    yield* settle
    assert.strictEqual((yield* fleet.coordinator.get).sessions.get("s1")?.state, "running")
    yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
    yield* fleet.pass
    // The first run never ends (it waits on the held record): the clock moves until it is stuck
    // there, bounded in steps, each giving the agents' I/O its turn first (as `quiesce` does: one
    // turn of the event loop, later 10 ms of real time, about 20 s at most on a loaded machine).
    for (let i = 0; i < 2000 && !(first.heldAsked && first.sent); i++) {
      yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
      yield* TestClock.adjust("1 second")
    }
    assert.isTrue(first.heldAsked && first.sent, "the first run reached the held record and sent the final round")
    const atStop = (yield* fleet.coordinator.get).moves.get("m1")!.rounds

    first.holding = false
    const a = yield* fleet.restart("a")
    assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
    assert.deepStrictEqual((yield* a.residents.pendingCommits).map((p) => p.moveId), ["m1"], "the restarted source owes the move")
    yield* settle

    const s = yield* fleet.coordinator.get
    const move = s.moves.get("m1")!
    assert.strictEqual(move.state, "committed")
    assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "b"])
    assert.deepStrictEqual(yield* a.runtime.list, [])
    assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    return { atStop, rounds: move.rounds }
  })

for (const moveIntent of [true, false])
  describe(`a source restarted in the pause between its late rounds' records, intent ${moveIntent ? "on" : "off"}`, () => {
    effect("the move's record holds each late round once, in order, then the final round; the move commits on the target", () =>
      Effect.gen(function* () {
        const pre = moveIntent ? ["full", "delta", "delta", "intent"] : ["full", "delta", "delta"]
        // The second late round's record is held: the first one is recorded when the source stops.
        const { atStop, rounds } = yield* restartedInThePause(moveIntent, pre.length + 1)
        assert.deepStrictEqual(atStop.map((r) => r.kind), [...pre, "delta"])
        assert.deepStrictEqual(atStop.at(-1), late[0])
        assert.deepStrictEqual(rounds.map((r) => r.kind), [...pre, "delta", "delta", "final"])
        assert.deepStrictEqual(rounds.slice(pre.length, pre.length + 2), late, "each late round once, in order, at the positions of the first run")
        assert.deepStrictEqual(rounds.slice(0, atStop.length), atStop)
      }),
    )
  })

describe("a source restarted in the pause while a pre-copy round's record was in flight (intent off)", () => {
  effect("the move's record holds that round once at its position, then the late rounds and the final round", () =>
    Effect.gen(function* () {
      // The last pre-copy round (the second delta, position 2) is still being recorded when the guest pauses.
      const { atStop, rounds } = yield* restartedInThePause(false, 2)
      assert.deepStrictEqual(atStop.map((r) => r.kind), ["full", "delta"])
      assert.deepStrictEqual(rounds.map((r) => r.kind), ["full", "delta", "delta", "delta", "delta", "final"])
      assert.deepStrictEqual(rounds.slice(0, 2), atStop)
      // Position 2 is the pre-copy round itself (the simulated runtime's), not a late round.
      assert.notDeepInclude(late, rounds[2])
      assert.deepStrictEqual(rounds.slice(3, 5), late)
    }),
  )
})

describe("a source restarted in the pause between its late rounds' records, intent on, the runtime paused on its own", () => {
  effect("the late rounds once, in order, then the intent (sent in the pause, after them) and the final round", () =>
    Effect.gen(function* () {
      // No intent before the pause (the guard never decided): the debt owes the intent, after the late rounds.
      const { atStop, rounds } = yield* restartedInThePause(true, 4, true)
      assert.deepStrictEqual(atStop.map((r) => r.kind), ["full", "delta", "delta", "delta"])
      assert.deepStrictEqual(rounds.map((r) => r.kind), ["full", "delta", "delta", "delta", "delta", "intent", "final"])
      assert.deepStrictEqual(rounds.slice(3, 5), late, "each late round once, in order, at the positions of the first run")
      assert.deepStrictEqual(rounds.slice(0, atStop.length), atStop)
    }),
  )
})
