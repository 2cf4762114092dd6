/**
 * Which coordinator the CLI talks to, and with which token: `--url`/`--token`, else
 * `ENGRAM_URL`/`ENGRAM_TOKEN` (a URL may be a comma-separated list of replicas), else the default address (`http://127.0.0.1:7070`, or
 * `ENGRAM_PORT`) and the admin token the coordinator wrote to `.engram/admin-token`, looked
 * for in `ENGRAM_DATA_DIR`, then from the directory the command was started in (pnpm's
 * `INIT_CWD`) and the working directory up to the filesystem root — that file only for a URL on
 * this machine (loopback): a remote coordinator needs `--token` or `ENGRAM_TOKEN`. Where the
 * token came from is kept, so an error can say which token was refused.
 */
import { Replicas } from "@engram/client"
import { existsSync, readFileSync } from "node:fs"
import { dirname, isAbsolute, join, resolve } from "node:path"

/** A resolved coordinator and token. */
export interface Target {
  /** The coordinator's URL, or its replicas' comma-separated as given (`urls` in order). */
  readonly url: string
  /** The replicas, tried in turn on a connection failure or a 502/503/504 (`Replicas.unreachable`). */
  readonly urls: readonly [string, ...string[]]
  /** Where the URL came from, for messages: `--url`, `ENGRAM_URL`, or the default. */
  readonly urlSource: string
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

/** Whether `url` names this machine: `localhost`, 127.0.0.0/8 or `[::1]`. */
export const isLoopback = (url: string): boolean => {
  const host = new URL(url).hostname
  return host === "localhost" || host === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)
}

/** A `--url`/`ENGRAM_URL` (or `ENGRAM_PORT`) that breaks the rule: the setting, the value (secrets masked) and the rule. */
export interface BadUrl {
  readonly problem: string
}

/**
 * Resolves the target from flags, the environment and the filesystem. The URL is one
 * coordinator's or a comma-separated list of its replicas' (as the host agent's
 * `ENGRAM_COORDINATOR_URL`), each an absolute `http://` or `https://` URL (`Replicas.parseUrls`);
 * one that breaks the rule is answered as a `BadUrl` naming the setting.
 */
export const resolveTarget = (
  flags: { readonly url: string | undefined; readonly token: string | undefined },
  env: Readonly<Record<string, string | undefined>> = process.env,
  cwd: string = process.cwd(),
): Target | BadUrl => {
  const fromUrlFlag = nonEmpty(flags.url)
  const fromUrlEnv = nonEmpty(env["ENGRAM_URL"])
  const urlSource = fromUrlFlag !== undefined ? "--url" : fromUrlEnv !== undefined ? "ENGRAM_URL" : nonEmpty(env["ENGRAM_PORT"]) !== undefined ? "ENGRAM_PORT" : "the default URL"
  const given = fromUrlFlag ?? fromUrlEnv ?? defaultUrl(env)
  const parsed = Replicas.parseUrls(given)
  if (!("urls" in parsed)) return { problem: `${urlSource} ${JSON.stringify(Replicas.redactUrl(given))}: ${parsed.problem}` }
  const urls = parsed.urls.map(Replicas.baseUrlOf) as unknown as readonly [string, ...string[]]
  const base = { url: urls.join(","), urls, urlSource }
  const fromFlag = nonEmpty(flags.token)
  if (fromFlag !== undefined) return { ...base, token: fromFlag, tokenSource: "--token" }
  const fromEnv = nonEmpty(env["ENGRAM_TOKEN"])
  if (fromEnv !== undefined) return { ...base, token: fromEnv, tokenSource: "ENGRAM_TOKEN" }
  // The token file is a local coordinator's: it goes only to addresses on this machine, never
  // to a URL elsewhere (over plain http, a token anyone on the path could read).
  if (!urls.every(isLoopback)) return { ...base, token: null, tokenSource: null }
  for (const file of tokenFiles(env, cwd)) {
    if (!existsSync(file)) continue
    const token = nonEmpty(readFileSync(file, "utf8"))
    if (token !== undefined) return { ...base, token, tokenSource: file }
  }
  return { ...base, token: null, tokenSource: null }
}
