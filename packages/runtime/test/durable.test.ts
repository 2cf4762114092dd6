// Files kept across restarts and crashes (Durable): replaced whole, with their mode, nothing left
// beside them; a directory synced like a file. (What a sync buys, surviving a power cut, no test
// here can observe.)
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { Durable } from "../src/index.js"

describe("Durable", () => {
  it("replace writes the file whole over the one before, with its mode, and leaves no temporary beside it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-durable-"))
    const file = join(dir, "state.json")
    writeFileSync(file, "before")
    await Durable.replace(file, '{"after":true}', 0o600)
    expect(readFileSync(file, "utf8")).toBe('{"after":true}')
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(readdirSync(dir)).toEqual(["state.json"])
    await Durable.replace(join(dir, "new.json"), "fresh")
    expect(readdirSync(dir).sort()).toEqual(["new.json", "state.json"])
  })

  it("syncs a file and a directory; a path that is not there fails", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-durable-"))
    writeFileSync(join(dir, "f"), "x")
    await Durable.syncPath(join(dir, "f"))
    await Durable.syncDir(dir)
    await expect(Durable.syncDir(join(dir, "missing"))).rejects.toMatchObject({ code: "ENOENT" })
  })
})
