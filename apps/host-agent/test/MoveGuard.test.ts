import { assert, describe } from "@effect/vitest"
import { Downtime, Limits } from "@engram/core"
import { SimRuntime } from "@engram/runtime"
import { Effect, Logger, Ref } from "effect"
import { TestClock } from "effect/testing"
import { StateWriteError } from "../src/LocalState.js"
import { resendGiveUpMs } from "../src/MoveSource.js"
import { PeerError } from "../src/MoveTarget.js"
import type { PeerLink } from "../src/PeerLink.js"
import type { RoundReport } from "../src/Coordinator.js"
import type { FakeCoordinator } from "./support/FakeCoordinator.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet, type FleetOptions, type TestHost } from "./support/InProcess.js"

type SimConfig = SimRuntime.SimConfig

/** Seed 004's hardware run: a 4 GiB guest rewriting a hot 64 MiB; capture ≈ 40 ms, send ≈ 85 ms, commit ≈ 420 ms. */
const seed004: Partial<SimConfig> = SimRuntime.defaultSimConfig

const runMove = (opts: {
  readonly maxDowntimeMs: number
  readonly source?: Partial<SimConfig>
  readonly memMib?: number
  /** The coordinator's commitAllowanceMs (default 400); null = it sends no limits. */
  readonly commitAllowanceMs?: number | null
  readonly fleet?: FleetOptions
  /** From the move's start, every other round that adds a record loses its answer (recorded, then a timeout). */
  readonly loseRoundAnswers?: boolean
  /** Records the move holds before its source runs it (an earlier run's, before a restart of its agent). */
  readonly earlierRounds?: readonly RoundReport[]
}) =>
  Effect.gen(function* () {
    const fleet = yield* makeFleet(
      [
        { hostId: "a", sim: { ...seed004, ...opts.source } },
        { hostId: "b", sim: seed004 },
      ],
      opts.fleet,
    )
    if (opts.commitAllowanceMs !== undefined) yield* fleet.coordinator.setCommitAllowance(opts.commitAllowanceMs)
    const [a, b] = fleet.hosts as [(typeof fleet.hosts)[0], (typeof fleet.hosts)[0]]
    const settle = fleet.settle()
    yield* fleet.coordinator.addSession("s1", "a", opts.memMib ?? 4096, 2)
    yield* settle
    assert.strictEqual((yield* fleet.coordinator.get).sessions.get("s1")?.state, "running")
    yield* fleet.coordinator.beginMove("m1", "s1", "b", opts.maxDowntimeMs)
    const earlier = opts.earlierRounds ?? []
    for (const [seq, round] of earlier.entries()) yield* fleet.coordinator.client("a").round("m1", { ...round, seq }).pipe(Effect.orDie)
    if (opts.loseRoundAnswers === true) yield* fleet.coordinator.loseRoundAnswers(true)
    yield* settle
    const state = yield* fleet.coordinator.get
    return { fleet, a, b, settle, move: state.moves.get("m1")!, session: state.sessions.get("s1")!, outcome: (yield* a.agent.status).moves[0]! }
  })

for (const moveIntent of [true, false])
  describe(`rounds whose answers are lost, intent ${moveIntent ? "on" : "off"}`, () => {
    effect("each round is recorded once: its retry carries its position, which the coordinator holds already, and the move commits", () =>
      Effect.gen(function* () {
        const { fleet, move, outcome } = yield* runMove({ maxDowntimeMs: 600, loseRoundAnswers: true, fleet: { moveIntent } })
        assert.strictEqual(move.state, "committed")
        assert.deepStrictEqual(move.rounds.map((r) => r.kind), moveIntent ? ["full", "delta", "delta", "intent", "final"] : ["full", "delta", "delta", "final"])
        assert.strictEqual(outcome._tag, "Committed")
        // The pre-copy rounds as measured (the final round's figures: with the intent off, as recorded in the pause, before its send).
        if (outcome._tag === "Committed") assert.deepStrictEqual(move.rounds.filter((r) => r.kind === "full" || r.kind === "delta"), outcome.rounds.slice(0, -1))
        // Every record was written once (every other answer was lost, and that round tried again).
        assert.strictEqual((yield* fleet.coordinator.get).calls.filter((c) => c.startsWith("round m1 ")).length, move.rounds.length)
      }),
    )

    effect("a run of a move that holds an earlier run's records (its agent restarted) counts its positions from them; an intent it holds is not recorded again", () =>
      Effect.gen(function* () {
        const earlier: RoundReport[] = [{ kind: "full", wireBytes: 7, apparentBytes: 7, sendMs: 1, captureMs: 1 }, ...(moveIntent ? [{ kind: "intent" as const, wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }] : [])]
        const { move } = yield* runMove({ maxDowntimeMs: 600, loseRoundAnswers: true, earlierRounds: earlier, fleet: { moveIntent } })
        assert.strictEqual(move.state, "committed")
        assert.deepStrictEqual(move.rounds.slice(0, earlier.length), earlier)
        assert.deepStrictEqual(move.rounds.slice(earlier.length).map((r) => r.kind), ["full", "delta", "delta", "final"])
      }),
    )
  })

