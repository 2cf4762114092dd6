/** Files the agent keeps across its restarts and the host's crashes. */
import { open, rename } from "node:fs/promises"
import { dirname } from "node:path"

/**
 * Replaces the file at `path` with `text`, atomically and durably: a temporary beside it
 * written and fsynced, renamed over it, then its directory fsynced (the rename is an entry of the
 * directory, which the file's fsync does not write: without it a crash soon after may bring back
 * the file of before). A reader finds the old file or the new one, never a part.
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
  const dir = await open(dirname(path), "r")
  try {
    await dir.sync()
  } finally {
    await dir.close()
  }
}
