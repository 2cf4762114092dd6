/**
 * One writer per embedded store (SPEC §12): a coordinator on PGlite holds a lock file in its
 * data directory (`coordinator.lock`: the holder's pid, start, boot and PID namespace,
 * `Pid.format`) for as long as it runs, and touches it every `refreshMs`. The file is created
 * atomically, its owner already in it (a link of a file of our own: it fails if the lock
 * exists); a second coordinator on the same directory finds it and refuses to start, naming the
 * holder's pid. A lock whose holder no longer runs (killed) is stale: it is taken over, and that
 * is logged. The lock is removed when the coordinator stops.
 *
 * Whether the holder runs (`Pid.judge`): in this PID namespace, while its pid runs with the same
 * start in the same boot (a frozen holder runs); a pid alone is reused, so a lock naming this
 * coordinator's own pid, or a pid another process has since, is stale. A holder in another PID
 * namespace (another container on the same volume, or this container's crashed predecessor:
 * a restarted container has a namespace of its own, and its coordinator the pid the old one had)
 * or of another boot id (another machine mounting the volume, or this one before a reboot)
 * cannot be seen from here: it runs while it touches the file. Such a lock is watched, on this
 * process's clock alone: touched meanwhile, its holder runs and this coordinator refuses;
 * untouched for `staleAfterMs`, it is taken over. It is watched however old its last touch
 * looks: that time is the other machine's clock, which may be any amount behind this one's, so
 * a lock it touches every `refreshMs` could look untouched for minutes (the cost: a coordinator
 * restarted in a new container, or after a reboot, starts `staleAfterMs` later). A holder that
 * finds its lock no longer its own (it was frozen or cut off that long, and another
 * took over) says so (`onLost`): the coordinator then exits, so that one process writes the
 * directory. A lock naming only a pid (written by a coordinator before this one) is judged by
 * the pid alone, in this namespace, except this coordinator's own pid, which no other process
 * here can have.
 */
import { Pid } from "@engram/process"
import { Clock, Data, Effect } from "effect"
import type { Scope } from "effect"
import { existsSync, linkSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs"
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

/** How often a holder touches its lock file (ms). */
export const refreshMs = 2_000

/** A lock whose holder cannot be seen from here (another PID namespace, boot or machine) is stale once watched untouched this long (ms). */
export const staleAfterMs = 10_000

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

/** When lock `file` was last touched (epoch ms), or undefined when it is gone. */
const touchedAt = (file: string): number | undefined => {
  try {
    return statSync(file).mtimeMs
  } catch {
    return undefined
  }
}

/**
 * Whether `owner`, named by lock `file`, holds it as far as this process can see: this process
 * if it does hold it; another of this PID namespace while it runs; "unseen" for one of another
 * namespace or boot (whether it touches the lock decides).
 */
const holds = (file: string, owner: Pid.Owner): boolean | "unseen" => {
  const seen = Pid.judge(owner)
  if (seen === "unseen") return "unseen"
  return owner.pid === process.pid ? held.has(file) : seen === "runs"
}

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
  // Another owner than the one judged stale (a takeover raced this one): its own if it runs, or
  // if it cannot be seen (the next round watches it).
  const movedStale = moved === null || same(moved, stale) || holds(file, moved) === false
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

/** What `acquire` is told beyond its directory. */
export interface AcquireOptions {
  /**
   * Told once if the lock stops being this process's while it holds it (another coordinator
   * took it over: this one was frozen or cut off for longer than `staleAfterMs`): the caller
   * must stop writing the directory.
   */
  readonly onLost?: ((why: string) => void) | undefined
}

/**
 * Takes the lock on `dataDir` for the scope, touched every `refreshMs` while it lasts: fails
 * `DataDirLocked` while a running process holds it (one that cannot be seen from here: touched
 * while watched); takes over a stale one with a warning; removes it when the scope closes (if
 * it is still ours).
 */
export const acquire = (dataDir: string, options: AcquireOptions = {}): Effect.Effect<void, DataDirLocked, Scope.Scope> => {
  const file = join(dataDir, lockFileName)
  return Effect.acquireRelease(
    Effect.gen(function* () {
      // The unseen holder watched: its record, its lock's last touch when first seen, and when (this monotonic clock).
      let watched: { readonly record: string; readonly touched: number; readonly sinceMs: number } | null = null
      for (let attempt = 0; ; ) {
        if (create(file)) {
          held.add(file)
          return
        }
        // The watch is timed on the monotonic clock: a step of the wall clock neither ends nor extends it.
        const nowMs = Number((yield* Clock.Clock).monotonicTimeNanosUnsafe() / 1_000_000n)
        const owner = holderOf(file)
        const pid = owner?.pid ?? null
        const verdict = owner === null ? false : holds(file, owner)
        if (owner !== null && verdict === true) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: owner.pid })
        const touched = touchedAt(file)
        if (owner !== null && verdict === "unseen" && touched !== undefined) {
          // Watched for a touch, on this clock alone.
          const record = Pid.format(owner)
          if (watched === null || watched.record !== record) {
            watched = { record, touched, sinceMs: nowMs }
            yield* Effect.logWarning(
              `the lock on the data directory names a coordinator this one cannot see (another PID namespace, boot or machine; pid ${owner.pid} there): watching it up to ${staleAfterMs / 1000} s (a running one touches it every ${refreshMs / 1000} s, and then this one exits; a crashed one's is then taken over)`,
              { lockFile: file, holderPid: owner.pid },
            )
          } else if (touched !== watched.touched) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: owner.pid })
          if (nowMs - watched.sinceMs < staleAfterMs) {
            yield* Effect.sleep(refreshMs)
            continue
          }
        }
        // A holder that no longer runs (or a file that names none): move it aside and create
        // ours; a takeover racing ours may win, and we see its owner next round.
        if (++attempt > 3) return yield* new DataDirLocked({ dataDir, lockFile: file, pid: pid ?? 0 })
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
  ).pipe(Effect.andThen(Effect.forkScoped(refresh(file, options.onLost))), Effect.asVoid)
}

/**
 * Touches lock `file` every `refreshMs` while it names this process (so one that cannot see us
 * knows we run). Once it names another, or is gone at two touches in a row (a takeover moves it
 * aside for a moment), `onLost` is told and the touches end.
 */
const refresh = (file: string, onLost?: (why: string) => void): Effect.Effect<void> =>
  Effect.gen(function* () {
    const me = Pid.self()
    let missing = 0
    for (;;) {
      yield* Effect.sleep(refreshMs)
      const nowS = (yield* Clock.currentTimeMillis) / 1000
      const owner = holderOf(file)
      if (same(owner, me)) {
        missing = 0
        try {
          utimesSync(file, nowS, nowS)
        } catch {
          // Unwritable for now: the next touch tries again; a holder that cannot touch its lock
          // looks stale only to a coordinator that cannot see it.
        }
        continue
      }
      if (owner === null && existsSync(file)) continue
      if (owner === null && ++missing < 2) continue
      const why =
        owner === null
          ? `the data directory's lock file ${file} is gone`
          : `the data directory's lock file ${file} names another coordinator (pid ${owner.pid}): it took the lock over while this one was frozen or cut off for longer than ${staleAfterMs / 1000} s`
      yield* Effect.logError(`${why}; this coordinator must stop writing the directory`, { lockFile: file })
      onLost?.(why)
      return
    }
  })
