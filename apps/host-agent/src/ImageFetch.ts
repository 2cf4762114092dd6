/**
 * Descent images between agents. A cold resume is placed on the host holding the session's image
 * when that host has room (the coordinator's ranking); when it has not, the session lands on
 * another host, whose agent fetches the image from the image host's peer server before it
 * restores, instead of booting a fresh guest.
 *
 * The image host serves what its image store keeps for the session: every regular file of the
 * session's directory (the image, the runtime's files beside it, the descent tag), each with its
 * size and the SHA-256 of its contents. The hashes are computed once per file (streamed: images
 * are GiBs; about 544 MiB/s measured niced on a busy 2-core machine, some 3 minutes for 100 GiB)
 * and kept in a sidecar in the directory (`~sha256.json`, never listed nor served) keyed by each
 * file's size and modification time, so a changed file is hashed again. The agent computes them
 * in the background as soon as a descent has written its image and tag (`warmHashes`, the
 * listing's own hashing), so a listing finds the sidecar fresh and answers at once; one that
 * comes while the image is still being hashed waits for that hashing (one hashing of a directory
 * at a time in the process) and answers from the sidecar; one that finds a file not hashed (an
 * older agent's descent, a hashing a restart cut) hashes it then. Files are hashed on a worker
 * thread (`makeHasher`), off the agent's event loop. A fetch writes the sidecar of
 * what it brought, so a host that fetched an image lists it without hashing it again.
 *
 * A fetch reads the list (`GET /v1/peer/images/{session}?for={host}`), streams each file
 * (`…/files/{name}`) into a new directory beside the image store's, hashing it as it streams
 * and stopping it at its listed size, checks each size and hash against the list, and only then
 * moves the directory into place: a failed or partial fetch leaves nothing a restore could take.
 * Every request carries its own bearer (`MoveToken.imageToken`: the session, both hosts, what it
 * opens — the listing or one file by name —, an issue time and a random nonce), which the image
 * host takes once, within `MoveToken.imageBearerWindowMs` of its issue (`ImageNonceFile`: kept across restarts);
 * the listing carries the image host's own peer URL and its `MoveToken.imageProof` (the files
 * with their hashes, that URL, both hosts and the listing request's nonce), checked in constant
 * time before anything is fetched, and the files are fetched from that URL (or from the
 * operator's `ENGRAM_PEERS` entry for the image host), not from the coordinator's. So an address
 * that relays a real agent's listing cannot serve other contents, nor replay an older listing,
 * nor read the files (they do not pass it, and the listing's bearer opens none), and a bearer
 * seen once opens nothing later. An image host older than this answers its bearer with 401
 * before listing (its bearers differ); a listing without hashes is refused too.
 *
 * A failed fetch says whether the image host answered that it holds no such image (`absent`: its
 * listing's own 404, `noImageMessage`; the resume then boots fresh) or anything else (the host
 * frozen, unreachable, failing, a bound passed, a check failed: the agent tries again later, up
 * to its deadline, `Agent`'s `imageFetchDeadlineMs`). A fetch first probes the image host's peer
 * server (`imageHostProbeMs`, no credential, any answer), so a host frozen with its socket open
 * fails a try in seconds rather than at the listing's bound.
 *
 * A fetch's listing is bounded by `listingBoundMs` (the floor `imageFetchFloorMs`, or the
 * session's memory at the floor rate `ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS`, whichever is longer:
 * the image host may hash the image before it answers) and in bytes by `listingMaxBytes` (read
 * no further: its proof is judged only after), its files by `fetchBoundMs` (the floor,
 * or the listed bytes at the floor rate, whichever is longer), and each file by a stall bound
 * (`imageFetchStallMs` without a byte). Whether the image
 * is of the session's last descent is judged after the fetch by the same tag check as a local
 * image (`Agent.ts`).
 */
import { Pid } from "@engram/process"
import { createHash } from "node:crypto"
import { createReadStream, createWriteStream } from "node:fs"
import { lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Readable, Transform } from "node:stream"
import { Worker } from "node:worker_threads"
import { pipeline } from "node:stream/promises"
import type { ReadableStream as NodeReadableStream } from "node:stream/web"
import type { ImageStore } from "@engram/runtime"
import { Clock, Data, Effect, Schema, Stream } from "effect"
import { Agent, fetch } from "undici"
import { webBodyAtMost } from "./BoundedRead.js"
import { imageProof, type ImageRoute, imageToken, newImageBearer, tokensEqual } from "./MoveToken.js"

