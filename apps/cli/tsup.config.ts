import { app, library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

// The library (types for whoever imports the CLI's parts) and the runnable `engram`
// (dist/main.js, which bin/engram.js loads): one file with its dependencies bundled in, so a
// command starts fast. Its metafile lists the sources it was built from (bin/fresh.js reads it).
export default defineConfig([{ ...library, clean: false }, { ...app({ bundle: "all" }), metafile: true }])
