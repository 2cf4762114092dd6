// The CLI's memory of replicas that hung (Hung.ts): remembered for a minute, then forgotten; a
// replica remembered is tried after the others; a missing or broken file is no memory.
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Hung from "../src/Hung.js"

const dir = mkdtempSync(join(tmpdir(), "engram-hung-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

describe("the memory of hung replicas", () => {
  it("orders a replica that hung within the minute last, and forgets it after", () => {
    const file = Hung.hungFile({ XDG_STATE_HOME: dir })
    expect(file).toBe(join(dir, "engram", "hung-replicas.json"))
    const urls = ["http://a", "http://b", "http://c"] as const
    expect(Hung.ordered(urls, Hung.recent(file, 1_000))).toEqual(urls)
    Hung.remember(file, "http://a", 1_000)
    Hung.remember(file, "http://b", 2_000)
    expect(Hung.ordered(urls, Hung.recent(file, 2_000))).toEqual(["http://c", "http://a", "http://b"])
    expect(Hung.ordered(urls, Hung.recent(file, 1_000 + Hung.rememberMs))).toEqual(["http://a", "http://c", "http://b"])
    expect(Hung.recent(file, 2_000 + Hung.rememberMs)).toEqual({})
    // A time ahead of now (a clock set back) is not trusted.
    expect(Hung.recent(file, 500)).toEqual({})
  })

  it("a file that is not the memory's is no memory", () => {
    const file = join(dir, "broken.json")
    writeFileSync(file, "{not json")
    expect(Hung.recent(file, 0)).toEqual({})
    writeFileSync(file, JSON.stringify({ "http://a": "yesterday" }))
    expect(Hung.recent(file, 0)).toEqual({})
  })

  it("the memory is the user's own: its file 0600, its directory 0700, no temporary left", () => {
    const file = Hung.hungFile({ XDG_STATE_HOME: join(dir, "own") })
    Hung.remember(file, "http://a", 1_000)
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(statSync(dirname(file)).mode & 0o777).toBe(0o700)
    expect(readdirSync(dirname(file))).toEqual(["hung-replicas.json"])
  })
})