/** One file of a session's image directory, as the image host lists it: its SHA-256 in hex. */
export const ImageFile = Schema.Struct({ name: Schema.String, bytes: Schema.Number, sha256: Schema.String })
export type ImageFile = typeof ImageFile.Type

/** The files of a session's image directory. */
export interface ImageListing {
  readonly files: readonly ImageFile[]
}

/**
 * The image host's answer to a listing: the files, and its proof that it holds the peer secret
 * (`MoveToken.imageProof`). Decoded with each hash optional, so a listing without them (an older
 * image host) is refused by name rather than as a shape.
 */
export const ListingAnswer = Schema.Struct({
  files: Schema.Array(Schema.Struct({ name: Schema.String, bytes: Schema.Number, sha256: Schema.optional(Schema.String) })),
  /** The image host's own peer URL (what its agent advertises), where the files are fetched; null: none. */
  peerUrl: Schema.optional(Schema.NullOr(Schema.String)),
  proof: Schema.String,
})

/**
 * Why an image could not be fetched. `absent`: the image host answered that it holds no image of
 * the session (its listing's own 404, `noImageMessage`): the resume boots fresh. Any other
 * failure says nothing about the image (the host frozen, unreachable, failing, a bound passed):
 * the agent tries again later (`Agent`'s `imageFetchDeadlineMs`).
 */
export class ImageFetchError extends Data.TaggedError("ImageFetchError")<{
  readonly sessionId: string
  readonly imageHostId: string
  readonly message: string
  readonly absent?: boolean
}> {}

/** The message of the image host's 404 for a session it holds no image of (`PeerServer`): what a fetch takes for its word. */
export const noImageMessage = (sessionId: string): string => `no descent image of session ${sessionId} here`

/** The most bytes of a listing's 404 a fetch reads to tell the image host's word from another 404, or of its 401 to say why (a few dozen). */
const noImageMaxBytes = 4 * 1024

/**
 * Whether a listing's 404 body is the image host's own word that it holds no image of
 * `sessionId` (its JSON `NotFound` naming the session), not a 404 of anything else at that
 * address (a wrong URL, a proxy, an unknown route).
 */
const saysNoImage = (body: Uint8Array | undefined, sessionId: string): boolean => {
  if (body === undefined) return false
  try {
    const v = JSON.parse(new TextDecoder().decode(body)) as { readonly error?: unknown; readonly message?: unknown }
    return v.error === "NotFound" && v.message === noImageMessage(sessionId)
  } catch {
    return false
  }
}

/** The most characters of an image host's refusal (its 401's message) a fetch's error quotes. */
const refusalMaxChars = 200

/**
 * Why the image host refused a listing with 401, as the fetch's error says it: the image host's
 * own message (its JSON `message`, control characters dropped, at most `refusalMaxChars`), then
 * what is likely behind it. Each try sends a fresh bearer, so a refusal of one issued before the
 * image host's agent started passes on a later try; the others need the operator (the peer
 * secret, an upgrade, the clocks), who may mend them before the fetch's deadline, so none fails
 * the fetch for good. Before, every 401 read `an image host older than this agent, or a rotated
 * peer secret?`, a clock skew too.
 */
export const listingRefusal = (body: Uint8Array | undefined): string => {
  let said: string | undefined
  try {
    const v = body === undefined ? undefined : (JSON.parse(new TextDecoder().decode(body)) as { readonly message?: unknown })
    if (typeof v?.message === "string")
      said = Array.from(v.message, (c) => (c < " " || c === "\u007f" ? " " : c))
        .slice(0, refusalMaxChars)
        .join("")
  } catch {
    said = undefined
  }
  const hint =
    said?.startsWith("image token expired") === true
      ? "this host's clock and the image host's differ by more than that: check their time sync"
      : said?.startsWith("image token issued before") === true
        ? "its agent restarted just now; a later try's bearer passes"
        : "an image host older than this agent, or a rotated peer secret?"
  return `the image host answered 401 to the listing${said === undefined || said === "" ? "" : `: ${said}`} (${hint})`
}

/**
 * The most bytes of a listing a fetch reads (`BoundedRead`): a real one is a few files (the image,
 * the runtime's files beside it, the descent tag), some 150 bytes each besides its name; 1 MiB
 * holds thousands. Past it the fetch fails before the listing's proof is judged, the rest unread.
 */
export const listingMaxBytes = 1024 * 1024

/** The shortest bound of a fetch's listing (which may hash a file not hashed yet) and of its files. */
export const imageFetchFloorMs = 10 * 60_000

/** The default floor rate of a fetch (`ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS`). */
export const defaultImageFetchMinMibPerSec = 50

