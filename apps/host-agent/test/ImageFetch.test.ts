/**
 * Fetching a descent image from a peer over real HTTP: from the image host's peer server (every
 * file of the session's directory, byte for byte, into place only when whole), from a peer
 * whose listing lies about a size or a name, and through a relay serving other contents of the
 * listed sizes (refused, nothing left behind); the image host refusing a bearer seen before or
 * past its window; the fetch's bound growing with the listed bytes.
 */
import { createHash } from "node:crypto"
import { createServer, get as httpGet, type IncomingHttpHeaders } from "node:http"
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs"
import { spawnSync } from "node:child_process"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Pid } from "@engram/process"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Clock, Effect, Exit, Logger, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as ImageFetch from "../src/ImageFetch.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import { imageBearerWindowMs, imageNonces, imageProof, imageToken, newImageBearer } from "../src/MoveToken.js"
import { startHostAgent } from "../src/Host.js"
import * as PeerServer from "../src/PeerServer.js"
import { makeResidents } from "../src/Residents.js"
import { floodingPeer } from "./support/Flood.js"

const SECRET = "image-fetch-test-secret"

/**
 * The image host `a`'s peer server over an image store holding session `s1`'s directory, its
 * clock the Effect `Clock`; it names its own URL in its listings unless `advertises` is false.
 */
const serveImages = (o: { readonly advertises?: boolean; readonly idleTimeoutMs?: number; readonly ramBytes?: number } = {}) => Effect.gen(function* () {
  const images = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-a-")))
  const dir = join(images.root, "s1")
  mkdirSync(dir, { recursive: true })
  // A RAM file beside the image (as QEMU's), bigger than one chunk, and the descent tag.
  writeFileSync(join(dir, "image"), "the image")
  writeFileSync(join(dir, "ram"), Buffer.alloc(3 * 1024 * 1024 + 17, 7))
  // A big RAM file, sparse (as a guest's that touched little): its hashing takes a while.
  if (o.ramBytes !== undefined) truncateSync(join(dir, "ram"), o.ramBytes)
  writeFileSync(join(dir, "descent.json"), JSON.stringify({ createdAt: 1, lastActiveAt: 2 }))
  const runtime = yield* SimRuntime.make()
  const residents = yield* makeResidents("a", null, () => Effect.void)
  const target = yield* makeMoveTarget("a", runtime, residents)
  // Its advertised URL is known once it listens (as an agent's).
  const advertised: { url: string | null } = { url: null }
  const port = yield* PeerServer.serve(
    { hostId: "a", secret: SECRET, target, status: Effect.succeed({}), images, peerUrl: Effect.sync(() => advertised.url), ...(o.idleTimeoutMs === undefined ? {} : { idleTimeoutMs: o.idleTimeoutMs }) },
    { port: 0, host: "127.0.0.1" },
  )
  if (o.advertises !== false) advertised.url = `http://127.0.0.1:${port}`
  return { port, dir }
})

/** A fetch of `s1` from `a` asked at `port` (the coordinator's URL for `a`, unless `trusted`: the operator's). */
const fetchInto = (images: ImageStore.ImageStore, port: number, secret = SECRET, trusted = false) =>
  ImageFetch.fetchImage({ images, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${port}`, peerUrlTrusted: trusted, me: "b", secret, minMibPerSec: 50, floorMs: 30_000 })

/** The nonce of a request's image bearer (`<issued at>.<nonce>.<mac>`). */
const nonceOf = (headers: IncomingHttpHeaders) => (headers.authorization ?? "").slice("Bearer ".length).split(".")[1] ?? ""

const sha256 = (body: string | Buffer) => createHash("sha256").update(body).digest("hex")

/** A listing as the image host `a` would prove it to `b` for the request of `nonce`, naming no peer URL (the fetches that take it say the asked URL is the operator's). */
const proven = (files: { name: string; bytes: number; sha256: string }[]) => (nonce: string) => ({ files, peerUrl: null, proof: imageProof(SECRET, "s1", "a", "b", nonce, null, files) })

/** A peer answering every listing with `listing` (given the request's nonce) and every file with `body` (null: two bytes, then nothing more). */
const lyingPeer = (listing: (nonce: string) => unknown, body: string | null) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ port: number; close: () => void }>((resolve) => {
          const server = createServer((req, res) => {
            res.writeHead(200, { "content-type": req.url?.includes("/files/") ? "application/octet-stream" : "application/json" })
            if (req.url?.includes("/files/") === true && body === null) res.write("ev")
            else res.end(req.url?.includes("/files/") ? body : JSON.stringify(listing(nonceOf(req.headers))))
          })
          server.listen(0, "127.0.0.1", () => {
            const a = server.address()
            resolve({ port: typeof a === "object" && a !== null ? a.port : 0, close: () => server.close() })
          })
        }),
    ),
    (s) => Effect.sync(() => s.close()),
  )

/**
 * A relay in front of the image host at `port` (an address a stolen host token could report):
 * it keeps every request's path and bearer, and answers with the image host's answer, or, with
 * `upstream` false, with a 503 (the bearer then unused). `swap` gives each file's bytes in place
 * of the real ones.
 */
const relay = (port: number, o: { readonly upstream?: boolean; readonly swap?: (name: string, real: Buffer) => Buffer; readonly listing?: (real: Record<string, unknown>, relayPort: number) => unknown } = {}) =>
  Effect.acquireRelease(
    Effect.promise(
      () =>
        new Promise<{ port: number; seen: { url: string; authorization: string }[]; close: () => void }>((resolve) => {
          const seen: { url: string; authorization: string }[] = []
          const server = createServer((req, res) => {
            const url = req.url ?? ""
            const authorization = req.headers.authorization ?? ""
            // The fetch's probe of the peer server carries no bearer: not among the requests seen.
            if (url !== "/v1/peer/status") seen.push({ url, authorization })
            if (o.upstream === false) return void res.writeHead(503).end()
            void fetch(`http://127.0.0.1:${port}${url}`, { headers: { authorization } }).then(async (up) => {
              const real = Buffer.from(await up.arrayBuffer())
              const name = /\/files\/([^?]+)/.exec(url)?.[1]
              res.writeHead(up.status, { "content-type": up.headers.get("content-type") ?? "application/octet-stream" })
              const listed = name === undefined && up.status === 200 && o.listing !== undefined
              const a = server.address()
              const relayPort = typeof a === "object" && a !== null ? a.port : 0
              res.end(
                name !== undefined && up.status === 200 && o.swap !== undefined
                  ? o.swap(decodeURIComponent(name), real)
                  : listed
                    ? JSON.stringify(o.listing!(JSON.parse(real.toString()) as Record<string, unknown>, relayPort))
                    : real,
              )
            })
          })
          server.listen(0, "127.0.0.1", () => {
            const a = server.address()
            resolve({ port: typeof a === "object" && a !== null ? a.port : 0, seen, close: () => server.close() })
          })
        }),
    ),
    (s) => Effect.sync(() => s.close()),
  )

