// An unsupported Node.js is refused at once, in one line: the rule, every package's `engines`
// agreeing with it, and a real older Node (the system's /usr/bin/node, where it is older)
// stopping at the check before anything else runs.
import { spawnSync } from "node:child_process"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join, resolve } from "node:path"
import { describe, expect, it } from "vitest"
import { minimum, unsupported } from "../node-version.js"

const root = resolve(import.meta.dirname, "..", "..", "..")
const olderNode = "/usr/bin/node"
const olderVersion = existsSync(olderNode) ? spawnSync(olderNode, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.trim() : ""
const haveOlderNode = olderVersion !== "" && unsupported(olderVersion) !== null

describe("the Node.js engram needs", () => {
  it("refuses an older Node in one line naming the version needed, the version found and how to get it", () => {
    const line = unsupported("20.20.2")
    expect(line).not.toBeNull()
    expect(line).toContain(`Node.js ${minimum.major}.${minimum.minor} or newer`)
    expect(line).toContain("this is Node.js 20.20.2")
    expect(line).toContain(`nvm install ${minimum.major}`)
    expect(line).not.toContain("\n")
    expect(unsupported(`${minimum.major}.${minimum.minor - 1}.9`)).not.toBeNull()
  })

  it("accepts the minimum and anything newer", () => {
    expect(unsupported(`${minimum.major}.${minimum.minor}.0`)).toBeNull()
    expect(unsupported(`${minimum.major}.${minimum.minor + 3}.1`)).toBeNull()
    expect(unsupported(`${minimum.major + 1}.0.0`)).toBeNull()
    expect(unsupported()).toBeNull()
  })

  it("every package that states an engine states this one, and every published one states it", () => {
    const dirs = ["packages", "apps", "tooling"].flatMap((d) => readdirSync(join(root, d)).map((p) => join(root, d, p)))
    const manifests = [join(root, "package.json"), ...dirs.map((d) => join(d, "package.json")).filter(existsSync)]
    const wrong: string[] = []
    for (const file of manifests) {
      const m = JSON.parse(readFileSync(file, "utf8")) as { name?: string; private?: boolean; engines?: { node?: string } }
      const stated = m.engines?.node
      if (stated !== undefined ? stated !== `>=${minimum.major}.${minimum.minor}` : m.private !== true) wrong.push(`${m.name ?? file}: ${stated ?? "no engines.node"}`)
    }
    expect(wrong).toEqual([])
  })

  it.skipIf(!haveOlderNode)(`an older Node (${olderNode} ${olderVersion}) stops at the check with exit 1 and the one line, before the module that imports it runs`, () => {
    const r = spawnSync(olderNode, ["--input-type=module", "-e", `import ${JSON.stringify(join(import.meta.dirname, "..", "check-node.js"))}; console.log("ran on")`], { encoding: "utf8" })
    expect(r.status).toBe(1)
    expect(r.stdout).toBe("")
    expect(r.stderr.trim().split("\n")).toEqual([unsupported(olderVersion)!.replace(process.execPath, olderNode)])
  })
})
