// Sums every package's vitest JSON report into one closing line, so a run of `pnpm test`
// ends with the totals of the whole monorepo: "tests: N passed, N failed, N skipped". Before it,
// the slowest tests of the run beside their timeouts (from each package's .vitest/timings.json),
// and every test that took more than a third of its timeout: on a busy 2-core machine such a test
// is the next random CI failure.
import { existsSync, readFileSync, readdirSync } from "node:fs"
import { join } from "node:path"

const root = new URL("../..", import.meta.url).pathname
const slowest = Number(process.env.ENGRAM_TEST_SLOWEST ?? 12)
let passed = 0
let failed = 0
let skipped = 0
const rows = []
const timings = []
/** The failed tests and files, with the head of their messages: the end of a CI log names them. */
const failures = []
const plain = (text) => String(text).replace(/\x1b\[[0-9;]*m/g, "")
const head = (text, lines) =>
  plain(text)
    .split("\n")
    .filter((l) => l.trim() !== "" && !/^\s+at .*node_modules/.test(l))
    .slice(0, lines)
    .map((l) => `      ${l.slice(0, 300)}`)
for (const group of ["packages", "apps", "tooling"]) {
  const dir = join(root, group)
  if (!existsSync(dir)) continue
  for (const name of readdirSync(dir)) {
    const pkg = `${group}/${name}`
    const file = join(dir, name, ".vitest", "results.json")
    if (!existsSync(file)) continue
    const r = JSON.parse(readFileSync(file, "utf8"))
    passed += r.numPassedTests
    failed += r.numFailedTests
    skipped += r.numPendingTests + r.numTodoTests
    rows.push(`  ${pkg.padEnd(34)} ${String(r.numPassedTests).padStart(5)} passed ${String(r.numFailedTests).padStart(3)} failed ${String(r.numPendingTests + r.numTodoTests).padStart(3)} skipped`)
    for (const f of r.testResults ?? []) {
      const file = f.name.startsWith(join(dir, name)) ? f.name.slice(join(dir, name).length + 1) : f.name
      const failedHere = (f.assertionResults ?? []).filter((a) => a.status === "failed")
      for (const a of failedHere) failures.push({ where: `${pkg} › ${file} › ${a.fullName}`, message: (a.failureMessages ?? []).join("\n") })
      // A file that failed with no failed test: its hooks or its import failed.
      if (f.status === "failed" && failedHere.length === 0) failures.push({ where: `${pkg} › ${file} (the file)`, message: f.message ?? "" })
    }
    const t = join(dir, name, ".vitest", "timings.json")
    if (existsSync(t)) for (const row of JSON.parse(readFileSync(t, "utf8"))) timings.push({ pkg, ...row })
  }
}
const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`
const line = (t) => `  ${seconds(t.durationMs).padStart(8)} of ${seconds(t.timeoutMs).padStart(7)} (${String(Math.round((100 * t.durationMs) / t.timeoutMs)).padStart(3)} %)  ${t.pkg} › ${t.file} › ${t.name}`
const ran = timings.filter((t) => t.state !== "skipped" && t.timeoutMs > 0)
if (ran.length > 0) {
  console.log(`slowest tests (duration of timeout):`)
  for (const t of [...ran].sort((a, b) => b.durationMs - a.durationMs).slice(0, slowest)) console.log(line(t))
  const near = ran.filter((t) => t.durationMs * 3 > t.timeoutMs).sort((a, b) => b.durationMs / b.timeoutMs - a.durationMs / a.timeoutMs)
  console.log(near.length === 0 ? "every test took at most a third of its timeout" : `${near.length} test(s) took more than a third of their timeout:`)
  for (const t of near) console.log(line(t))
}
if (failures.length > 0) {
  console.log(`failed (${failures.length}):`)
  for (const f of failures.slice(0, 12)) console.log(`  ${f.where}\n${head(f.message, 8).join("\n")}`)
  if (failures.length > 12) console.log(`  … and ${failures.length - 12} more`)
}
console.log(rows.join("\n"))
console.log(`tests: ${passed} passed, ${failed} failed, ${skipped} skipped`)
