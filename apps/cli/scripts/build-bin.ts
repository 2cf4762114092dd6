// Builds the runnable `engram` alone (dist/main.js and its metafile), without the library's
// declarations: what the bin rebuilds in a checkout when a source changed, and what the tests
// build before they run.
import { build } from "tsup"
import config from "../tsup.config.js"

const configs = Array.isArray(config) ? config : [config]
const runnable = configs.find((c) => typeof c === "object" && c !== null && "entry" in c && JSON.stringify(c.entry).includes("main.ts"))
if (runnable === undefined) throw new Error("tsup.config.ts has no main.ts entry")
await build({ ...runnable, silent: true })