describe("the seed 004 hardware table on the simulated runtime", () => {
  effect("a 600 ms budget succeeds: capture ≈ 40, send ≈ 85, commit ≈ 420, within the pause", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 600 })
      assert.strictEqual(move.state, "committed")
      const p = move.phases!
      console.log("seed 004 @600 ms:", JSON.stringify({ phases: p, rounds: move.rounds }))
      assert.isTrue(p.captureMs >= 36 && p.captureMs <= 43, `captureMs ${p.captureMs}`)
      assert.isTrue(p.sendMs >= 74 && p.sendMs <= 92, `sendMs ${p.sendMs}`)
      assert.isTrue(p.commitMs >= 411 && p.commitMs <= 428, `commitMs ${p.commitMs}`)
      assert.isTrue(p.downtimeMs <= 600, `downtimeMs ${p.downtimeMs}`)
      assert.isTrue(Downtime.phasesConsistent(p))
      // The phases name every part of the pause: they sum to it.
      assert.strictEqual(p.captureMs + p.sendMs + p.commitMs, p.downtimeMs)
      if (outcome._tag === "Committed") {
        const parts = outcome.pause!
        const sum = parts.captureMs + parts.persistMs + parts.sendMs + parts.recordWaitMs + parts.peerCommitMs
        assert.isTrue(Math.abs(sum - p.downtimeMs) < 1e-6, `parts ${JSON.stringify(parts)} sum to ${sum}, downtime ${p.downtimeMs}`)
        assert.deepStrictEqual(outcome.guard, { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: outcome.guard.estimateMs, estimateErrorMs: outcome.guard.estimateMs - p.downtimeMs, allowanceErrorMs: 400 - p.commitMs })
      }
      // Rounds: a full round, deltas until the dirty set stops shrinking, the intent (before the pause), then the final one.
      assert.deepStrictEqual(move.rounds.map((r) => r.kind), ["full", "delta", "delta", "intent", "final"])
      assert.strictEqual(session.hostId, "b")
      assert.strictEqual(session.state, "running")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.strictEqual((yield* b.target.incoming).length, 0)
      assert.strictEqual(outcome._tag, "Committed")
      assert.deepStrictEqual((yield* a.residents.pendingCommits), [])
    }))

  effect("the pause holds one write of the source's state file (the debt and the paused VM together), and ends where the guest resumed on the target", () =>
    Effect.gen(function* () {
      // Writes of a's state file between its pause and the final round's send.
      const phase = { paused: false, sent: false, writes: 0 }
      const base = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          onPause: (_, hostId) => Effect.sync(() => void (hostId === "a" && (phase.paused = true))),
          onSwitchover: (_, hostId) => Effect.sync(() => void (hostId === "a" && (phase.sent = true))),
          onPersist: (hostId) => Effect.sync(() => void (hostId === "a" && phase.paused && !phase.sent && phase.writes++)),
        },
      })
      assert.strictEqual(base.move.state, "committed")
      assert.strictEqual(phase.writes, 1)
      // A target that says the guest had run for 25 ms when its answer left (its own state file's
      // write after the resume): the pause ends 25 ms before the answer.
      const later = yield* runMove({
        maxDowntimeMs: 600,
        fleet: { wrapLink: (link) => ({ ...link, commit: (h) => Effect.as(link.commit(h), { resumedForMs: 25 }) }) },
      })
      if (base.outcome._tag !== "Committed" || later.outcome._tag !== "Committed") return assert.fail(`not committed: ${later.outcome._tag}`)
      assert.strictEqual(later.move.phases!.downtimeMs, base.move.phases!.downtimeMs - 25)
      assert.strictEqual(later.outcome.pause!.peerCommitMs, base.outcome.pause!.peerCommitMs - 25)
    }))

  effect("a source whose state file cannot take the move's debt in the pause (a full disk) gives the pause back: nothing is sent, the guest runs on the source, the move is aborted naming why", () =>
    Effect.gen(function* () {
      const phase = { paused: false, refused: 0 }
      const { a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          onPause: (_, hostId) => Effect.sync(() => void (hostId === "a" && (phase.paused = true))),
          onPersist: (hostId) =>
            hostId === "a" && phase.paused
              ? Effect.andThen(
                  Effect.sync(() => phase.refused++),
                  Effect.fail(new StateWriteError({ path: "/var/lib/engram/agent-state.json", message: "ENOSPC: no space left on device, write" })),
                )
              : Effect.void,
        },
      })
      assert.isTrue(phase.refused >= 1, "the debt's write was refused")
      assert.strictEqual(outcome._tag, "Failed")
      assert.strictEqual(move.state, "aborted")
      assert.match(move.abortReason ?? "", /state file could not record the move's debt before its final round: ENOSPC/)
      assert.isFalse(move.rounds.some((r) => r.kind === "final"), "no final round sent")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* a.residents.all).map((v) => v.status), ["running"])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [], "no debt held in memory that the file lacks")
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.strictEqual((yield* b.target.incoming).length, 0)
    }))

  effect("a source whose state disk hangs on the move's debt in the pause gives the pause back after 5 s (or what is left of the budget), not when the disk answers: nothing is sent, the guest runs on the source, the move is aborted", () =>
    Effect.gen(function* () {
      const phase = { paused: false, held: 0 }
      const { a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          onPause: (_, hostId) => Effect.sync(() => void (hostId === "a" && (phase.paused = true))),
          // The debt's write (the first in the pause) hangs for a minute, then lands.
          onPersist: (hostId) => (hostId === "a" && phase.paused && phase.held++ === 0 ? Effect.sleep("60 seconds") : Effect.void),
        },
      })
      assert.strictEqual(phase.held >= 1, true, "the debt's write was made")
      assert.strictEqual(outcome._tag, "Failed")
      assert.strictEqual(move.state, "aborted")
      assert.match(move.abortReason ?? "", /could not record the move's debt before its final round: not written within 5000 ms of the guest's pause/)
      assert.isFalse(move.rounds.some((r) => r.kind === "final"), "no final round sent")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      // The write landed later, before the abort's own (one lock): its debt is gone, the VM runs.
      assert.deepStrictEqual((yield* a.residents.all).map((v) => v.status), ["running"])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual(yield* b.runtime.list, [])
    }))

  for (const moveIntent of [false, true])
    effect(`a coordinator that hangs on the record made in the pause (intent ${moveIntent ? "on, taken in the pause" : "off: the final round"}) holds the guest paused for 5 s (or what is left of the budget, when more), not its calls' timeouts (30 s, tried again): the pause is given back, the move aborted, the guest runs on the source`, () =>
      Effect.gen(function* () {
        const phase = { held: 0 }
        const { a, b, move, session, outcome } = yield* runMove({
          maxDowntimeMs: 600,
          // With the intent on, QEMU's own convergence pauses before the intent is taken: it is recorded in the pause.
          fleet: {
            moveIntent,
            ...(moveIntent ? { selfConverge: true } : {}),
            wrapCoordinator: (client, hostId) =>
              hostId !== "a"
                ? client
                : {
                    ...client,
                    round: (id, r) => (r.kind === (moveIntent ? "intent" : "final") ? Effect.andThen(Effect.sync(() => void phase.held++), Effect.never) : client.round(id, r)),
                  },
          },
        })
        assert.isTrue(phase.held >= 1, "the record in the pause was asked")
        assert.strictEqual(outcome._tag, "Failed")
        if (outcome._tag === "Failed") assert.match(outcome.reason, /could not be recorded: not answered within 5000 ms of the guest's pause/)
        assert.strictEqual(move.state, "aborted")
        assert.strictEqual(session.state, "running")
        assert.strictEqual(session.hostId, "a")
        assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
        assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
        assert.deepStrictEqual(yield* b.runtime.list, [])
      }))

  effect("a 480 ms budget is refused before any pause", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 480 })
      assert.strictEqual(move.state, "aborted")
      console.log("seed 004 @480 ms:", move.abortReason)
      assert.match(move.abortReason ?? "", /^ErrMoveDowntime: pre-pause estimate/)
      assert.isTrue((move.estimateMs ?? 0) > 480, `estimate ${move.estimateMs}`)
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0)
      assert.strictEqual(outcome._tag, "Refused")
      if (outcome._tag === "Refused") assert.strictEqual(outcome.stage, "pre-pause")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.isFalse((yield* a.runtime.stats("s1")).tracking)
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.strictEqual((yield* b.target.incoming).length, 0)
    }))
})

