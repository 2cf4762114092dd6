/**
 * The policy table's goal table as Markdown (`examples/table.ts`): its columns, and the baselines'
 * rows read back from a README's goal table (`--baseline-md FILE --baseline-table N`).
 *
 * A goal table is one whose header starts with `goalColumns` (workload, policy, queued, …,
 * warm ÷ best demand), the columns the rows are read by. Other tables of a README that share a
 * column name (the "60 s → 20 s" comparison, the "off → on" ones) are not goal tables: their
 * cells are other figures, and reading them gave no baselines at all.
 */
import type { Result } from "../src/Simulation.js"

/** The goal table's leading columns, in order: the rows are read by these. */
export const goalColumns = ["workload", "policy", "queued", "wait p99 s", "wait max s", "unplaceable", "warm", "warm ÷ best demand"] as const

/** The policies whose rows the goal reads from a baseline (its floor and its two references). */
export const baselinePolicies: readonly string[] = ["demand", "demand-fitting", "floor30"]

/** A workload's baseline rows: what the goal reads of each policy's result. */
export interface Stored {
  readonly workload: string
  readonly results: Omit<Result, "series">[]
}

const cellsOf = (line: string): string[] => line.split("|").map((c) => c.trim()).slice(1, -1)

/** Whether `line` is the header of a goal table: its cells start with `goalColumns`. */
export const isGoalHeader = (line: string): boolean => {
  const cells = cellsOf(line)
  return goalColumns.every((c, i) => cells[i] === c)
}

const figure = (cell: string): number => (cell.trim() === "" ? Number.NaN : Number(cell.replace(/,/g, "")))

/** One row's result, or undefined when it is not a usable baseline row (another policy, a cell that is not a figure). */
const rowOf = (line: string): { readonly workload: string; readonly result: Omit<Result, "series"> } | undefined => {
  const cells = cellsOf(line)
  if (cells.length < goalColumns.length) return undefined
  const [workload, policy, queued, p99, max, unplaceable, warm] = cells as [string, string, string, string, string, string, string]
  if (!baselinePolicies.includes(policy)) return undefined
  const figures = { queued: figure(queued), p99Ms: figure(p99) * 1000, maxMs: figure(max) * 1000, unplaceable: figure(unplaceable), warm: figure(warm) }
  if (!Object.values(figures).every(Number.isFinite)) return undefined
  const queueWait = { p50: 0, p95: 0, p99: figures.p99Ms, max: figures.maxMs, mean: 0 }
  const result = { policy, queued: figures.queued, queueWait, unplaceable: figures.unplaceable, warmResumes: figures.warm } as unknown as Omit<Result, "series">
  return { workload, result }
}

/**
 * The baselines' rows of the `table`-th goal table (1: the first) of a README: what the goal
 * reads of them. A README may hold several (today's costs, the stream timings), and only the
 * chosen one counts (`file` names the text in errors). Throws an error naming `--baseline-table` when `table` is not a positive
 * integer, when the text has no such goal table, or when that table has no usable row (one of
 * `baselinePolicies` with figures in its cells).
 */
export const fromMarkdown = (text: string, table: number, file = "the file"): Stored[] => {
  if (!Number.isSafeInteger(table) || table < 1) throw new Error(`--baseline-table ${table}: must be a whole number from 1 (the first goal table)`)
  const tables: string[][] = []
  let current: string[] | undefined
  for (const line of text.split("\n")) {
    if (!line.startsWith("|")) current = undefined
    else if (current !== undefined) current.push(line)
    else if (isGoalHeader(line)) tables.push((current = []))
  }
  const chosen = tables[table - 1]
  if (chosen === undefined) throw new Error(`--baseline-table ${table}: ${file} has ${tables.length} goal table(s) (a header starting "| ${goalColumns.join(" | ")} |")`)
  const out = new Map<string, Omit<Result, "series">[]>()
  for (const line of chosen) {
    const row = rowOf(line)
    if (row !== undefined) out.set(row.workload, [...(out.get(row.workload) ?? []), row.result])
  }
  if (out.size === 0) throw new Error(`--baseline-table ${table}: goal table ${table} of ${file} has no usable row (a ${baselinePolicies.join(", ")} row with figures in its cells)`)
  return [...out].map(([workload, results]) => ({ workload, results }))
}
