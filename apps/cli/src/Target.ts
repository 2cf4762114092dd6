/**
 * Which coordinator the CLI talks to, and with which token: `--url`/`--token`, else
 * `ENGRAM_URL`/`ENGRAM_TOKEN` (a URL may be a comma-separated list of replicas), else the default address (`http://127.0.0.1:7070`, or
 * `ENGRAM_PORT`) and the admin token the coordinator wrote to `.engram/admin-token`, looked
 * for in `ENGRAM_DATA_DIR`, then from the directory the command was started in (pnpm's
 * `INIT_CWD`) and the working directory up to the filesystem root — that file only for a URL on
 * this machine (loopback): a remote coordinator needs `--token` or `ENGRAM_TOKEN`. Where the
 * token came from is kept, so an error can say which token was refused.
 *
 * No URL or token is trimmed: one given with whitespace before or after it (a blank pasted
 * with it, a newline copied from a file) is refused naming where it came from, never sent as
 * another value; the token file may end in one newline (the coordinator writes it so). Empty is
 * unset. `ENGRAM_DATA_DIR` too, where a token file is looked for: the coordinator refuses such a
 * data dir at start, so none wrote its token there, and trimming would read another's.
 * `INIT_CWD` is taken as pnpm wrote it (the directory it ran in, which may end in a blank), as
 * the coordinator takes it. `ENGRAM_PORT` is a port, 1 to 65535, by core's rule for an integer
 * read from text (`Names.decimalInt`, the coordinator's).
 */
import { Replicas } from "@engram/client"
import { Names } from "@engram/core"
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

/** The default coordinator address: port 7070, or `ENGRAM_PORT` (`portProblem` judged it) as a number (`07070` is 7070). */
export const defaultUrl = (env: Readonly<Record<string, string | undefined>>): string => `http://127.0.0.1:${Number(env["ENGRAM_PORT"] || "7070")}`

/** The rule of `ENGRAM_PORT`, as a refusal says it. */
export const portRule = "must be an integer from 1 to 65535 in decimal digits (the port of the coordinator on this machine)"

/**
 * Why `ENGRAM_PORT` (set, not empty) is refused, or undefined: a TCP port a coordinator listens
 * on, 1 to 65535, read as the coordinator reads the same variable (core's `Names.decimalInt`: a
 * sign and leading zeros are taken, `+7070` is 7070). Pasted into the default URL as it was, `0`
 * named no coordinator, `7070/x` a path prefix, and a blank made the error blame "the default URL".
 */
export const portProblem = (raw: string): string | undefined => {
  const n = Names.decimalInt.test(raw) ? Number(raw) : Number.NaN
  return n >= 1 && n <= 65535 ? undefined : `ENGRAM_PORT ${JSON.stringify(raw)}: ${portRule}`
}

/** The rule of a URL or token given with whitespace around it, as a refusal says it (after its source). */
export const whitespaceRule = "must not begin or end with whitespace (empty is unset)"

/** The rule of the token in a token file, as a refusal says it (after the file). */
export const tokenFileRule = "must not begin or end with whitespace (one trailing newline is taken)"

/**
 * The first of `candidates` (a source and its value: `--url` then `ENGRAM_URL`) that is set (not
 * absent or empty), untouched; `{ problem }` when whitespace surrounds it (its source named, the
 * value shown only as `shown` masks it, never for a token); undefined when none is set.
 */
const firstGiven = (
  candidates: readonly (readonly [string, string | undefined])[],
  shown?: (v: string) => string,
): { readonly source: string; readonly value: string } | BadSetting | undefined => {
  for (const [source, value] of candidates) {
    if (value === undefined || value === "") continue
    if (value.trim() === value) return { source, value }
    return { problem: `${source}${shown === undefined ? "" : ` ${JSON.stringify(shown(value))}`}: ${whitespaceRule}` }
  }
  return undefined
}

/**
 * The token of a token file's text: the text without one trailing newline (`\n` or `\r\n`, as
 * the coordinator writes it and editors leave it); undefined when that is empty (the file holds
 * none); `{ problem }` naming the file when whitespace is left around it.
 */