describe("the post-capture check", () => {
  effect("a slow final capture aborts before the final round: the guest resumes on the source, the target holds nothing", () =>
    Effect.gen(function* () {
      const { a, b, move, session, outcome } = yield* runMove({ maxDowntimeMs: 600, source: { finalCaptureExtraMs: 300 } })
      assert.strictEqual(move.state, "aborted")
      console.log("slow final capture @600 ms:", move.abortReason)
      assert.match(move.abortReason ?? "", /^ErrMoveDowntime: post-capture estimate/)
      assert.isTrue((move.estimateMs ?? 0) > 600)
      assert.isFalse(move.rounds.some((r) => r.kind === "final"), "no final round sent")
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 1, "paused once for the final capture")
      assert.strictEqual(outcome._tag, "Refused")
      assert.strictEqual(session.state, "running")
      assert.strictEqual(session.hostId, "a")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* a.residents.all).map((v) => v.status), ["running"])
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.deepStrictEqual(yield* b.residents.all, [])
      assert.strictEqual((yield* b.target.incoming).length, 0)
    }))

})

describe("the commit allowance is the coordinator's", () => {
  effect("a coordinator with commitAllowanceMs 600 makes the agent refuse, before pausing, the 600 ms move it accepts at 400", () =>
    Effect.gen(function* () {
      const { a, move, session, outcome } = yield* runMove({ maxDowntimeMs: 600, commitAllowanceMs: 600 })
      assert.strictEqual(move.state, "aborted")
      assert.match(move.abortReason ?? "", /^ErrMoveDowntime: pre-pause estimate/)
      // The same rounds as the 480 ms case (estimate 486 = 86 + 400), with the coordinator's 600.
      assert.strictEqual(move.estimateMs, 686)
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0)
      assert.strictEqual(outcome._tag, "Refused")
      assert.deepStrictEqual([session.state, session.hostId], ["running", "a"])
    }))

  effect("a coordinator that sends no limits (older than the field): the SPEC default 400 applies", () =>
    Effect.gen(function* () {
      const { move } = yield* runMove({ maxDowntimeMs: 600, commitAllowanceMs: null })
      assert.strictEqual(move.state, "committed")
    }))
})

/** Collects log lines (level and text) for assertions. */
const capturingLogs = Effect.sync(() => {
  const lines: { readonly level: string; readonly text: string }[] = []
  const logger = Logger.make((o) => {
    lines.push({ level: o.logLevel, text: JSON.stringify(o.message) })
  })
  return { lines, layer: Logger.layer([logger]) }
})

