/**
 * Files an agent and its runtime keep across their restarts and the host's crashes: written
 * whole and synced, with the directory entries that name them.
 */
import { open, rename } from "node:fs/promises"
import { dirname } from "node:path"

/** Writes a file's data to its disk. */
export const syncPath = async (path: string): Promise<void> => {
  const fd = await open(path, "r")
  try {
    await fd.sync()
  } finally {
    await fd.close()
  }
}

/**
 * Writes a directory's entries to its disk: a rename or a new file there is an entry of the
 * directory, which an fsync of the file does not write. A filesystem that cannot sync a
 * directory (EINVAL) is taken as having nothing to sync.
 */
export const syncDir = async (dir: string): Promise<void> => {
  try {
    await syncPath(dir)
  } catch (e) {
    if ((e as { code?: unknown }).code !== "EINVAL") throw e
  }
}

/**
 * Replaces the file at `path` with `text`, atomically and durably: a temporary beside it
 * written and fsynced, renamed over it, then its directory synced (without it a crash soon after
 * may bring back the file of before). A reader finds the old file or the new one, never a part.
 */
export const replace = async (path: string, text: string, mode = 0o644): Promise<void> => {
  const tmp = `${path}.tmp-${process.pid}`
  const fh = await open(tmp, "w", mode)
  try {
    await fh.writeFile(text)
    await fh.sync()
  } finally {
    await fh.close()
  }
  await rename(tmp, path)
  await syncDir(dirname(path))
}
