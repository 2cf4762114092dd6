/**
 * Which coordinator the CLI talks to, and with which token: `--url`/`--token`, else
 * `ENGRAM_URL`/`ENGRAM_TOKEN`, else the default address (`http://127.0.0.1:7070`, or
 * `ENGRAM_PORT`) and the admin token the coordinator wrote to `.engram/admin-token`, looked
 * for in `ENGRAM_DATA_DIR`, then from the directory the command was started in (pnpm's
 * `INIT_CWD`) and the working directory up to the filesystem root. Where the token came from
 * is kept, so an error can say which token was refused.
 */
import { existsSync, readFileSync } from "node:fs"
import { dirname, isAbsolute, join, resolve } from "node:path"

/** A resolved coordinator and token. */
export interface Target {
  readonly url: string
  readonly token: string | null
  /** Where the token came from, for messages: `--token`, `ENGRAM_TOKEN`, or a file's path. */
  readonly tokenSource: string | null
}

/** The default coordinator address. */
export const defaultUrl = (env: Readonly<Record<string, string | undefined>>): string => `http://127.0.0.1:${env["ENGRAM_PORT"] || "7070"}`

const nonEmpty = (s: string | undefined | null): string | undefined => (s === undefined || s === null || s.trim() === "" ? undefined : s.trim())

/** The directories from `start` up to the filesystem root. */
const upwards = function* (start: string): Generator<string> {
  let dir = resolve(start)
  for (;;) {
    yield dir
    const parent = dirname(dir)
    if (parent === dir) return
    dir = parent
  }
}

/** The admin-token files to try, in order. */
export const tokenFiles = (env: Readonly<Record<string, string | undefined>>, cwd: string): readonly string[] => {
  const files: string[] = []
  const dataDir = nonEmpty(env["ENGRAM_DATA_DIR"])
  const starts = [nonEmpty(env["INIT_CWD"]), cwd].filter((d): d is string => d !== undefined)
  if (dataDir !== undefined) files.push(join(isAbsolute(dataDir) ? dataDir : resolve(starts[0] ?? cwd, dataDir), "admin-token"))
  for (const start of starts) for (const dir of upwards(start)) files.push(join(dir, ".engram", "admin-token"))
  return [...new Set(files)]
}

/** Resolves the target from flags, the environment and the filesystem. */
export const resolveTarget = (
  flags: { readonly url: string | undefined; readonly token: string | undefined },
  env: Readonly<Record<string, string | undefined>> = process.env,
  cwd: string = process.cwd(),
): Target => {
  const url = (nonEmpty(flags.url) ?? nonEmpty(env["ENGRAM_URL"]) ?? defaultUrl(env)).replace(/\/+$/, "")
  const fromFlag = nonEmpty(flags.token)
  if (fromFlag !== undefined) return { url, token: fromFlag, tokenSource: "--token" }
  const fromEnv = nonEmpty(env["ENGRAM_TOKEN"])
  if (fromEnv !== undefined) return { url, token: fromEnv, tokenSource: "ENGRAM_TOKEN" }
  for (const file of tokenFiles(env, cwd)) {
    if (!existsSync(file)) continue
    const token = nonEmpty(readFileSync(file, "utf8"))
    if (token !== undefined) return { url, token, tokenSource: file }
  }
  return { url, token: null, tokenSource: null }
}
