import { app, library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

// The library (startCoordinator and the services, for tests and embedding) and the runnable
// service, `node dist/main.js` (no tsx; the @engram packages from their built dist: `pnpm build`).
export default defineConfig([{ ...library, clean: false }, app({ bundle: "none" })])