describe("the intent is the point of no return (SPEC §5), held by the coordinator before the pause", () => {
  effect("the coordinator's move wait times out while the source is paused: the intent refuses its abort, the move commits on the target", () =>
    Effect.gen(function* () {
      const tried: boolean[] = []
      const { a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: { onPause: (coordinator, hostId) => (hostId === "a" ? coordinator.timeoutAbort("m1").pipe(Effect.tap((x) => Effect.sync(() => void tried.push(x)))) : Effect.void) },
      })
      assert.deepStrictEqual(tried, [false], "refused: the move is past its point of no return")
      assert.strictEqual(move.state, "committed")
      assert.strictEqual(outcome._tag, "Committed")
      assert.deepStrictEqual([session.state, session.hostId], ["running", "b"])
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
    }))

  effect("a runtime that paused on its own before the intent (QEMU converging by itself) records it beside the send, before the target may run the guest", () =>
    Effect.gen(function* () {
      const seen: string[][] = []
      const { move, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          selfConverge: true,
          wrapLink: (link, coordinator) => ({
            ...link,
            commit: (h) => Effect.flatMap(coordinator.get, (s) => Effect.sync(() => void seen.push(s.moves.get(h.moveId)!.rounds.map((r) => r.kind)))).pipe(Effect.andThen(link.commit(h))),
          }),
        },
      })
      assert.deepStrictEqual(seen, [["full", "delta", "delta", "intent"]])
      assert.strictEqual(move.state, "committed")
      assert.strictEqual(outcome._tag, "Committed")
      if (outcome._tag === "Committed") {
        assert.isFalse(outcome.pause!.intentBeforePause)
        const p = outcome.pause!
        assert.isTrue(Math.abs(p.captureMs + p.persistMs + p.sendMs + p.recordWaitMs + p.peerCommitMs - move.phases!.downtimeMs) < 1e-6)
      }
    }))

  effect("a commit that reaches an already-aborted move is logged as an error; the coordinator places the session on the source, so the target's copy is destroyed and the source's paused copy resumes", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      const { a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          // The race the fence closes within one process (replicas on PostgreSQL): the coordinator
          // aborts just after the target committed, before the source's commit arrives.
          wrapLink: (link, coordinator) => ({ ...link, commit: (h) => link.commit(h).pipe(Effect.tap(() => coordinator.abortMove(h.moveId, "timeout"))) }),
        },
      }).pipe(Effect.provide(logs.layer))
      assert.strictEqual(move.state, "aborted")
      assert.strictEqual(outcome._tag, "CommitRefused")
      if (outcome._tag === "CommitRefused") assert.isTrue(outcome.restoredOnSource)
      const errors = logs.lines.filter((l) => l.level === "Error")
      assert.strictEqual(errors.length, 1, JSON.stringify(logs.lines))
      assert.match(errors[0]!.text, /move commit refused: the target committed move m1 but the coordinator had aborted it \(timeout\)/)
      assert.deepStrictEqual([session.state, session.hostId], ["running", "a"])
      // One guest, on the source, the one that was paused (not booted again); nothing on the target.
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1)
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.deepStrictEqual(yield* b.residents.all, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }))

  effect("a commit refused for a session no longer on the source (ended meanwhile): logged, the target's copy is not touched by the source", () =>
    Effect.gen(function* () {
      const logs = yield* capturingLogs
      let targetRanAtRefusal = false
      const { a, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          wrapLink: (link, coordinator) => ({
            ...link,
            commit: (h) =>
              link.commit(h).pipe(
                Effect.tap(() => coordinator.abortMove(h.moveId, "session ended")),
                Effect.tap(() => coordinator.setState(h.sessionId, "ended")),
              ),
            abort: (h) => Effect.sync(() => void (targetRanAtRefusal = true)).pipe(Effect.andThen(link.abort(h))),
          }),
        },
      }).pipe(Effect.provide(logs.layer))
      assert.strictEqual(outcome._tag, "CommitRefused")
      if (outcome._tag === "CommitRefused") assert.isFalse(outcome.restoredOnSource)
      assert.isFalse(targetRanAtRefusal, "the source did not ask the target to destroy its copy")
      assert.match(logs.lines.find((l) => l.level === "Error")?.text ?? "", /the session is not on this host \(ended\)/i)
      // The ended session's copies go through each host's reconcile (the source's at once).
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }))
})

describe("the commit allowance is learned per host pair (SPEC §13)", () => {
  effect("a budget under the 400 ms prior is refused before anything starts while a host pair has no commits, and admitted once it has", () =>
    Effect.gen(function* () {
      // Commits of ≈ 60 ms on both hosts: far under the prior.
      const quick: Partial<SimConfig> = { ...seed004, commitMs: 60 }
      const fleet = yield* makeFleet([
        { hostId: "a", sim: quick },
        { hostId: "b", sim: quick },
      ])
      const [a, b] = fleet.hosts as [TestHost, TestHost]
      const settle = fleet.settle()
      const move = (id: string, target: string, maxDowntimeMs: number) =>
        Effect.gen(function* () {
          yield* fleet.coordinator.beginMove(id, "s1", target, maxDowntimeMs)
          yield* settle
          return (yield* fleet.coordinator.get).moves.get(id)!
        })
      yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
      yield* settle

      const refused = yield* move("m1", "b", 300)
      assert.strictEqual(refused.state, "aborted")
      assert.strictEqual(refused.estimateMs, 400, "the estimate of an empty final round is the prior allowance alone")
      assert.deepStrictEqual(refused.rounds, [], "refused before any round")
      assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0)
      assert.deepStrictEqual(yield* b.runtime.list, [], "the target started nothing")

      const first = yield* move("m2", "b", 2000)
      assert.strictEqual(first.state, "committed")
      yield* move("m3", "a", 2000) // b → a: that pair's own history
      const admitted = yield* move("m4", "b", 300)
      assert.strictEqual(admitted.state, "committed", admitted.abortReason ?? "")
      const outcome = (yield* a.agent.status).moves.find((m) => m.moveId === "m4")!
      assert.strictEqual(outcome._tag, "Committed")
      if (outcome._tag !== "Committed") return
      assert.strictEqual(outcome.guard.allowanceSource, "learned")
      assert.strictEqual(outcome.guard.allowanceSamples, 1)
      assert.strictEqual(outcome.guard.allowanceMs, first.phases!.commitMs, "the quantile of one commit is that commit")
      assert.strictEqual(outcome.guard.allowanceErrorMs, outcome.guard.allowanceMs - admitted.phases!.commitMs)
      assert.isTrue(admitted.phases!.downtimeMs <= 300, JSON.stringify(admitted.phases))
      assert.deepStrictEqual(
        (yield* a.agent.status).allowances.map((x) => [x.targetHostId, x.source, x.samples]),
        [["b", "learned", 2]],
      )
    }))
})

