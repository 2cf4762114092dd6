/**
 * Stress workloads: named, seeded generators of the fleets that are hard for a park policy,
 * each with the fleet it is meant for. A policy is chosen on all of them (and on the README's
 * workloads), never on one. The same name, seed and session count always give the same
 * workload (`Workload.generate` with a config of plain data).
 */
import type { HostShape } from "./Simulation.js"
import * as Workload from "./Workload.js"
import type { GeneratorConfig, SizeClass } from "./Workload.js"

const GIB = 1024

/** A stress workload: its generator config for a seed, and the fleet it is meant for. */
export interface Scenario {
  readonly name: Name
  /** What it stresses, in a line. */
  readonly summary: string
  /** The fleet it is sized for (`--host` replaces it). */
  readonly shapes: readonly HostShape[]
  /** Sessions over the run when `--sessions` is not given. */
  readonly sessions: number
  /** The generator config for a seed and a session count. */
  readonly generator: (seed: number, sessions: number) => GeneratorConfig
}

/** The stress workloads by name. */
export type Name = "flash-crowd" | "diurnal-bimodal" | "big-bursts" | "shift" | "jitter"

const size = (gib: number, vcpus: number, weight: number): SizeClass => ({ memMib: gib * GIB, vcpus, weight })

/** Very big sessions for the bursts: 128–448 GiB, and a few of 768 GiB that no host can take (SPEC §12 `too_big`). */
const bigSizes: readonly SizeClass[] = [
  ...Workload.defaultGenerator.sizes,
  size(128, 32, 6),
  size(256, 64, 3),
  size(448, 112, 1),
  size(768, 192, 1),
]

/** The default mix, every size doubled but the largest (48 GiB: it still fits a 64 GiB host). */
const shiftedSizes: readonly SizeClass[] = [size(4, 2, 20), size(8, 4, 35), size(16, 8, 30), size(32, 8, 12), size(48, 12, 3)]

const base = (seed: number, sessions: number): GeneratorConfig => ({ ...Workload.defaultGenerator, seed, sessions })

/** Every stress workload, in the order tables list them. */
export const scenarios: readonly Scenario[] = [
  {
    name: "flash-crowd",
    summary: "the default day at 55 sessions per 64 GiB host, and a flash crowd at the 14:00 peak: 5× the arrival rate for 10 minutes",
    shapes: [{ count: 100, memMib: 64 * GIB, vcpus: 16 }],
    sessions: 5500,
    generator: (seed, sessions) => ({ ...base(seed, sessions), phases: [{ fromHour: 14, hours: 1 / 6, rateFactor: 5 }] }),
  },
  {
    name: "diurnal-bimodal",
    summary:
      "a strong daily cycle (amplitude 0.95) with heavy-tailed idle periods (Pareto from 2 min, shape 1.05) and bimodal sizes (70 % 2 GiB, 30 % 32 GiB), on 128 GiB hosts",
    shapes: [{ count: 100, memMib: 128 * GIB, vcpus: 32 }],
    sessions: 6000,
    generator: (seed, sessions) => ({
      ...base(seed, sessions),
      dailyAmplitude: 0.95,
      idleMinMin: 2,
      idleAlpha: 1.05,
      sizes: [size(2, 1, 70), size(32, 8, 30)],
    }),
  },
  {
    name: "big-bursts",
    summary:
      "a mixed fleet (60 × 64 GiB, 30 × 256 GiB, 10 × 512 GiB) with three 20-minute bursts (10:00, 15:00, 20:00) where one session in ten is very big (128–448 GiB; a few of 768 GiB fit no host)",
    shapes: [
      { count: 60, memMib: 64 * GIB, vcpus: 16 },
      { count: 30, memMib: 256 * GIB, vcpus: 64 },
      { count: 10, memMib: 512 * GIB, vcpus: 128 },
    ],
    sessions: 14_000,
    generator: (seed, sessions) => ({
      ...base(seed, sessions),
      phases: [10, 15, 20].map((fromHour) => ({ fromHour, hours: 1 / 3, rateFactor: 1, sizes: bigSizes })),
    }),
  },
  {
    name: "shift",
    summary: "an abrupt shift at 12:00: from then on 1.5× the arrival rate and every size doubled (4–48 GiB), on 64 GiB hosts",
    shapes: [{ count: 100, memMib: 64 * GIB, vcpus: 16 }],
    sessions: 4000,
    generator: (seed, sessions) => ({ ...base(seed, sessions), phases: [{ fromHour: 12, hours: 12, rateFactor: 1.5, sizes: shiftedSizes }] }),
  },
  {
    name: "jitter",
    summary: "the default day at 60 sessions per 64 GiB host, every size × (1 − U × 3 %): the same workload as without noise but slightly lighter",
    shapes: [{ count: 100, memMib: 64 * GIB, vcpus: 16 }],
    sessions: 6000,
    generator: (seed, sessions) => ({ ...base(seed, sessions), sizeJitterPct: 3 }),
  },
]

/** The stress workloads' names. */
export const names: readonly Name[] = scenarios.map((s) => s.name)

/** Whether `s` names a stress workload. */
export const isName = (s: string): s is Name => (names as readonly string[]).includes(s)

/** The stress workload of that name. */
export const byName = (name: Name): Scenario => scenarios.find((s) => s.name === name) as Scenario
