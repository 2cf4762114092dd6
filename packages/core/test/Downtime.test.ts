import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Downtime } from "../src/index.js"

const KiB = 1024
const MiB = 1024 * KiB
const TiB = 1024 * 1024 * MiB

describe("Downtime", () => {
  it("the pre-pause estimate is the last delta at the rounds' rate plus the commit allowance", () => {
    expect(Downtime.prePauseEstimateMs({ lastDeltaWireBytes: 100 * MiB, rateBytesPerMs: MiB })).toBe(500)
    expect(Downtime.prePauseEstimateMs({ lastDeltaWireBytes: 100 * MiB, rateBytesPerMs: MiB, commitAllowanceMs: 0 })).toBe(100)
  })

  it("the rounds' rate is wire bytes sent over send time", () => {
    const rounds = [
      { wireBytes: 600 * MiB, apparentBytes: 4096 * MiB, sendMs: 500 },
      { wireBytes: 400 * MiB, apparentBytes: 400 * MiB, sendMs: 500 },
    ]
    expect(Downtime.rateBytesPerMs(rounds)).toBe(MiB)
    expect(Downtime.rateBytesPerMs([])).toBe(0)
  })

  it("an unknown rate with bytes to send overruns any budget", () => {
    const v = Downtime.check({ lastDeltaWireBytes: 1, rateBytesPerMs: 0, maxDowntimeMs: 1e9 })
    expect(v._tag).toBe("Overrun")
  })

  it("a slow final capture overruns after the pause", () => {
    const base = { lastDeltaWireBytes: 10 * MiB, lastDeltaApparentBytes: 10 * MiB, finalApparentBytes: 10 * MiB, rateBytesPerMs: MiB, maxDowntimeMs: 600 }
    expect(Downtime.check({ ...base, captureMs: 40 })._tag).toBe("Fits")
    const slow = Downtime.check({ ...base, captureMs: 2000 })
    expect(slow).toEqual({ _tag: "Overrun", estimateMs: 2000 + 10 + 400 })
  })

  it("a final round grown 1 TiB over a 1 KiB delta overruns", () => {
    const v = Downtime.check({
      captureMs: 40,
      lastDeltaWireBytes: KiB,
      lastDeltaApparentBytes: KiB,
      finalApparentBytes: TiB + KiB,
      rateBytesPerMs: 100 * MiB,
      maxDowntimeMs: 2000,
    })
    expect(v._tag).toBe("Overrun")
    expect(Downtime.finalWireBytes({ lastDeltaWireBytes: KiB, lastDeltaApparentBytes: KiB, finalApparentBytes: TiB + KiB })).toBe(TiB + KiB)
  })

  it("a 1-byte delta sent as 4 KiB, then a 16 MiB final round, still fits", () => {
    // Growth, not scaling: 4 KiB + (16 MiB − 1 B) on the wire, not 16 MiB × 4096.
    const i = { captureMs: 40, lastDeltaWireBytes: 4 * KiB, lastDeltaApparentBytes: 1, finalApparentBytes: 16 * MiB, rateBytesPerMs: MiB, maxDowntimeMs: 600 }
    expect(Downtime.finalWireBytes(i)).toBe(4 * KiB + 16 * MiB - 1)
    const v = Downtime.check(i)
    expect(v._tag).toBe("Fits")
    expect(v.estimateMs).toBeCloseTo(40 + 16 + 4 / 1024 + 400, 3)
  })

  it("a final round smaller than the last delta does not cancel the delta's bytes", () => {
    const i = { lastDeltaWireBytes: 32 * MiB, lastDeltaApparentBytes: 256 * MiB, finalApparentBytes: 0 }
    expect(Downtime.finalWireBytes(i)).toBe(32 * MiB)
    expect(Downtime.postCaptureEstimateMs({ ...i, captureMs: 100, rateBytesPerMs: MiB / 10 })).toBe(100 + 320 + 400)
  })

  it("seed 004 hardware: a 600 ms budget fits, 480 ms is refused before any pause", () => {
    // Rounds at ~1 MiB/ms; the last delta took ~85 ms on the wire; final capture ~40 ms.
    const rate = MiB
    const lastDeltaWireBytes = 85 * MiB
    for (const budget of [600, 800]) {
      expect(Downtime.check({ lastDeltaWireBytes, rateBytesPerMs: rate, maxDowntimeMs: budget })._tag).toBe("Fits")
      expect(
        Downtime.check({ captureMs: 40, lastDeltaWireBytes, lastDeltaApparentBytes: 90 * MiB, finalApparentBytes: 80 * MiB, rateBytesPerMs: rate, maxDowntimeMs: budget })._tag,
      ).toBe("Fits")
    }
    expect(Downtime.check({ lastDeltaWireBytes, rateBytesPerMs: rate, maxDowntimeMs: 480 })._tag).toBe("Overrun")
  })

  it("equal to the budget fits", () => {
    expect(Downtime.check({ lastDeltaWireBytes: 100 * MiB, rateBytesPerMs: MiB, maxDowntimeMs: 500 })._tag).toBe("Fits")
  })

  it("phases are consistent when each is positive and they sum within the downtime", () => {
    expect(Downtime.phasesConsistent({ downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 420 })).toBe(true)
    expect(Downtime.phasesConsistent({ downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 420 })).toBe(false)
    expect(Downtime.phasesConsistent({ downtimeMs: 560, captureMs: 0, sendMs: 80, commitMs: 420 })).toBe(false)
  })

  it("property: estimates are monotone in bytes and capture time", () => {
    const n = fc.integer({ min: 0, max: 2 ** 40 })
    fc.assert(
      fc.property(n, n, n, n, fc.integer({ min: 0, max: 100_000 }), fc.integer({ min: 0, max: 100_000 }), fc.integer({ min: 1, max: 2 ** 30 }), (w, dw, a, fa, c, dc, rate) => {
        const base = { captureMs: c, lastDeltaWireBytes: w, lastDeltaApparentBytes: a, finalApparentBytes: fa, rateBytesPerMs: rate }
        const e = Downtime.postCaptureEstimateMs(base)
        expect(Downtime.postCaptureEstimateMs({ ...base, lastDeltaWireBytes: w + dw })).toBeGreaterThanOrEqual(e)
        expect(Downtime.postCaptureEstimateMs({ ...base, finalApparentBytes: fa + dw })).toBeGreaterThanOrEqual(e)
        expect(Downtime.postCaptureEstimateMs({ ...base, captureMs: c + dc })).toBeGreaterThanOrEqual(e)
        expect(Downtime.prePauseEstimateMs({ lastDeltaWireBytes: w + dw, rateBytesPerMs: rate })).toBeGreaterThanOrEqual(
          Downtime.prePauseEstimateMs({ lastDeltaWireBytes: w, rateBytesPerMs: rate }),
        )
        // Faster links never estimate longer.
        expect(Downtime.postCaptureEstimateMs({ ...base, rateBytesPerMs: rate * 2 })).toBeLessThanOrEqual(e)
      }),
    )
  })

  describe("a guest paused before its move", () => {
    it("is never refused, before the pause or after the capture: its move pauses it no further; the estimate is still reported", () => {
      // The seed 004 rounds at a 480 ms budget: refused for a running guest (486 ms).
      const pre = { lastDeltaWireBytes: 86 * MiB, rateBytesPerMs: MiB, maxDowntimeMs: 480 }
      expect(Downtime.check(pre)).toEqual({ _tag: "Overrun", estimateMs: 486 })
      expect(Downtime.check({ ...pre, alreadyPaused: false })).toEqual({ _tag: "Overrun", estimateMs: 486 })
      expect(Downtime.check({ ...pre, alreadyPaused: true })).toEqual({ _tag: "AlreadyPaused", estimateMs: 486 })
      // A budget below the commit allowance alone (an empty final round), and an unknown rate.
      expect(Downtime.check({ lastDeltaWireBytes: 0, rateBytesPerMs: 0, maxDowntimeMs: 1, alreadyPaused: true })).toEqual({ _tag: "AlreadyPaused", estimateMs: 400 })
      expect(Downtime.check({ lastDeltaWireBytes: 1, rateBytesPerMs: 0, maxDowntimeMs: 1, alreadyPaused: true }).estimateMs).toBe(Number.POSITIVE_INFINITY)
      const post = { captureMs: 2000, lastDeltaWireBytes: 10 * MiB, lastDeltaApparentBytes: 10 * MiB, finalApparentBytes: 10 * MiB, rateBytesPerMs: MiB, maxDowntimeMs: 600 }
      expect(Downtime.check(post)._tag).toBe("Overrun")
      expect(Downtime.check({ ...post, alreadyPaused: true })).toEqual({ _tag: "AlreadyPaused", estimateMs: 2410 })
      expect(Downtime.refuses(Downtime.check({ ...post, alreadyPaused: true }))).toBe(false)
      expect(Downtime.refuses(Downtime.check(post))).toBe(true)
    })

    it("property: a guest already paused is refused by no estimate, with the estimate a running guest gets; a running guest's verdict is unchanged", () => {
      const n = fc.integer({ min: 0, max: 2 ** 40 })
      const ms = fc.integer({ min: 0, max: 100_000 })
      const input = fc.oneof(
        fc.record({ lastDeltaWireBytes: n, rateBytesPerMs: fc.integer({ min: 0, max: 2 ** 30 }), commitAllowanceMs: ms, maxDowntimeMs: ms }),
        fc.record({
          captureMs: ms,
          lastDeltaWireBytes: n,
          lastDeltaApparentBytes: n,
          finalApparentBytes: n,
          rateBytesPerMs: fc.integer({ min: 0, max: 2 ** 30 }),
          commitAllowanceMs: ms,
          maxDowntimeMs: ms,
        }),
      )
      fc.assert(
        fc.property(input, (i) => {
          const runningGuest = Downtime.check(i)
          expect(Downtime.check({ ...i, alreadyPaused: false })).toEqual(runningGuest)
          expect(runningGuest._tag).toBe(runningGuest.estimateMs <= i.maxDowntimeMs ? "Fits" : "Overrun")
          const paused = Downtime.check({ ...i, alreadyPaused: true })
          expect(paused).toEqual({ _tag: "AlreadyPaused", estimateMs: runningGuest.estimateMs })
          expect(Downtime.refuses(paused)).toBe(false)
          expect(Downtime.refuses(runningGuest)).toBe(runningGuest._tag === "Overrun")
        }),
      )
    })
  })

  describe("the learned commit allowance", () => {
    it("is the prior before any history, then a high quantile of the last commits", () => {
      expect(Downtime.commitAllowance([])).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
      expect(Downtime.commitAllowance([], { priorMs: 250 }).allowanceMs).toBe(250)
      const twenty = Array.from({ length: 20 }, (_, i) => 10 * (i + 1)) // 10 … 200 ms
      expect(Downtime.commitAllowance(twenty)).toEqual({ allowanceMs: 190, source: "learned", samples: 20 })
      expect(Downtime.commitAllowance([42])).toEqual({ allowanceMs: 42, source: "learned", samples: 1 })
      expect(Downtime.commitAllowance([40, 50], { marginMs: 5 }).allowanceMs).toBe(55)
    })

    it("counts only the last window of commits, and ignores what is not a commit time", () => {
      expect(Downtime.commitAllowance([900, 30, 40], { window: 2 }).allowanceMs).toBe(40)
      expect(Downtime.commitAllowance([Number.NaN, -1, Number.POSITIVE_INFINITY])).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
      expect(Downtime.commitAllowance([Number.NaN, 60]).allowanceMs).toBe(60)
    })

    it("a pair's history keeps only the window's most recent commits, oldest first", () => {
      let h: readonly number[] = []
      for (let i = 1; i <= 25; i++) h = Downtime.recordCommit(h, i)
      expect(h).toEqual(Array.from({ length: 20 }, (_, i) => i + 6))
      expect(Downtime.recordCommit([1, 2, 3], 4, { window: 2 })).toEqual([3, 4])
      expect(Downtime.recordCommit([1], Number.NaN)).toEqual([1])
      expect(Downtime.commitAllowance(h)).toEqual(Downtime.commitAllowance([...Array.from({ length: 5 }, () => 9999), ...h]))
    })

    const commits = fc.array(fc.double({ min: 0, max: 10_000, noNaN: true }), { maxLength: 60 })
    const policy = fc.record({ window: fc.integer({ min: 1, max: 40 }), quantile: fc.double({ min: 0, max: 1, noNaN: true }), marginMs: fc.integer({ min: 0, max: 100 }) })

    it("property: with no history it is the prior, whatever the policy", () => {
      fc.assert(fc.property(policy, fc.integer({ min: 0, max: 5000 }), (p, priorMs) => {
        expect(Downtime.commitAllowance([], { ...p, priorMs })).toEqual({ allowanceMs: priorMs, source: "prior", samples: 0 })
      }))
    })

    it("property: bounded by the fastest and slowest commit of the window, plus the margin", () => {
      fc.assert(fc.property(commits.filter((c) => c.length > 0), policy, (c, p) => {
        const recent = c.slice(-p.window)
        const a = Downtime.commitAllowance(c, p)
        expect(a.source).toBe("learned")
        expect(a.samples).toBe(recent.length)
        expect(a.allowanceMs).toBeGreaterThanOrEqual(Math.min(...recent) + p.marginMs)
        expect(a.allowanceMs).toBeLessThanOrEqual(Math.max(...recent) + p.marginMs)
      }))
    })

    it("property: monotone: a slower commit, a higher quantile or a larger margin never lowers it", () => {
      fc.assert(fc.property(commits.filter((c) => c.length > 0), policy, fc.nat(), fc.double({ min: 0, max: 5000, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), (c, p, at, more, dq) => {
        const base = Downtime.commitAllowance(c, p).allowanceMs
        const i = at % c.length
        const slower = c.map((ms, j) => (j === i ? ms + more : ms))
        expect(Downtime.commitAllowance(slower, p).allowanceMs).toBeGreaterThanOrEqual(base)
        expect(Downtime.commitAllowance(c, { ...p, quantile: Math.min(1, p.quantile + dq) }).allowanceMs).toBeGreaterThanOrEqual(base)
        expect(Downtime.commitAllowance(c, { ...p, marginMs: p.marginMs + 1 }).allowanceMs).toBeGreaterThan(base)
      }))
    })

    it("property: only the last window counts: older commits change nothing", () => {
      fc.assert(fc.property(commits, commits, policy, (older, c, p) => {
        fc.pre(c.length >= p.window)
        expect(Downtime.commitAllowance([...older, ...c], p)).toEqual(Downtime.commitAllowance(c, p))
      }))
    })
  })
  describe("the allowance that relearns (recent commits, pooled when a pair has too few)", () => {
    const H = Downtime.defaultRecencyPolicy.horizonMs
    const at = (atMs: number, ...commitsMs: number[]) => commitsMs.map((commitMs) => ({ commitMs, atMs }))
    const none = { pair: [], target: [], fleet: [] }

    it("two slow commits that aged out no longer count: the prior again, a refused pair relearns", () => {
      const slow = { ...none, pair: at(0, 900, 950) }
      expect(Downtime.recentAllowance(slow, H - 1)).toEqual({ allowanceMs: 950, source: "learned", samples: 2 })
      expect(Downtime.recentAllowance(slow, H)).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
    })

    it("a pair with too few recent commits learns from moves into its target, then from the fleet", () => {
      const now = 10 * H
      expect(Downtime.recentAllowance({ pair: [], target: at(now - 5, 60, 70, 80, 80, 80), fleet: at(now - 5, 300, 300, 300) }, now)).toEqual({ allowanceMs: 80, source: "target", samples: 5 })
      // Too few into the target (3 of the 5 a pool needs): the fleet's, which holds 6.
      expect(Downtime.recentAllowance({ pair: [], target: at(now - 5, 60, 70, 80), fleet: at(now - 5, 300, 300, 300) }, now)).toEqual({ allowanceMs: 300, source: "fleet", samples: 6 })
      // By default any own recent commit stands alone; with a higher bar a pair pools its few with its target's.
      expect(Downtime.recentAllowance({ pair: at(now - 1, 50), target: at(now - 5, 60, 70), fleet: at(now - 5, 300) }, now)).toEqual({ allowanceMs: 50, source: "learned", samples: 1 })
      expect(Downtime.recentAllowance({ pair: at(now - 1, 50), target: at(now - 5, 60, 70), fleet: at(now - 5, 300) }, now, { minSamples: 3, pooledMinSamples: 3 })).toEqual({ allowanceMs: 70, source: "target", samples: 3 })
      expect(Downtime.recentAllowance({ pair: at(now - 1, 50), target: at(now - 5, 60), fleet: at(now - 5, 300) }, now, { minSamples: 3, pooledMinSamples: 3 })).toEqual({ allowanceMs: 300, source: "fleet", samples: 3 })
      // No pool reaches the 5 it needs: the pair's own few, however few.
      expect(Downtime.recentAllowance({ pair: at(now - 1, 50), target: at(now - 5, 60), fleet: at(now - 5, 300) }, now, { minSamples: 3 })).toEqual({ allowanceMs: 50, source: "learned", samples: 1 })
      expect(Downtime.recentAllowance({ pair: [], target: at(now - H, 60, 70, 80), fleet: at(now - 5, 120) }, now, { pooledMinSamples: 1 })).toEqual({ allowanceMs: 120, source: "fleet", samples: 1 })
      // Pools that add nothing do not rename the source.
      expect(Downtime.recentAllowance({ ...none, pair: at(now, 42) }, now)).toEqual({ allowanceMs: 42, source: "learned", samples: 1 })
      expect(Downtime.recentAllowance({ ...none, target: at(now, 42) }, now, { priorMs: 250, pooledMinSamples: 1 })).toEqual({ allowanceMs: 42, source: "target", samples: 1 })
      expect(Downtime.recentAllowance(none, now, { priorMs: 250 })).toEqual({ allowanceMs: 250, source: "prior", samples: 0 })
    })

    it("one pooled commit, even a fast one, does not replace the prior: a pool needs `pooledMinSamples` (5)", () => {
      const now = 10 * H
      expect(Downtime.defaultRecencyPolicy.pooledMinSamples).toBe(5)
      expect(Downtime.recentAllowance({ pair: [], target: at(now - H, 60, 70, 80), fleet: at(now - 5, 120) }, now)).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
      expect(Downtime.recentAllowance({ ...none, target: at(now, 42) }, now, { priorMs: 250 })).toEqual({ allowanceMs: 250, source: "prior", samples: 0 })
      expect(Downtime.recentAllowance({ ...none, target: at(now, 1, 2), fleet: at(now, 3, 4) }, now)).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
      expect(Downtime.recentAllowance({ ...none, target: at(now, 1, 2), fleet: at(now, 3, 4, 5) }, now)).toEqual({ allowanceMs: 5, source: "fleet", samples: 5 })
    })

    it("a store's pairs split into the pair's own, its target's and the fleet's pools", () => {
      const pair = (sourceHostId: string, targetHostId: string, commitsMs: number[], recordedAtMs: number[]): Downtime.PairCommits => ({ sourceHostId, targetHostId, commitsMs, recordedAtMs, updatedAt: Math.max(0, ...recordedAtMs) })
      const pairs = [pair("a", "b", [900], [0]), pair("c", "b", [60, 70, 80], [100, 100, 100]), pair("b", "a", [20, 20, 20], [100, 100, 100])]
      const pooled = { pooledMinSamples: 3 }
      expect(Downtime.pairAllowance(pairs, "a", "b", H + 50, pooled)).toEqual({ allowanceMs: 80, source: "target", samples: 3 })
      expect(Downtime.pairAllowance(pairs, "a", "b", H + 50)).toEqual({ allowanceMs: 80, source: "fleet", samples: 6 })
      expect(Downtime.pairAllowance(pairs, "a", "b", 50)).toEqual({ allowanceMs: 900, source: "learned", samples: 1 })
      expect(Downtime.pairAllowance(pairs, "a", "b", 150, { minSamples: 2, ...pooled })).toEqual({ allowanceMs: 900, source: "target", samples: 4 })
      expect(Downtime.pairAllowance(pairs, "c", "a", H + 50, pooled)).toEqual({ allowanceMs: 20, source: "target", samples: 3 })
      expect(Downtime.pairAllowance(pairs, "x", "y", H + 50)).toEqual({ allowanceMs: 80, source: "fleet", samples: 6 })
      expect(Downtime.pairAllowance(pairs, "x", "y", H + 101)).toEqual({ allowanceMs: 400, source: "prior", samples: 0 })
    })

    it("a commit is kept with its time, the window of both", () => {
      let h: Pick<Downtime.PairCommits, "commitsMs" | "recordedAtMs"> = { commitsMs: [], recordedAtMs: [] }
      for (let i = 1; i <= 22; i++) h = Downtime.recordTimedCommit(h, i, 1000 + i)
      expect(h.commitsMs).toEqual(Array.from({ length: 20 }, (_, i) => i + 3))
      expect(h.recordedAtMs).toEqual(Array.from({ length: 20 }, (_, i) => 1003 + i))
      expect(Downtime.recordTimedCommit(h, Number.NaN, 5000)).toEqual(h)
      expect(h).toMatchObject({ updatedAt: 1022 })
      // Commits kept before their times were (an older store) count as recorded at the pair's last.
      expect(Downtime.samplesOf({ sourceHostId: "a", targetHostId: "b", commitsMs: [5, 6], recordedAtMs: [], updatedAt: 77 })).toEqual(at(77, 5, 6))
    })

    it("a commit is recorded no earlier than the pair's last, whatever the clock says: times never decrease, the last is `updatedAt`", () => {
      // Recorded at 5,000 and 5,001, then by a clock behind at 1,500: kept at 5,001.
      let h: Pick<Downtime.PairCommits, "commitsMs" | "recordedAtMs" | "updatedAt"> = { commitsMs: [], recordedAtMs: [], updatedAt: 0 }
      for (const [commitMs, atMs] of [[3000, 5000], [3000, 5001], [100, 1500]] as const) h = Downtime.recordTimedCommit(h, commitMs, atMs)
      expect(h).toStrictEqual({ commitsMs: [3000, 3000, 100], recordedAtMs: [5000, 5001, 5001], updatedAt: 5001 })
      expect(Downtime.recordTimedCommit(h, 7, 6000)).toStrictEqual({ commitsMs: [3000, 3000, 100, 7], recordedAtMs: [5000, 5001, 5001, 6000], updatedAt: 6000 })
      // Nor before the pair's `updatedAt` (its commits kept before their times were), nor any time it
      // keeps (a row written out of order before this rule): from then on its last is its latest.
      expect(Downtime.recordTimedCommit({ commitsMs: [5], recordedAtMs: [], updatedAt: 900 }, 6, 800)).toStrictEqual({ commitsMs: [5, 6], recordedAtMs: [900, 900], updatedAt: 900 })
      expect(Downtime.recordTimedCommit({ commitsMs: [5, 6], recordedAtMs: [5000, 1500], updatedAt: 1500 }, 7, 2000)).toStrictEqual({
        commitsMs: [5, 6, 7],
        recordedAtMs: [5000, 1500, 5000],
        updatedAt: 5000,
      })
      // A first commit takes the clock's time; one not kept changes nothing.
      expect(Downtime.recordTimedCommit({ commitsMs: [], recordedAtMs: [] }, 1, 42)).toStrictEqual({ commitsMs: [1], recordedAtMs: [42], updatedAt: 42 })
      expect(Downtime.recordTimedCommit(h, -1, 9000)).toStrictEqual(h)
    })

    const sample = (maxAt: number) => fc.record({ commitMs: fc.double({ min: 0, max: 10_000, noNaN: true }), atMs: fc.integer({ min: 0, max: maxAt }) })
    const samples = (maxAt: number) => fc.array(sample(maxAt), { maxLength: 30 })
    const recency = fc.record({
      window: fc.integer({ min: 1, max: 40 }),
      quantile: fc.double({ min: 0, max: 1, noNaN: true }),
      horizonMs: fc.integer({ min: 1, max: 10_000 }),
      minSamples: fc.integer({ min: 1, max: 10 }),
      pooledMinSamples: fc.integer({ min: 1, max: 10 }),
      priorMs: fc.integer({ min: 0, max: 5000 }),
    })

    it("property: with only commits no slower than the prior, the allowance never exceeds the prior", () => {
      fc.assert(fc.property(recency, samples(20_000), samples(20_000), samples(20_000), fc.integer({ min: 0, max: 20_000 }), (p, a, b, c, now) => {
        const fast = (xs: typeof a) => xs.map((x) => ({ ...x, commitMs: Math.min(x.commitMs, p.priorMs) }))
        expect(Downtime.recentAllowance({ pair: fast(a), target: fast(b), fleet: fast(c) }, now, p).allowanceMs).toBeLessThanOrEqual(p.priorMs)
      }))
    })

    it("property: an aged commit never counts, however slow", () => {
      fc.assert(fc.property(recency, samples(20_000), samples(20_000), samples(20_000), fc.integer({ min: 0, max: 20_000 }), fc.double({ min: 0, max: 1e6, noNaN: true }), (p, a, b, c, now, slowMs) => {
        const fresh = (xs: typeof a) => xs.filter((x) => now - x.atMs < p.horizonMs)
        const base = Downtime.recentAllowance({ pair: fresh(a), target: fresh(b), fleet: fresh(c) }, now, p)
        const aged = { commitMs: slowMs, atMs: now - p.horizonMs - 1 }
        const edge = { commitMs: slowMs, atMs: now - p.horizonMs }
        expect(Downtime.recentAllowance({ pair: [...a, aged, edge], target: [...b, aged], fleet: [...c, edge] }, now, p)).toEqual(Downtime.recentAllowance({ pair: a, target: b, fleet: c }, now, p))
        expect(Downtime.recentAllowance({ pair: a, target: b, fleet: c }, now, p)).toEqual(base)
      }))
    })

    it("property: enough recent commits of its own win over pooled ones", () => {
      fc.assert(fc.property(recency, samples(100), samples(100), samples(100), (p, own, b, c) => {
        const now = 100
        const recentOwn = own.filter((x) => now - x.atMs < p.horizonMs)
        fc.pre(recentOwn.length >= p.minSamples)
        const alone = Downtime.recentAllowance({ pair: own, target: [], fleet: [] }, now, p)
        expect(alone.source).toBe("learned")
        expect(Downtime.recentAllowance({ pair: own, target: b, fleet: c }, now, p)).toEqual(alone)
      }))
    })

    it("property: it is the prior exactly when the pair has no recent commit of its own and all pools together hold fewer than `pooledMinSamples`", () => {
      fc.assert(fc.property(recency, samples(20_000), samples(20_000), samples(20_000), fc.integer({ min: 0, max: 20_000 }), (p, a, b, c, now) => {
        const recent = (xs: typeof a) => xs.filter((x) => now - x.atMs < p.horizonMs).length
        const prior = recent(a) === 0 && recent(a) + recent(b) + recent(c) < p.pooledMinSamples
        const out = Downtime.recentAllowance({ pair: a, target: b, fleet: c }, now, p)
        expect(out.source === "prior").toBe(prior)
        if (prior) expect(out).toEqual({ allowanceMs: p.priorMs, source: "prior", samples: 0 })
      }))
    })

    it("property: pools too small to count change nothing: the pair's own alone (or the prior)", () => {
      fc.assert(fc.property(recency, samples(20_000), samples(20_000), samples(20_000), fc.integer({ min: 0, max: 20_000 }), (p, a, b, c, now) => {
        const recent = (xs: typeof a) => xs.filter((x) => now - x.atMs < p.horizonMs).length
        fc.pre(recent(a) + recent(b) + recent(c) < p.pooledMinSamples)
        const out = Downtime.recentAllowance({ pair: a, target: b, fleet: c }, now, p)
        expect(out).toEqual(Downtime.recentAllowance({ pair: a, target: [], fleet: [] }, now, p))
        expect(["prior", "learned"]).toContain(out.source)
      }))
    })

    // A fleet's pairs: each pair once, its commits recorded as a store records them (core's
    // `recordTimedCommit`) by clocks that may step back between them.
    const hostIds = ["a", "b", "c", "d", "e"]
    const fleetPairs = fc
      .uniqueArray(
        fc.record({
          sourceHostId: fc.constantFrom(...hostIds),
          targetHostId: fc.constantFrom(...hostIds),
          commits: fc.array(fc.record({ commitMs: fc.integer({ min: 0, max: 2000 }), atMs: fc.integer({ min: 0, max: 30 }) }), { minLength: 1, maxLength: 25 }),
        }),
        { selector: (p) => `${p.sourceHostId} ${p.targetHostId}`, maxLength: 20 },
      )
      .map((ps) =>
        ps
          .filter((p) => p.sourceHostId !== p.targetHostId)
          .map((p): Downtime.PairCommits => {
            const kept = p.commits.reduce<Pick<Downtime.PairCommits, "commitsMs" | "recordedAtMs" | "updatedAt">>(
              (h, c) => Downtime.recordTimedCommit(h, c.commitMs, c.atMs),
              { commitsMs: [], recordedAtMs: [], updatedAt: 0 },
            )
            return { sourceHostId: p.sourceHostId, targetHostId: p.targetHostId, ...kept }
          }),
      )
    const smallPools = fc.record({
      window: fc.integer({ min: 1, max: 8 }),
      quantile: fc.double({ min: 0, max: 1, noNaN: true }),
      horizonMs: fc.integer({ min: 1, max: 40 }),
      // Counts as configured, whole or not (a pool holds 1.5 when it holds 2).
      minSamples: fc.oneof(fc.integer({ min: 1, max: 6 }), fc.double({ min: 0, max: 6, noNaN: true })),
      pooledMinSamples: fc.oneof(fc.integer({ min: 1, max: 10 }), fc.double({ min: 0, max: 10, noNaN: true })),
      priorMs: fc.integer({ min: 0, max: 5000 }),
    })

    it("property: the allowances over a store's bounded answer (`allowanceCommits`, `poolLimit` of each group) are those over every pair", () => {
      fc.assert(
        fc.property(smallPools, fleetPairs, fc.constantFrom(...hostIds), fc.subarray(hostIds), fc.integer({ min: 0, max: 40 }), (p, pairs, sourceHostId, targets, now) => {
          const targetHostIds = targets.filter((t) => t !== sourceHostId)
          const recordedSince = now - p.horizonMs + 1
          const limit = Downtime.poolLimit(p)
          const bounded = Downtime.allowanceCommits(pairs, { sourceHostId, targetHostIds, recordedSince, limit })
          // What a store answered before: every pair with a recent commit, by source then target.
          const every = pairs.filter((q) => q.updatedAt >= recordedSince).sort((x, y) => (x.sourceHostId + " " + x.targetHostId < y.sourceHostId + " " + y.targetHostId ? -1 : 1))
          for (const t of targetHostIds) expect(Downtime.pairAllowance(bounded, sourceHostId, t, now, p)).toEqual(Downtime.pairAllowance(every, sourceHostId, t, now, p))
          expect(bounded.reduce((n, q) => n + q.commitsMs.length, 0)).toBeLessThanOrEqual(limit * (2 * targetHostIds.length + 1))
          // Only commits recorded since, each with its time, in its pair's order.
          for (const q of pairs) {
            expect([...q.recordedAtMs].sort((x, y) => x - y)).toStrictEqual(q.recordedAtMs)
            expect(q.updatedAt).toBe(q.recordedAtMs[q.recordedAtMs.length - 1])
          }
          for (const q of bounded) {
            expect(q.recordedAtMs.every((at) => at >= recordedSince)).toBe(true)
            expect([...q.recordedAtMs].sort((x, y) => x - y)).toStrictEqual(q.recordedAtMs)
          }
        }),
        { numRuns: 2000 },
      )
    })

    it("a pool is cut to its most recent commits, the policy's window and enough to count", () => {
      expect(Downtime.poolLimit()).toBe(20)
      expect(Downtime.poolLimit({ window: 5, pooledMinSamples: 8 })).toBe(8)
      expect(Downtime.poolLimit({ window: 5, minSamples: 12 })).toBe(12)
      // A fractional count is reached at the next whole one: a pool must hold that many to tell.
      expect(Downtime.poolLimit({ window: 1, minSamples: 1, pooledMinSamples: 1.5 })).toBe(2)
      expect(Downtime.poolLimit({ window: 1, minSamples: 2.2, pooledMinSamples: 1 })).toBe(3)
      const into = (sourceHostId: string, atMs: number): Downtime.PairCommits => ({ sourceHostId, targetHostId: "b", commitsMs: [100], recordedAtMs: [atMs], updatedAt: atMs })
      const fractional = { window: 1, minSamples: 1, pooledMinSamples: 1.5 }
      const two = [into("x", 10), into("y", 11)]
      const cut = Downtime.allowanceCommits(two, { sourceHostId: "a", targetHostIds: ["b"], recordedSince: 0, limit: Downtime.poolLimit(fractional) })
      expect(Downtime.pairAllowance(two, "a", "b", 20, fractional)).toMatchObject({ allowanceMs: 100, source: "target" })
      expect(Downtime.pairAllowance(cut, "a", "b", 20, fractional)).toMatchObject({ allowanceMs: 100, source: "target" })
      const pair = (sourceHostId: string, targetHostId: string, n: number, from: number): Downtime.PairCommits => {
        const recordedAtMs = Array.from({ length: n }, (_, i) => from + i)
        return { sourceHostId, targetHostId, commitsMs: recordedAtMs.map((at) => at * 10), recordedAtMs, updatedAt: from + n - 1 }
      }
      const out = Downtime.allowanceCommits([pair("x", "b", 4, 100), pair("a", "b", 4, 0), pair("c", "b", 4, 50), pair("c", "d", 4, 10), pair("d", "c", 1, 1)], {
        sourceHostId: "a",
        targetHostIds: ["b"],
        recordedSince: 2,
        limit: 3,
      })
      // a→b: its 3 most recent since 2 (2 of them); into b from others: x→b's 3 newest; elsewhere: c→d's 3 newest; d→c too old.
      expect(out.map((q) => [q.sourceHostId, q.targetHostId, q.recordedAtMs])).toStrictEqual([
        ["a", "b", [2, 3]],
        ["c", "d", [11, 12, 13]],
        ["x", "b", [101, 102, 103]],
      ])
      expect(out[0]?.commitsMs).toStrictEqual([20, 30])
    })
  })
})
