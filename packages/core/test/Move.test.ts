import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Limits, Move } from "../src/index.js"

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
  resendOwed: false,
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

  it("an operator's commit before the final round is refused while the source is heard (its last report within the stale window); a silent, unreported or removed source, or a final round recorded, lets it through", () => {
    const intent: Move.Round = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
    const preCopy = { ...open, rounds: [intent, round("full"), round("delta")] }
    const windowMs = Limits.defaults.heartbeatStaleWindowMs
    const now = 1_000_000
    expect(Move.refuseOperatorCommit(preCopy, { reportedAt: now - 12_000 }, now, Limits.defaults)).toEqual({
      _tag: "Conflict",
      moveId: "m1",
      reason: "the move's source h1 is heard (its last report 12 s ago, within the 120 s stale window) and the move's final round is not recorded yet: the target may hold no complete copy; wait for the final round (or the target's own commit) or abort",
    })
    // Exactly the window is still heard (`Placement.isSilent`); past it the source is frozen or dead.
    expect(Move.refuseOperatorCommit(preCopy, { reportedAt: now - windowMs }, now, Limits.defaults)).not.toBeNull()
    expect(Move.refuseOperatorCommit(preCopy, { reportedAt: now - windowMs - 1 }, now, Limits.defaults)).toBeNull()
    expect(Move.refuseOperatorCommit(preCopy, { reportedAt: null }, now, Limits.defaults)).toBeNull()
    expect(Move.refuseOperatorCommit(preCopy, null, now, Limits.defaults)).toBeNull()
    // The final round recorded: the target holds the complete stream, the commit stands.
    expect(Move.refuseOperatorCommit({ ...preCopy, rounds: [...preCopy.rounds, round("final")] }, { reportedAt: now }, now, Limits.defaults)).toBeNull()
    // The resolution's own rules first: not in doubt, or finished.
    expect(Move.refuseOperatorCommit({ ...open, rounds: [round("full")] }, { reportedAt: null }, now, Limits.defaults)).toMatchObject({ reason: "neither an intent nor a final round recorded: the move is not in doubt" })
    expect(Move.refuseOperatorCommit({ ...preCopy, state: "aborted" }, null, now, Limits.defaults)).toMatchObject({ reason: "move is aborted" })
  })

  it("a round with a position is recorded once: a repeat with the same figures changes nothing, other figures or a gap are refused by rule, an intent at a new position after the intent is refused", () => {
    const intent: Move.Round = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
    const two = { ...open, rounds: [round("full"), round("delta")] }
    expect(Move.placeRound(two, { ...round("delta"), seq: 2 })).toBe("append")
    expect(Move.placeRound(two, { ...round("delta"), seq: 1 })).toBe("held")
    expect(Move.recordRound(two, { ...round("delta"), seq: 1 }, 7)).toMatchObject({ moves: [{ _tag: "Update", move: two }] })
    // The position is not stored: the round's index in `rounds` is its position.
    expect(Move.recordRound(two, { ...round("delta"), seq: 2 }, 7)).toMatchObject({ moves: [{ _tag: "Update", move: { ...two, rounds: [round("full"), round("delta"), round("delta")] } }] })
    expect(Move.placeRound(two, { ...round("delta"), wireBytes: 11, seq: 1 })).toEqual({
      _tag: "Conflict",
      moveId: "m1",
      reason: "round 1 is recorded with other figures (delta, 10 wire bytes, 10 apparent, send 1 ms, capture 1 ms): a position is recorded once",
    })
    expect(Move.placeRound(two, { ...round("final"), seq: 1 })).toMatchObject({ _tag: "Conflict" })
    expect(Move.placeRound(two, { ...round("delta"), seq: 3 })).toEqual({ _tag: "Conflict", moveId: "m1", reason: "round 3 leaves a gap: the move holds 2 rounds, so the next is round 2" })
    // The final round repeated at its own position is held; a new round after it is refused as before.
    const final = { ...open, rounds: [round("full"), round("final")] }
    expect(Move.placeRound(final, { ...round("final"), seq: 1 })).toBe("held")
    expect(Move.placeRound(final, { ...round("delta"), seq: 2 })).toMatchObject({ reason: "the final round is recorded: no round follows it" })
    // A finished move refuses even a repeat.
    expect(Move.placeRound({ ...final, state: "aborted" }, { ...round("final"), seq: 1 })).toMatchObject({ reason: "move is aborted" })
    const held = { ...open, rounds: [round("full"), intent] }
    expect(Move.placeRound(held, { ...intent, seq: 1 })).toBe("held")
    expect(Move.placeRound(held, intent)).toBe("held")
    expect(Move.placeRound(held, { ...intent, seq: 2 })).toEqual({ _tag: "Conflict", moveId: "m1", reason: "the intent is recorded: round 2 cannot be a second one" })
  })

  it("property: rounds sent in order with their positions, each delivered one to three times (answers lost, retried), are recorded once each, in order", () => {
    const aRound = fc.record({ kind: fc.constantFrom<Move.RoundKind>("full", "delta"), wireBytes: fc.nat(), apparentBytes: fc.nat(), sendMs: fc.nat(), captureMs: fc.nat() })
    fc.assert(
      fc.property(fc.array(fc.tuple(aRound, fc.integer({ min: 1, max: 3 })), { maxLength: 12 }), (sent) => {
        let m: Move.Record = open
        for (const [seq, [r, times]] of sent.entries()) {
          for (let i = 0; i < times; i++) {
            const plan = Move.recordRound(m, { ...r, seq }, 1)
            if (plan._tag === "Conflict") throw new Error(plan.reason)
            m = plan.moves[0]!.move as Move.Record
          }
        }
        expect(m.rounds).toEqual(sent.map(([r]) => r))
      }),
    )
  })
})

