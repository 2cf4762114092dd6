// Whether the built `engram` (dist/main.js) is older than a source it was built from, read from
// the build's esbuild metafile (its inputs, relative to the package directory). Used only in a
// checkout of the repository (`pnpm engram`), where sources change under a built file; an
// installed package has no sources and never rebuilds.
import { readFileSync, statSync } from "node:fs"
import { join } from "node:path"

const mtimeMs = (file) => {
  try {
    return statSync(file).mtimeMs
  } catch {
    return null
  }
}

/**
 * Why the build is not current, in a few words (`no build yet`, `src/Cli.ts changed`): the
 * first input outside node_modules that changed after the build or is gone; null when current.
 */
export const staleness = (packageDir, built = "dist/main.js", metafile = "dist/metafile-esm.json") => {
  const builtAt = mtimeMs(join(packageDir, built))
  let inputs
  try {
    inputs = Object.keys(JSON.parse(readFileSync(join(packageDir, metafile), "utf8")).inputs)
  } catch {
    inputs = null
  }
  if (builtAt === null || inputs === null) return "no build yet"
  for (const input of inputs) {
    if (input.includes("node_modules/")) continue
    const at = mtimeMs(join(packageDir, input))
    if (at === null) return `${input} is gone`
    if (at > builtAt) return `${input} changed`
  }
  return null
}
