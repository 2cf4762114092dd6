// The policy table tool's baselines from a README (`examples/table.ts --baseline-md FILE
// --baseline-table N`): only goal tables count, and a table N that does not exist or has no
// usable row stops the run with an error naming the flag (in-process, and as a real process).
import { execFile } from "node:child_process"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { promisify } from "node:util"
import { describe, expect, it } from "vitest"
import * as GoalTable from "../examples/goal-table.js"

const pkg = join(import.meta.dirname, "..")
const readme = readFileSync(join(pkg, "README.md"), "utf8")
const workloads = (stored: GoalTable.Stored[]) => stored.map((s) => s.workload)

describe("the goal tables of a README", () => {
  it("--baseline-table 2 is the second goal table (the stream timings'), not the \"60 s → 20 s\" table between them", () => {
    const first = GoalTable.fromMarkdown(readme, 1, "README.md")
    const second = GoalTable.fromMarkdown(readme, 2, "README.md")
    for (const stored of [first, second]) {
      expect(workloads(stored)).toContain("50 per host")
      for (const s of stored) expect(s.results.map((r) => r.policy).sort()).toEqual(["demand", "demand-fitting", "floor30"])
    }
    // The stream table's own figures (its 50 per host demand row: 135 queued, 124 s max, 16382 warm).
    const demand = second.find((s) => s.workload === "50 per host")?.results.find((r) => r.policy === "demand")
    expect(demand).toMatchObject({ queued: 135, warmResumes: 16382, queueWait: { max: 124_000 } })
    expect(second).not.toEqual(first)
  })

  it("a table N that does not exist, one without usable rows, and an N that is not a table number: errors naming --baseline-table", () => {
    expect(() => GoalTable.fromMarkdown(readme, 3, "README.md")).toThrow(/^--baseline-table 3: README\.md has 2 goal table\(s\)/)
    expect(() => GoalTable.fromMarkdown(readme, 0, "README.md")).toThrow(/^--baseline-table 0: must be a whole number from 1/)
    expect(() => GoalTable.fromMarkdown(readme, Number("two"), "README.md")).toThrow(/^--baseline-table NaN: must be a whole number from 1/)
    const header = `| ${GoalTable.goalColumns.join(" | ")} | goal |`
    const onlyOthers = [header, "|---|---|---:|---:|---:|---:|---:|---:|---|", "| 50 per host | demand-reserve | 1 | 0.0 | 1.0 | 0 | 10 | 1.00 | ✓ |", "| 50 per host | demand | - | - | - | - | - | - | ✓ |"].join("\n")
    expect(() => GoalTable.fromMarkdown(onlyOthers, 1, "x.md")).toThrow(/^--baseline-table 1: goal table 1 of x\.md has no usable row/)
  })

  it("examples/table.ts stops with that error, before simulating anything", async () => {
    // The README up to its second goal table: the first goal table, then the "60 s → 20 s" one (no goal table).
    const dir = mkdtempSync(join(tmpdir(), "engram-goal-table-"))
    const file = join(dir, "one.md")
    const goalHeader = `| ${GoalTable.goalColumns.join(" | ")} |`
    const first = readme.indexOf(goalHeader)
    const second = readme.indexOf(goalHeader, first + 1)
    expect([first >= 0, second > first]).toEqual([true, true])
    const head = readme.slice(0, second)
    expect(head).toContain("| workload | wait p99 s 60 s → 20 s |")
    writeFileSync(file, head)
    // `--only` no workload: a run that got past the baselines would end at once, with no rows (exit 0).
    const args = ["--conditions=@engram/source", join(pkg, "examples", "table.ts"), "--baseline-md", file, "--baseline-table", "2", "--only", "no such workload", "--no-lp"]
    const run = promisify(execFile)(join(pkg, "node_modules", ".bin", "tsx"), args, {
      cwd: pkg,
      timeout: 120_000,
    })
    await expect(run).rejects.toMatchObject({ code: 1, stderr: expect.stringMatching(/--baseline-table 2: .*one\.md has 1 goal table\(s\)/) as unknown })
  })
})
