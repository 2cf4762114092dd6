/**
 * One writer per embedded store (SPEC §12): a coordinator on PGlite holds a lock file in its
 * data directory (`coordinator.lock`: the holder's pid, its start and its boot, `Pid.format`) for
 * as long as it runs. The file is created atomically, its owner already in it (a link of a file
 * of our own: it fails if the lock exists); a second coordinator on the same directory finds it
 * and refuses to start, naming the holder's pid. A lock whose holder no longer runs (killed) is
 * stale: it is taken over, and that is logged. A holder runs only while its pid runs with the
 * same start in the same boot (`Pid.runs`): a container restarted after a crash gives the new
 * coordinator the pid the old one had, and after a reboot another process may have it; either
 * would otherwise keep the directory locked for good. A lock naming only a pid (written by a
 * coordinator before this one) is judged by the pid alone, except our own pid, which no other
 * running process can have. The lock is removed when the coordinator stops.
 */
import { Pid } from "@engram/process"
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

/** The lock files this process holds (a second hold of one in the same process is refused too). */
const held = new Set<string>()

/** The owner a lock file names, or null when it names none (empty, or written only in part). */
const holderOf = (file: string): Pid.Owner | null => {
  try {
    return Pid.parse(readFileSync(file, "utf8")) ?? null
  } catch {
    return null
  }
}

/** Whether the owner of lock `file` still holds it: this process if it does hold it, another while it runs. */
const holds = (file: string, owner: Pid.Owner): boolean => (owner.pid === process.pid ? held.has(file) : Pid.runs(owner))

/** Whether two lock records name the same owner. */
const same = (a: Pid.Owner | null, b: Pid.Owner | null): boolean => (a === null ? b === null : b !== null && Pid.format(a) === Pid.format(b))

/**
 * Creates the lock file naming this process, atomically; false when it already exists. The
 * owner is written to a file of our own first, then linked to the lock's name (a link, like
 * `wx`, fails if the name exists): the lock never exists without its owner in it.
 */
const create = (file: string): boolean => {
  const own = `${file}.${process.pid}.new`
  writeFileSync(own, `${Pid.format(Pid.self())}\n`, { flag: "w", mode: 0o644 })
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
const moveAside = (file: string, stale: Pid.Owner | null): boolean => {
  const aside = `${file}.stale-${process.pid}`
  try {
    renameSync(file, aside)
  } catch (e) {
    if ((e as { code?: unknown }).code === "ENOENT") return false
    throw e
  }
  const moved = holderOf(aside)
  const movedStale = moved === null || same(moved, stale) || !holds(file, moved)
  if (!movedStale) {
    try {
      linkSync(aside, file)
    } catch {
      // A lock exists again: its holder decides.
    }
  }
  rmSync(aside, { force: true })
  return movedStale
}

/**
 * Takes the lock on `dataDir` for the scope: fails `DataDirLocked` while a running process
 * holds it; takes over a stale one (its holder does not run) with a warning; removes it when the
 * scope closes (if it is still ours).
 */
export const acquire = (dataDir: string): Effect.Effect<void, DataDirLocked, Scope.Scope> => {
  const file = join(dataDir, lockFileName)
  return Effect.acquireRelease(
    Effect.gen(function* () {
      for (let attempt = 0; ; attempt++) {
        if (create(file)) {
          held.add(file)
          return
        }
        const owner = holderOf(file)
        const pid = owner?.pid ?? null
        if (owner !== null && holds(file, owner)) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: owner.pid })
        // A holder that no longer runs (or a file that names none): move it aside and create
        // ours; a takeover racing ours may win, and we see its owner next round.
        if (attempt >= 3) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: pid ?? 0 })
        if (moveAside(file, owner))
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
        held.delete(file)
        if (same(holderOf(file), Pid.self())) rmSync(file, { force: true })
      }),
  )
}