/** How long a file's stream may send no byte before the fetch fails. */
export const imageFetchStallMs = 60_000

/**
 * How long the image host's peer server has to answer a fetch's probe (any answer: the probe
 * carries no credential) before the listing is asked: a host frozen or cut off with its socket
 * open accepts the listing's connection and never answers, and the listing's own bound (10
 * minutes or more: the image host may hash the image before it answers) would hold the resume
 * that long. A live image host answers at once, even while it hashes (on a thread of its own).
 */
export const imageHostProbeMs = 10_000

/**
 * The bound of fetching an image's files of `bytes` in all: `floorMs`, or the time they take at
 * `minMibPerSec`, whichever is longer (100 GiB at 50 MiB/s: 2,048 s).
 */
export const fetchBoundMs = (bytes: number, minMibPerSec: number, floorMs: number = imageFetchFloorMs): number =>
  Math.max(floorMs, Math.ceil((bytes / (minMibPerSec * 1024 * 1024)) * 1000))

/**
 * The bound of a fetch's listing of the image of a session of `memMib`: the image host may hash
 * the image (about the guest's memory) before it answers, the first time it lists it, so the
 * bound grows as the files' does: `fetchBoundMs` of the memory's bytes (at least `floorMs`;
 * 100 GiB at 50 MiB/s: 2,048 s).
 */
export const listingBoundMs = (memMib: number, minMibPerSec: number, floorMs: number = imageFetchFloorMs): number =>
  fetchBoundMs(memMib * 1024 * 1024, minMibPerSec, floorMs)

/** The session's image directory in `images` (where its `image` file lives). */
const dirOf = (images: ImageStore.ImageStore, sessionId: string): string => dirname(images.pathFor(sessionId))

/** The sidecar of a session's image directory holding its files' hashes; it and its temporaries are never listed. */
const sidecar = "~sha256.json"

/** Whether `name` is the sidecar or one of its temporaries (`~sha256.json.<pid>.<random>`). */
const isSidecar = (name: string): boolean => name === sidecar || name.startsWith(`${sidecar}.`)

interface Entry {
  readonly name: string
  readonly bytes: number
  readonly mtimeMs: number
}

/** The regular files of `dir` by name (every one but the sidecar and its temporaries); undefined when it cannot be read. */
const entriesOf = async (dir: string): Promise<Entry[] | undefined> => {
  try {
    const out: Entry[] = []
    for (const name of (await readdir(dir)).sort()) {
      if (isSidecar(name)) continue
      const st = await lstat(join(dir, name))
      if (st.isFile()) out.push({ name, bytes: st.size, mtimeMs: st.mtimeMs })
    }
    return out
  } catch {
    return undefined
  }
}

/**
 * The hashing thread's code (a worker evaluated from this text, so the bundled agent and the
 * sources under tsx run the same, with no file of its own to find): each message names a file,
 * streamed and hashed there; the answer is its SHA-256 in hex, or why it could not be read.
 */
const hasherSource = `
const { parentPort } = require("node:worker_threads")
const { createHash } = require("node:crypto")
const { createReadStream } = require("node:fs")
parentPort.on("message", async ({ id, path }) => {
  try {
    const h = createHash("sha256")
    for await (const chunk of createReadStream(path)) h.update(chunk)
    parentPort.postMessage({ id, sha256: h.digest("hex") })
  } catch (e) {
    parentPort.postMessage({ id, error: e instanceof Error ? e.message : String(e) })
  }
})
`

/** A hashing thread: `sha256Of` a file there, `close` when done. */
interface Hasher {
  readonly sha256Of: (path: string) => Promise<string>
  readonly close: () => Promise<void>
}

/**
 * A thread of its own that hashes files, off the agent's event loop: a 100 GiB image is some 3
 * minutes of a core, which on the loop would be taken in slices between the agent's heartbeats,
 * polls and answers. Never holds the process open (unreferenced). A thread that dies fails
 * every hash asked of it.
 */
const makeHasher = (): Hasher => {
  const worker = new Worker(hasherSource, { eval: true })
  worker.unref()
  const waiting = new Map<number, { readonly resolve: (hex: string) => void; readonly reject: (e: Error) => void }>()
  let next = 0
  const failAll = (e: Error) => {
    for (const w of waiting.values()) w.reject(e)
    waiting.clear()
  }
  worker.on("message", (m: { readonly id: number; readonly sha256?: string; readonly error?: string }) => {
    const w = waiting.get(m.id)
    waiting.delete(m.id)
    if (m.sha256 !== undefined) w?.resolve(m.sha256)
    else w?.reject(new Error(m.error ?? "the hashing thread answered nothing"))
  })
  worker.on("error", failAll)
  worker.on("exit", (code) => failAll(new Error(`the hashing thread exited (${code})`)))
  return {
    sha256Of: (path) =>
      new Promise((resolve, reject) => {
        const id = next++
        waiting.set(id, { resolve, reject })
        worker.postMessage({ id, path })
      }),
    close: () => worker.terminate().then(() => undefined),
  }
}

