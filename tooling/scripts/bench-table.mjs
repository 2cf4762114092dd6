// Prints the rows every package's bench appended to .bench/results.jsonl as one table:
// the figure, its value, its ratio against the baseline measured beside it, its goal, and what
// the run was set to where that moves the figures (e.g. coordinator=dist).
import { existsSync, readFileSync } from "node:fs"

const file = new URL("../../.bench/results.jsonl", import.meta.url).pathname
if (!existsSync(file)) {
  console.log("bench: no results (did every bench fail?)")
  process.exit(1)
}
const rows = readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l))
const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3))
const settings = (s) => (s === undefined ? "" : Object.entries(s).map(([k, v]) => `${k}=${v}`).join(" "))
const lines = [["bench", "figure", "value", "ratio", "goal", "settings"]]
for (const r of rows)
  lines.push([r.bench, r.figure, `${fmt(r.value)} ${r.unit}`, r.ratio === undefined ? "" : `${r.ratio.toFixed(2)}${r.baseline ? ` vs ${r.baseline}` : ""}`, r.goal ?? "", settings(r.settings)])
const widths = lines[0].map((_, i) => Math.max(...lines.map((l) => l[i].length)))
console.log("")
for (const [i, l] of lines.entries()) {
  console.log(l.map((c, j) => (j === 2 ? c.padStart(widths[j]) : c.padEnd(widths[j]))).join("  ").trimEnd())
  if (i === 0) console.log(widths.map((w) => "-".repeat(w)).join("  "))
}
