/**
 * Fetching a descent image from a peer over real HTTP: from the image host's peer server (every
 * file of the session's directory, byte for byte, into place only when whole), and from a peer
 * whose listing lies about a size or a name (refused, nothing left behind).
 */
import { createServer } from "node:http"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Effect } from "effect"
import * as ImageFetch from "../src/ImageFetch.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { imageProof } from "../src/MoveToken.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"

const SECRET = "image-fetch-test-secret"

/** The image host `a`'s peer server over an image store holding session `s1`'s directory. */
const serveImages = Effect.gen(function* () {
  const images = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-a-")))
  const dir = join(images.root, "s1")
  mkdirSync(dir, { recursive: true })
  // A RAM file beside the image (as QEMU's), bigger than one chunk, and the descent tag.
  writeFileSync(join(dir, "image"), "the image")
  writeFileSync(join(dir, "ram"), Buffer.alloc(3 * 1024 * 1024 + 17, 7))
  writeFileSync(join(dir, "descent.json"), JSON.stringify({ createdAt: 1, lastActiveAt: 2 }))
  const runtime = yield* SimRuntime.make()
  const residents = yield* makeResidents("a", null, () => Effect.void)
  const target = yield* makeMoveTarget("a", runtime, residents)
  const port = yield* PeerServer.serve({ hostId: "a", secret: SECRET, target, status: Effect.succeed({}), images }, { port: 0, host: "127.0.0.1" })
  return { port, dir }
})

const fetchInto = (images: ImageStore.ImageStore, port: number, secret = SECRET) =>
  ImageFetch.fetchImage({ images, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${port}`, me: "b", secret, timeoutMs: 30_000 })

/** A peer answering every listing with `listing` and every file with `body`. */
const lyingPeer = (listing: unknown, body: string) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ port: number; close: () => void }>((resolve) => {
          const server = createServer((req, res) => {
            res.writeHead(200, { "content-type": req.url?.includes("/files/") ? "application/octet-stream" : "application/json" })
            res.end(req.url?.includes("/files/") ? body : JSON.stringify(listing))
          })
          server.listen(0, "127.0.0.1", () => {
            const a = server.address()
            resolve({ port: typeof a === "object" && a !== null ? a.port : 0, close: () => server.close() })
          })
        }),
    ),
    (s) => Effect.sync(() => s.close()),
  )

describe("fetching a descent image from its host", () => {
  it.live("a peer that cannot prove it holds the peer secret gets nothing taken from it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const files = [{ name: "image", bytes: 4 }]
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        for (const listing of [{ files }, { files, proof: imageProof("another-secret", "s1", "a", "b", files) }, { files, proof: imageProof(SECRET, "s1", "a", "c", files) }]) {
          const impostor = yield* lyingPeer(listing, "evil")
          const e = yield* fetchInto(mine, impostor.port).pipe(Effect.flip)
          assert.match(e.message, /proof|does not match|Expected|Missing/)
          assert.deepStrictEqual(readdirSync(mine.root), [])
        }
      }),
    ))


  it.live("every file of the session's directory arrives byte for byte, in place only when whole", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, dir } = yield* serveImages
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const got = yield* fetchInto(mine, port)
        assert.deepStrictEqual(got, { files: 3, bytes: 9 + 3 * 1024 * 1024 + 17 + JSON.stringify({ createdAt: 1, lastActiveAt: 2 }).length })
        for (const name of ["image", "ram", "descent.json"]) assert.isTrue(readFileSync(join(mine.root, "s1", name)).equals(readFileSync(join(dir, name))), name)
        assert.strictEqual((yield* mine.get("s1"))?.bytes, 9)
        assert.deepStrictEqual(yield* mine.readTag!("s1"), { createdAt: 1, lastActiveAt: 2 })
        assert.deepStrictEqual(readdirSync(mine.root), ["s1"])
      }),
    ))

  it.live("a wrong secret is refused by the image host (401), and nothing is left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, port, "another-secret").pipe(Effect.flip)
        assert.match(e.message, /answered 401/)
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.live("a file whose size is not its listing's, or a listed name with a separator, is refused and nothing is left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const listed = (files: { name: string; bytes: number }[]) => ({ files, proof: imageProof(SECRET, "s1", "a", "b", files) })
        const short = yield* lyingPeer(listed([{ name: "image", bytes: 100 }]), "only a few bytes")
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, short.port).pipe(Effect.flip)
        assert.strictEqual(e.message, "image is 16 bytes, the image host listed 100")
        assert.deepStrictEqual(readdirSync(mine.root), [])
        // A peer sending more than it listed is cut off at the listed size (no disk filled).
        const long = yield* lyingPeer(listed([{ name: "image", bytes: 4 }]), "x".repeat(1 << 20))
        const over = yield* fetchInto(mine, long.port).pipe(Effect.flip)
        assert.strictEqual(over.message, "image is longer than the 4 bytes the image host listed")
        assert.deepStrictEqual(readdirSync(mine.root), [])
        const sneaky = yield* lyingPeer(listed([{ name: "../escape", bytes: 4 }]), "evil")
        const bad = yield* fetchInto(mine, sneaky.port).pipe(Effect.flip)
        assert.match(bad.message, /bad file name/)
        assert.deepStrictEqual(readdirSync(mine.root), [])
        assert.isFalse(existsSync(join(mine.root, "escape")))
      }),
    ))
})
