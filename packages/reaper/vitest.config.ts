import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: { include: ["test/**/*.test.ts"] },
})
