// An image store's removal: the session's directory is moved aside in one rename, then deleted,
// so a removal cut short leaves no image without its tag (or tag without its image) for a
// restore to find, and its leftover is swept at the agent's next start.
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { ImageStore } from "../src/index.js"

const withImage = () => {
  const root = mkdtempSync(join(tmpdir(), "engram-imagestore-"))
  const store = ImageStore.directory(root)
  mkdirSync(join(root, "s1"))
  writeFileSync(store.pathFor("s1"), "image")
  writeFileSync(join(root, "s1", "descent.json"), JSON.stringify({ createdAt: 1, lastActiveAt: 2 }))
  return { root, store }
}

describe("ImageStore.directory's removal", () => {
  it("removes the session's directory whole, and an absent one without fault", async () => {
    const { root, store } = withImage()
    await Effect.runPromise(store.remove("s1"))
    expect(readdirSync(root)).toEqual([])
    expect(await Effect.runPromise(store.get("s1"))).toBeUndefined()
    await Effect.runPromise(store.remove("s1"))
  })

  it("a removal cut short after its move aside finds no image, and the sweep deletes its leftover", async () => {
    const { root, store } = withImage()
    // As the first step of a removal, the agent stopped before the delete.
    mkdirSync(join(root, "~removed-1-2-s0"))
    writeFileSync(join(root, "~removed-1-2-s0", "image"), "old")
    expect((await Effect.runPromise(store.list!)).map((i) => i.vmId)).toEqual(["s1"])
    expect(await Effect.runPromise(ImageStore.sweepRemoved(root))).toEqual(["~removed-1-2-s0"])
    expect(readdirSync(root)).toEqual(["s1"])
  })
})