/**
 * A peer that answers the fetch's probe of its peer server (401: no credential) and takes every
 * other request and never answers (an image host still hashing a large image for its first
 * listing); `frozen`: it answers nothing, the probe neither (its process stopped, its socket open).
 */
const silentPeer = (o: { readonly frozen?: boolean } = {}) => Effect.acquireRelease(
  Effect.promise(
    () =>
      new Promise<{ port: number; close: () => void }>((resolve) => {
        const server = createServer((req, res) => {
          if (o.frozen !== true && req.url === "/v1/peer/status") res.writeHead(401).end()
        })
        server.listen(0, "127.0.0.1", () => {
          const a = server.address()
          resolve({
            port: typeof a === "object" && a !== null ? a.port : 0,
            close: () => {
              server.closeAllConnections()
              server.close()
            },
          })
        })
      }),
  ),
  (s) => Effect.sync(() => s.close()),
)

/** `url` on the image host at `port` with `authorization`: its status and error message. */
const replay = (port: number, url: string, authorization: string) =>
  Effect.promise(async () => {
    const res = await fetch(`http://127.0.0.1:${port}${url}`, { headers: { authorization } })
    const body = Buffer.from(await res.arrayBuffer()).toString()
    return { status: res.status, message: res.status === 200 ? "" : (JSON.parse(body) as { message: string }).message }
  })

