// What several test files share: a session's script, and the check of the figures per window.
import { expect } from "vitest"
import { Workload } from "../src/index.js"
import type { Simulation } from "../src/index.js"
import type { Script } from "../src/Workload.js"

/** A 1-vCPU session that arrives at `arriveAtMs` and runs for ever (unless `extra` says otherwise). */
export const session = (id: string, arriveAtMs: number, memMib: number, extra: Partial<Script> = {}): Script => ({
  id,
  arriveAtMs,
  budget: { memMib, vcpus: 1 },
  activeMs: [Workload.OPEN],
  idleMs: [],
  endAfterIdle: false,
  ...extra,
})

/** The windows of `r` start every `windowMs` from 0 over `count` windows and add up to its totals. */
export const expectWindowsAddUp = (r: Simulation.Result, windowMs: number, count: number): void => {
  expect(r.windows.map((x) => x.startMs)).toEqual(Array.from({ length: count }, (_, k) => k * windowMs))
  const sum = (f: (x: Simulation.WindowFigures) => number) => r.windows.reduce((a, x) => a + f(x), 0)
  expect(sum((x) => x.requests)).toBe(r.requests)
  expect(sum((x) => x.queued)).toBe(r.queued)
  expect(sum((x) => x.warm)).toBe(r.warmResumes)
  expect(sum((x) => x.cold)).toBe(r.coldResumes)
  expect(sum((x) => x.descents)).toBe(r.descents)
  expect(Math.max(...r.windows.map((x) => x.waitMaxMs))).toBe(r.queueWait.max)
}
