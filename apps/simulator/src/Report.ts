/**
 * The report: one table row per policy, as plain text for the terminal and as Markdown for
 * the README. The columns are the figures SPEC §4.2 compares policies on.
 */
import type { Result } from "./Simulation.js"

const seconds = (ms: number): string => (ms / 1000).toFixed(ms >= 100_000 ? 0 : 1)

/** The columns of the table: a header and how each row fills it. */
const columns: readonly { readonly head: string; readonly cell: (r: Result) => string }[] = [
  { head: "policy", cell: (r) => r.policy },
  { head: "requests", cell: (r) => String(r.requests) },
  { head: "queued", cell: (r) => String(r.queued) },
  { head: "wait p50 s", cell: (r) => seconds(r.queueWait.p50) },
  { head: "wait p95 s", cell: (r) => seconds(r.queueWait.p95) },
  { head: "wait p99 s", cell: (r) => seconds(r.queueWait.p99) },
  { head: "wait max s", cell: (r) => seconds(r.queueWait.max) },
  { head: "warm", cell: (r) => String(r.warmResumes) },
  { head: "cold", cell: (r) => String(r.coldResumes) },
  { head: "resume p99 s", cell: (r) => seconds(r.resumeToRun.p99) },
  { head: "descents", cell: (r) => String(r.descents) },
  { head: "wasted", cell: (r) => String(r.wastedDescents) },
  { head: "RAM reserved %", cell: (r) => r.meanReservedPct.toFixed(1) },
  { head: "over-commits", cell: (r) => String(r.overCommits) },
]

/** The table as aligned text. */
export const text = (results: readonly Result[]): string => {
  const rows = [columns.map((c) => c.head), ...results.map((r) => columns.map((c) => c.cell(r)))]
  const widths = columns.map((_, j) => Math.max(...rows.map((row) => (row[j] as string).length)))
  return `${rows
    .map((row) => row.map((cell, j) => (j === 0 ? cell.padEnd(widths[j] as number) : cell.padStart(widths[j] as number))).join("  "))
    .join("\n")}\n`
}

/** The table as Markdown. */
export const markdown = (results: readonly Result[]): string => {
  const head = `| ${columns.map((c) => c.head).join(" | ")} |`
  const rule = `|${columns.map((_, j) => (j === 0 ? "---" : "---:")).join("|")}|`
  const body = results.map((r) => `| ${columns.map((c) => c.cell(r)).join(" | ")} |`)
  return `${[head, rule, ...body].join("\n")}\n`
}

/** What must hold in every run: lines naming each broken invariant (empty when all hold). */
export const invariantBreaks = (r: Result): string[] => {
  const out: string[] = []
  if (r.overCommits > 0) out.push(`${r.policy}: ${r.overCommits} over-commits (Σ reserved > capacity on a host)`)
  if (r.ledgerDrift > 0) out.push(`${r.policy}: the store's reserved sums differed from the simulator's ${r.ledgerDrift} times`)
  if (r.storeErrors > 0) out.push(`${r.policy}: ${r.storeErrors} store operations failed, first: ${r.firstStoreError ?? "?"}`)
  return out
}
