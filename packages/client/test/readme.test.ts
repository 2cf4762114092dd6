// The README's examples, run as written against a real coordinator: each ```ts block that
// starts with `// example: <name>` is written to a file and imported, with ENGRAM_URL and
// ENGRAM_TOKEN set as after `pnpm start`; what it prints is checked.
import type { RunningCoordinator } from "@engram/coordinator"
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest"
import { addHost, adminToken, start, uid } from "./support/Fleet.js"

const pkgDir = join(import.meta.dirname, "..")
const readme = readFileSync(join(pkgDir, "README.md"), "utf8")
const examples = new Map([...readme.matchAll(/```ts\n\/\/ example: ([^\n]+)\n([\s\S]*?)```/g)].map((m) => [m[1] ?? "", m[2] ?? ""]))
const dir = join(pkgDir, ".tmp", `readme-${process.pid}`)

let c: RunningCoordinator
const host = uid("readme-host")

beforeAll(async () => {
  c = await start()
  await addHost(c.url, host, 8192, 8)
  mkdirSync(dir, { recursive: true })
  process.env["ENGRAM_URL"] = c.url
  process.env["ENGRAM_TOKEN"] = adminToken
})
afterAll(async () => {
  delete process.env["ENGRAM_URL"]
  delete process.env["ENGRAM_TOKEN"]
  rmSync(dir, { recursive: true, force: true })
  await c?.stop()
})

/** Runs one example; answers the lines it printed. */
const run = async (name: string): Promise<string[]> => {
  const code = examples.get(name)
  if (code === undefined) throw new Error(`README has no example "${name}"`)
  const file = join(dir, `${name.replace(/\W+/g, "-")}.ts`)
  writeFileSync(file, code)
  const lines: string[] = []
  const spy = vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => void lines.push(args.map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(" ")))
  try {
    await import(pathToFileURL(file).href)
  } finally {
    spy.mockRestore()
  }
  return lines
}

describe("the README's examples", () => {
  it("lists every example this test runs", () => {
    expect([...examples.keys()].sort()).toEqual(["effect", "errors", "pages", "quick start"])
  })

  it("quick start: a session places, the fleet signal reads, the session ends", async () => {
    const lines = await run("quick start")
    expect(lines[0]).toBe(`placed on ${host}`)
    expect(lines[1]).toMatch(/^\d+ MiB free, 0 waiting$/)
    const sessions = await (await fetch(`${c.url}/v1/sessions?state=pending`, { headers: { authorization: `Bearer ${adminToken}` } })).json()
    expect(sessions).toEqual({ items: [], nextCursor: null })
  })

  it("errors: a NotFound and an InvalidInput, told apart with instanceof", async () => {
    const lines = await run("errors")
    expect(lines[0]).toBe("no session no-such-session")
    expect(lines[1]).toMatch(/^memMib \S.*/)
  })

  it("pages: one page, then every host", async () => {
    const lines = await run("pages")
    expect(lines[0]).toBe(`first page: ${host} (the last)`)
    expect(lines[1]).toBe(`${host}: 8192 MiB free`)
  })

  it("effect: the service, with catchTag", async () => {
    expect(await run("effect")).toEqual(['{"hosts":1,"missing":null}'])
  })
})