type Hashes = Record<string, { readonly bytes: number; readonly mtimeMs: number; readonly sha256: string }>

const readHashes = async (dir: string): Promise<Hashes> => {
  try {
    const v: unknown = JSON.parse(await readFile(join(dir, sidecar), "utf8"))
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Hashes) : {}
  } catch {
    return {}
  }
}

/** Writes the sidecar whole (a temporary renamed over it): a reader finds the old one or the new one. */
const writeHashes = async (dir: string, hashes: Hashes): Promise<void> => {
  const tmp = join(dir, `${sidecar}.${process.pid}.${Math.random().toString(36).slice(2)}`)
  await writeFile(tmp, JSON.stringify(hashes), { mode: 0o600 })
  await rename(tmp, join(dir, sidecar))
}

/** A warm hashing stopped because its image is no longer wanted here (`warmHashes`'s `goOn`). */
class WarmStopped extends Error {}

/**
 * The hashes of `entries` in `dir`: the sidecar's where its size and time still match, else
 * hashed now, and the sidecar written (its failure thrown when `keep`, else ignored: the hashes
 * are still good for this answer). `goOn`, when given, is asked before each file is hashed: false
 * stops the hashing (`WarmStopped` thrown, the sidecar left as it was).
 */
const hashesOf = async (dir: string, entries: readonly Entry[], keep: boolean, goOn?: () => Promise<boolean>): Promise<Hashes> => {
  const known = await readHashes(dir)
  const out: Record<string, Hashes[string]> = {}
  let changed = false
  // Started for the first file to hash (a fresh sidecar needs none), ended with this hashing.
  let hasher: Hasher | undefined
  try {
    for (const e of entries) {
      const k = known[e.name]
      if (k !== undefined && k.bytes === e.bytes && k.mtimeMs === e.mtimeMs && typeof k.sha256 === "string") out[e.name] = k
      else {
        if (goOn !== undefined && !(await goOn())) throw new WarmStopped()
        hasher ??= makeHasher()
        out[e.name] = { bytes: e.bytes, mtimeMs: e.mtimeMs, sha256: await hasher.sha256Of(join(dir, e.name)) }
        changed = true
      }
    }
  } finally {
    await hasher?.close()
  }
  if (changed || Object.keys(known).length !== entries.length) await writeHashes(dir, out).catch((e: unknown) => {
    if (keep) throw e
  })
  return out
}

/**
 * The directories being hashed in this process, each by the end of its last hashing: one
 * hashing of a directory at a time, so a listing that comes while a descent's hashes are
 * computed (`warmHashes`) waits for them and then finds the sidecar fresh, rather than reading
 * the same GiBs a second time beside it.
 */
const hashing = new Map<string, Promise<void>>()

/** `f` once every earlier hashing of `dir` has ended (however it ended). */
const oneAtATime = <A>(dir: string, f: () => Promise<A>): Promise<A> => {
  const run = (hashing.get(dir) ?? Promise.resolve()).then(f)
  const end = run.then(
    () => undefined,
    () => undefined,
  )
  hashing.set(dir, end)
  void end.then(() => {
    if (hashing.get(dir) === end) hashing.delete(dir)
  })
  return run
}

/**
 * The listing of the image directory `dir`, its files hashed unless the sidecar holds them
 * (the one hashing rule of the listing and of `warmHashes`). Throws when a file cannot be read
 * (gone while hashed: the image removed or restored), and when `keep`, when the sidecar cannot
 * be written.
 */
const hashedListing = (dir: string, keep: boolean, goOn?: () => Promise<boolean>): Promise<ImageListing | undefined> =>
  oneAtATime(dir, async () => {
    const entries = await entriesOf(dir)
    if (entries === undefined || !entries.some((f) => f.name === "image")) return undefined
    const hashes = await hashesOf(dir, entries, keep, goOn)
    return { files: entries.map((e) => ({ name: e.name, bytes: e.bytes, sha256: hashes[e.name]!.sha256 })) }
  })

/**
 * The files of `sessionId`'s image directory (regular files only, by name) with their sizes and
 * hashes, or undefined when it holds no complete image (no `image` file). What the image host
 * lists to a fetching peer: at once when the sidecar is fresh (`warmHashes` wrote it at the
 * descent), else after hashing what is not in it.
 */