export const tokenOfFile = (text: string, file: string): { readonly value: string } | BadSetting | undefined => {
  const token = text.endsWith("\r\n") ? text.slice(0, -2) : text.endsWith("\n") ? text.slice(0, -1) : text
  if (token === "") return undefined
  return token.trim() === token ? { value: token } : { problem: `the token in ${file} ${tokenFileRule}` }
}

// Empty is unset; any other value as given (`resolveTarget` refuses a data dir with whitespace around it).
const nonEmpty = (s: string | undefined): string | undefined => (s === undefined || s === "" ? undefined : s)

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

/**
 * A URL or token setting that breaks its rule (`--url`, `ENGRAM_URL`, `ENGRAM_PORT`, `--token`,
 * `ENGRAM_TOKEN`, the token file): the setting, the value (a URL's secrets masked, a token's
 * never shown) and the rule.
 */
export interface BadSetting {
  readonly problem: string
}

/** The former name of {@link BadSetting}, when only URLs were judged. */
export type BadUrl = BadSetting

/**
 * Resolves the target from flags, the environment and the filesystem. The URL is one
 * coordinator's or a comma-separated list of its replicas' (as the host agent's
 * `ENGRAM_COORDINATOR_URL`), each an absolute `http://` or `https://` URL (`Replicas.parseUrls`);
 * a URL, port or token that breaks its rule is answered as a `BadSetting` naming the setting.
 */
export const resolveTarget = (
  flags: { readonly url: string | undefined; readonly token: string | undefined },
  env: Readonly<Record<string, string | undefined>> = process.env,
  cwd: string = process.cwd(),
): Target | BadSetting => {
  const url = firstGiven([["--url", flags.url], ["ENGRAM_URL", env["ENGRAM_URL"]]], Replicas.redactUrl)
  if (url !== undefined && "problem" in url) return url
  const port = env["ENGRAM_PORT"]
  const urlSource = url?.source ?? (port !== undefined && port !== "" ? "ENGRAM_PORT" : "the default URL")
  // The port only where it is used: a shell may export the coordinator's (0 there takes any free one) beside ENGRAM_URL.
  if (urlSource === "ENGRAM_PORT") {
    const problem = portProblem(port ?? "")
    if (problem !== undefined) return { problem }
  }
  const chosen = url?.value ?? defaultUrl(env)
  const parsed = Replicas.parseUrls(chosen)
  if (!("urls" in parsed)) return { problem: `${urlSource} ${JSON.stringify(Replicas.redactUrl(chosen))}: ${parsed.problem}` }
  const urls = parsed.urls.map(Replicas.baseUrlOf) as unknown as readonly [string, ...string[]]
  const base = { url: urls.join(","), urls, urlSource }
  const token = firstGiven([["--token", flags.token], ["ENGRAM_TOKEN", env["ENGRAM_TOKEN"]]])
  if (token !== undefined) return "problem" in token ? token : { ...base, token: token.value, tokenSource: token.source }
  // The token file is a local coordinator's: it goes only to addresses on this machine, never
  // to a URL elsewhere (over plain http, a token anyone on the path could read).
  if (!urls.every(isLoopback)) return { ...base, token: null, tokenSource: null }
  // The data dir only where it is used, as the port: by the rule of every CLI setting (and the coordinator's ENGRAM_DATA_DIR's).
  const dataDir = firstGiven([["ENGRAM_DATA_DIR", env["ENGRAM_DATA_DIR"]]], (v) => v)
  if (dataDir !== undefined && "problem" in dataDir) return dataDir
  for (const file of tokenFiles(env, cwd)) {
    if (!existsSync(file)) continue
    const token = tokenOfFile(readFileSync(file, "utf8"), file)
    if (token !== undefined) return "problem" in token ? token : { ...base, token: token.value, tokenSource: file }
  }
  return { ...base, token: null, tokenSource: null }
}
