import { app, library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

// The library (types for whoever imports the CLI's parts) and the runnable `engram`
// (dist/main.js): one file with its dependencies bundled in, so a command starts fast.
export default defineConfig([{ ...library, clean: false }, app({ bundle: "all" })])
