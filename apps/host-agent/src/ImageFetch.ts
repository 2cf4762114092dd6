/**
 * Descent images between agents. A cold resume is placed on the host holding the session's image
 * when that host has room (the coordinator's ranking); when it has not, the session lands on
 * another host, whose agent fetches the image from the image host's peer server before it
 * restores, instead of booting a fresh guest.
 *
 * The image host serves what its image store keeps for the session: every regular file of the
 * session's directory (the image, the runtime's files beside it, the descent tag). A fetch reads
 * the list with each file's size (`GET /v1/peer/images/{session}?for={host}`), streams each file
 * (`…/files/{name}`) into a new directory beside the image store's, checks each size against the
 * list, and only then moves the directory into place: a failed or partial fetch leaves nothing a
 * restore could take. The bearer is `MoveToken.imageToken` (the session and both hosts), compared
 * in constant time; the listing carries the image host's `MoveToken.imageProof` (the files and
 * both hosts), checked in constant time before anything is fetched. Whether the image is of the session's last descent is judged after the fetch
 * by the same tag check as a local image (`Agent.ts`).
 */
import { createReadStream, createWriteStream } from "node:fs"
import { lstat, mkdir, readdir, rename, rm, stat } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Readable, Transform } from "node:stream"
import { pipeline } from "node:stream/promises"
import type { ReadableStream as NodeReadableStream } from "node:stream/web"
import type { ImageStore } from "@engram/runtime"
import { Data, Effect, Schema, Stream } from "effect"
import { imageProof, imageToken, tokensEqual } from "./MoveToken.js"

/** One file of a session's image directory, as the image host lists it. */
export const ImageFile = Schema.Struct({ name: Schema.String, bytes: Schema.Number })
export type ImageFile = typeof ImageFile.Type

/** The files of a session's image directory. */
export interface ImageListing {
  readonly files: readonly ImageFile[]
}

/** The image host's answer to a listing: the files, and its proof that it holds the peer secret (`MoveToken.imageProof`). */
export const ListingAnswer = Schema.Struct({ files: Schema.Array(ImageFile), proof: Schema.String })

/** Why an image could not be fetched (the resume then boots fresh, as without one). */
export class ImageFetchError extends Data.TaggedError("ImageFetchError")<{
  readonly sessionId: string
  readonly imageHostId: string
  readonly message: string
}> {}

/** The session's image directory in `images` (where its `image` file lives). */
const dirOf = (images: ImageStore.ImageStore, sessionId: string): string => dirname(images.pathFor(sessionId))

/**
 * The files of `sessionId`'s image directory (regular files only, by name), or undefined when it
 * holds no complete image (no `image` file). What the image host lists to a fetching peer.
 */
export const listing = (images: ImageStore.ImageStore, sessionId: string): Effect.Effect<ImageListing | undefined> =>
  Effect.promise(async () => {
    const dir = dirOf(images, sessionId)
    try {
      const files: ImageFile[] = []
      for (const name of (await readdir(dir)).sort()) {
        const st = await lstat(join(dir, name))
        if (st.isFile()) files.push({ name, bytes: st.size })
      }
      return files.some((f) => f.name === "image") ? { files } : undefined
    } catch {
      return undefined
    }
  })

/** A stream of one listed file of `sessionId`'s image directory; undefined when `name` is not one (no path is built from an unlisted name). */
export const fileStream = (images: ImageStore.ImageStore, sessionId: string, name: string): Effect.Effect<{ readonly bytes: number; readonly body: Stream.Stream<Uint8Array, Error> } | undefined> =>
  Effect.map(listing(images, sessionId), (l) => {
    const file = l?.files.find((f) => f.name === name)
    if (file === undefined) return undefined
    const path = join(dirOf(images, sessionId), file.name)
    return {
      bytes: file.bytes,
      body: Stream.fromReadableStream({
        evaluate: () => Readable.toWeb(createReadStream(path)) as unknown as ReadableStream<Uint8Array>,
        onError: (e) => (e instanceof Error ? e : new Error(String(e))),
      }),
    }
  })

