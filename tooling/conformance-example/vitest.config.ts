import { defineConfig } from "vitest/config"

// Inside a clone of the engram repository, the @engram packages export their TypeScript
// sources under the "@engram/source" condition: with it, no build is needed. (Installed from
// npm or from `pnpm pack` tarballs, they are built JavaScript: leave the condition out.)
export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: { include: ["test/**/*.test.ts"], testTimeout: 60_000 },
})
