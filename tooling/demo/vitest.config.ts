import { base } from "@engram/vitest-config"
import { defineConfig } from "vitest/config"

/** Each file starts a coordinator (PGlite) and the demo as a child process, as `pnpm start` does. */
export default defineConfig({ ...base, test: { ...base.test, testTimeout: 60_000, hookTimeout: 120_000 } })
