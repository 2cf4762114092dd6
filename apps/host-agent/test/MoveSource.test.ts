/**
 * The brief retry of a move's coordinator calls (`MoveSource.retrying`): its waits are drawn as
 * `Pacing`'s are, so the sources of moves that failed together do not retry in lock-step. On the
 * TestClock with a fixed `Random`. And a round recorded at its position (`recordRound`): a retry
 * of one whose answer was lost is recorded once. A move read ended is not started; a final round
 * refused (409) on a move still pending without it is not taken for recorded; a debt's late
 * rounds are sent again at their positions, only where the move does not hold them (a state file
 * of an older agent, without their position, still settles as before).
 */
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { Move as CoreMove } from "@engram/core"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { type AtSwitchover, RuntimeError, type VmRuntimeShape } from "@engram/runtime"
import { Conflict, CoordinatorError } from "../src/Coordinator.js"
import type { CoordinatorShape, MoveView, NumberedRound, RoundReport } from "../src/Coordinator.js"
import * as LocalState from "../src/LocalState.js"
import { type MoveSourceDeps, recordRound, retrying, runSource, settleCommit } from "../src/MoveSource.js"
import { PeerError } from "../src/MoveTarget.js"
import type { PeerLink } from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { effect, fixedRandom } from "./support/PatientClock.js"

const highest = 1 - 1e-9

/** A call that always fails as `error` does, and the instants (TestClock ms) of its tries. */
const failingCall = (error: CoordinatorError) => {
  const at: number[] = []
  const call = Effect.flatMap(Clock.currentTimeMillis, (t) => {
    at.push(t)
    return Effect.fail(error)
  })
  return { at, call }
}

const away = (retryAfterMs?: number) => new CoordinatorError({ op: "round", status: 503, message: "the store is away", ...(retryAfterMs === undefined ? {} : { retryAfterMs }) })

/** Runs `retrying(call)` to its end on the TestClock; the tries' instants. */
const tries = (error: CoordinatorError) =>
  Effect.gen(function* () {
    const { at, call } = failingCall(error)
    const fiber = yield* Effect.forkChild(Effect.result(retrying(call)))
    yield* TestClock.adjust("10 seconds")
    const r = yield* Fiber.join(fiber)
    assert.strictEqual(r._tag, "Failure")
    return at
  })

describe("MoveSource.retrying", () => {
  effect("the waits are drawn: the lowest draw retries every 100 ms, the highest after 200, 400, 450, 450 ms (1500 in all, as the fixed waits before)", () =>
    Effect.gen(function* () {
      const low = yield* tries(away()).pipe(Effect.provideService(Random.Random, fixedRandom(0)))
      assert.deepStrictEqual(low, [0, 100, 200, 300, 400])
      const t0 = yield* Clock.currentTimeMillis
      const high = yield* tries(away()).pipe(Effect.provideService(Random.Random, fixedRandom(highest)))
      assert.deepStrictEqual(
        high.map((t) => t - t0),
        [0, 200, 600, 1050, 1500],
      )
    }),
  )

  effect("a 503's retryAfterMs does not stretch the waits (some run in the guest's pause); a 404 naming its record is an answer, tried once", () =>
    Effect.gen(function* () {
      const asked = yield* tries(away(5000)).pipe(Effect.provideService(Random.Random, fixedRandom(0)))
      assert.deepStrictEqual(asked, [0, 100, 200, 300, 400])
      const t0 = yield* Clock.currentTimeMillis
      const gone = new CoordinatorError({ op: "round", status: 404, message: "no such move", notFound: { entity: "move", id: "m1" } })
      assert.deepStrictEqual((yield* tries(gone)).map((t) => t - t0), [0])
    }),
  )
})

/**
 * A coordinator that records rounds as core's `Move` does (`placeRound`: a round after the final
 * one is refused, 409; a round at a recorded position with the same figures changes nothing) and
 * loses its answer to the first try of each round it records (`lost`): the round is recorded, the
 * agent sees a failure and tries again, as when a replica hangs after its write. It cannot be read
 * (`getMove` fails): the agent needs no read to tell its own round from the move's end.
 */