describe("fetching a descent image from its host", () => {
  it.live("a peer that cannot prove it holds the peer secret gets nothing taken from it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const files = [{ name: "image", bytes: 4, sha256: sha256("evil") }]
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        for (const listing of [
          () => ({ files }),
          (nonce: string) => ({ files, peerUrl: null, proof: imageProof("another-secret", "s1", "a", "b", nonce, null, files) }),
          (nonce: string) => ({ files, peerUrl: null, proof: imageProof(SECRET, "s1", "a", "c", nonce, null, files) }),
          // A listing proven for another request (an older one, replayed).
          () => ({ files, peerUrl: null, proof: imageProof(SECRET, "s1", "a", "b", "0".repeat(32), null, files) }),
        ]) {
          const impostor = yield* lyingPeer(listing, "evil")
          const e = yield* fetchInto(mine, impostor.port, SECRET, true).pipe(Effect.flip)
          assert.match(e.message, /proof|does not match|Expected|Missing/)
          assert.deepStrictEqual(readdirSync(mine.root), [])
        }
      }),
    ))


  it.live("every file of the session's directory arrives byte for byte, in place only when whole", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, dir } = yield* serveImages()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const got = yield* fetchInto(mine, port)
        assert.deepStrictEqual(got, { files: 3, bytes: 9 + 3 * 1024 * 1024 + 17 + JSON.stringify({ createdAt: 1, lastActiveAt: 2 }).length })
        for (const name of ["image", "ram", "descent.json"]) assert.isTrue(readFileSync(join(mine.root, "s1", name)).equals(readFileSync(join(dir, name))), name)
        assert.strictEqual((yield* mine.get("s1"))?.bytes, 9)
        assert.deepStrictEqual(yield* mine.readTag!("s1"), { createdAt: 1, lastActiveAt: 2 })
        assert.deepStrictEqual(readdirSync(mine.root), ["s1"])
        // The hashes came with the listing: this host lists what it fetched without hashing it again.
        assert.deepStrictEqual(readdirSync(join(mine.root, "s1")).sort(), ["descent.json", "image", "ram", "~sha256.json"])
        assert.deepStrictEqual(yield* ImageFetch.listing(mine, "s1"), yield* ImageFetch.listing(ImageStore.directory(join(dir, "..")), "s1"))
      }),
    ))

  it.live("a wrong secret is refused by the image host (401), and nothing is left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, port, "another-secret").pipe(Effect.flip)
        assert.strictEqual(e.message, "the image host answered 401 to the listing: invalid image token (an image host older than this agent, or a rotated peer secret?)")
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.effect("a bearer refused as expired (the two hosts' clocks apart by more than its window) says so: the image host's word, and the clocks to check", () =>
    Effect.scoped(
      Effect.gen(function* () {
        // The image host judges by the TestClock; this host's clock is ahead of it by more than the window.
        const { port } = yield* serveImages()
        const theirs = yield* Clock.Clock
        const aheadMs = imageBearerWindowMs + 60_000
        const nanos = () => theirs.currentTimeNanosUnsafe() + BigInt(aheadMs) * 1_000_000n
        const ahead: Clock.Clock = {
          currentTimeMillisUnsafe: () => theirs.currentTimeMillisUnsafe() + aheadMs,
          currentTimeMillis: Effect.sync(() => theirs.currentTimeMillisUnsafe() + aheadMs),
          currentTimeNanosUnsafe: nanos,
          currentTimeNanos: Effect.sync(nanos),
          monotonicTimeNanosUnsafe: () => theirs.monotonicTimeNanosUnsafe(),
          monotonicTimeNanos: Effect.sync(() => theirs.monotonicTimeNanosUnsafe()),
          sleep: (d) => theirs.sleep(d),
        }
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, port).pipe(Effect.provideService(Clock.Clock, ahead), Effect.flip)
        assert.strictEqual(
          e.message,
          "the image host answered 401 to the listing: image token expired (issued more than 15 minutes from this host's clock) (this host's clock and the image host's differ by more than that: check their time sync)",
        )
        assert.isUndefined(e.absent)
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it("a 401's message is quoted without control characters, cut to 200 characters; none (an older image host, a proxy) leaves the likely causes", () => {
    const body = (v: unknown) => new TextEncoder().encode(JSON.stringify(v))
    assert.strictEqual(ImageFetch.listingRefusal(body({ message: "bad\nline" })), "the image host answered 401 to the listing: bad line (an image host older than this agent, or a rotated peer secret?)")
    assert.strictEqual(ImageFetch.listingRefusal(body({ message: "x".repeat(500) })), `the image host answered 401 to the listing: ${"x".repeat(200)} (an image host older than this agent, or a rotated peer secret?)`)
    for (const b of [undefined, new TextEncoder().encode("<h1>401</h1>"), body({ error: "Unauthorized" })])
      assert.strictEqual(ImageFetch.listingRefusal(b), "the image host answered 401 to the listing (an image host older than this agent, or a rotated peer secret?)")
    assert.strictEqual(
      ImageFetch.listingRefusal(body({ message: "image token issued before this image host's agent started, and its record of the tokens used before is lost" })),
      "the image host answered 401 to the listing: image token issued before this image host's agent started, and its record of the tokens used before is lost (its agent restarted just now; a later try's bearer passes)",
    )
  })

  it.live("a file whose size is not its listing's, or a listed name with a separator, is refused and nothing is left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const short = yield* lyingPeer(proven([{ name: "image", bytes: 100, sha256: sha256("x") }]), "only a few bytes")
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, short.port, SECRET, true).pipe(Effect.flip)
        assert.strictEqual(e.message, "image is 16 bytes, the image host listed 100")
        assert.deepStrictEqual(readdirSync(mine.root), [])
        // A peer sending more than it listed is cut off at the listed size (no disk filled).
        const long = yield* lyingPeer(proven([{ name: "image", bytes: 4, sha256: sha256("x") }]), "x".repeat(1 << 20))
        const over = yield* fetchInto(mine, long.port, SECRET, true).pipe(Effect.flip)
        assert.strictEqual(over.message, "image is longer than the 4 bytes the image host listed")
        assert.deepStrictEqual(readdirSync(mine.root), [])
        const sneaky = yield* lyingPeer(proven([{ name: "../escape", bytes: 4, sha256: sha256("evil") }]), "evil")
        const bad = yield* fetchInto(mine, sneaky.port, SECRET, true).pipe(Effect.flip)
        assert.match(bad.message, /bad file name/)
        assert.deepStrictEqual(readdirSync(mine.root), [])
        assert.isFalse(existsSync(join(mine.root, "escape")))
        // A peer that stops sending mid-file is cut off after the stall bound.
        const stalled = yield* lyingPeer(proven([{ name: "image", bytes: 4, sha256: sha256("evil") }]), null)
        const stall = yield* ImageFetch.fetchImage({ images: mine, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${stalled.port}`, peerUrlTrusted: true, me: "b", secret: SECRET, minMibPerSec: 50, stallMs: 300 }).pipe(Effect.flip)
        assert.strictEqual(stall.message, "the image host sent no byte of image for 300 ms")
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.live("the listing's bound grows with the session's memory (the image host may hash its image first), nothing left behind when it passes", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const silent = yield* silentPeer()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        // 512 MiB at 1,024 MiB/s: 500 ms, past the 100 ms floor.
        const e = yield* ImageFetch.fetchImage({ images: mine, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${silent.port}`, me: "b", secret: SECRET, minMibPerSec: 1024, memMib: 512, floorMs: 100 }).pipe(Effect.flip)
        assert.strictEqual(e.message, "the image host did not answer the listing within 500 ms")
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.live("only the image host's own 404 says it has no such image (absent: the resume boots fresh); a 404 of another route, a 503, a refused connection say nothing of the image", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const fetchOf = (sessionId: string, peerUrl: string) => ImageFetch.fetchImage({ images: mine, sessionId, imageHostId: "a", peerUrl, peerUrlTrusted: true, me: "b", secret: SECRET, minMibPerSec: 50, floorMs: 30_000 }).pipe(Effect.flip)
        const none = yield* fetchOf("s2", `http://127.0.0.1:${port}`)
        assert.deepStrictEqual([none.message, none.absent], ["the image host has no descent image of session s2", true])
        // The same server at a wrong path: its JSON 404 names no image, so it is no word about one.
        const elsewhere = yield* fetchOf("s1", `http://127.0.0.1:${port}/elsewhere`)
        assert.deepStrictEqual([elsewhere.message, elsewhere.absent], ["the image host answered 404 to the listing", undefined])
        const failing = yield* relay(port, { upstream: false })
        const unavailable = yield* fetchOf("s1", `http://127.0.0.1:${failing.port}`)
        assert.deepStrictEqual([unavailable.message, unavailable.absent], ["the image host answered 503 to the listing", undefined])
        // A port nothing listens on any more: the connection is refused.
        const gone = yield* silentPeer()
        gone.close()
        const refused = yield* fetchOf("s1", `http://127.0.0.1:${gone.port}`)
        assert.isUndefined(refused.absent)
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.live("an image host that accepts the connection and answers nothing (frozen) fails the fetch after the probe's bound, not the listing's (minutes); nothing left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const frozen = yield* silentPeer({ frozen: true })
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        // The listing's own bound is the 10-minute floor here; the probe's 300 ms.
        const e = yield* ImageFetch.fetchImage({ images: mine, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${frozen.port}`, peerUrlTrusted: true, me: "b", secret: SECRET, minMibPerSec: 50, probeMs: 300 }).pipe(Effect.flip)
        assert.deepStrictEqual([e.message, e.absent], ["the image host's peer server did not answer a probe within 300 ms (frozen, or cut off?)", undefined])
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ), 60_000)

  it.live("a listing over listingMaxBytes fails naming the bound, the rest never read (the connection cut), though its proof is good; nothing left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const total = 64 * 1024 * 1024
        const peer = yield* Effect.acquireRelease(
          Effect.promise(() => floodingPeer((req) => proven([])(nonceOf(req.headers)), total)),
          (p) => Effect.sync(() => p.close()),
        )
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, peer.port, SECRET, true).pipe(Effect.flip)
        assert.strictEqual(e.message, `the image host's listing is over ${ImageFetch.listingMaxBytes} bytes (a real one lists a few files): not read further, nothing fetched`)
        const ended = yield* Effect.promise(() => peer.ended)
        assert.isFalse(ended.finished)
        assert.isBelow(ended.sentBytes, total)
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ), 120_000)

  it.live("a listing whose headers came and whose body stalls is cut after the stall bound, not held for the listing's (minutes), nothing left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const halting = yield* Effect.acquireRelease(
          Effect.promise(
            () =>
              new Promise<{ port: number; close: () => void }>((resolve) => {
                const server = createServer((_req, res) => {
                  res.writeHead(200, { "content-type": "application/json" })
                  res.write('{"files":[')
                })
                server.listen(0, "127.0.0.1", () => {
                  const a = server.address()
                  resolve({ port: typeof a === "object" && a !== null ? a.port : 0, close: () => (server.closeAllConnections(), server.close()) })
                })
              }),
          ),
          (p) => Effect.sync(() => p.close()),
        )
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        // The listing's own bound is the 10-minute floor here; the stall bound 300 ms.
        const e = yield* ImageFetch.fetchImage({ images: mine, sessionId: "s1", imageHostId: "a", peerUrl: `http://127.0.0.1:${halting.port}`, peerUrlTrusted: true, me: "b", secret: SECRET, minMibPerSec: 50, stallMs: 300 }).pipe(Effect.flip)
        assert.strictEqual(e.message, "the image host sent its listing's headers and no whole body within 300 ms")
        assert.deepStrictEqual(readdirSync(mine.root), [])
      }),
    ))

  it.live("a descent image hashed ahead (warmHashes) keeps each file's SHA-256 in its sidecar, and the listing answers from it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { dir } = yield* serveImages()
        const images = ImageStore.directory(join(dir, ".."))
        assert.isFalse(existsSync(join(dir, "~sha256.json")))
        assert.deepStrictEqual(yield* ImageFetch.warmHashes(images, "s1"), { files: 3, bytes: 9 + 3 * 1024 * 1024 + 17 + JSON.stringify({ createdAt: 1, lastActiveAt: 2 }).length, stopped: false })
        const kept = JSON.parse(readFileSync(join(dir, "~sha256.json"), "utf8")) as Record<string, { bytes: number; mtimeMs: number; sha256: string }>
        for (const name of ["descent.json", "image", "ram"]) assert.strictEqual(kept[name]?.sha256, sha256(readFileSync(join(dir, name))), name)
        // The listing reads the sidecar rather than the files: a hash put there (same size and time) is what it lists.
        writeFileSync(join(dir, "~sha256.json"), JSON.stringify({ ...kept, ram: { ...kept.ram!, sha256: "f".repeat(64) } }))
        assert.strictEqual((yield* ImageFetch.listing(images, "s1"))?.files.find((f) => f.name === "ram")?.sha256, "f".repeat(64))
        // A directory without an image: nothing hashed.
        assert.deepStrictEqual(yield* ImageFetch.warmHashes(images, "s2"), { files: 0, bytes: 0, stopped: false })
      }),
    ))

  it.live("a warm hashing asks before each file whether the image is still wanted here, and stops when it is not (the sidecar left as it was)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { dir } = yield* serveImages()
        const images = ImageStore.directory(join(dir, ".."))
        // Wanted for the first file only (the session restored, or its image removed, meanwhile).
        let asked = 0
        const goOn = Effect.sync(() => ++asked <= 1)
        assert.deepStrictEqual(yield* ImageFetch.warmHashes(images, "s1", goOn), { files: 0, bytes: 0, stopped: true })
        assert.strictEqual(asked, 2)
        assert.isFalse(existsSync(join(dir, "~sha256.json")))
        // Wanted throughout: asked once a file, every file hashed.
        asked = -10
        assert.strictEqual((yield* ImageFetch.warmHashes(images, "s1", goOn)).files, 3)
        assert.strictEqual(asked, -7)
        // Nothing left to hash: not asked.
        assert.isFalse((yield* ImageFetch.warmHashes(images, "s1", Effect.sync(() => false))).stopped)
      }),
    ))

  it.live("through a relay (the coordinator's URL for the image host), only the listing passes it: the files come from the image host's proven URL, and the listing's bearer opens no file", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        // A listing's bearer (captured, never used) opens no file: the relay cannot read the RAM with it.
        const sniffer = yield* relay(port, { upstream: false })
        assert.match((yield* fetchInto(mine, sniffer.port).pipe(Effect.flip)).message, /answered 503/)
        const listingBearer = sniffer.seen[0]!.authorization
        assert.deepStrictEqual(yield* replay(port, "/v1/peer/images/s1/files/ram?for=b", listingBearer), { status: 401, message: "invalid image token" })
        // The relay would swap the RAM's bytes for others of its size, as it would read them.
        const relayed = yield* relay(port, { swap: (name, real) => (name === "ram" ? Buffer.alloc(real.length, 8) : real) })
        assert.strictEqual((yield* fetchInto(mine, relayed.port)).files, 3)
        assert.isTrue(readFileSync(join(mine.root, "s1", "ram")).equals(Buffer.alloc(3 * 1024 * 1024 + 17, 7)))
        // The relay saw the listing's request, and no file's.
        assert.deepStrictEqual(relayed.seen.map((r) => r.url), ["/v1/peer/images/s1?for=b"])
        // A relay naming itself as the image host's URL breaks the proof.
        const rewriting = yield* relay(port, { listing: (real, relayPort) => ({ ...real, peerUrl: `http://127.0.0.1:${relayPort}` }) })
        const altered = yield* fetchInto(mine, rewriting.port).pipe(Effect.flip)
        assert.strictEqual(altered.message, "the image host's listing carries no valid proof that it holds the peer secret")
        assert.deepStrictEqual(rewriting.seen.map((r) => r.url), ["/v1/peer/images/s1?for=b"])
      }),
    ))

  it.live("an image host that names no URL of its own has its files fetched only from the operator's URL for it", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages({ advertises: false })
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, port).pipe(Effect.flip)
        assert.match(e.message, /^the image host names no peer URL of its own in its listing/)
        assert.deepStrictEqual(readdirSync(mine.root), [])
        assert.strictEqual((yield* fetchInto(mine, port, SECRET, true)).files, 3)
      }),
    ))

  it.live("through the operator's URL, a relay serving other contents of the listed sizes is refused, and nothing is left behind", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const relayed = yield* relay(port, { swap: (name, real) => (name === "ram" ? Buffer.alloc(real.length, 8) : real) })
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const e = yield* fetchInto(mine, relayed.port, SECRET, true).pipe(Effect.flip)
        assert.match(e.message, /^ram: content does not match the listing \(SHA-256 [0-9a-f]{64}, listed [0-9a-f]{64}\)$/)
        assert.deepStrictEqual(readdirSync(mine.root), [])
        // The same relay passing the real bytes: fetched.
        const honest = yield* relay(port)
        assert.strictEqual((yield* fetchInto(mine, honest.port, SECRET, true)).files, 3)
      }),
    ))

  it.live("a bearer seen once opens no second listing nor file", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const recorded = yield* relay(port)
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        assert.strictEqual((yield* fetchInto(mine, recorded.port, SECRET, true)).files, 3)
        const [list, ...files] = recorded.seen
        assert.deepStrictEqual([list?.url, files.length], ["/v1/peer/images/s1?for=b", 3])
        assert.deepStrictEqual(yield* replay(port, list!.url, list!.authorization), { status: 401, message: "image token already used" })
        assert.deepStrictEqual(yield* replay(port, files[0]!.url, files[0]!.authorization), { status: 401, message: "image token already used" })
        // Every request carried a bearer of its own.
        assert.strictEqual(new Set(recorded.seen.map((r) => r.authorization)).size, 4)
      }),
    ))

  it.effect("a bearer never used is refused once its window has passed on the image host's clock (the Effect Clock), either way", () =>
    Effect.scoped(
      Effect.gen(function* () {
        // The TestClock starts at the epoch: a server judging by the system's clock would refuse every bearer issued here.
        const { port } = yield* serveImages()
        // Bearers seen on their way (the relay answers 503: the image host never saw them).
        const sniffer = yield* relay(port, { upstream: false })
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        for (let i = 0; i < 2; i++) assert.match((yield* fetchInto(mine, sniffer.port).pipe(Effect.flip)).message, /answered 503/)
        const [inTime, late] = sniffer.seen
        // Within the window, such a bearer opens the listing.
        assert.strictEqual((yield* replay(port, inTime!.url, inTime!.authorization)).status, 200)
        // One issued further ahead of the image host's clock than the window.
        const nowMs = yield* Clock.currentTimeMillis
        const early = imageToken(SECRET, "s1", "a", "b", { _tag: "Listing" }, newImageBearer(nowMs + imageBearerWindowMs + 60_000))
        assert.deepStrictEqual(yield* replay(port, "/v1/peer/images/s1?for=b", `Bearer ${early}`), { status: 401, message: "image token expired (issued more than 15 minutes from this host's clock)" })
        yield* TestClock.adjust(imageBearerWindowMs + 60_000)
        assert.deepStrictEqual(yield* replay(port, late!.url, late!.authorization), { status: 401, message: "image token expired (issued more than 15 minutes from this host's clock)" })
      }),
    ))

  it.live("a file whose name starts with `~` (other than the hashes' sidecar) is listed and fetched like any other", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port, dir } = yield* serveImages()
        writeFileSync(join(dir, "~notes"), "kept by the runtime")
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const listed = yield* ImageFetch.listing(ImageStore.directory(join(dir, "..")), "s1")
        assert.deepStrictEqual(listed?.files.map((f) => f.name), ["descent.json", "image", "ram", "~notes"])
        assert.strictEqual((yield* fetchInto(mine, port)).files, 4)
        assert.strictEqual(readFileSync(join(mine.root, "s1", "~notes"), "utf8"), "kept by the runtime")
        // The sidecar and its temporaries stay unlisted.
        writeFileSync(join(dir, "~sha256.json.123.abc"), "{}")
        assert.deepStrictEqual((yield* ImageFetch.listing(ImageStore.directory(join(dir, "..")), "s1"))?.files.map((f) => f.name), ["descent.json", "image", "ram", "~notes"])
      }),
    ))
})

