import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    // The end-to-end file starts a coordinator (PGlite) and three agent processes.
    testTimeout: 60_000,
    hookTimeout: 240_000,
    // Read by the root `pnpm test` summary.
    reporters: ["default", ["json", { outputFile: ".vitest/results.json" }]],
  },
})
