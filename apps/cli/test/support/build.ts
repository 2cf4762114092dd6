// Vitest global setup: builds the runnable `engram` (dist/main.js, one bundled file) once for
// every test file, so the tests run what users run, and each command starts in well under a
// second (from source through tsx it takes seconds).
import { build } from "tsup"
import config from "../../tsup.config.js"

export default async function setup(): Promise<void> {
  const configs = Array.isArray(config) ? config : [config]
  const runnable = configs.find((c) => typeof c === "object" && c !== null && "entry" in c && JSON.stringify(c.entry).includes("main.ts"))
  if (runnable === undefined) throw new Error("tsup.config.ts has no main.ts entry")
  await build({ ...runnable, silent: true })
}