describe("the allowance the coordinator sends", () => {
  effect("a pooled allowance arrives as `learned` with its pool: the guard uses it and reports the pool (`target`, `fleet`) with the commit", () =>
    Effect.gen(function* () {
      for (const pool of ["target", "fleet"] as const) {
        const fleet = yield* makeFleet([
          { hostId: "a", sim: { ...seed004, commitMs: 60 } },
          { hostId: "b", sim: { ...seed004, commitMs: 60 } },
        ])
        const [a] = fleet.hosts as [TestHost, TestHost]
        const settle = fleet.settle()
        // As a coordinator sends it: `source` within the literals every agent decodes, the pool beside it.
        yield* fleet.coordinator.setAllowances([{ sourceHostId: "a", targetHostId: "b", allowanceMs: 100, source: "learned", samples: 6, pool }])
        yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
        yield* settle
        yield* fleet.coordinator.beginMove("m1", "s1", "b", 300)
        yield* settle
        const outcome = (yield* a.agent.status).moves.find((m) => m.moveId === "m1")!
        assert.strictEqual(outcome._tag, "Committed", JSON.stringify(outcome))
        if (outcome._tag !== "Committed") return
        assert.deepStrictEqual([outcome.guard.allowanceMs, outcome.guard.allowanceSource, outcome.guard.allowanceSamples], [100, pool, 6])
      }
    }))
})

describe("the final round's figures, recorded after the resume", () => {
  effect("a source cut off from the coordinator right after the resume: the target's report commits the move (past the intent); back, the source finds it committed and drops its paused copy", () =>
    Effect.gen(function* () {
      let silenced = false
      const { fleet, a, b, settle, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          // The target resumed the guest; then the source's calls to the coordinator fail.
          wrapLink: (link, coordinator) => ({ ...link, commit: (h) => link.commit(h).pipe(Effect.tap(() => (silenced ? Effect.void : Effect.andThen(Effect.sync(() => void (silenced = true)), coordinator.silence("a", true))))) }),
        },
      })
      // The guest runs on the target; the source still owes the record (its copy never ran again).
      assert.strictEqual(outcome._tag, "Committed")
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((c) => [c.moveId, c.finalRecorded]), [["m1", false]])
      assert.isFalse((yield* a.runtime.list).some((v) => v.status === "running"))
      const held = yield* fleet.coordinator.get
      // The target's report (the source silent) commits the move without phases: the intent made it in doubt.
      assert.strictEqual(held.moves.get("m1")?.state, "committed")
      assert.strictEqual(held.moves.get("m1")?.phases, null)
      assert.deepStrictEqual(held.moves.get("m1")?.rounds.map((r) => r.kind), ["full", "delta", "delta", "intent"])
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
      yield* fleet.coordinator.silence("a", false)
      yield* settle
      const s = yield* fleet.coordinator.get
      assert.strictEqual(s.moves.get("m1")?.state, "committed")
      assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "b"])
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }))
})

/** The copies of `vmId` that run, over every host. */
const runningCopies = (hosts: readonly TestHost[], vmId: string) =>
  Effect.map(Effect.forEach(hosts, (h) => h.runtime.list), (lists) => lists.flat().filter((v) => v.vmId === vmId && v.status === "running").length)

/** A peer link whose commit (and abort) a test can cut: the request is lost before or after the target acted on it. */
const cuttable = () => {
  const cut = { commit: "no" as "no" | "before" | "after" | "refuse", abort: false, commits: 0 }
  const lost = (op: string, moveId: string) => new PeerError({ op, moveId, message: "connection reset", refused: false })
  const wrap = (link: PeerLink): PeerLink => ({
    ...link,
    commit: (h) =>
      Effect.gen(function* () {
        cut.commits++
        if (cut.commit === "before") return yield* lost("commit", h.moveId)
        if (cut.commit === "refuse") return yield* new PeerError({ op: "commit", moveId: h.moveId, message: "no incoming VM for this move", refused: true })
        const committed = yield* link.commit(h)
        if (cut.commit === "after") return yield* lost("commit", h.moveId)
        return committed
      }),
    abort: (h) => (cut.abort ? Effect.fail(lost("abort", h.moveId)) : link.abort(h)),
  })
  return { cut, wrap }
}