const losingAnswers = (state: MoveView["state"] = "pending") => {
  const rounds: RoundReport[] = []
  let lost = 0
  const port = {
    round: (_id: string, round: NumberedRound) =>
      Effect.suspend((): Effect.Effect<void, Conflict | CoordinatorError> => {
        const placed = CoreMove.placeRound({ id: "m1", state, rounds }, round)
        if (typeof placed !== "string") return Effect.fail(new Conflict({ op: "round", message: `move m1: ${placed.reason}` }))
        if (placed === "held") return Effect.void
        const { kind, wireBytes, apparentBytes, sendMs, captureMs } = round
        rounds.push({ kind, wireBytes, apparentBytes, sendMs, captureMs })
        lost++
        return lost % 2 === 1 ? Effect.fail(new CoordinatorError({ op: "round", status: null, message: "timed out" })) : Effect.void
      }),
    getMove: () => Effect.fail(new CoordinatorError({ op: "getMove", status: 503, message: "the store is away" })),
  } as unknown as CoordinatorShape
  return { port, rounds }
}

const finalRound: RoundReport = { kind: "final", wireBytes: 10, apparentBytes: 10, sendMs: 1, captureMs: 1 }
const delta: RoundReport = { ...finalRound, kind: "delta" }

describe("MoveSource.recordRound", () => {
  effect("a round whose answer was lost is tried again at its position and recorded once, the final round too; a 409 is the move's end", () =>
    Effect.gen(function* () {
      const { port, rounds } = losingAnswers()
      for (const [seq, round] of [delta, delta, finalRound].entries()) {
        const fiber = yield* Effect.forkChild(Effect.result(recordRound(port, "m1", { ...round, seq })))
        yield* TestClock.adjust("10 seconds")
        assert.strictEqual((yield* Fiber.join(fiber))._tag, "Success")
      }
      assert.deepStrictEqual(rounds, [delta, delta, finalRound])
      // A round refused is the move's end: after the final round, or on a move that ended (aborted).
      const r3 = yield* Effect.result(recordRound(port, "m1", { ...delta, seq: 3 }))
      assert.strictEqual(r3._tag === "Failure" && r3.failure._tag, "Conflict")
      const ended = losingAnswers("aborted")
      const r2 = yield* Effect.result(recordRound(ended.port, "m1", { ...finalRound, seq: 0 }))
      assert.strictEqual(r2._tag === "Failure" && r2.failure._tag, "Conflict")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))),
  )

  effect("a coordinator older than round positions (400 naming seq, as its strict decoding answers an unknown key) gets the round without one; any other 400 is the answer", () =>
    Effect.gen(function* () {
      const sent: NumberedRound[] = []
      const refusing = (field: string) =>
        ({
          round: (_id: string, round: NumberedRound) =>
            Effect.suspend((): Effect.Effect<void, Conflict | CoordinatorError> => {
              sent.push(round)
              return round.seq === undefined
                ? Effect.void
                : Effect.fail(new CoordinatorError({ op: "round", status: 400, message: "is not a key of this object", field }))
            }),
        }) as unknown as CoordinatorShape
      assert.strictEqual((yield* Effect.result(recordRound(refusing("seq"), "m1", { ...delta, seq: 2 })))._tag, "Success")
      assert.deepStrictEqual(sent, [{ ...delta, seq: 2 }, delta])
      sent.length = 0
      const other = yield* Effect.result(recordRound(refusing("wireBytes"), "m1", { ...delta, seq: 2 }))
      assert.strictEqual(other._tag === "Failure" && other.failure._tag === "CoordinatorError" && other.failure.status, 400)
      assert.deepStrictEqual(sent, [{ ...delta, seq: 2 }])
    }),
  )
})