/** A pid no process has any more (a child that ran and exited: an agent killed mid-fetch). */
const deadPid = (): number => {
  const pid = spawnSync(process.execPath, ["-e", ""]).pid
  if (pid === undefined) throw new Error("no child process")
  return pid
}

/** A staging directory `name` under `root` holding `bytes` bytes of a partial file. */
const leftStaging = (root: string, name: string, bytes: number) => {
  mkdirSync(join(root, name))
  writeFileSync(join(root, name, "ram"), Buffer.alloc(bytes, 1))
  return name
}

describe("a fetch's staging left behind by a crash", () => {
  it.live("a fetch of the same image removes the staging of a fetch whose process is gone, never one a live process writes", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { port } = yield* serveImages()
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        const dead = leftStaging(mine.root, `~fetch-${deadPid()}-1-s1`, 4096)
        // Another agent on this machine (a live process) fetching the same session: its staging is its own.
        const live = leftStaging(mine.root, `~fetch-${process.ppid}-2-s1`, 10)
        // A crashed fetch of another session: this fetch leaves it (the start's sweep takes it).
        const other = leftStaging(mine.root, `~fetch-${deadPid()}-3-s2`, 100)
        // This process's own, no fetch of it writing it (the same pid after a restart in a container).
        const mineOld = leftStaging(mine.root, `~fetch-${process.pid}-4-s1`, 7)
        // Named as fetches name them now, with their process's start (Linux's /proc): the live
        // process as it runs keeps its own; the same pid with another start is a process that
        // ended and whose pid another now runs (a reboot, a restarted container): removed.
        const parentStart = Pid.startTicksOf(process.ppid)
        assert.match(parentStart ?? "", /^\d+$/)
        const liveNamed = leftStaging(mine.root, `~fetch-${process.ppid}.${parentStart}-5-s1`, 11)
        const reused = leftStaging(mine.root, `~fetch-${process.ppid}.${Number(parentStart) + 1}-6-s1`, 33)
        const logged: unknown[] = []
        const capture = Logger.make<unknown, void>(({ message }) => void logged.push(message))
        assert.strictEqual((yield* fetchInto(mine, port).pipe(Effect.provide(Logger.layer([capture])))).files, 3)
        assert.deepStrictEqual(readdirSync(mine.root).sort(), ["s1", live, liveNamed, other].sort())
        assert.deepInclude(logged.flat(), { sessionId: "s1", removed: [dead, mineOld, reused].sort(), bytes: 4096 + 7 + 33 })
        // The start's sweep (every session): the dead one of s2 goes, the live ones stay.
        assert.deepStrictEqual(yield* ImageFetch.sweepStaging(mine.root), [{ name: other, bytes: 100 }])
        assert.deepStrictEqual(readdirSync(mine.root).sort(), ["s1", live, liveNamed].sort())
      }),
    ))

  it.live("an agent starting removes the staging a killed agent left in its image directory, and says what and how many bytes", () =>
    Effect.gen(function* () {
      const imageDir = mkdtempSync(join(tmpdir(), "engram-imagefetch-start-"))
      const dead = leftStaging(imageDir, `~fetch-${deadPid()}-1-s1`, 5000)
      const live = leftStaging(imageDir, `~fetch-${process.ppid}-2-s1`, 10)
      mkdirSync(join(imageDir, "s2"))
      const logged: unknown[] = []
      const capture = Logger.make<unknown, void>(({ message }) => void logged.push(message))
      const scope = yield* Scope.make()
      yield* startHostAgent({
        hostId: "h",
        coordinator: { url: "http://127.0.0.1:9", hostToken: "t" },
        peerSecret: SECRET,
        peers: () => undefined,
        imageDir,
        measure: () => Effect.succeed({ totalMib: 1024, allocatableMib: 1024, totalVcpus: 1 }),
      }).pipe(Scope.provide(scope), Effect.provide(Logger.layer([capture])))
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(readdirSync(imageDir).sort(), [live, "s2"].sort())
      assert.deepInclude(logged.flat(), { hostId: "h", removed: [dead], bytes: 5000 })
    }))
})

