/**
 * Which coordinator a bench runs. `dist` (the default) is the coordinator as it ships and as its
 * README tells operators to run it: `node apps/coordinator/dist/main.js`, built by tsup, no tsx.
 * `source` is `apps/coordinator/src/main.ts` under tsx with the `@engram/source` condition (what
 * `pnpm start` runs): tsx compiles with esbuild's `keepNames` (a `__name` call and a `name`
 * property of its own for every named closure made) and turns on source maps (more allocation
 * per request; on a quiet machine, 7 December, creates cost no more CPU than the build's).
 */
import { spawnSync } from "node:child_process"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"

export type CoordinatorMode = "dist" | "source"

/** The mode an environment variable asks for (`dist` when unset or empty), and whether it was asked for. */
export const coordinatorMode = (variable: string): { readonly mode: CoordinatorMode; readonly explicit: boolean } => {
  const value = process.env[variable] ?? ""
  if (value === "") return { mode: "dist", explicit: false }
  if (value === "dist" || value === "source") return { mode: value, explicit: true }
  throw new Error(`${variable}=${value}: must be "dist" (the built coordinator, node dist/main.js) or "source" (src/main.ts under tsx)`)
}

/**
 * `packages` and the workspace packages they import at run time (their `dependencies`, not the
 * `devDependencies`: a package's tests and benches pull in most of the workspace), by name, from
 * the checkout at `root` (`apps/*`, `packages/*`, `tooling/*`).
 */
const runtimeClosure = (root: string, packages: readonly string[]): string[] => {
  const manifests = new Map<string, { dependencies?: Record<string, string> }>()
  for (const group of ["apps", "packages", "tooling"]) {
    const dir = join(root, group)
    if (!existsSync(dir)) continue
    for (const entry of readdirSync(dir)) {
      const file = join(dir, entry, "package.json")
      if (!existsSync(file)) continue
      const manifest = JSON.parse(readFileSync(file, "utf8")) as { name?: string; dependencies?: Record<string, string> }
      if (manifest.name !== undefined) manifests.set(manifest.name, manifest)
    }
  }
  const out = new Set<string>()
  const visit = (name: string): void => {
    if (out.has(name) || !manifests.has(name)) return
    out.add(name)
    for (const [dep, spec] of Object.entries(manifests.get(name)?.dependencies ?? {})) if (spec.startsWith("workspace:")) visit(dep)
  }
  for (const p of packages) visit(p)
  return [...out].sort()
}

/**
 * Builds `packages` and the workspace packages they import at run time in the checkout at
 * `root`, so their `dist` is that checkout's code: turbo's cache makes this about a second when
 * nothing changed, a few minutes from a clean clone. Answers the error's tail when the build fails.
 */
export const buildForBench = (root: string, packages: readonly string[]): { readonly ok: true } | { readonly ok: false; readonly error: string } => {
  const turbo = join(root, "node_modules", ".bin", "turbo")
  const all = runtimeClosure(root, packages)
  // `--only`: these packages and no others (turbo's `^build` would also build what their tests import).
  const [command, args] = existsSync(turbo)
    ? [turbo, ["run", "build", "--only", ...all.map((p) => `--filter=${p}`), "--output-logs=errors-only"]]
    : ["pnpm", [...all.flatMap((p) => ["--filter", p]), "run", "build"]]
  const t0 = performance.now()
  const r = spawnSync(command, args, { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] })
  if (r.error !== undefined || r.status !== 0)
    return { ok: false, error: `${command} ${args.join(" ")} in ${root}: ${r.error?.message ?? `exit ${r.status}`}: ${`${r.stdout}${r.stderr}`.slice(-2000)}` }
  console.log(`built ${packages.join(", ")} in ${root} (${((performance.now() - t0) / 1000).toFixed(1)} s)`)
  return { ok: true }
}

/**
 * The coordinator a bench will spawn from the checkout at `root`, by the environment variable
 * `variable` (`dist` by default: built first; `source`). When the build fails, a run that did not
 * ask for `dist` falls back to the source and says so; one that asked for it fails.
 */
export const coordinatorToRun = (root: string, variable: string): { readonly mode: CoordinatorMode; readonly main: string; readonly cwd: string } => {
  const asked = coordinatorMode(variable)
  const cwd = join(root, "apps", "coordinator")
  if (asked.mode === "dist") {
    const built = buildForBench(root, ["@engram/coordinator"])
    if (built.ok) return { mode: "dist", main: join(cwd, "dist", "main.js"), cwd }
    if (asked.explicit) throw new Error(`${variable}=dist: the coordinator did not build: ${built.error}`)
    console.log(`the coordinator in ${root} did not build, so this run measures its SOURCE under tsx (${variable}=source): ${built.error}`)
  }
  return { mode: "source", main: join(cwd, "src", "main.ts"), cwd }
}

/**
 * Node's arguments to start the coordinator chosen by `coordinatorToRun`: Node `flags`, then the
 * `preload` modules (`--import`; TypeScript ones load tsx, whose source maps are then turned off
 * again for a `dist` coordinator), then its entry point.
 */
export const coordinatorArgs = (run: { readonly mode: CoordinatorMode; readonly main: string }, flags: readonly string[] = [], preload: readonly string[] = []): string[] => {
  const imports = preload.flatMap((p) => ["--import", p])
  if (run.mode === "source") return [...flags, "--import", "tsx", ...imports, "--conditions=@engram/source", run.main]
  if (preload.length === 0) return [...flags, run.main]
  return [...flags, "--import", "tsx", ...imports, "--import", "data:text/javascript,process.setSourceMapsEnabled(false)", run.main]
}
