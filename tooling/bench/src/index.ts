/**
 * The bench harness every package shares: time a function over repeated runs, print a row,
 * and append it to `.bench/results.jsonl` at the repo root so `pnpm bench` prints one table.
 * Figures are medians of several runs; ratios compare runs made side by side in one process.
 */
import { appendFileSync, mkdirSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

/** One reported figure. */
export interface Row {
  readonly bench: string
  readonly figure: string
  readonly value: number
  readonly unit: string
  /** A ratio against a baseline measured in the same run, when there is one. */
  readonly ratio?: number | undefined
  readonly baseline?: string | undefined
  readonly goal?: string | undefined
  /** What the run was set to, where it moves the figures (e.g. `{ coordinator: "dist" }`): kept in the row, shown beside the figure. */
  readonly settings?: Readonly<Record<string, string>> | undefined
}

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..")
/** Where rows are appended; the root `pnpm bench` reads and prints them. */
export const resultsFile = join(root, ".bench", "results.jsonl")

/** Median wall time in ms of `fn` over `runs` runs, after `warmup` unmeasured runs. */
export const timeMs = async (fn: () => unknown, runs = 7, warmup = 2): Promise<number> => {
  for (let i = 0; i < warmup; i++) await fn()
  const samples: number[] = []
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now()
    await fn()
    samples.push(performance.now() - t0)
  }
  samples.sort((a, b) => a - b)
  return samples[Math.floor(samples.length / 2)] as number
}

/** A row's settings as one would write them: `coordinator=dist`. */
export const settingsText = (settings: Readonly<Record<string, string>>): string =>
  Object.entries(settings)
    .map(([k, v]) => `${k}=${v}`)
    .join(" ")

/** Prints a row and records it for the combined table. */
export const report = (row: Row): void => {
  const ratio = row.ratio === undefined ? "" : `  ratio ${row.ratio.toFixed(2)}${row.baseline ? ` vs ${row.baseline}` : ""}`
  const goal = row.goal === undefined ? "" : `  (goal: ${row.goal})`
  const settings = row.settings === undefined ? "" : `  [${settingsText(row.settings)}]`
  const value = row.value >= 100 ? row.value.toFixed(0) : row.value.toPrecision(3)
  console.log(`${row.bench.padEnd(14)} ${row.figure.padEnd(52)} ${value.padStart(10)} ${row.unit}${ratio}${goal}${settings}`)
  mkdirSync(dirname(resultsFile), { recursive: true })
  appendFileSync(resultsFile, `${JSON.stringify({ ...row, at: new Date().toISOString() })}\n`)
}

export { buildForBench, coordinatorArgs, coordinatorMode, coordinatorToRun } from "./coordinator.js"
export type { CoordinatorMode } from "./coordinator.js"