/** The image host `a`'s peer server over `images`, its used nonces kept in `nonceFile`, in a scope of its own (closing it: the agent stopping). */
const imageHostOn = (images: ImageStore.ImageStore, nonceFile: string) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const runtime = yield* SimRuntime.make()
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const target = yield* makeMoveTarget("a", runtime, residents)
    const advertised: { url: string | null } = { url: null }
    const port = yield* PeerServer.serve({ hostId: "a", secret: SECRET, target, status: Effect.succeed({}), images, peerUrl: Effect.sync(() => advertised.url), nonceFile }, { port: 0, host: "127.0.0.1" }).pipe(Scope.provide(scope))
    advertised.url = `http://127.0.0.1:${port}`
    return { port, stop: Scope.close(scope, Exit.void) }
  })

describe("an image host's used bearers across its agent's restart", () => {
  it.live("a bearer used before the image host's agent restarted opens nothing after it (its nonce kept in the image directory)", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { dir } = yield* serveImages()
        const images = ImageStore.directory(join(dir, ".."))
        const nonceFile = join(images.root, "~image-nonces-a.json")
        const before = yield* imageHostOn(images, nonceFile)
        const recorded = yield* relay(before.port)
        const mine = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        assert.strictEqual((yield* fetchInto(mine, recorded.port, SECRET, true)).files, 3)
        const [list, ...files] = recorded.seen
        // The agent restarts: the same image directory, a new process (a new server, nothing in memory).
        yield* before.stop
        const after = yield* imageHostOn(images, nonceFile)
        assert.deepStrictEqual(yield* replay(after.port, list!.url, list!.authorization), { status: 401, message: "image token already used" })
        for (const f of files) assert.deepStrictEqual(yield* replay(after.port, f.url, f.authorization), { status: 401, message: "image token already used" })
        // New bearers are taken as before.
        const again = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-imagefetch-b-")))
        assert.strictEqual((yield* fetchInto(again, after.port)).files, 3)
        const kept = JSON.parse(readFileSync(nonceFile, "utf8")) as { version: number; nonces: Record<string, number> }
        assert.strictEqual(Object.keys(kept.nonces).length, 8)
        // The image store lists no session for it.
        assert.deepStrictEqual((yield* images.list!).map((i) => i.vmId), ["s1"])
        yield* after.stop
      }),
    ))

  it.live("without the record (no file, or one that cannot be read), a bearer issued before the start is refused, one issued since is taken", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { dir } = yield* serveImages()
        const images = ImageStore.directory(join(dir, ".."))
        const listing = (issuedAtMs: number) => `Bearer ${imageToken(SECRET, "s1", "a", "b", { _tag: "Listing" }, newImageBearer(issuedAtMs))}`
        for (const content of [undefined, "{ not json"]) {
          const nonceFile = join(mkdtempSync(join(tmpdir(), "engram-nonces-")), "~image-nonces-a.json")
          if (content !== undefined) writeFileSync(nonceFile, content)
          const issuedBefore = Date.now() - 1_000
          const host = yield* imageHostOn(images, nonceFile)
          assert.deepStrictEqual(yield* replay(host.port, "/v1/peer/images/s1?for=b", listing(issuedBefore)), {
            status: 401,
            message: "image token issued before this image host's agent started, and its record of the tokens used before is lost",
          })
          assert.strictEqual((yield* replay(host.port, "/v1/peer/images/s1?for=b", listing(Date.now() + 1))).status, 200)
          yield* host.stop
        }
        // A nonce that cannot be written (its directory a file): the request is refused, not served unrecorded.
        const notADir = join(mkdtempSync(join(tmpdir(), "engram-nonces-")), "a-file")
        writeFileSync(notADir, "")
        const unwritable = yield* imageHostOn(images, join(notADir, "~image-nonces-a.json"))
        assert.deepStrictEqual(yield* replay(unwritable.port, "/v1/peer/images/s1?for=b", listing(Date.now() + 1)), { status: 503, message: "this image host could not record the image token's use; try again" })
        yield* unwritable.stop

        // A nonce file that cannot be rewritten (a full disk; here its temporary's name taken by a
        // directory) but can be removed: the request is served and the file removed, so the next
        // start refuses the bearers issued before it, this one among them.
        const nonceFile = join(mkdtempSync(join(tmpdir(), "engram-nonces-")), "~image-nonces-a.json")
        const host = yield* imageHostOn(images, nonceFile)
        assert.strictEqual((yield* replay(host.port, "/v1/peer/images/s1?for=b", listing(Date.now() + 1))).status, 200)
        assert.isTrue(existsSync(nonceFile))
        mkdirSync(`${nonceFile}.tmp-${process.pid}`)
        const servedUnwritten = listing(Date.now() + 1)
        assert.strictEqual((yield* replay(host.port, "/v1/peer/images/s1?for=b", servedUnwritten)).status, 200)
        assert.isFalse(existsSync(nonceFile), "the file that no longer holds every nonce is removed")
        // Still once while this process lives.
        assert.deepStrictEqual(yield* replay(host.port, "/v1/peer/images/s1?for=b", servedUnwritten), { status: 401, message: "image token already used" })
        yield* host.stop
        rmSync(`${nonceFile}.tmp-${process.pid}`, { recursive: true })
        const restarted = yield* imageHostOn(images, nonceFile)
        assert.strictEqual((yield* replay(restarted.port, "/v1/peer/images/s1?for=b", servedUnwritten)).status, 401)
        yield* restarted.stop
      }),
    ))
})

