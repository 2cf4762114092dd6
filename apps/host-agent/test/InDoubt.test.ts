/**
 * An in-doubt move on the agents' side (SPEC §13): once its intent is recorded (before the pause), a silent
 * source delays the move's end but never costs the guest. The target that runs the guest keeps
 * it and, when the source stays silent, reports it running itself, which commits the move; the
 * source, back, finds the move committed and drops its paused copy. Never two running copies.
 */
import { assert, describe } from "@effect/vitest"
import { SimRuntime } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { PeerError } from "../src/MoveTarget.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet } from "./support/InProcess.js"

const running = (vms: readonly { readonly vmId: string; readonly status: string }[]) => vms.filter((v) => v.status === "running").map((v) => v.vmId)

describe("an in-doubt move on the agents", () => {
  effect("the source goes silent right after the target committed: the target keeps the guest, reports it running, and the move commits; the source then drops its copy", () =>
    Effect.gen(function* () {
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          // The target resumed the guest; the source is cut off before it can say so.
          wrapLink: (link, coordinator) => ({ ...link, commit: (h) => link.commit(h).pipe(Effect.tap(() => coordinator.silence(h.sourceHostId, true))) }),
        },
      )
      const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
      const settle = fleet.settle()
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* settle
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      yield* fleet.pass
      yield* fleet.quiesce
      // In doubt: the intent is recorded (the final round's figures, due after the resume, are not), the guest runs on the target, the source paused.
      let state = yield* fleet.coordinator.get
      assert.deepStrictEqual(state.moves.get("m1")!.rounds.map((r) => r.kind).slice(-1), ["intent"])
      assert.deepStrictEqual(running(yield* b.runtime.list), ["s1"])
      assert.deepStrictEqual(running(yield* a.runtime.list), [])

      // The target's own passes (a minute apart) report the guest it runs: the move commits.
      yield* settle
      state = yield* fleet.coordinator.get
      assert.strictEqual(state.moves.get("m1")!.state, "committed")
      assert.strictEqual(state.moves.get("m1")!.phases, null)
      assert.deepInclude(state.sessions.get("s1"), { state: "running", hostId: "b" })
      assert.isTrue(state.calls.includes("reportRunning m1"))
      assert.deepStrictEqual(running(yield* b.runtime.list), ["s1"])
      // A frozen source never got to boot its copy again.
      assert.deepStrictEqual(running(yield* a.runtime.list), [])

      // The source is back: its owed commit finds the move committed and drops the paused copy.
      yield* fleet.coordinator.silence("a", false)
      yield* settle
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual(running(yield* b.runtime.list), ["s1"])
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0)
    }))

  effect("the outcome a source owes records where it reached the target's agent (a restarted source asks there again)", () =>
    Effect.gen(function* () {
      const url = "http://10.0.0.2:7100"
      const fleet = yield* makeFleet(
        [
          { hostId: "a", sim: SimRuntime.defaultSimConfig },
          { hostId: "b", sim: SimRuntime.defaultSimConfig },
        ],
        {
          // A link that reaches b at `url`, whose commit answers nothing: the outcome stays owed.
          wrapLink: (link) => ({
            ...link,
            addressOf: (h) => (h.targetHostId === "b" ? url : undefined),
            commit: (h) => Effect.fail(new PeerError({ op: "commit", moveId: h.moveId, message: "no answer", refused: false })),
          }),
        },
      )
      const [a] = fleet.hosts as [(typeof fleet.hosts)[0]]
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      for (let i = 0; i < 4; i++) {
        yield* fleet.pass
        yield* fleet.quiesce
      }
      yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
      yield* fleet.pass
      yield* fleet.quiesce
      const owed = yield* a.residents.pendingCommits
      assert.deepStrictEqual(owed.map((p) => [p.moveId, p.phases, p.target]), [["m1", null, { targetHostId: "b", memMib: 4096, vcpus: 2, peerUrl: url }]])
    }))
})
