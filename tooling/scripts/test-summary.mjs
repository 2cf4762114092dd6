// Sums every package's vitest JSON report into one closing line, so a run of `pnpm test`
// ends with the totals of the whole monorepo: "tests: N passed, N failed, N skipped".
import { existsSync, readFileSync, readdirSync } from "node:fs"
import { join } from "node:path"

const root = new URL("../..", import.meta.url).pathname
let passed = 0
let failed = 0
let skipped = 0
const rows = []
for (const group of ["packages", "apps", "tooling"]) {
  const dir = join(root, group)
  if (!existsSync(dir)) continue
  for (const name of readdirSync(dir)) {
    const file = join(dir, name, ".vitest", "results.json")
    if (!existsSync(file)) continue
    const r = JSON.parse(readFileSync(file, "utf8"))
    passed += r.numPassedTests
    failed += r.numFailedTests
    skipped += r.numPendingTests + r.numTodoTests
    rows.push(`  ${`${group}/${name}`.padEnd(34)} ${String(r.numPassedTests).padStart(5)} passed ${String(r.numFailedTests).padStart(3)} failed ${String(r.numPendingTests + r.numTodoTests).padStart(3)} skipped`)
  }
}
console.log(rows.join("\n"))
console.log(`tests: ${passed} passed, ${failed} failed, ${skipped} skipped`)
