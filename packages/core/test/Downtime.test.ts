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
})