describe("past the intent, a link failure never resumes the source copy (issue 13 item 11)", () => {
  effect("the target commits and the link drops before its answer: the source stays paused and owes the outcome; once the link is back the commit is confirmed and posted", () =>
    Effect.gen(function* () {
      const link = cuttable()
      link.cut.commit = "after"
      link.cut.abort = true
      const { fleet, a, b, settle, move, outcome } = yield* runMove({ maxDowntimeMs: 600, fleet: { wrapLink: link.wrap } })
      // The target restored the guest and runs it; the source could not learn it.
      assert.strictEqual(outcome._tag, "Owed")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "the source copy stays paused")
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
      assert.deepStrictEqual(yield* a.residents.pendingCommits.pipe(Effect.map((p) => p.map((c) => [c.moveId, c.phases]))), [["m1", null]])
      assert.strictEqual(move.state, "pending", "the intent is recorded: the coordinator waits for the commit")
      assert.strictEqual(move.rounds.at(-1)?.kind, "intent", "the final round's figures follow the target's confirmed commit")
      // More passes with the link still down: asked again, still paused, never two copies.
      const asked = link.cut.commits
      yield* settle
      assert.isTrue(link.cut.commits > asked, "the source asks the target again")
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => v.status), ["paused"])
      // The link is back: the target answers (it runs the guest), the commit is posted, the source copy goes.
      link.cut.commit = "no"
      link.cut.abort = false
      yield* settle
      const s = yield* fleet.coordinator.get
      assert.strictEqual(s.moves.get("m1")?.state, "committed")
      assert.isTrue(Downtime.phasesConsistent(s.moves.get("m1")!.phases!), JSON.stringify(s.moves.get("m1")!.phases))
      assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "b"])
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0, "the guest on the target is the moved one, never booted")
    }))

  effect("the link drops before the commit reaches the target: the source stays paused; once it is back the target commits the VM it holds", () =>
    Effect.gen(function* () {
      const link = cuttable()
      link.cut.commit = "before"
      link.cut.abort = true
      const { fleet, a, b, settle, outcome } = yield* runMove({ maxDowntimeMs: 600, fleet: { wrapLink: link.wrap } })
      assert.strictEqual(outcome._tag, "Owed")
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 0, "paused on both sides: the pause goes on, no copy runs twice")
      assert.deepStrictEqual(yield* b.target.incoming, [{ moveId: "m1", vmId: "s1" }])
      link.cut.commit = "no"
      link.cut.abort = false
      yield* settle
      const s = yield* fleet.coordinator.get
      assert.strictEqual(s.moves.get("m1")?.state, "committed")
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.runtime.list, [])
    }))

  effect("the target refuses the commit while the coordinator cannot be reached: the source copy stays paused until the coordinator ended the move, then resumes", () =>
    Effect.gen(function* () {
      let cut = false
      const { fleet, a, b, settle, move, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          // The target's incoming VM is lost (its commit is refused), and the source's calls to the coordinator fail for a while.
          wrapLink: (link, coordinator) => ({
            ...link,
            commit: (h) => link.abort(h).pipe(Effect.andThen(cut ? Effect.void : Effect.andThen(Effect.sync(() => void (cut = true)), coordinator.silence(h.sourceHostId, true))), Effect.andThen(link.commit(h))),
          }),
        },
      })
      assert.strictEqual(outcome._tag, "Owed")
      assert.strictEqual(move.state, "pending", "the coordinator holds the intent: only the source's abort ends the move")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "not resumed before the coordinator ended the move")
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((c) => [c.moveId, c.phases]), [["m1", null]])
      // The coordinator stays away past any give-up: the move may still be pending (it is), so the
      // copy is the guest's only memory and stays paused and owed (a give-up here, tried and
      // withdrawn on 2026-12-07, destroyed it and the abort then sent the session back to nothing).
      yield* TestClock.adjust(resendGiveUpMs(Limits.defaults.heartbeatStaleWindowMs) + 60_000)
      yield* fleet.settle(2)
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "kept past the give-up: the move is not known committed")
      assert.deepStrictEqual((yield* a.residents.pendingCommits).map((c) => c.moveId), ["m1"])
      yield* fleet.coordinator.silence("a", false)
      yield* settle
      const s = yield* fleet.coordinator.get
      assert.strictEqual(s.moves.get("m1")?.state, "aborted")
      assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "a"])
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }))

  effect("the target answers that it does not run the guest (its incoming VM failed): only then the source copy resumes, and the move aborts", () =>
    Effect.gen(function* () {
      const { fleet, a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          // The target's incoming VM is lost after the stream (say its hypervisor died): its commit is refused.
          wrapLink: (link) => ({ ...link, commit: (h) => link.abort(h).pipe(Effect.andThen(link.commit(h))) }),
        },
      })
      assert.strictEqual(outcome._tag, "Failed")
      if (outcome._tag === "Failed") assert.match(outcome.reason, /the target refused the commit/)
      assert.strictEqual(move.state, "aborted")
      assert.deepStrictEqual([session.state, session.hostId], ["running", "a"])
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
    }))
})

