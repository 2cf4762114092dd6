/**
 * Where descents put their images: one directory per session under the store's root, holding
 * the image file (`image`) and whatever the runtime writes beside it (QEMU: the machine it
 * must be restored into, and a mapped image's RAM file). A resumed (descended → pending)
 * session is restored from it; a restore may take the runtime's files back out of it.
 */
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Effect } from "effect"
import { pathSegment } from "./Paths.js"
import type { DescentImage } from "./Runtime.js"

export interface ImageStore {
  readonly root: string
  /** The image file of `vmId` (its directory is created by `prepare`). */
  readonly pathFor: (vmId: string) => string
  /** Creates the image's directory and answers the image path. */
  readonly prepare: (vmId: string) => Effect.Effect<string>
  /** The image of `vmId`, when a complete one exists. */
  readonly get: (vmId: string) => Effect.Effect<DescentImage | undefined>
  /**
   * Removes the image and its side files; removing an absent one succeeds. The directory store
   * first moves the session's directory aside (`~removed-…`, one rename: from then on no `get`
   * or `list` finds any of it, a tag without its image or an image without its tag included),
   * then deletes it; a crash between leaves only the aside directory (`sweepRemoved`).
   */
  readonly remove: (vmId: string) => Effect.Effect<void>
  /**
   * Writes a small JSON record beside `vmId`'s image (the agent's descent tag: which descent wrote
   * it). Optional: a store without it keeps no tags.
   */
  readonly writeTag?: (vmId: string, tag: unknown) => Effect.Effect<void, unknown>
  /** The record `writeTag` wrote beside `vmId`'s image; undefined when there is none (or it does not parse). */
  readonly readTag?: (vmId: string) => Effect.Effect<unknown>
  /**
   * Every complete image in the store: its VM and when its image file was written (epoch ms).
   * Optional: a store without it is never cleaned up by the agent.
   */
  readonly list?: Effect.Effect<readonly { readonly vmId: string; readonly writtenAtMs: number }[]>
}

/** The name prefix of a removed image's directory, moved aside before it is deleted (`~` is outside the id rule). */
const removedPrefix = "~removed-"

/**
 * Deletes what removals cut short left in `root` (`~removed-…`: an agent stopped between the move
 * aside and the delete); answers their names. Such a directory is no image any more (nothing
 * finds it), so any of them may go, one another process is deleting too.
 */
export const sweepRemoved = (root: string): Effect.Effect<readonly string[]> =>
  Effect.promise(async () => {
    const names = (await readdir(root).catch(() => [] as string[])).filter((n) => n.startsWith(removedPrefix))
    for (const name of names) await rm(join(root, name), { recursive: true, force: true }).catch(() => undefined)
    return names
  })

/** An image store in the directory `root`. */
export const directory = (root: string): ImageStore => {
  const pathFor = (vmId: string) => join(root, pathSegment(vmId), "image")
  const tagPathOf = (vmId: string) => join(dirname(pathFor(vmId)), "descent.json")
  return {
    root,
    pathFor,
    prepare: (vmId) =>
      Effect.suspend(() => {
        const path = pathFor(vmId)
        return Effect.promise(() => mkdir(dirname(path), { recursive: true })).pipe(Effect.as(path))
      }),
    get: (vmId) =>
      Effect.tryPromise(() => stat(pathFor(vmId))).pipe(
        Effect.map((s): DescentImage | undefined => (s.isFile() ? { vmId, path: pathFor(vmId), bytes: s.size } : undefined)),
        Effect.orElseSucceed(() => undefined),
      ),
    remove: (vmId) =>
      Effect.promise(async () => {
        const dir = dirname(pathFor(vmId))
        const aside = join(root, `${removedPrefix}${process.pid}-${Date.now()}-${pathSegment(vmId)}`)
        const moved = await rename(dir, aside).then(
          () => true,
          (e: NodeJS.ErrnoException) => (e.code === "ENOENT" ? null : false),
        )
        // Absent: nothing to remove. Not movable (another filesystem's mount, say): deleted in place.
        if (moved === null) return
        await rm(moved ? aside : dir, { recursive: true, force: true })
      }),
    writeTag: (vmId, tag) => Effect.tryPromise(() => writeFile(tagPathOf(vmId), JSON.stringify(tag))),
    list: Effect.promise(async () => {
      const names = await readdir(root).catch(() => [] as string[])
      const out: { vmId: string; writtenAtMs: number }[] = []
      for (const name of names) {
        // Names the store did not make (an agent's staging `~fetch-…`, anything not encoded by it) are not images.
        if (name.startsWith("~")) continue
        let vmId: string
        try {
          vmId = decodeURIComponent(name)
        } catch {
          continue
        }
        if (encodeURIComponent(vmId) !== name) continue
        const st = await stat(pathFor(vmId)).catch(() => undefined)
        if (st?.isFile() === true) out.push({ vmId, writtenAtMs: st.mtimeMs })
      }
      return out
    }),
    readTag: (vmId) =>
      Effect.tryPromise(() => readFile(tagPathOf(vmId), "utf8")).pipe(
        Effect.map((text): unknown => JSON.parse(text)),
        Effect.orElseSucceed(() => undefined),
      ),
  }
}
