import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  // Each case simulates a day or more; on a loaded 2-core machine one can take longer than 5 s.
  test: { include: ["test/**/*.test.ts"], testTimeout: 60_000 },
})
