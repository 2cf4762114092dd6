/**
 * A descent image's hashing for its listing runs off the agent's event loop: the same hashes in
 * the same sidecar, the hashing stops when its image is no longer wanted, and no SHA-256 of the
 * image's bytes is computed on the main thread (its `node:crypto` is watched: a worker thread has
 * a `node:crypto` of its own), which meanwhile keeps running its scheduled work.
 */
import crypto from "node:crypto"
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { syncBuiltinESMExports } from "node:module"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { ImageStore } from "@engram/runtime"
import { Effect } from "effect"
import * as ImageFetch from "../src/ImageFetch.js"

const sha256 = (body: Buffer | string) => crypto.createHash("sha256").update(body).digest("hex")

/** An image store holding session `s1`'s descent: a RAM file of `ramMib` MiB, its image and tag. */
const descended = (ramMib: number) => {
  const images = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-hashing-")))
  const dir = join(images.root, "s1")
  mkdirSync(dir, { recursive: true })
  const ram = Buffer.alloc(ramMib * 1024 * 1024)
  for (let i = 0; i < ram.length; i += 4096) ram.writeUInt32LE(i, i)
  writeFileSync(join(dir, "ram"), ram)
  writeFileSync(join(dir, "image"), "the image")
  writeFileSync(join(dir, "descent.json"), JSON.stringify({ createdAt: 1, lastActiveAt: 2 }))
  return { images, dir }
}

/**
 * Runs `f` with the main thread's `node:crypto` watched: how many bytes its SHA-256 hashes were
 * given, here (a worker thread's `node:crypto` is its own, unwatched).
 */
const watchingMainThread = async <A>(f: () => Promise<A>): Promise<{ readonly result: A; readonly mainThreadBytes: number }> => {
  const original = crypto.createHash
  let mainThreadBytes = 0
  crypto.createHash = ((algorithm: string, options?: crypto.HashOptions) => {
    const h = original(algorithm, options)
    if (algorithm !== "sha256") return h
    const update = h.update.bind(h) as (data: crypto.BinaryLike, encoding?: crypto.Encoding) => crypto.Hash
    h.update = ((data: crypto.BinaryLike, encoding?: crypto.Encoding) => {
      mainThreadBytes += typeof data === "string" ? Buffer.byteLength(data) : data.byteLength
      return update(data, encoding)
    }) as typeof h.update
    return h
  }) as typeof crypto.createHash
  // The named import `createHash` of every ES module now reads the watched one.
  syncBuiltinESMExports()
  try {
    return { result: await f(), mainThreadBytes }
  } finally {
    crypto.createHash = original
    syncBuiltinESMExports()
  }
}

describe("a descent image is hashed off the agent's event loop", () => {
  it.live("the same hashes in the sidecar, and none of the image's bytes hashed on the main thread, which runs its scheduled work meanwhile", () =>
    Effect.gen(function* () {
      const { images, dir } = descended(64)
      const expected = Object.fromEntries(["descent.json", "image", "ram"].map((name) => [name, sha256(readFileSync(join(dir, name)))]))
      // Scheduled work of the main thread (heartbeats, polls, answers), counted while the image hashes.
      let ticks = 0
      let hashing = true
      const tick = (): void => {
        if (!hashing) return
        ticks++
        setImmediate(tick)
      }
      const { result, mainThreadBytes } = yield* Effect.promise(() =>
        watchingMainThread(() => {
          setImmediate(tick)
          return Effect.runPromise(ImageFetch.warmHashes(images, "s1")).finally(() => (hashing = false))
        }),
      )
      assert.deepStrictEqual(result, { files: 3, bytes: 64 * 1024 * 1024 + 9 + JSON.stringify({ createdAt: 1, lastActiveAt: 2 }).length, stopped: false })
      const kept = JSON.parse(readFileSync(join(dir, "~sha256.json"), "utf8")) as Record<string, { sha256: string }>
      assert.deepStrictEqual(Object.fromEntries(Object.entries(kept).map(([name, h]) => [name, h.sha256])), expected)
      assert.strictEqual(mainThreadBytes, 0, `the main thread hashed ${mainThreadBytes} bytes of the image`)
      assert.isAbove(ticks, 0)
      // The listing answers from the sidecar: nothing hashed again, anywhere.
      assert.deepStrictEqual((yield* ImageFetch.listing(images, "s1"))?.files.map((f) => f.sha256), [expected["descent.json"], expected["image"], expected["ram"]])
    }))

  it.live("a listing that finds a file not hashed hashes it off the main thread too, and a stopped hashing leaves the sidecar as it was", () =>
    Effect.gen(function* () {
      const { images, dir } = descended(8)
      let asked = 0
      const stopped = yield* Effect.promise(() => watchingMainThread(() => Effect.runPromise(ImageFetch.warmHashes(images, "s1", Effect.sync(() => ++asked <= 1)))))
      assert.deepStrictEqual(stopped.result, { files: 0, bytes: 0, stopped: true })
      assert.strictEqual(asked, 2)
      assert.throws(() => readFileSync(join(dir, "~sha256.json")))
      const listed = yield* Effect.promise(() => watchingMainThread(() => Effect.runPromise(ImageFetch.listing(images, "s1"))))
      assert.strictEqual(listed.mainThreadBytes, 0)
      assert.strictEqual(listed.result?.files.find((f) => f.name === "ram")?.sha256, sha256(readFileSync(join(dir, "ram"))))
    }))
})