export const listing = (images: ImageStore.ImageStore, sessionId: string): Effect.Effect<ImageListing | undefined> =>
  // A file gone while it was hashed (the image removed, restored): no image to list.
  Effect.promise(() => hashedListing(dirOf(images, sessionId), false).catch(() => undefined))

/** Why a descent image's hashes could not be computed or kept (`warmHashes`); the first listing then hashes it. */
export class ImageHashError extends Data.TaggedError("ImageHashError")<{
  readonly sessionId: string
  readonly message: string
}> {}

/**
 * Hashes `sessionId`'s descent image as the listing does and keeps the hashes in its sidecar,
 * so the image host's first listing of it answers at once: what an agent runs in the background
 * once a descent's image and tag are written. `goOn` is asked before each file is hashed (whether
 * the session is still descended with its image here): false stops the hashing, the sidecar left
 * as it was (`stopped: true`, no file counted). Succeeds with the files hashed (none when the
 * directory holds no image); fails when a file cannot be read or the sidecar cannot be written.
 */
export const warmHashes = (
  images: ImageStore.ImageStore,
  sessionId: string,
  goOn: Effect.Effect<boolean> = Effect.succeed(true),
): Effect.Effect<{ readonly files: number; readonly bytes: number; readonly stopped: boolean }, ImageHashError> =>
  Effect.tryPromise({
    try: () =>
      hashedListing(dirOf(images, sessionId), true, () => Effect.runPromise(goOn)).then(
        (l) => ({ files: l?.files.length ?? 0, bytes: (l?.files ?? []).reduce((sum, f) => sum + f.bytes, 0), stopped: false }),
        (e: unknown) => {
          if (e instanceof WarmStopped) return { files: 0, bytes: 0, stopped: true }
          throw e
        },
      ),
    catch: (e) => new ImageHashError({ sessionId, message: e instanceof Error ? e.message : String(e) }),
  })

/** A stream of one listed file of `sessionId`'s image directory; undefined when `name` is not one (no path is built from an unlisted name). */
export const fileStream = (images: ImageStore.ImageStore, sessionId: string, name: string): Effect.Effect<{ readonly bytes: number; readonly body: Stream.Stream<Uint8Array, Error> } | undefined> =>
  Effect.promise(() => entriesOf(dirOf(images, sessionId))).pipe(
    Effect.map((entries) => {
      const file = entries?.some((f) => f.name === "image") === true ? entries.find((f) => f.name === name) : undefined
      if (file === undefined) return undefined
      const path = join(dirOf(images, sessionId), file.name)
      return {
        bytes: file.bytes,
        body: Stream.fromReadableStream({
          evaluate: () => Readable.toWeb(createReadStream(path)) as unknown as ReadableStream<Uint8Array>,
          onError: (e) => (e instanceof Error ? e : new Error(String(e))),
        }),
      }
    }),
  )

/** The name prefix of a fetch's staging directory, beside the sessions' directories (`~` is outside the id rule). */
const stagingPrefix = "~fetch-"

/** This process as a staging name records it: its pid, and its start (clock ticks since boot) where `/proc` tells it. */
const stagingOwner = ((me: Pid.Owner) => (me.startTicks === undefined ? String(me.pid) : `${me.pid}.${me.startTicks}`))(Pid.self())

/** A fetch's staging directory name: the fetching process (`<pid>.<start>`), when it began, the session. */
const stagingName = (sessionId: string): string => `${stagingPrefix}${stagingOwner}-${Date.now()}-${encodeURIComponent(sessionId)}`

/** A staging directory name's parts: the owner (its start where recorded: a name of before has none), the session. */
const stagingPattern = /^~fetch-(\d+)(?:\.(\d+))?-(\d+)-(.+)$/

/** The staging directories this process is writing (a sweep never takes one of them). */
const activeStaging = new Set<string>()

/** The bytes of the regular files under `path` (a directory walked, symbolic links not followed); 0 when it cannot be read. */
const bytesUnder = async (path: string): Promise<number> => {
  try {
    const st = await lstat(path)
    if (!st.isDirectory()) return st.isFile() ? st.size : 0
    let n = 0
    for (const name of await readdir(path)) n += await bytesUnder(join(path, name))
    return n
  } catch {
    return 0
  }
}

/** A staging directory a sweep removed: its name and the bytes it held. */
export interface StaleStaging {
  readonly name: string
  readonly bytes: number
}