/**
 * A source's world that notes every call that acts on the move (`calls`): a coordinator holding
 * the move in `state` with `rounds` (which `round` may add to), whose commit is judged as core's
 * `Move` does (refused, 409, without a final round); a target and a runtime that only note that
 * they were asked.
 */
const sourceWorld = (state: MoveView["state"], rounds: RoundReport[], round: (r: NumberedRound) => Effect.Effect<void, Conflict | CoordinatorError>) =>
  Effect.gen(function* () {
    const calls: string[] = []
    const note = (call: string) => Effect.sync(() => void calls.push(call))
    const coordinator = {
      getMove: () => Effect.sync(() => moveView(state, [...rounds])),
      round: (_id: string, r: NumberedRound) => Effect.andThen(note(`round ${r.kind} at ${r.seq}`), round(r)),
      abort: () => note("abort"),
      commit: () =>
        Effect.andThen(note("commit"), () => {
          const refused = CoreMove.refuseCommit(moveView(state, rounds))
          return refused === null ? Effect.void : Effect.fail(new Conflict({ op: "commit", message: `move m1: ${refused.reason}` }))
        }),
      getSession: () => Effect.succeed(null),
    } as unknown as CoordinatorShape
    const refuse = (op: string) => Effect.andThen(note(`peer ${op}`), Effect.fail(new PeerError({ op, moveId: "m1", message: "not asked for in this test", refused: false })))
    const link: PeerLink = { prepare: () => refuse("prepare"), commit: () => refuse("commit"), abort: () => refuse("abort") }
    const runtime = {
      migrate: () => Effect.andThen(note("migrate"), Effect.die("not asked for in this test")),
      destroy: () => note("destroy"),
      unpark: () => note("unpark"),
    } as unknown as VmRuntimeShape
    const vm: LocalState.ResidentVm = { vmId: "s1", memMib: 256, vcpus: 1, status: "running", reservationId: "r1", moveId: null }
    const residents = yield* makeResidents("a", { ...LocalState.empty("a"), vms: [vm] }, () => Effect.void)
    const deps: MoveSourceDeps = {
      hostId: "a",
      runtime,
      coordinator,
      link,
      residents,
      maxPreCopyRounds: 4,
      allowance: { allowanceMs: 100, source: "prior", samples: 0 },
      coordinatorKeepsGuard: false,
    }
    return { calls, deps, residents }
  })

const moveView = (state: MoveView["state"], rounds: readonly RoundReport[] = []): MoveView => ({
  id: "m1",
  sessionId: "s1",
  sourceHostId: "a",
  targetHostId: "b",
  maxDowntimeMs: 5_000,
  state,
  abortReason: state === "aborted" ? "an operator aborted it" : null,
  rounds,
})

describe("MoveSource.runSource", () => {
  effect("a move that reads ended when the source takes it up ends at once (Gone): the target is not asked to prepare, nothing is streamed or aborted", () =>
    Effect.gen(function* () {
      const { calls, deps, residents } = yield* sourceWorld("aborted", [], () => Effect.void)
      const outcome = yield* runSource(moveView("pending"), deps)
      assert.deepStrictEqual(outcome, { _tag: "Gone", reason: "move no longer pending on the coordinator: it reads aborted (an operator aborted it)" })
      assert.deepStrictEqual(calls, [])
      assert.strictEqual((yield* residents.get("s1"))?.status, "running")
    }),
  )
})

