import { describe, expect, it } from "vitest"
import { MoveGuard, type MoveRound } from "../src/index.js"

const b = { maxDowntimeMs: 600, commitAllowanceMs: 400, maxPreCopyRounds: 4 }
const round = (kind: MoveRound["kind"], apparentBytes: number, wireBytes = apparentBytes, sendMs = 1): MoveRound => ({ kind, apparentBytes, wireBytes, sendMs, captureMs: 0 })

describe("the pre-copy step", () => {
  it("goes on after the full round and while the deltas shrink", () => {
    expect(MoveGuard.afterRound([round("full", 1e6)], b)._tag).toBe("Continue")
    expect(MoveGuard.afterRound([round("full", 1e6), round("delta", 1e5)], b)._tag).toBe("Continue")
  })

  it("checks the pre-pause estimate once a delta stops shrinking: the last delta at the rounds' rate plus the allowance", () => {
    // 1000 B/ms; the last delta 150 000 B → 150 ms + 400 = 550 ≤ 600.
    const rounds = [round("full", 1e6, 1e6, 1000), round("delta", 150_000, 150_000, 150), round("delta", 150_000, 150_000, 150)]
    expect(MoveGuard.afterRound(rounds, b)).toEqual({ _tag: "Pause", estimateMs: 550 })
    const refused = MoveGuard.afterRound(rounds, { ...b, maxDowntimeMs: 500 })
    expect(refused).toMatchObject({ _tag: "Refuse", estimateMs: 550 })
    if (refused._tag === "Refuse") expect(refused.reason).toBe("ErrMoveDowntime: pre-pause estimate 550 ms > maxDowntimeMs 500 ms; refused before pausing")
  })

  it("stops at maxPreCopyRounds even while shrinking, and at an empty delta", () => {
    const four = [round("full", 1e6), round("delta", 4e5), round("delta", 3e5), round("delta", 2e5)]
    expect(MoveGuard.afterRound(four, b)._tag).not.toBe("Continue")
    expect(MoveGuard.afterRound([round("full", 1e6), round("delta", 0)], b)._tag).toBe("Pause")
  })

  it("refuses before the start a budget below the commit allowance", () => {
    expect(MoveGuard.beforeStart({ ...b, maxDowntimeMs: 399 })).toMatchObject({ _tag: "Refuse", estimateMs: 400 })
    expect(MoveGuard.beforeStart({ ...b, maxDowntimeMs: 400 })._tag).toBe("Continue")
  })
})

describe("the post-capture check", () => {
  it("with the full round alone, the final round is all of the final wire: the bulk round is not a delta", () => {
    const onlyFull = [round("full", 72_000_000, 72_000_000, 1000)]
    // 72 000 B/ms; 360 000 B final → 5 ms; + 1 + 50.
    expect(MoveGuard.postCapture(onlyFull, { captureMs: 1, apparentBytes: 360_000 }, { ...b, commitAllowanceMs: 50 })).toEqual({ _tag: "Fits", estimateMs: 56 })
  })
  const rounds = [round("full", 1e6, 1e6, 1000), round("delta", 100_000, 100_000, 100)]
  it("adds the capture time and the final round's growth over the last delta", () => {
    // rate 1000 B/ms; final wire = 100 000 + (150 000 − 100 000) → 150 ms; 20 + 150 + 400 = 570.
    expect(MoveGuard.postCapture(rounds, { captureMs: 20, apparentBytes: 150_000 }, b)).toEqual({ _tag: "Fits", estimateMs: 570 })
    expect(MoveGuard.finalWireEstimate(rounds, { captureMs: 20, apparentBytes: 150_000 })).toBe(150_000)
  })
  it("a final round smaller than the last delta does not cancel its bytes; over budget it words the abort", () => {
    const v = MoveGuard.postCapture(rounds, { captureMs: 150, apparentBytes: 0 }, b)
    expect(v).toMatchObject({ _tag: "Overrun", estimateMs: 650 })
    if (v._tag === "Overrun") expect(v.reason).toMatch(/^ErrMoveDowntime: post-capture estimate 650 ms > maxDowntimeMs 600 ms \(final capture 150 ms\)/)
  })
})

describe("a guest paused before its move (core's rule: its move pauses it no further)", () => {
  const paused: MoveGuard.Guest = { alreadyPaused: true }
  const rounds = [round("full", 1e6, 1e6, 1000), round("delta", 150_000, 150_000, 150), round("delta", 150_000, 150_000, 150)]
  it("is refused at no stage, each estimate made as for a running guest", () => {
    expect(MoveGuard.beforeStart({ ...b, maxDowntimeMs: 1 }, paused)).toEqual({ _tag: "Continue" })
    expect(MoveGuard.afterRound(rounds, { ...b, maxDowntimeMs: 500 }, paused)).toEqual({ _tag: "Pause", estimateMs: 550 })
    const final = { captureMs: 150, apparentBytes: 0 }
    expect(MoveGuard.postCapture(rounds, final, b, paused)).toEqual({ _tag: "AlreadyPaused", estimateMs: 700 })
    // The same, the guest running (the default).
    expect(MoveGuard.beforeStart({ ...b, maxDowntimeMs: 1 }, MoveGuard.running)._tag).toBe("Refuse")
    expect(MoveGuard.afterRound(rounds, { ...b, maxDowntimeMs: 500 })._tag).toBe("Refuse")
    expect(MoveGuard.postCapture(rounds, final, b)._tag).toBe("Overrun")
  })
  it("still copies while the deltas shrink: only the estimate's refusal is waived", () => {
    expect(MoveGuard.afterRound([round("full", 1e6), round("delta", 1e5)], b, paused)._tag).toBe("Continue")
  })
})
