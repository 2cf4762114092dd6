// The README's settings table states the range of every setting the code bounds, as the code
// bounds it: four rows gave none (an operator learned the range only from a refusal at start),
// and the reserve and overcommit rows gave no upper bound once core gained one. An open interval
// (a probability above one figure and below another) states both ends.
import { readFileSync } from "node:fs"
import { describe, expect, it } from "vitest"
import { Config } from "@engram/coordinator"

const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8")

/** The README's table row of a variable. */
const rowOf = (variable: string): string | undefined => readme.split("\n").find((l) => l.startsWith(`| \`${variable}\` |`))

/** The refusal of a value that is no number: it words the setting's range. */
const ruleOf = (variable: string): string => {
  const r = Config.parse({ [variable]: "x" })
  return r._tag === "Invalid" ? (r.issues.find((i) => i.variable === variable)?.rule ?? "") : ""
}

describe("the README's settings table", () => {
  it("states the range of every bounded setting and limit as the code bounds it (min–max, 0 or 1, >= min)", () => {
    const variables = [...Object.values(Config.settingVariables), ...Object.keys(Config.limitVariables)]
    const missing: string[] = []
    let bounded = 0
    for (const variable of variables) {
      const rule = ruleOf(variable)
      const range = /from (-?[0-9.]+) to (-?[0-9.]+)/.exec(rule)
      const least = /^must be an integer >= (-?[0-9]+)$/.exec(rule)
      // An open interval (`ENGRAM_RESERVE_SLOW_CLASS_QUANTILE`): both ends, as the rule words them.
      const open = /^must be a decimal number above ([0-9.]+) \(.*\) and below ([0-9.]+)$/.exec(rule)
      if (open !== null) {
        bounded++
        if (!((rowOf(variable) ?? "").includes(`above ${open[1]}`) && (rowOf(variable) ?? "").includes(`below ${open[2]}`))) missing.push(`${variable} (${rule})`)
        continue
      }
      if (range === null && least === null) continue
      bounded++
      const row = rowOf(variable) ?? ""
      const [min, max] = range === null ? [least?.[1], undefined] : [range[1], range[2]]
      const stated =
        max === undefined
          ? row.includes(`>= ${min}`)
          : row.includes(`${min}–${max}`) || row.includes(`from ${min} to ${max}`) || (min === "0" && max === "1" && row.includes("| 0 or 1"))
      if (!stated) missing.push(`${variable} (${rule})`)
    }
    expect(bounded).toBeGreaterThan(40)
    expect(missing).toEqual([])
  })
})
