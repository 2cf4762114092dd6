/**
 * The report of a lost guest (`guestLost`) beside a move and a restart.
 *
 * A move that takes the session away while its report is untold (the coordinator did not answer
 * it yet): before, the agent's next pass found the session no longer assigned here and dropped
 * the report, so the loss was missing from the session's history. Guard: the report is still
 * told; the coordinator records the copy lost on the host its latest move left (`moveId`,
 * `toHostId`), and refuses (the agent drops) a report of a session that ended or left otherwise.
 *
 * An agent restarted after the loss was told and before its session's fresh guest runs (or its
 * `descended` lands): before, the sessions whose loss was noted were kept in memory only, so the
 * restarted agent found the guest gone again and told the same loss a second time (a second
 * `guest_lost` in the history). Guard: they are kept in the state file (`lostNoted`).
 */
import { assert, describe } from "@effect/vitest"
import { RuntimeError, SimRuntime } from "@engram/runtime"
import { Effect } from "effect"
import { lostReasonOf } from "../src/Agent.js"
import { CoordinatorError } from "../src/Coordinator.js"
import { makeFleet } from "./support/InProcess.js"
import { effect } from "./support/PatientClock.js"

describe("a lost guest's report", () => {
  effect("untold when a move takes the session away: told after, recorded as the copy lost on the host the move left", () =>
    Effect.gen(function* () {
      // a's reports of lost guests go unanswered (a coordinator that times them out) until `cut` is lifted.
      let cut = true
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          wrapCoordinator: (client, hostId) =>
            hostId !== "a" ? client : { ...client, guestLost: (id, reason) => (cut ? Effect.fail(new CoordinatorError({ op: "guestLost", status: null, message: "timed out" })) : client.guestLost(id, reason)) },
        },
      )
      const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.coordinator.addSession("s2", "a", 1024, 1)
      yield* fleet.settle()
      // The guests vanish on a: fresh ones boot there, their reports untold.
      yield* a.runtime.destroy("s1")
      yield* a.runtime.destroy("s2")
      yield* fleet.settle(1)
      assert.deepStrictEqual((yield* a.residents.lostReports).map((r) => r.sessionId).sort(), ["s1", "s2"])
      // s2 ends meanwhile: its report is refused once told, and dropped.
      yield* fleet.coordinator.setState("s2", "ended")
      // The fresh guest moves to b while the report is still untold.
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      yield* fleet.settle()
      const moved = yield* fleet.coordinator.get
      assert.strictEqual(moved.moves.get("m1")!.state, "committed")
      assert.strictEqual(moved.sessions.get("s1")!.hostId, "b")
      assert.deepStrictEqual(moved.guestsLost, [])
      // Before: dropped by a's first pass without the session; the loss never reached the history.
      assert.deepStrictEqual((yield* a.residents.lostReports).map((r) => r.sessionId).sort(), ["s1", "s2"], "kept, though the sessions are no longer a's")
      cut = false
      yield* fleet.settle()
      const told = yield* fleet.coordinator.get
      assert.deepStrictEqual(told.guestsLost, [{ hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running"), moveId: "m1", toHostId: "b" }])
      assert.deepStrictEqual(yield* a.residents.lostReports, [], "s1's told, s2's refused: both dropped")
      assert.strictEqual(told.sessions.get("s1")!.state, "running")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      yield* fleet.settle(2)
      assert.strictEqual((yield* fleet.coordinator.get).guestsLost.length, 1, "told once")
    }),
  )

  effect("told, then the agent restarts before its descent is acknowledged: the loss is not told again", () =>
    Effect.gen(function* () {
      // a's `descended` is not answered until `cut` is lifted (the coordinator fails it).
      let cut = false
      const fleet = yield* makeFleet([{ hostId: "a", sim: SimRuntime.defaultSimConfig }], {
        wrapCoordinator: (client) => ({ ...client, descended: (id, options) => (cut ? Effect.fail(new CoordinatorError({ op: "descended", status: 503, message: "the store call timed out" })) : client.descended(id, options)) }),
      })
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.settle()
      // The guest vanishes, and the session is told to descend: its loss is told first, then `descended` fails.
      yield* fleet.hosts[0]!.runtime.destroy("s1")
      yield* fleet.coordinator.setState("s1", "descending")
      cut = true
      yield* fleet.settle(1)
      const lost = { hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "descending") }
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [lost])
      assert.strictEqual((yield* fleet.coordinator.get).sessions.get("s1")!.state, "descending")
      // Restarted from its state file (written and read back) before the descent is acknowledged.
      const a = yield* fleet.restart("a")
      const noted = (yield* a.residents.snapshot).lostNoted
      cut = false
      yield* fleet.settle()
      const st = yield* fleet.coordinator.get
      assert.strictEqual(st.sessions.get("s1")!.state, "descended")
      assert.isNull(st.sessions.get("s1")!.imageHostId ?? null, "the descent left no image, and said so: no image host named")
      // Before: the restarted agent found the guest gone and told the loss again (`VM not found`).
      assert.deepStrictEqual(st.guestsLost, [lost])
      assert.deepStrictEqual(noted, ["s1"], "the noted loss outlived the restart (in the state file)")
      assert.isUndefined((yield* a.residents.snapshot).lostNoted, "forgotten once the session left the host")
    }),
  )

  effect("told, then the agent restarts before the fresh guest runs: the loss is not told again", () =>
    Effect.gen(function* () {
      // a's runtime refuses to boot while `refuse` holds (a hypervisor that fails to start).
      let refuse = false
      const fleet = yield* makeFleet([{ hostId: "a", sim: SimRuntime.defaultSimConfig }])
      const rt = fleet.hosts[0]!.runtime
      const start = rt.start
      // The fleet's runtime is a plain object the agents call through: its start refuses while `refuse` holds.
      Object.assign(rt, {
        start: ((spec, options) =>
          refuse ? Effect.fail(new RuntimeError({ op: "start", vmId: spec.vmId, message: "the hypervisor refused to start (a test's)" })) : start(spec, options)) satisfies typeof start,
      })
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* fleet.settle()
      yield* rt.destroy("s1")
      refuse = true
      yield* fleet.settle(1)
      const lost = { hostId: "a", sessionId: "s1", reason: lostReasonOf("exited", "running") }
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [lost])
      assert.deepStrictEqual(yield* rt.list, [], "no fresh guest yet")
      const a = yield* fleet.restart("a")
      refuse = false
      yield* fleet.settle()
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      // Before: the restarted agent found no VM for the running session and told it again (`VM not found`).
      assert.deepStrictEqual((yield* fleet.coordinator.get).guestsLost, [lost])
      assert.isUndefined((yield* a.residents.snapshot).lostNoted, "forgotten once the fresh guest runs")
    }),
  )
})