// Both protocols: with the intent (ENGRAM_AGENT_MOVE_INTENT=1) and without it (the default).
for (const moveIntent of [true, false])
  describe(`a move committed by the target's report while the link was down (review item 2: never two running copies), intent ${moveIntent ? "on" : "off"}`, () => {
  /**
   * The target commits and the answer is lost; then the move commits on the target's report and
   * the target's reconcile clears its move. The source settles its debt on a view of the
   * coordinator taken just before that commit (its poll answered first, then it could not reach
   * the coordinator until the settling: its retries read no newer view): the session still reads
   * on the source, so its reconcile keeps the paused copy and only the debt's settling decides.
   */
  const committedByReport = (link: ReturnType<typeof cuttable>) =>
    Effect.gen(function* () {
      link.cut.commit = "after"
      link.cut.abort = true
      const run = yield* runMove({ maxDowntimeMs: 600, fleet: { wrapLink: link.wrap, moveIntent } })
      assert.strictEqual(run.outcome._tag, "Owed")
      // Nothing reaches the target until the test says so.
      link.cut.commit = "before"
      const staleView = yield* run.fleet.coordinator.assignmentsOf("a")
      yield* run.fleet.coordinator.silence("a", true)
      yield* run.fleet.coordinator.client("b").reportRunning("m1", "the target runs the guest")
      yield* run.b.agent.reconcile(yield* run.fleet.coordinator.assignmentsOf("b"))
      yield* run.fleet.quiesce
      assert.strictEqual((yield* run.fleet.coordinator.get).moves.get("m1")?.state, "committed")
      assert.deepStrictEqual((yield* run.b.residents.all).map((v) => [v.vmId, v.status, v.moveId]), [["s1", "running", null]], "the target's reconcile cleared the move")
      assert.deepStrictEqual((yield* run.a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]])
      const settleOnStaleView = Effect.gen(function* () {
        yield* run.fleet.coordinator.silence("a", false)
        yield* run.a.agent.reconcile(staleView)
        yield* run.fleet.quiesce
      })
      return { ...run, settleOnStaleView }
    })

  effect("the link is back: the target answers the late commit with success (the guest runs there); the source drops its paused copy", () =>
    Effect.gen(function* () {
      const link = cuttable()
      const { fleet, a, b, settle, settleOnStaleView } = yield* committedByReport(link)
      // The target's own answer: the guest runs there, so the repeat of the commit succeeds.
      const answer = yield* b.target.commit({ moveId: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: 4096, vcpus: 2 }).pipe(Effect.result)
      assert.strictEqual(answer._tag, "Success", "a commit that landed is answered with success, not a refusal")
      link.cut.commit = "no"
      link.cut.abort = false
      yield* settleOnStaleView
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1, "never two running copies")
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      yield* settle
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.strictEqual((yield* fleet.coordinator.get).moves.get("m1")?.state, "committed")
    }))

  effect("a target that refuses the late commit (an older agent): the source's abort meets a 409, it reads the move committed and drops its paused copy instead of resuming it", () =>
    Effect.gen(function* () {
      const link = cuttable()
      const { fleet, a, b, settle, settleOnStaleView } = yield* committedByReport(link)
      // An older target: a commit for a move it no longer holds is refused.
      link.cut.commit = "refuse"
      link.cut.abort = false
      yield* settleOnStaleView
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1, "never two running copies")
      assert.deepStrictEqual(yield* a.runtime.list, [])
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      yield* settle
      assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      const s = yield* fleet.coordinator.get
      assert.strictEqual(s.moves.get("m1")?.state, "committed")
      assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "b"])
    }))
})

