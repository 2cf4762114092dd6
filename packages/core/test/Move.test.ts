import { describe, expect, it } from "vitest"
import { Move } from "../src/index.js"

const open: Move.Record = {
  id: "m1",
  sessionId: "s1",
  sourceHostId: "h1",
  targetHostId: "h2",
  reservationId: "t1",
  maxDowntimeMs: 600,
  state: "pending",
  rounds: [],
  phases: null,
  abortReason: null,
  abortEstimateMs: null,
  guard: null,
  createdAt: 0,
  endedAt: null,
}
const round = (kind: Move.RoundKind): Move.Round => ({ kind, wireBytes: 10, apparentBytes: 10, sendMs: 1, captureMs: 1 })

describe("Move rules (SPEC §5, §12)", () => {
  it("rounds are recorded in order until the final one; nothing follows the final round", () => {
    const full = Move.recordRound(open, round("full"), 7)
    expect(full).toEqual({ _tag: "Plan", at: 7, sessions: [], ledger: [], moves: [{ _tag: "Update", move: { ...open, rounds: [round("full")] } }], events: [], host: null })
    const withFinal = { ...open, rounds: [round("full"), round("final")] }
    expect(Move.recordRound(withFinal, round("delta"), 7)).toEqual({
      _tag: "Conflict",
      moveId: "m1",
      reason: "the final round is recorded: no round follows it",
    })
    expect(Move.refuseRound({ ...open, state: "committed" })).toEqual({ _tag: "Conflict", moveId: "m1", reason: "move is committed" })
  })

  it("a commit needs the final round recorded, and an open move", () => {
    expect(Move.refuseCommit(open)).toMatchObject({ reason: "no final round recorded: a commit needs the final round" })
    expect(Move.refuseCommit({ ...open, rounds: [round("full"), round("delta")] })).not.toBeNull()
    expect(Move.refuseCommit({ ...open, rounds: [round("final")] })).toBeNull()
    expect(Move.refuseCommit({ ...open, state: "aborted", rounds: [round("final")] })).toMatchObject({ reason: "move is aborted" })
  })

  it("the intent is the point of no return: in doubt, a timeout's abort refused, a resolution's commit allowed, a measured commit still needs the final round; a second intent changes nothing", () => {
    const intent: Move.Round = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
    const held = { ...open, rounds: [round("full"), intent] }
    expect([Move.inDoubt(open), Move.inDoubt(held), Move.inDoubt({ ...held, state: "aborted" })]).toStrictEqual([false, true, false])
    expect(Move.refuseAbort(held, true)).toMatchObject({ reason: "intent recorded: the target may run the guest" })
    expect(Move.refuseAbort(held, false)).toBeNull()
    expect(Move.refuseAbort({ ...open, rounds: [round("full")] }, true)).toBeNull()
    expect(Move.refuseCommit(held, false)).toBeNull()
    expect(Move.refuseCommit({ ...open, rounds: [round("full")] }, false)).toMatchObject({ reason: "neither an intent nor a final round recorded: the move is not in doubt" })
    expect(Move.refuseCommit(held)).toMatchObject({ reason: "no final round recorded: a commit needs the final round" })
    expect(Move.recordRound(held, intent, 7)).toMatchObject({ moves: [{ _tag: "Update", move: held }] })
    expect(Move.recordRound(held, round("delta"), 7)).toMatchObject({ moves: [{ _tag: "Update", move: { ...held, rounds: [round("full"), intent, round("delta")] } }] })
  })
})