/** What a fetch brought: the files and their total size. */
export interface Fetched {
  readonly files: number
  readonly bytes: number
}

/**
 * Fetches `sessionId`'s image from the agent of `imageHostId` at `peerUrl` into `images` (this
 * host is `me`). Fails with `ImageFetchError` (nothing left behind) when the peer cannot be
 * reached, refuses, has no image, or a file's size differs from its listing.
 */
export const fetchImage = (o: {
  readonly images: ImageStore.ImageStore
  readonly sessionId: string
  readonly imageHostId: string
  readonly peerUrl: string
  readonly me: string
  readonly secret: string
  readonly timeoutMs: number
}): Effect.Effect<Fetched, ImageFetchError> => {
  const fail = (message: string) => new ImageFetchError({ sessionId: o.sessionId, imageHostId: o.imageHostId, message })
  const base = `${o.peerUrl.replace(/\/+$/, "")}/v1/peer/images/${encodeURIComponent(o.sessionId)}`
  const query = `?for=${encodeURIComponent(o.me)}`
  const headers = { authorization: `Bearer ${imageToken(o.secret, o.sessionId, o.imageHostId, o.me)}` }
  const final = dirOf(o.images, o.sessionId)
  // Beside the sessions' directories under a name no session id takes (`~` is outside the id rule).
  const staging = join(dirname(final), `~fetch-${process.pid}-${Date.now()}-${encodeURIComponent(o.sessionId)}`)
  return Effect.tryPromise({
    try: async (signal) => {
      const timeout = AbortSignal.any([signal, AbortSignal.timeout(o.timeoutMs)])
      const res = await fetch(`${base}${query}`, { headers, signal: timeout })
      if (res.status !== 200) throw fail(`the image host answered ${res.status} to the listing`)
      const list = Schema.decodeUnknownSync(ListingAnswer)(await res.json())
      // Nothing is taken from an address that cannot prove it holds the peer secret.
      if (!tokensEqual(list.proof, imageProof(o.secret, o.sessionId, o.imageHostId, o.me, list.files))) throw fail("the image host's listing carries no valid proof that it holds the peer secret")
      await mkdir(staging, { recursive: true, mode: 0o700 })
      let bytes = 0
      for (const file of list.files) {
        // A listed name is a plain file name: anything with a separator or a dot-name is refused.
        if (file.name === "" || file.name === "." || file.name === ".." || /[/\\\0]/.test(file.name)) throw fail(`the image host listed a bad file name ${JSON.stringify(file.name)}`)
        const got = await fetch(`${base}/files/${encodeURIComponent(file.name)}${query}`, { headers, signal: timeout })
        if (got.status !== 200 || got.body === null) throw fail(`the image host answered ${got.status} for ${file.name}`)
        const path = join(staging, file.name)
        // Stops at the listed size: a peer that sends more fills no disk.
        let written = 0
        const capped = new Transform({
          transform(chunk: Buffer, _encoding, done) {
            written += chunk.length
            if (written > file.bytes) done(fail(`${file.name} is longer than the ${file.bytes} bytes the image host listed`))
            else done(null, chunk)
          },
        })
        await pipeline(Readable.fromWeb(got.body as NodeReadableStream<Uint8Array>), capped, createWriteStream(path, { mode: 0o600 }))
        const size = (await stat(path)).size
        if (size !== file.bytes) throw fail(`${file.name} is ${size} bytes, the image host listed ${file.bytes}`)
        bytes += size
      }
      // Into place only once every file is whole; an older directory under the id (no image in it) goes.
      await rm(final, { recursive: true, force: true })
      await rename(staging, final)
      return { files: list.files.length, bytes }
    },
    catch: (e) => (e instanceof ImageFetchError ? e : fail(e instanceof Error ? e.message : String(e))),
    // Failed or interrupted (the agent stopping, the resume's action cut): nothing left behind.
  }).pipe(Effect.onExit((exit) => (exit._tag === "Success" ? Effect.void : Effect.promise(() => rm(staging, { recursive: true, force: true })))))
}
