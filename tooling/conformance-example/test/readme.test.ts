// The conformance guide (packages/store-conformance/README.md) shows this package's files: each
// TypeScript block that starts with `// <path>` must be that file here, word for word, so the
// guide an outsider pastes is the setup CI runs green. Its install commands name the packages
// this package depends on.
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"

const here = join(import.meta.dirname, "..")
const guide = readFileSync(join(here, "..", "..", "packages", "store-conformance", "README.md"), "utf8")
const blocks = [...guide.matchAll(/```ts\n\/\/ ([^\n]+)\n([\s\S]*?)```/g)].map((m) => ({ path: m[1] ?? "", body: m[2] ?? "" }))
const pkg = JSON.parse(readFileSync(join(here, "package.json"), "utf8")) as { dependencies: Record<string, string>; devDependencies: Record<string, string> }

describe("the conformance guide", () => {
  it("shows the runner file and the vitest config of this package, as they are", () => {
    expect(blocks.map((b) => b.path).sort()).toEqual(["test/conformance.test.ts", "vitest.config.ts"])
    for (const b of blocks) expect(readFileSync(join(here, b.path), "utf8"), b.path).toBe(b.body)
  })

  it("installs what this package depends on", () => {
    const installs = [...guide.matchAll(/^pnpm --filter my-store add (-D )?(.+)$/gm)].flatMap((m) => (m[2] ?? "").split(/\s+/).map((n) => [n.replace(/@workspace:\^$/, ""), m[1] !== undefined] as const))
    for (const [name, dev] of installs) {
      const declared = dev ? pkg.devDependencies[name] : pkg.dependencies[name]
      expect(declared, `${name} as a ${dev ? "dev " : ""}dependency`).toBeDefined()
    }
    expect(installs.map(([n]) => n).sort()).toEqual(["@effect/vitest", "@engram/store", "@engram/store-conformance", "effect", "vitest"])
  })
})
