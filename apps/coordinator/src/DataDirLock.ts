/**
 * One writer per embedded store (SPEC §12): a coordinator on PGlite holds a lock file in its
 * data directory (`coordinator.lock`, the holder's pid) for as long as it runs. The file is
 * created atomically, its pid already in it (a link of a file of our own: it fails if the lock
 * exists); a second coordinator on the same directory finds it and refuses to start, naming
 * the holder's pid. A lock whose pid no longer runs (the holder was killed) is stale: it is
 * taken over, and that is logged. The lock is removed when the coordinator stops.
 */
import { Data, Effect } from "effect"
import type { Scope } from "effect"
import { linkSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"

/** The lock file's name inside the data directory. */
export const lockFileName = "coordinator.lock"

/** Another running coordinator holds the data directory. */
export class DataDirLocked extends Data.TaggedError("DataDirLocked")<{
  readonly dataDir: string
  readonly lockFile: string
  readonly pid: number
}> {
  override get message(): string {
    return `the data directory ${this.dataDir} is in use by another coordinator (pid ${this.pid}, lock file ${this.lockFile}): stop that one, or give this one another ENGRAM_DATA_DIR`
  }
}

/** Whether a process with this pid runs (one we may not signal runs too). */
export const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as { code?: unknown }).code === "EPERM"
  }
}

/** The pid a lock file names, or null when it names none (empty, or written only in part). */
const holderOf = (file: string): number | null => {
  try {
    const pid = Number(readFileSync(file, "utf8").trim())
    return Number.isInteger(pid) && pid > 0 ? pid : null
  } catch {
    return null
  }
}

/**
 * Creates the lock file with our pid, atomically; false when it already exists. The pid is
 * written to a file of our own first, then linked to the lock's name (a link, like `wx`, fails
 * if the name exists): the lock never exists without its pid in it.
 */
const create = (file: string): boolean => {
  const own = `${file}.${process.pid}.new`
  writeFileSync(own, `${process.pid}\n`, { flag: "w", mode: 0o644 })
  try {
    linkSync(own, file)
    return true
  } catch (e) {
    if ((e as { code?: unknown }).code === "EEXIST") return false
    throw e
  } finally {
    rmSync(own, { force: true })
  }
}

/**
 * Moves a stale lock out of the way (a rename is atomic): true when the file moved was the
 * stale one. Two coordinators taking over at once: the second may move the lock the first
 * just created; it sees a live pid in what it moved and puts it back (a link, which fails if
 * a lock exists again), so exactly one of them ends up holding the directory.
 */
const moveAside = (file: string, stalePid: number | null): boolean => {
  const aside = `${file}.stale-${process.pid}`
  try {
    renameSync(file, aside)
  } catch (e) {
    if ((e as { code?: unknown }).code === "ENOENT") return false
    throw e
  }
  const moved = holderOf(aside)
  const stale = moved === stalePid || moved === null || !isAlive(moved)
  if (!stale) {
    try {
      linkSync(aside, file)
    } catch {
      // A lock exists again: its holder decides.
    }
  }
  rmSync(aside, { force: true })
  return stale
}

/**
 * Takes the lock on `dataDir` for the scope: fails `DataDirLocked` while a running process
 * holds it; takes over a stale one (its pid does not run) with a warning; removes it when the
 * scope closes (if it is still ours).
 */
export const acquire = (dataDir: string): Effect.Effect<void, DataDirLocked, Scope.Scope> => {
  const file = join(dataDir, lockFileName)
  return Effect.acquireRelease(
    Effect.gen(function* () {
      for (let attempt = 0; ; attempt++) {
        if (create(file)) return
        const pid = holderOf(file)
        if (pid !== null && isAlive(pid)) return yield* new DataDirLocked({ dataDir, lockFile: file, pid })
        // A holder that no longer runs (or a file that names none): move it aside and create
        // ours; a takeover racing ours may win, and we see its pid next round.
        if (attempt >= 3) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: pid ?? 0 })
        if (moveAside(file, pid))
          yield* Effect.logWarning(
            pid === null
              ? `taking over the lock file ${file}: it names no process`
              : `taking over a stale lock on the data directory: its holder (pid ${pid}) no longer runs`,
            { lockFile: file, stalePid: pid },
          )
      }
    }),
    () =>
      Effect.sync(() => {
        if (holderOf(file) === process.pid) rmSync(file, { force: true })
      }),
  )
}