/**
 * Removes the stale fetch staging directories (`~fetch-<pid>.<start>-<ms>-<session>`) of the
 * image store rooted at `root`: those of a fetch that can no longer end, its process gone (an
 * agent killed or crashed mid-fetch leaves its partial image there; nothing else would ever
 * remove it), or this process's own that no fetch of it is writing. A process gone includes its
 * pid now run by another (`Pid.runs`: a daemon after a reboot, an agent's container restarted
 * with the pid it had); a name of before (`~fetch-<pid>-…`) is judged by its pid alone. Never one
 * an active fetch writes: this process's are known, another live process's (another agent on
 * the machine) are left to it.
 * `sessionId`: only that session's. Answers what it removed; best effort (one that cannot be
 * removed is left, and not named).
 */
export const sweepStaging = (root: string, sessionId?: string): Effect.Effect<readonly StaleStaging[]> =>
  Effect.promise(async () => {
    const names = await readdir(root).catch(() => [] as string[])
    const removed: StaleStaging[] = []
    for (const name of names.sort()) {
      const m = stagingPattern.exec(name)
      if (m === null) continue
      if (sessionId !== undefined && m[4] !== encodeURIComponent(sessionId)) continue
      const path = join(root, name)
      const pid = Number(m[1])
      if (activeStaging.has(path) || (pid !== process.pid && Pid.runs({ pid, startTicks: m[2] }))) continue
      const bytes = await bytesUnder(path)
      const gone = await rm(path, { recursive: true, force: true }).then(
        () => true,
        () => false,
      )
      if (gone) removed.push({ name, bytes })
    }
    return removed
  })

/** What a fetch brought: the files and their total size. */
export interface Fetched {
  readonly files: number
  readonly bytes: number
}

/**
 * The fetches' connections, without undici's own limits: Node's `fetch` gives up on headers
 * after 300 s and on a quiet body after 300 s, below a big image's listing bound (the image host
 * may hash GiBs before it answers) and unrelated to the stall bound. The bounds here are the
 * fetch's own signals.
 */
const unbounded = new Agent({ headersTimeout: 0, bodyTimeout: 0 })

/**
 * Fetches `sessionId`'s image from the agent of `imageHostId` into `images` (this host is `me`):
 * the listing from `peerUrl`, the files from the peer URL the listing proves (the image host's
 * own), or from `peerUrl` too when `peerUrlTrusted` (the operator's `ENGRAM_PEERS` entry, not
 * the coordinator's word). Fails with `ImageFetchError` (nothing left behind) when the peer
 * cannot be reached, refuses, has no image, lists no hashes, names no peer URL of its own (and
 * `peerUrl` is not trusted), a file's size or contents differ from its listing, or a bound passes (`listingBoundMs` of `memMib` and `fetchBoundMs` of the listed
 * bytes at `minMibPerSec`, `stallMs` without a byte).
 * Each request's bearer is issued at the Effect `Clock`'s time.
 */
