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
})
