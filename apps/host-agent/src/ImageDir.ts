/**
 * Where an agent keeps its descent images when `ENGRAM_AGENT_IMAGE_DIR` is unset. A descended
 * session's image is the user's memory: a restarted agent must find it again, so an agent with a
 * state file keeps them in a fixed directory per host (before: `mkdtemp` on every start, so a
 * restart lost every image and a resume booted a fresh guest).
 *
 * - With a state file: `engram-images-<host>` beside it, as QEMU's VM directory
 *   (`engram-qemu-<host>`): what the operator keeps across restarts, on one filesystem.
 * - Without one: a new directory under the temp directory on every start (`mkdtemp`, mode 0700),
 *   as before. Such an agent forgets its residents on restart, and a fixed name there would be
 *   shared by every agent process of the same host id on the machine (tests, a second agent by
 *   mistake), whose images are found by session id alone: one would restore another's guest.
 *   An operator who wants images back after a restart sets a state file (or the directory).
 * The directory beside a state file must be this agent's own: created mode 0700, not a symlink,
 * owned by this user.
 */
import { chmodSync, lstatSync, mkdirSync, mkdtempSync } from "node:fs"
import { dirname, join } from "node:path"
import { Env } from "@engram/process"
import { Effect } from "effect"

/** The variable that overrides the default. */
export const variable = "ENGRAM_AGENT_IMAGE_DIR"

/** The default image directory of `hostId` beside its state file. */
export const defaultImageDir = (hostId: string, stateFile: string): string => join(dirname(stateFile), `engram-images-${encodeURIComponent(hostId)}`)

/**
 * Why `dir` cannot hold this agent's images (undefined: it can), after creating it mode 0700
 * when absent. `uid`: this process's user (undefined where the platform has none: not checked).
 * A directory of ours that others may read is narrowed to 0700.
 */
export const ownDirProblem = (dir: string, uid: number | undefined): string | undefined => {
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 })
    const st = lstatSync(dir)
    if (st.isSymbolicLink()) return `${dir} is a symbolic link`
    if (!st.isDirectory()) return `${dir} is not a directory`
    if (uid !== undefined && st.uid !== uid) return `${dir} belongs to uid ${st.uid}, not to this agent's user (uid ${uid})`
    if ((st.mode & 0o077) !== 0) chmodSync(dir, 0o700)
    return undefined
  } catch (e) {
    return `${dir} cannot be created: ${e instanceof Error ? e.message : String(e)}`
  }
}

/**
 * The agent's image directory: `imageDir` as given (the operator's, created on first use), else
 * the default, made ready here (a new one per start without a state file). A default that is not
 * this agent's own fails the start, naming the variable that sets another.
 */
export const resolve = (hostId: string, imageDir: string | undefined, stateFile: string | undefined, tmp: string): Effect.Effect<string, Env.ConfigInvalid> =>
  Effect.suspend(() => {
    if (imageDir !== undefined) return Effect.succeed(imageDir)
    if (stateFile === undefined) return Effect.succeed(mkdtempSync(join(tmp, `engram-images-${encodeURIComponent(hostId)}-`)))
    const dir = defaultImageDir(hostId, stateFile)
    const problem = ownDirProblem(dir, process.getuid?.())
    return problem === undefined
      ? Effect.succeed(dir)
      : Effect.fail(new Env.ConfigInvalid({ component: "host agent", issues: [{ variable, rule: `is unset and its default cannot be used: ${problem}; set it to a directory of this agent's own` }] }))
  })