describe("the bounds of an image fetch", () => {
  it("the fetch's bound is 10 minutes, or the listed bytes at the floor rate when longer", () => {
    const gib = 1024 * 1024 * 1024
    assert.strictEqual(ImageFetch.fetchBoundMs(0, 50), 600_000)
    assert.strictEqual(ImageFetch.fetchBoundMs(20 * gib, 50), 600_000)
    assert.strictEqual(ImageFetch.fetchBoundMs(100 * gib, 50), 2_048_000)
    assert.strictEqual(ImageFetch.fetchBoundMs(100 * gib, 100), 1_024_000)
    assert.strictEqual(ImageFetch.fetchBoundMs(200 * gib, 50), 4_096_000)
  })

  it("the listing's bound is 10 minutes, or the session's memory at the floor rate when longer", () => {
    assert.strictEqual(ImageFetch.listingBoundMs(512, 50), 600_000)
    assert.strictEqual(ImageFetch.listingBoundMs(20 * 1024, 50), 600_000)
    assert.strictEqual(ImageFetch.listingBoundMs(100 * 1024, 50), 2_048_000)
    assert.strictEqual(ImageFetch.listingBoundMs(100 * 1024, 170), 602_353)
    assert.strictEqual(ImageFetch.listingBoundMs(512, 1024, 100), 500)
  })

  it("the image host keeps a nonce only while its bearer's window lasts", () => {
    const nonces = imageNonces(1_000)
    const at = (issuedAtMs: number) => newImageBearer(issuedAtMs)
    const first = at(0)
    assert.strictEqual(nonces.admit(first, 0), "ok")
    assert.strictEqual(nonces.admit(first, 500), "replayed")
    assert.strictEqual(nonces.admit(at(0), 1_000), "ok")
    assert.strictEqual(nonces.size(), 2)
    // Their window ended at 1,000: refused by age, and no longer kept.
    assert.strictEqual(nonces.admit(at(0), 1_001), "expired")
    assert.strictEqual(nonces.size(), 0)
    // Issued further ahead of this clock than the window: refused too.
    assert.strictEqual(nonces.admit(at(2_002), 1_001), "expired")
    assert.strictEqual(nonces.admit(at(1_500), 1_500), "ok")
    assert.strictEqual(nonces.size(), 1)
    assert.strictEqual(nonces.admit(first, 1_500), "expired")
  })
})