describe("MoveSource.runSource, a pause the runtime could not give back", () => {
  effect("a final round not sent, and a guest the runtime lists paused after it (QEMU did not answer): the session is recorded paused, so its next pass unparks it", () =>
    Effect.gen(function* () {
      const { calls, deps, residents } = yield* sourceWorld("pending", [], () => Effect.void)
      const notSent = new RuntimeError({ op: "switchover", vmId: "s1", message: "migration not ended within 600 ms; the guest could not be given back (QEMU does not answer)" })
      const atSwitchover: AtSwitchover = {
        _tag: "AtSwitchover",
        rounds: [],
        unreported: [],
        final: { kind: "final", wireBytes: 10, apparentBytes: 10, sendMs: 0, captureMs: 1 },
        estimateMs: 10,
        alreadyPaused: false,
        pausedAtMs: 0,
        captureMs: 1,
        selfConverged: true,
        switchover: Effect.fail(notSent),
        abort: Effect.void,
      }
      const runtime = {
        ...deps.runtime,
        migrate: () => Effect.succeed(atSwitchover),
        list: Effect.succeed([{ vmId: "s1", memMib: 256, vcpus: 1, status: "paused" }]),
      } as unknown as VmRuntimeShape
      const link: PeerLink = { ...deps.link, prepare: () => Effect.succeed({ runtime: "test", uri: "test:b" }), abort: () => Effect.void }
      const outcome = yield* runSource(moveView("pending"), { ...deps, runtime, link })
      assert.strictEqual(outcome._tag, "Failed")
      assert.include(calls, "abort")
      assert.strictEqual((yield* residents.get("s1"))?.status, "paused")
      assert.deepStrictEqual(yield* residents.pendingCommits, [], "the move ended: nothing owed")
    }),
  )
})

