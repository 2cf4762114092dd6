/**
 * A copy of the workspace to release from, so the test never changes the checkout: the files
 * git tracks or would track (the working tree as it is, uncommitted changes included) and the
 * built `dist` of each package. Then what a maintainer runs: `changeset version` (versions,
 * changelogs, the changesets consumed) and `pnpm publish -r` (each `workspace:` range becomes
 * the version it points at).
 */
import { execFileSync } from "node:child_process"
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"

/** A package of the workspace: its folder (relative), name, version and whether it is published. */
export interface WorkspacePackage {
  readonly dir: string
  readonly name: string
  readonly version: string
  readonly published: boolean
  readonly dependencies: Readonly<Record<string, string>>
}

/** Every package of a workspace (`packages/*`, `apps/*`, `tooling/*`). */
export const packagesOf = (root: string): WorkspacePackage[] =>
  ["packages", "apps", "tooling"].flatMap((group) =>
    readdirSync(join(root, group))
      .map((name) => join(group, name))
      .filter((dir) => existsSync(join(root, dir, "package.json")))
      .map((dir) => {
        const m = JSON.parse(readFileSync(join(root, dir, "package.json"), "utf8")) as { name: string; version: string; private?: boolean; dependencies?: Record<string, string> }
        return { dir, name: m.name, version: m.version, published: m.private !== true, dependencies: m.dependencies ?? {} }
      }),
  )

/** The published packages whose build is missing: `pnpm build` first. */
export const unbuilt = (root: string): string[] =>
  packagesOf(root)
    .filter((p) => p.published && existsSync(join(root, p.dir, "tsup.config.ts")) && !existsSync(join(root, p.dir, "dist")))
    .map((p) => p.name)

/** Copies the workspace at `root` to `to`: git's files of the working tree and every package's `dist`. */
export const copyWorkspace = (root: string, to: string): void => {
  const files = execFileSync("git", ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], { cwd: root, encoding: "utf8", maxBuffer: 64 << 20 })
    .split("\0")
    .filter((f) => f !== "" && existsSync(join(root, f)))
  for (const f of files) {
    mkdirSync(dirname(join(to, f)), { recursive: true })
    cpSync(join(root, f), join(to, f))
  }
  for (const p of packagesOf(root)) if (existsSync(join(root, p.dir, "dist"))) cpSync(join(root, p.dir, "dist"), join(to, p.dir, "dist"), { recursive: true })
}

/** The environment of a package-manager child: nothing of the pnpm that runs this test. */
export const cleanEnv = (extra: Record<string, string> = {}): Record<string, string> => ({
  ...Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !/^(npm_|pnpm_|PNPM_|INIT_CWD$|ENGRAM_)/i.test(e[0]))),
  ...extra,
})

/** `changeset version` in the copy, with the checkout's changesets CLI. */
export const versionPackages = (root: string, copy: string): void => {
  execFileSync(join(root, "node_modules", ".bin", "changeset"), ["version"], { cwd: copy, env: cleanEnv(), stdio: ["ignore", "pipe", "pipe"] })
}

/**
 * `pnpm publish -r` from the copy to `registry` (its `.npmrc` holds the token). pnpm resolves
 * `workspace:` ranges from what is installed, so the copy is installed first, from pnpm's store
 * alone (the checkout's lockfile, offline, no scripts).
 */
export const publishAll = (copy: string, npmrc: string, registry: string): string => {
  execFileSync("pnpm", ["install", "--frozen-lockfile", "--offline", "--ignore-scripts"], { cwd: copy, env: cleanEnv(), stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 << 20 })
  writeFileSync(join(copy, ".npmrc"), npmrc)
  return execFileSync("pnpm", ["publish", "-r", "--no-git-checks", "--registry", registry], {
    cwd: copy,
    env: cleanEnv({ npm_config_userconfig: join(copy, ".npmrc") }),
    encoding: "utf8",
    maxBuffer: 64 << 20,
  })
}
