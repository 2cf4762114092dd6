/**
 * The replicas that hung lately: each command makes a new client, so without a memory every
 * command against a frozen first replica waits out `ENGRAM_TIMEOUT_MS` on it again. A replica that
 * took a call and did not answer is remembered for `rememberMs` in a small file of the CLI's state
 * (`$XDG_STATE_HOME/engram/`, else `~/.local/state/engram/`), and tried after the others meanwhile.
 * A file that cannot be read or written is as good as none: the memory only orders, never skips.
 */
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { homedir } from "node:os"
import { dirname, join } from "node:path"

/** How long a replica that hung is tried last. */
export const rememberMs = 60_000

/** The memory's file. */
export const hungFile = (env: Readonly<Record<string, string | undefined>>): string =>
  join(env["XDG_STATE_HOME"]?.trim() || join(homedir(), ".local", "state"), "engram", "hung-replicas.json")

/** The replicas that hung within `rememberMs` of `now`, with when. */
export const recent = (file: string, now: number): Record<string, number> => {
  try {
    const read: unknown = JSON.parse(readFileSync(file, "utf8"))
    return Object.fromEntries(Object.entries(read as object).filter((e): e is [string, number] => typeof e[1] === "number" && e[1] <= now && now - e[1] < rememberMs))
  } catch {
    return {}
  }
}

/** `urls` with the ones that hung lately last, each part in its given order. */
export const ordered = <U extends string>(urls: readonly [U, ...U[]], hung: Record<string, number>): readonly [U, ...U[]] =>
  [...urls.filter((u) => !Object.hasOwn(hung, u)), ...urls.filter((u) => Object.hasOwn(hung, u))] as unknown as readonly [U, ...U[]]

/** Remembers that `url` hung at `now` (written whole, then renamed: a reader never sees half a file). */
export const remember = (file: string, url: string, now: number): void => {
  try {
    mkdirSync(dirname(file), { recursive: true, mode: 0o700 })
    writeFileSync(`${file}.${process.pid}`, JSON.stringify({ ...recent(file, now), [url]: now }), { mode: 0o600 })
    renameSync(`${file}.${process.pid}`, file)
  } catch {
    try {
      rmSync(`${file}.${process.pid}`, { force: true })
    } catch {
      // Nothing more to do: a temporary file left behind is overwritten by this pid's next write.
    }
    // Not remembered: the next command tries the replicas in their given order.
  }
}
