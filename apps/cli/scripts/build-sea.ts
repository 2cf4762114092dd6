// Builds `dist-sea/engram`: a Node.js single executable application (SEA) holding the command
// line and both services. Steps: one CommonJS bundle of src/sea.ts (Node 22's SEA runs a CommonJS
// script); its run-time files as SEA assets; the blob (`node --experimental-sea-config`); a copy
// of this Node.js binary with the blob injected (postject).
//
// The bundle's modules find their files with `new URL("…", import.meta.url)`: store-pg
// `../drizzle`, the dashboard `../assets/`, PGlite `./pglite.wasm` (and `./pglite.data`,
// `./initdb.wasm`), the coordinator `../package.json`. In the bundle `import.meta.url` is one
// value, set by the banner: a file `dist/main.js` inside the directory the assets are written to
// (once per build, under ENGRAM_SEA_CACHE_DIR, else $XDG_CACHE_HOME/engram or ~/.cache/engram), so
// every one of those paths lands on its file.
import { execFileSync } from "node:child_process"
import { createHash } from "node:crypto"
import { copyFileSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join, relative } from "node:path"
import { fileURLToPath } from "node:url"
import { build } from "esbuild"

const cliDir = join(dirname(fileURLToPath(import.meta.url)), "..")
const out = join(cliDir, "dist-sea")
const require = createRequire(import.meta.url)
/** A dependency's directory as `from` sees it (pnpm links each package's dependencies beside it). */
const packageDir = (name: string, from: string) => realpathSync(join(from, "node_modules", name))

const coordinatorDir = packageDir("@engram/coordinator", cliDir)
const storePgDir = packageDir("@engram/store-pg", coordinatorDir)
const dashboardDir = packageDir("@engram/dashboard", coordinatorDir)
const pgliteDist = join(packageDir("@electric-sql/pglite", storePgDir), "dist")

/** Every file under `dir`, as [asset key, path]; keys are relative to `prefix`. */
const filesOf = (dir: string, prefix: string): [string, string][] =>
  readdirSync(dir, { recursive: true, encoding: "utf8" })
    .map((f) => join(dir, f))
    .filter((p) => statSync(p).isFile())
    .map((p) => [join(prefix, relative(dir, p)), p])

const assets = new Map<string, string>([
  ...filesOf(join(storePgDir, "drizzle"), "drizzle"),
  ...filesOf(join(dashboardDir, "assets"), "assets"),
  ...["pglite.wasm", "pglite.data", "initdb.wasm"].map((f): [string, string] => [`dist/${f}`, join(pgliteDist, f)]),
  ["package.json", join(coordinatorDir, "package.json")],
])
rmSync(out, { recursive: true, force: true })
mkdirSync(out, { recursive: true })

// PGlite's worker thread (`ENGRAM_PGLITE_WORKER`) loads a script from disk: store-pg's
// `worker/pglite-worker.mjs` bundled here as CommonJS with PGlite and drizzle inside, written
// beside the other files; its `import.meta.url` is the bundle's (`workerData.metaUrl`), so PGlite
// finds its WebAssembly in the same `dist/`.
const workerBundle = join(out, "pglite-worker.cjs")
await build({
  entryPoints: [join(storePgDir, "worker/pglite-worker.mjs")],
  outfile: workerBundle,
  bundle: true,
  format: "cjs",
  platform: "node",
  target: "node22",
  define: { "import.meta.url": "__engramMetaUrl" },
  banner: { js: `var __engramMetaUrl = require("node:worker_threads").workerData.metaUrl;` },
  logLevel: "silent",
})
if (/import\.meta/.test(readFileSync(workerBundle, "utf8"))) throw new Error(`${workerBundle} still uses import.meta (only import.meta.url is rewritten)`)
assets.set("worker/pglite-worker.cjs", workerBundle)

const id = createHash("sha256")
for (const [key, path] of [...assets].sort()) id.update(key).update("\0").update(readFileSync(path))
const buildId = id.digest("hex").slice(0, 16)

// Runs before any module of the bundle: writes the assets once (to a private directory, then
// renamed into place, so a concurrent start never sees half of them) and answers the URL.
const banner = `var __engramMetaUrl = (() => {
  const { isSea, getRawAsset } = require("node:sea");
  const { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } = require("node:fs");
  const { homedir, tmpdir } = require("node:os");
  const { dirname, join } = require("node:path");
  const { pathToFileURL } = require("node:url");
  if (!isSea()) return pathToFileURL(join(__dirname, "dist", "main.js")).href;
  const keys = ${JSON.stringify([...assets.keys()].sort())};
  const write = (root) => {
    const dir = join(root, "sea-${buildId}");
    if (existsSync(join(dir, ".complete"))) return dir;
    const temp = dir + ".tmp-" + process.pid;
    rmSync(temp, { recursive: true, force: true });
    for (const key of keys) {
      mkdirSync(dirname(join(temp, key)), { recursive: true });
      writeFileSync(join(temp, key), new Uint8Array(getRawAsset(key)));
    }
    writeFileSync(join(temp, ".complete"), "");
    try { renameSync(temp, dir) } catch (e) { rmSync(temp, { recursive: true, force: true }); if (!existsSync(join(dir, ".complete"))) throw e }
    return dir;
  };
  const roots = [process.env.ENGRAM_SEA_CACHE_DIR, join(process.env.XDG_CACHE_HOME || join(homedir(), ".cache"), "engram"), join(tmpdir(), "engram-" + process.getuid?.())].filter(Boolean);
  let failure;
  for (const root of roots) {
    try { return pathToFileURL(join(write(root), "dist", "main.js")).href } catch (e) { failure = e }
  }
  process.stderr.write("engram: cannot write the executable's files to " + roots.join(" or ") + ": " + failure.message + " (set ENGRAM_SEA_CACHE_DIR to a writable directory)\\n");
  process.exit(1);
})();`

const bundle = join(out, "engram.cjs")
const result = await build({
  entryPoints: [join(cliDir, "src/sea.ts")],
  outfile: bundle,
  bundle: true,
  format: "cjs",
  platform: "node",
  target: "node22",
  conditions: ["@engram/source"],
  define: { "import.meta.url": "__engramMetaUrl" },
  banner: { js: banner },
  logLevel: "silent",
  metafile: true,
})
// Any other use of import.meta would be empty in CommonJS: refuse to build rather than ship it.
const bundled = readFileSync(bundle, "utf8")
if (/import\.meta/.test(bundled)) throw new Error(`${bundle} still uses import.meta (only import.meta.url is rewritten)`)
for (const w of result.warnings) process.stderr.write(`esbuild: ${w.text}\n`)


const config = join(out, "sea-config.json")
const blob = join(out, "sea-prep.blob")
writeFileSync(
  config,
  JSON.stringify({ main: bundle, output: blob, disableExperimentalSEAWarning: true, useSnapshot: false, useCodeCache: true, assets: Object.fromEntries(assets) }, null, 2),
)
execFileSync(process.execPath, ["--experimental-sea-config", config], { stdio: "pipe" })
const exe = join(out, "engram")
copyFileSync(process.execPath, exe)
execFileSync(process.execPath, [require.resolve("postject/dist/cli.js"), exe, "NODE_SEA_BLOB", blob, "--sentinel-fuse", "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2"], { stdio: "pipe" })
process.stdout.write(`${exe} (${(statSync(exe).size / 2 ** 20).toFixed(0)} MiB, ${assets.size} assets, build ${buildId})\n`)