export const fetchImage = (o: {
  readonly images: ImageStore.ImageStore
  readonly sessionId: string
  readonly imageHostId: string
  readonly peerUrl: string
  /**
   * Whether `peerUrl` is the operator's (`ENGRAM_PEERS`): the files are then fetched from it as
   * the listing; otherwise (default; a URL the coordinator gave, which a stolen host token could
   * have reported) only from the peer URL the image host names under its listing's proof.
   */
  readonly peerUrlTrusted?: boolean
  readonly me: string
  readonly secret: string
  /** The floor rate of the listing's and the files' bounds (MiB/s). */
  readonly minMibPerSec: number
  /** The session's memory (MiB): the listing's bound grows with it (`listingBoundMs`); default 0 (the floor). */
  readonly memMib?: number
  /** The listing's and the files' shortest bound; default `imageFetchFloorMs`. */
  readonly floorMs?: number
  /** Default `imageFetchStallMs`. */
  readonly stallMs?: number
  /** Default `imageHostProbeMs`. */
  readonly probeMs?: number
}): Effect.Effect<Fetched, ImageFetchError> => {
  const fail = (message: string, absent = false) => new ImageFetchError({ sessionId: o.sessionId, imageHostId: o.imageHostId, message, ...(absent ? { absent } : {}) })
  const floorMs = o.floorMs ?? imageFetchFloorMs
  const stallMs = o.stallMs ?? imageFetchStallMs
  const baseOf = (peerUrl: string) => `${peerUrl.replace(/\/+$/, "")}/v1/peer/images/${encodeURIComponent(o.sessionId)}`
  const base = baseOf(o.peerUrl)
  const query = `?for=${encodeURIComponent(o.me)}`
  const final = dirOf(o.images, o.sessionId)
  // Beside the sessions' directories under a name no session id takes (`~` is outside the id rule).
  const staging = join(dirname(final), stagingName(o.sessionId))
  // A fetch of the same image that a crash cut (its staging left behind) goes first.
  const sweep = sweepStaging(dirname(final), o.sessionId).pipe(
    Effect.tap((removed) => (removed.length === 0 ? Effect.void : Effect.logInfo("stale fetch staging removed", { sessionId: o.sessionId, removed: removed.map((r) => r.name), bytes: removed.reduce((n, r) => n + r.bytes, 0) }))),
  )
  return Effect.andThen(sweep, Clock.clockWith((clock) =>
    Effect.tryPromise({
      try: async (signal) => {
        // A bearer of its own for every request: the image host takes each nonce once.
        // Each bound to what it opens: a relay that saw the listing's opens no file with it.
        const bearer = (opens: ImageRoute) => {
          const b = newImageBearer(clock.currentTimeMillisUnsafe())
          return { nonce: b.nonce, headers: { authorization: `Bearer ${imageToken(o.secret, o.sessionId, o.imageHostId, o.me, opens, b)}` } }
        }
        // First a probe: a peer server that answers anything at once is alive; the listing may
        // then wait for the image's hashing. No credential: a 401 is as good an answer as any.
        const probeMs = o.probeMs ?? imageHostProbeMs
        const probeBound = AbortSignal.timeout(probeMs)
        const probed = await fetch(`${o.peerUrl.replace(/\/+$/, "")}/v1/peer/status`, { dispatcher: unbounded, signal: AbortSignal.any([signal, probeBound]) }).catch((e: unknown) => {
          throw probeBound.aborted ? fail(`the image host's peer server did not answer a probe within ${probeMs} ms (frozen, or cut off?)`) : e
        })
        await probed.body?.cancel().catch(() => undefined)
        // The image host may hash the image before it answers (its first listing of it).
        const listingMs = listingBoundMs(o.memMib ?? 0, o.minMibPerSec, floorMs)
        const listingBound = AbortSignal.timeout(listingMs)
        // Its body is built before its headers go out: once they came, a body that stalls is cut as a file's is.
        const listingStall = new AbortController()
        const first = bearer({ _tag: "Listing" })
        const late = () => fail(`the image host did not answer the listing within ${listingMs} ms`)
        const res = await fetch(`${base}${query}`, { headers: first.headers, dispatcher: unbounded, signal: AbortSignal.any([signal, listingBound, listingStall.signal]) }).catch((e: unknown) => {
          throw listingBound.aborted ? late() : e
        })
        const listingTimer = setTimeout(() => listingStall.abort(), stallMs)
        // Only the image host's own word that it has no such image lets the resume boot fresh.
        if (res.status === 404 && saysNoImage(await webBodyAtMost(res.body, noImageMaxBytes, res.headers.get("content-length")).catch(() => undefined), o.sessionId)) {
          clearTimeout(listingTimer)
          throw fail(`the image host has no descent image of session ${o.sessionId}`, true)
        }
        if (res.status === 401) {
          const refusal = listingRefusal(await webBodyAtMost(res.body, noImageMaxBytes, res.headers.get("content-length")).catch(() => undefined))
          clearTimeout(listingTimer)
          throw fail(refusal)
        }
        if (res.status !== 200) {
          clearTimeout(listingTimer)
          throw fail(`the image host answered ${res.status} to the listing`)
        }
        // Read before its proof is judged: at most `listingMaxBytes`, never the rest.
        const listed = await webBodyAtMost(res.body, listingMaxBytes, res.headers.get("content-length")).catch((e: unknown) => {
          throw listingStall.signal.aborted ? fail(`the image host sent its listing's headers and no whole body within ${stallMs} ms`) : listingBound.aborted ? late() : e
        }).finally(() => clearTimeout(listingTimer))
        if (listed === undefined) throw fail(`the image host's listing is over ${listingMaxBytes} bytes (a real one lists a few files): not read further, nothing fetched`)
        const list = Schema.decodeUnknownSync(ListingAnswer)(JSON.parse(new TextDecoder().decode(listed)))
        // An image host older than content hashes: its files could not be checked.
        const files: ImageFile[] = []
        for (const f of list.files) {
          if (f.sha256 === undefined) throw fail(`the image host listed ${f.name} without its SHA-256 (an agent older than this one): refused`)
          files.push({ name: f.name, bytes: f.bytes, sha256: f.sha256 })
        }
        // Nothing is taken from an address that cannot prove it holds the peer secret.
        const ownUrl = list.peerUrl ?? null
        if (!tokensEqual(list.proof, imageProof(o.secret, o.sessionId, o.imageHostId, o.me, first.nonce, ownUrl, files))) throw fail("the image host's listing carries no valid proof that it holds the peer secret")
        // The files come from the image host itself: the URL it proves (a relay that passed the
        // listing on sees none of them), unless the operator named the URL asked.
        if (o.peerUrlTrusted !== true && ownUrl === null) throw fail("the image host names no peer URL of its own in its listing (it advertises none), and this agent fetches files only from that URL or from its ENGRAM_PEERS entry")
        const filesBase = o.peerUrlTrusted === true || ownUrl === null ? base : baseOf(ownUrl)
        const listedBytes = files.reduce((sum, f) => sum + f.bytes, 0)
        const boundMs = fetchBoundMs(listedBytes, o.minMibPerSec, floorMs)
        const bound = AbortSignal.timeout(boundMs)
        activeStaging.add(staging)
        await mkdir(staging, { recursive: true, mode: 0o700 })
        let bytes = 0
        for (const file of files) {
          // A listed name is a plain file name: anything with a separator, a dot-name or the sidecar's name is refused.
          if (file.name === "" || file.name === "." || file.name === ".." || isSidecar(file.name) || /[/\\\0]/.test(file.name))
            throw fail(`the image host listed a bad file name ${JSON.stringify(file.name)}`)
          // No byte for `stallMs`: the stream is cut.
          const stall = new AbortController()
          let timer = setTimeout(() => stall.abort(), stallMs)
          const why = () =>
            bound.aborted
              ? fail(`the fetch took longer than its bound of ${boundMs} ms (${listedBytes} bytes listed, at least ${o.minMibPerSec} MiB/s)`)
              : stall.signal.aborted
                ? fail(`the image host sent no byte of ${file.name} for ${stallMs} ms`)
                : undefined
          try {
            const got = await fetch(`${filesBase}/files/${encodeURIComponent(file.name)}${query}`, { headers: bearer({ _tag: "File", name: file.name }).headers, dispatcher: unbounded, signal: AbortSignal.any([signal, bound, stall.signal]) })
            if (got.status !== 200 || got.body === null) throw fail(`the image host answered ${got.status} for ${file.name}`)
            const path = join(staging, file.name)
            // Stops at the listed size (a peer that sends more fills no disk), and hashes what passes.
            let written = 0
            const hash = createHash("sha256")
            const checked = new Transform({
              transform(chunk: Buffer, _encoding, done) {
                clearTimeout(timer)
                timer = setTimeout(() => stall.abort(), stallMs)
                written += chunk.length
                if (written > file.bytes) done(fail(`${file.name} is longer than the ${file.bytes} bytes the image host listed`))
                else {
                  hash.update(chunk)
                  done(null, chunk)
                }
              },
            })
            await pipeline(Readable.fromWeb(got.body as NodeReadableStream<Uint8Array>), checked, createWriteStream(path, { mode: 0o600 }))
            const size = (await stat(path)).size
            if (size !== file.bytes) throw fail(`${file.name} is ${size} bytes, the image host listed ${file.bytes}`)
            const sha256 = hash.digest("hex")
            if (sha256 !== file.sha256) throw fail(`${file.name}: content does not match the listing (SHA-256 ${sha256}, listed ${file.sha256})`)
            bytes += size
          } catch (e) {
            throw e instanceof ImageFetchError ? e : (why() ?? e)
          } finally {
            clearTimeout(timer)
          }
        }
        // This host lists what it fetched without hashing it again.
        const entries = await entriesOf(staging)
        const byName = new Map(files.map((f) => [f.name, f.sha256]))
        if (entries !== undefined) await writeHashes(staging, Object.fromEntries(entries.map((e) => [e.name, { bytes: e.bytes, mtimeMs: e.mtimeMs, sha256: byName.get(e.name)! }]))).catch(() => undefined)
        // Into place only once every file is whole; an older directory under the id (no image in it) goes.
        await rm(final, { recursive: true, force: true })
        await rename(staging, final)
        return { files: files.length, bytes }
      },
      catch: (e) => (e instanceof ImageFetchError ? e : fail(e instanceof Error ? e.message : String(e))),
      // Failed or interrupted (the agent stopping, the resume's action cut): nothing left behind.
    }),
  )).pipe(
    Effect.onExit((exit) =>
      Effect.promise(async () => {
        if (exit._tag !== "Success") await rm(staging, { recursive: true, force: true })
        activeStaging.delete(staging)
      }),
    ),
  )
}