describe("the image host's idle connections", () => {
  it.live("a fetcher that stops reading a file is cut after the idle timeout; a listing that waits for a long hashing is not", () =>
    Effect.scoped(
      Effect.gen(function* () {
        // 1 GiB of RAM file, sparse: its first listing hashes it (seconds) before it answers.
        const { port } = yield* serveImages({ idleTimeoutMs: 300, ramBytes: 1024 ** 3 })
        const listing = `Bearer ${imageToken(SECRET, "s1", "a", "b", { _tag: "Listing" }, newImageBearer(Date.now()))}`
        assert.strictEqual((yield* replay(port, "/v1/peer/images/s1?for=b", listing)).status, 200)
        // A reader that takes the headers and then reads nothing for 3 s (frozen): the host's
        // writes stop, the connection goes idle and the host closes it. Read again, it ends
        // short of the file (what the kernels had buffered), where it would go on to the end.
        const file = `Bearer ${imageToken(SECRET, "s1", "a", "b", { _tag: "File", name: "ram" }, newImageBearer(Date.now()))}`
        const got = yield* Effect.promise(
          () =>
            new Promise<{ status: number | undefined; bytes: number; length: number }>((resolve) => {
              httpGet({ host: "127.0.0.1", port, path: "/v1/peer/images/s1/files/ram?for=b", headers: { authorization: file } }, (res) => {
                let bytes = 0
                const done = () => resolve({ status: res.statusCode, bytes, length: Number(res.headers["content-length"]) })
                res.pause()
                res.on("data", (chunk: Buffer) => void (bytes += chunk.length))
                res.on("error", done)
                res.on("aborted", done)
                res.on("end", done)
                setTimeout(() => res.resume(), 3000)
              }).on("error", () => resolve({ status: undefined, bytes: 0, length: 0 }))
            }),
        )
        assert.strictEqual(got.status, 200)
        assert.strictEqual(got.length, 1024 ** 3)
        assert.isBelow(got.bytes, got.length, "the host closed the idle connection before the whole file")
      }),
    ))
})
