import { app, library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

// The library and the runnable agent, `node dist/main.js` (the @engram packages bundled in; no tsx).
export default defineConfig([{ ...library, clean: false }, app()])