describe("MoveSource.settleCommit", () => {
  /** A debt whose target runs the guest (phases known) and whose final round the coordinator may not hold yet. */
  const debt: LocalState.PendingCommit = {
    moveId: "m1",
    sessionId: "s1",
    phases: { downtimeMs: 50, captureMs: 10, sendMs: 20, commitMs: 20 },
    target: { targetHostId: "b", memMib: 256, vcpus: 1 },
    final: finalRound,
    finalRecorded: false,
    intentRecorded: true,
  }
  const wrongPosition = new Conflict({ op: "round", message: "move m1: a round is missing before position 1" })
  const intent: RoundReport = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
  const settleOwed = (deps: MoveSourceDeps) =>
    Effect.gen(function* () {
      const [owed] = yield* deps.residents.pendingCommits
      assert.isDefined(owed)
      return yield* settleCommit(deps, owed!)
    })

  effect("a final round refused (409) while the move is still pending without it is not taken for recorded: no commit, still owed, recorded on the next pass", () =>
    Effect.gen(function* () {
      const rounds = [intent]
      let tries = 0
      // The first try refused at its position (the move's records changed since its read), the next recorded.
      const round = (r: NumberedRound) => (tries++ === 0 ? Effect.fail(wrongPosition) : Effect.sync(() => void rounds.push(r)))
      const { calls, deps, residents } = yield* sourceWorld("pending", rounds, round)
      yield* residents.addPendingCommit(debt)
      const first = yield* settleOwed(deps)
      assert.deepStrictEqual(calls, ["round final at 1"])
      assert.strictEqual(first._tag, "Owed")
      assert.deepStrictEqual((yield* residents.pendingCommits).map((p) => p.finalRecorded), [false])
      const second = yield* settleOwed(deps)
      assert.strictEqual(second._tag, "Acknowledged")
      assert.deepStrictEqual(calls, ["round final at 1", "round final at 1", "commit", "destroy"])
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
    }),
  )

  effect("a final round refused (409) whose move, read again, holds a final round is recorded: the commit goes on", () =>
    Effect.gen(function* () {
      const rounds: RoundReport[] = []
      // Recorded meanwhile with other figures (an earlier try of this round), so this one is refused.
      const round = () => Effect.andThen(Effect.sync(() => void rounds.push({ ...finalRound, sendMs: 2 })), Effect.fail(wrongPosition))
      const { calls, deps, residents } = yield* sourceWorld("pending", rounds, round)
      yield* residents.addPendingCommit(debt)
      assert.strictEqual((yield* settleOwed(deps))._tag, "Acknowledged")
      assert.deepStrictEqual(calls, ["round final at 0", "commit", "destroy"])
      assert.deepStrictEqual(yield* residents.pendingCommits, [])
    }),
  )

  const lateA: RoundReport = { kind: "delta", wireBytes: 30, apparentBytes: 31, sendMs: 3, captureMs: 1 }
  const lateB: RoundReport = { kind: "delta", wireBytes: 20, apparentBytes: 21, sendMs: 2, captureMs: 1 }

  effect("a debt's late rounds go at the positions they took (lateSeq), only those the move does not hold; the final round after them", () =>
    Effect.gen(function* () {
      // The move holds the first late round (position 2); the source stopped before the second's record.
      const rounds: RoundReport[] = [{ ...delta, kind: "full" }, intent, lateA]
      const { calls, deps, residents } = yield* sourceWorld("pending", rounds, (r) => Effect.sync(() => void rounds.push(r)))
      yield* residents.addPendingCommit({ ...debt, lateRounds: [lateA, lateB], lateSeq: 2 })
      assert.strictEqual((yield* settleOwed(deps))._tag, "Acknowledged")
      assert.deepStrictEqual(calls, ["round delta at 3", "round final at 4", "commit", "destroy"])
    }),
  )

  effect("a debt whose positions the move holds with other figures (an older coordinator appended a retried record twice) is judged by figures, as without lateSeq", () =>
    Effect.gen(function* () {
      // The agent counted 2 records; the move holds 3 (the pre-copy round appended twice), and
      // the late round the debt put at 2 never landed.
      const full = { ...delta, kind: "full" as const }
      const rounds: RoundReport[] = [full, delta, delta]
      const { calls, deps, residents } = yield* sourceWorld("pending", rounds, (r) => Effect.sync(() => void rounds.push(r)))
      const { intentRecorded: _intentOff, ...withoutIntent } = debt
      yield* residents.addPendingCommit({ ...withoutIntent, lateRounds: [lateA], lateSeq: 2 })
      assert.strictEqual((yield* settleOwed(deps))._tag, "Acknowledged")
      assert.deepStrictEqual(calls, ["round delta at 3", "round final at 4", "commit", "destroy"])
      assert.deepInclude(rounds[3], lateA)
    }),
  )

  effect("a state file of an older agent (late rounds without lateSeq) still loads and settles: its late rounds after what the move holds, unless it holds the last", () =>
    Effect.gen(function* () {
      const path = join(mkdtempSync(join(tmpdir(), "engram-late-")), "state.json")
      const older: LocalState.PendingCommit = { ...debt, lateRounds: [lateA] }
      writeFileSync(path, JSON.stringify({ version: 1, hostId: "a", vms: [], pendingCommits: [older] }))
      const loaded = yield* LocalState.load(path, "a")
      if (loaded._tag !== "Loaded") return assert.fail(`the older file did not load: ${loaded._tag}`)
      const [owed] = loaded.state.pendingCommits
      assert.deepStrictEqual(owed, older)
      assert.isUndefined(owed!.lateSeq)
      // Not held: the late round, then the final round, after what the move holds.
      const rounds: RoundReport[] = [{ ...delta, kind: "full" }, intent]
      const world = yield* sourceWorld("pending", rounds, (r) => Effect.sync(() => void rounds.push(r)))
      yield* world.residents.addPendingCommit(owed!)
      assert.strictEqual((yield* settleOwed(world.deps))._tag, "Acknowledged")
      assert.deepStrictEqual(world.calls, ["round delta at 2", "round final at 3", "commit", "destroy"])
      // Held (the move's last record): the final round alone.
      const holding: RoundReport[] = [{ ...delta, kind: "full" }, intent, lateA]
      const again = yield* sourceWorld("pending", holding, (r) => Effect.sync(() => void holding.push(r)))
      yield* again.residents.addPendingCommit(owed!)
      assert.strictEqual((yield* settleOwed(again.deps))._tag, "Acknowledged")
      assert.deepStrictEqual(again.calls, ["round final at 3", "commit", "destroy"])
    }),
  )
})
