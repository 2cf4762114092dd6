// Which Node.js engram runs on, checked before anything else is loaded: on an older Node an
// engram process stops at once with one line naming the version it needs and how to get it,
// instead of failing somewhere inside a dependency (or hanging). Plain JavaScript that imports
// nothing but Node's own `process`, so a launcher can run it first on any Node (`pnpm start`'s
// script, the `engram` bin, the apps' entry points), before its own code is even parsed.
import process from "node:process"

/** The oldest Node.js engram supports; every package's `engines.node` is `>=` this. */
export const minimum = { major: 22, minor: 19 }

/** The one line for `version` (default: this process's), or null when it is supported. */
export const unsupported = (version = process.versions.node) => {
  const [major = 0, minor = 0] = version.split(".").map(Number)
  if (major > minimum.major || (major === minimum.major && minor >= minimum.minor)) return null
  return `engram needs Node.js ${minimum.major}.${minimum.minor} or newer, and this is Node.js ${version} (${process.execPath}): install Node.js ${minimum.major} (nvm install ${minimum.major}, or https://nodejs.org/en/download) and put it first on your PATH`
}

/** Ends the process with exit code 1 and the one line when this Node is too old. */
export const exitIfUnsupported = () => {
  const line = unsupported()
  if (line === null) return
  process.stderr.write(`${line}\n`)
  process.exit(1)
}