// The cases both protocols share, each named by its mode: with the intent (ENGRAM_AGENT_MOVE_INTENT=1)
// the intent, recorded before the pause, is the point of no return (SPEC §5); without it (the default)
// the final round, recorded in the pause, as before the intent.
for (const moveIntent of [true, false])
  describe(
    moveIntent
      ? "the point of no return (SPEC §5), intent on (ENGRAM_AGENT_MOVE_INTENT=1): the intent, held by the coordinator before the pause"
      : "the point of no return (SPEC §5), intent off (ENGRAM_AGENT_MOVE_INTENT=0, the default): the final round, recorded in the pause, as before the intent",
    () => {
      const mode = (fleet: FleetOptions = {}): FleetOptions => ({ ...fleet, moveIntent })

      effect(
        moveIntent
          ? "the intent is recorded while the guest still runs; the target runs the guest only once the coordinator holds it; the final round's measured figures follow the resume"
          : "the final round is recorded while it is sent, and the target runs the guest only once the coordinator holds it; no intent is recorded",
        () =>
          Effect.gen(function* () {
            const seen: Record<string, string[][]> = {}
            const kinds = (coordinator: FakeCoordinator, at: string) =>
              Effect.flatMap(coordinator.get, (s) => Effect.sync(() => void (seen[at] ??= []).push(s.moves.get("m1")!.rounds.map((r) => r.kind))))
            const { move, outcome } = yield* runMove({
              maxDowntimeMs: 600,
              fleet: mode({
                onBeforePause: (coordinator, hostId) => (hostId === "a" ? kinds(coordinator, "beforePause") : Effect.void),
                onPause: (coordinator, hostId) => (hostId === "a" ? kinds(coordinator, "pause") : Effect.void),
                // The target's commit (it resumes the guest): what the coordinator holds by then.
                wrapLink: (link, coordinator) => ({ ...link, commit: (h) => kinds(coordinator, "commit").pipe(Effect.andThen(link.commit(h))) }),
              }),
            })
            assert.strictEqual(move.state, "committed")
            assert.strictEqual(outcome._tag, "Committed")
            const final = move.rounds.at(-1)!
            assert.strictEqual(final.kind, "final")
            if (moveIntent) {
              // Before the intent the rounds' records may still be in flight; the intent follows them.
              assert.isFalse(seen["beforePause"]!.at(-1)!.includes("intent"))
              assert.deepStrictEqual(seen["pause"]!.at(-1), ["full", "delta", "delta", "intent"])
              assert.deepStrictEqual(seen["commit"]!.at(-1), ["full", "delta", "delta", "intent"])
              // Recorded once the guest ran on the target: its measured send, the commit's `sendMs` phase.
              assert.isTrue(final.sendMs > 0)
              assert.strictEqual(final.sendMs, move.phases!.sendMs)
              if (outcome._tag === "Committed") {
                assert.isTrue(outcome.pause!.intentBeforePause)
                assert.strictEqual(outcome.pause!.recordWaitMs, 0, "nothing of the intent's record is in the pause")
              }
            } else {
              assert.deepStrictEqual(seen["commit"], [["full", "delta", "delta", "final"]])
              assert.deepStrictEqual(move.rounds.map((r) => r.kind), ["full", "delta", "delta", "final"])
              // Recorded before its send was measured: its send time is the commit's `sendMs` phase.
              assert.strictEqual(final.sendMs, 0)
              assert.isTrue(move.phases!.sendMs > 0)
            }
          }),
      )

      effect(
        moveIntent
          ? "the coordinator's move wait timed out before the intent: the intent is refused (409), the guest never pauses, nothing reaches the target, the guest runs on the source"
          : "the coordinator's move wait times out while the source is paused: the final round is refused, nothing reaches the target, the guest resumes on the source",
        () =>
          Effect.gen(function* () {
            const timeout = (coordinator: FakeCoordinator, hostId: string) => (hostId === "a" ? coordinator.timeoutAbort("m1").pipe(Effect.asVoid) : Effect.void)
            const { a, b, move, session, outcome } = yield* runMove({
              maxDowntimeMs: 600,
              // Just before each protocol's point of no return: the intent's record, or the final round's in the pause.
              fleet: mode(moveIntent ? { onBeforePause: timeout } : { onPause: timeout }),
            })
            assert.strictEqual(move.state, "aborted")
            assert.strictEqual(move.abortReason, "MoveTimeout")
            assert.isFalse(move.rounds.some((r) => r.kind === "intent" || r.kind === "final"))
            assert.strictEqual(outcome._tag, "Gone")
            if (moveIntent) assert.strictEqual(yield* Ref.get(a.runtime.pauses), 0, "the guest never paused")
            assert.deepStrictEqual(yield* b.runtime.list, [], "the target never committed, and dropped its incoming VM")
            assert.deepStrictEqual(yield* b.residents.all, [])
            assert.deepStrictEqual([session.state, session.hostId], ["running", "a"])
            assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
            assert.strictEqual(yield* Ref.get(a.runtime.starts), 1)
            assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
          }),
      )

      describe(
        moveIntent
          ? "an intent whose record did not land (the runtime paused on its own, the agent stopped while recording it)"
          : "a final round whose record did not land (no intent)",
        () => {
          /** A move left owed with its final round sent but its point of no return not held by the coordinator: the link to the target cut at the commit. */
          const strandedMove = Effect.gen(function* () {
            const link = cuttable()
            link.cut.commit = "before"
            link.cut.abort = true
            const run = yield* runMove({ maxDowntimeMs: 600, fleet: mode({ wrapLink: link.wrap }) })
            assert.strictEqual(run.outcome._tag, "Owed")
            const [owed] = yield* run.a.residents.pendingCommits
            if (moveIntent) {
              yield* run.a.residents.addPendingCommit({ ...owed!, intentRecorded: false })
              yield* run.fleet.coordinator.forgetIntent("m1")
            } else {
              assert.isUndefined(owed!.intentRecorded, "a debt without the intent")
              yield* run.a.residents.addPendingCommit({ ...owed!, finalRecorded: false })
              yield* run.fleet.coordinator.forgetFinalRound("m1")
            }
            return { ...run, link }
          })

          effect("is recorded on the next pass before the target may run the guest; then the final round's figures and the commit", () =>
            Effect.gen(function* () {
              const { fleet, a, b, settle, link } = yield* strandedMove
              const before = link.cut.commits
              link.cut.commit = "no"
              link.cut.abort = false
              yield* settle
              assert.isTrue(link.cut.commits > before)
              const s = yield* fleet.coordinator.get
              assert.strictEqual(s.moves.get("m1")?.state, "committed")
              assert.deepStrictEqual(s.moves.get("m1")?.rounds.map((r) => r.kind), moveIntent ? ["full", "delta", "delta", "intent", "final"] : ["full", "delta", "delta", "final"])
              assert.deepStrictEqual((yield* b.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
              assert.deepStrictEqual(yield* a.runtime.list, [])
              assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
            }))

          effect("a move that ended meanwhile never runs on the target: the target drops what it holds, the guest resumes on the source", () =>
            Effect.gen(function* () {
              const { fleet, a, b, settle, link } = yield* strandedMove
              assert.isTrue(yield* fleet.coordinator.timeoutAbort("m1"), "without its point of no return recorded, the move wait's timeout aborts it")
              link.cut.commit = "no"
              link.cut.abort = false
              yield* settle
              const s = yield* fleet.coordinator.get
              assert.strictEqual(s.moves.get("m1")?.state, "aborted")
              assert.deepStrictEqual([s.sessions.get("s1")?.state, s.sessions.get("s1")?.hostId], ["running", "a"])
              assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
              assert.deepStrictEqual(yield* b.runtime.list, [])
              assert.deepStrictEqual(yield* b.target.incoming, [])
              assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
              assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
            }))
        },
      )
    },
  )

describe("the intent held before the first round (as QEMU), then the move ends while the rounds are recorded (review item 3)", () => {
  effect("a pre-copy round refused (409: an admin aborted the move) is seen before the debt: the pause is given back, nothing reaches the target, the guest runs on the source", () =>
    Effect.gen(function* () {
      let commits = 0
      const { fleet, a, b, move, session, outcome } = yield* runMove({
        maxDowntimeMs: 600,
        fleet: {
          intentFirst: (coordinator, hostId) => (hostId === "a" ? coordinator.abortMove("m1", "an admin's abort") : Effect.void),
          wrapLink: (link) => ({ ...link, commit: (h) => Effect.andThen(Effect.sync(() => void commits++), link.commit(h)) }),
        },
      })
      assert.strictEqual(move.state, "aborted")
      assert.strictEqual(move.abortReason, "an admin's abort")
      assert.deepStrictEqual(move.rounds.map((r) => r.kind), ["intent"])
      assert.strictEqual(outcome._tag, "Gone")
      assert.strictEqual(commits, 0, "the target was never asked to run the guest")
      assert.strictEqual(yield* Ref.get(b.runtime.starts), 0)
      assert.deepStrictEqual(yield* b.runtime.list, [])
      assert.deepStrictEqual([session.state, session.hostId], ["running", "a"])
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.strictEqual(yield* Ref.get(a.runtime.starts), 1)
      assert.deepStrictEqual(yield* a.residents.pendingCommits, [])
      assert.strictEqual(yield* runningCopies(fleet.hosts, "s1"), 1)
    }))
})
