import { chmodSync, chownSync, mkdirSync, mkdtempSync, statSync, symlinkSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import * as ImageDir from "../src/ImageDir.js"

const uid = process.getuid?.()

describe("the default image directory", () => {
  it("is engram-images-<host> beside the state file: the same on every start", () => {
    expect(ImageDir.defaultImageDir("h3", "/var/lib/engram/agent.json")).toBe("/var/lib/engram/engram-images-h3")
    expect(ImageDir.defaultImageDir("h/3", "/var/lib/engram/agent.json")).toBe("/var/lib/engram/engram-images-h%2F3")
  })

  it("without a state file, a new directory of its own per start (agents of one host id on a machine never share images)", () => {
    const tmp = mkdtempSync(join(tmpdir(), "engram-imagedir-"))
    const first = Effect.runSync(ImageDir.resolve("h", undefined, undefined, tmp))
    const second = Effect.runSync(ImageDir.resolve("h", undefined, undefined, tmp))
    expect(first).not.toBe(second)
    for (const d of [first, second]) expect([d.startsWith(join(tmp, "engram-images-h-")), statSync(d).mode & 0o777]).toEqual([true, 0o700])
  })

  it("is created mode 0700; one of ours that others may read is narrowed to 0700", () => {
    const tmp = mkdtempSync(join(tmpdir(), "engram-imagedir-"))
    const state = join(tmp, "agent.json")
    const dir = Effect.runSync(ImageDir.resolve("h", undefined, state, tmp))
    expect([dir, statSync(dir).mode & 0o777]).toEqual([join(tmp, "engram-images-h"), 0o700])
    chmodSync(dir, 0o755)
    expect(Effect.runSync(ImageDir.resolve("h", undefined, state, tmp))).toBe(dir)
    expect(statSync(dir).mode & 0o777).toBe(0o700)
  })

  it("refuses the start, naming ENGRAM_AGENT_IMAGE_DIR, when the default beside the state file is a symbolic link or another user's", () => {
    const tmp = mkdtempSync(join(tmpdir(), "engram-imagedir-"))
    mkdirSync(join(tmp, "planted"))
    symlinkSync(join(tmp, "planted"), join(tmp, "engram-images-h"))
    const state = join(tmp, "agent.json")
    const linked = Effect.runSync(Effect.flip(ImageDir.resolve("h", undefined, state, tmp)))
    expect(linked.message).toBe(
      `invalid host agent configuration:\n  ENGRAM_AGENT_IMAGE_DIR: is unset and its default cannot be used: ${join(tmp, "engram-images-h")} is a symbolic link; set it to a directory of this agent's own`,
    )
    if (uid === 0) {
      mkdirSync(join(tmp, "engram-images-other"), { mode: 0o700 })
      chownSync(join(tmp, "engram-images-other"), 4242, 4242)
      const theirs = Effect.runSync(Effect.flip(ImageDir.resolve("other", undefined, state, tmp)))
      expect(theirs.message).toContain(`${join(tmp, "engram-images-other")} belongs to uid 4242, not to this agent's user (uid 0)`)
    }
    // The operator's own directory is taken as given.
    expect(Effect.runSync(ImageDir.resolve("h", join(tmp, "planted"), state, tmp))).toBe(join(tmp, "planted"))
  })
})
