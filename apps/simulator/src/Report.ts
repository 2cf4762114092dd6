/**
 * The report: one table row per policy, as plain text for the terminal and as Markdown for
 * the README (the columns are the figures SPEC §4.2 compares policies on), the sessions that
 * waited longest, by name, and the figures per time window.
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
  { head: "unplaceable", cell: (r) => String(r.unplaceable) },
  { head: "warm", cell: (r) => String(r.warmResumes) },
  { head: "warm ÷ TTL bound", cell: (r) => (r.warmBoundTtl > 0 ? (r.warmResumes / r.warmBoundTtl).toFixed(2) : "-") },
  { head: "cold", cell: (r) => String(r.coldResumes) },
  { head: "resume p99 s", cell: (r) => seconds(r.resumeToRun.p99) },
  { head: "descents", cell: (r) => String(r.descents) },
  { head: "wasted", cell: (r) => String(r.wastedDescents) },
  { head: "yields d/r/s", cell: (r) => `${r.yields.demand}/${r.yields.reserve}/${r.yields.starving}` },
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

const pad = (rows: string[][]): string => {
  const widths = (rows[0] as string[]).map((_, j) => Math.max(...rows.map((row) => (row[j] as string).length)))
  return `${rows.map((row) => row.map((cell, j) => (j === 0 ? cell.padEnd(widths[j] as number) : cell.padStart(widths[j] as number))).join("  ")).join("\n")}\n`
}

const hm = (ms: number): string => {
  const m = Math.floor(ms / 60_000)
  return `${String(Math.floor(m / 60)).padStart(2, "0")}:${String(m % 60).padStart(2, "0")}`
}

/** The sessions that waited longest, per policy, by name. */
export const longestWaitsText = (results: readonly Result[], count = 5): string => {
  const out: string[] = []
  for (const r of results) {
    if (r.longestWaits.length === 0) continue
    const rows = [["  session", "size", "request", "at", "waited s", ""]]
    for (const w of r.longestWaits.slice(0, count))
      rows.push([`  ${w.sessionId}`, `${w.memMib} MiB/${w.vcpus}`, w.request, hm(w.requestAtMs), seconds(w.waitMs), w.stillQueued ? "still queued" : ""])
    out.push(`\nlongest waits under ${r.policy}${r.unplaceable > 0 ? ` (${r.unplaceable} unplaceable sessions left out)` : ""}:\n${pad(rows)}`)
  }
  return out.join("")
}

const gib = (mib: number): string => (mib >= 1024 ? `${+(mib / 1024).toFixed(1)} GiB` : `${mib} MiB`)

/** The queue waits per size class, one line per policy: the bound on waiting shows here (the biggest sessions wait longest). */
export const waitsBySizeText = (results: readonly Result[]): string => {
  const out: string[] = ["\nwait by size class (up to the largest budget; p99 / max s):\n"]
  for (const r of results)
    out.push(`  ${r.policy.padEnd(18)} ${r.waitsBySize.map((c) => `${gib(c.memMib)} ${seconds(c.p99Ms)} / ${seconds(c.maxMs)}`).join(" · ")}\n`)
  for (const r of results)
    if (r.moves > 0)
      out.push(`  ${r.policy.padEnd(18)} moves for starving sessions: ${r.moves} started, ${r.movesCommitted} committed (${gib(r.movedMib)}), downtime p99 / max ${seconds(r.moveDowntime.p99)} / ${seconds(r.moveDowntime.max)} s\n`)
  return out.join("")
}

/** The figures per time window, one table per policy. */
export const windowsText = (results: readonly Result[]): string =>
  results
    .map((r) => {
      const rows = [["  window", "requests", "queued", "wait p99 s", "wait max s", "warm", "cold", "warm %", "descents"]]
      for (const w of r.windows) {
        const resumes = w.warm + w.cold
        rows.push([
          `  ${hm(w.startMs)}`,
          String(w.requests),
          String(w.queued),
          seconds(w.waitP99Ms),
          seconds(w.waitMaxMs),
          String(w.warm),
          String(w.cold),
          resumes > 0 ? ((w.warm / resumes) * 100).toFixed(0) : "-",
          String(w.descents),
        ])
      }
      return `\n${r.policy}, per window:\n${pad(rows)}`
    })
    .join("")

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