describe("Move.isPeerUrl: where a move's source reaches its target (the store's rule and the agent's)", () => {
  it("an absolute http(s) URL with a host, no credentials, query, fragment, whitespace or control character, at most 2048 characters", () => {
    for (const ok of ["http://10.0.0.2:7100", "https://agent-b.example/peer", "http://[::1]:7100"]) expect(Move.isPeerUrl(ok), ok).toBe(true)
    const bad = [
      "10.0.0.2:7100",
      "ftp://10.0.0.2",
      "http://user:pw@10.0.0.2:7100",
      "http://10.0.0.2:7100/?x=1",
      "http://10.0.0.2:7100/#f",
      "http://10.0.0.2:7100/ a",
      "http://10.0.0.2:7100/\u0007",
      "http://10.0.0.2:7100/\u007f",
      ` http://10.0.0.2:7100`,
      `http://a.example/${"x".repeat(Move.maxPeerUrlLength)}`,
    ]
    for (const no of bad) expect(Move.isPeerUrl(no), JSON.stringify(no)).toBe(false)
  })

  it("a wildcard host is never a peer URL, however it is spelt: no peer reaches a listener's wildcard", () => {
    for (const url of ["http://0.0.0.0:7100", "http://[::]:7100", "https://0.0.0.0/peer", "http://0:7100", "http://[0:0:0:0:0:0:0:0]:7100", "http://[::ffff:0.0.0.0]:7100"])
      expect(Move.isPeerUrl(url), url).toBe(false)
    for (const url of ["http://10.0.0.2:7100", "http://[::1]:7100", "http://0.0.0.1:7100"]) expect(Move.isPeerUrl(url), url).toBe(true)
  })
})

describe("Move.takesMoves: a host is a move's target only when its agent advertises a peer URL", () => {
  it("a URL takes moves; none (an older agent, or a wildcard listen host told nothing) does not", () => {
    expect(Move.takesMoves("http://10.0.0.2:7100")).toBe(true)
    expect(Move.takesMoves(null)).toBe(false)
  })

  it("a URL stored before the rule refused it (a wildcard, kept until the host's next report) takes none: no peer reaches it", () => {
    for (const url of ["http://0.0.0.0:7100", "http://[::]:7100", "http://0:7100", "not a url"]) expect(Move.takesMoves(url), url).toBe(false)
  })
})

describe("resendMarkStep (the resend mark's generation: a tell before a clear it did not see changes nothing)", () => {
  const unconfirmed = { id: "m", state: "committed" as const, phases: null, resendOwed: false, resendClears: 2 }
  it("a tell naming fewer clears than the move holds is stale: nothing changes", () => {
    expect(Move.resendTellStale(unconfirmed, true, 1)).toBe(true)
    expect(Move.resendMarkStep(unconfirmed, true, 1)).toBeNull()
    expect(Move.resendMarkStep(unconfirmed, true, 0)).toBeNull()
  })
  it("a tell naming the clears it read, or more, or none (an older source) sets the mark, the count as it is", () => {
    for (const seen of [2, 3, undefined]) expect(Move.resendMarkStep(unconfirmed, true, seen)).toStrictEqual({ resendOwed: true, resendClears: 2 })
    const { resendClears: _clears, ...older } = unconfirmed
    expect(Move.resendMarkStep(older, true, 0)).toStrictEqual({ resendOwed: true, resendClears: 0 })
  })
  it("a clear counts, even of a mark already clear; never on a move that may carry no mark", () => {
    expect(Move.resendMarkStep({ ...unconfirmed, resendOwed: true }, false, undefined)).toStrictEqual({ resendOwed: false, resendClears: 3 })
    expect(Move.resendMarkStep(unconfirmed, false, 0)).toStrictEqual({ resendOwed: false, resendClears: 3 })
    expect(Move.resendMarkStep({ ...unconfirmed, state: "pending" }, false, undefined)).toBeNull()
    expect(Move.resendMarkStep({ ...unconfirmed, phases: { downtimeMs: 10, captureMs: 1, sendMs: 1, commitMs: 1 } }, false, undefined)).toBeNull()
  })
  it("a clear is never stale; any tell after a clear it did not see is (property)", () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.nat(1000), (clears, seen) => {
        const m = { ...unconfirmed, resendClears: clears }
        expect(Move.resendTellStale(m, false, seen)).toBe(false)
        expect(Move.resendTellStale(m, true, seen)).toBe(seen < clears)
      }),
    )
  })
})
