import { defineConfig } from "vitest/config"

export default defineConfig({
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    // Real QEMU guests under TCG: a boot takes ~10 s on an idle machine, more on a busy one.
    testTimeout: 240_000,
    hookTimeout: 240_000,
    // One file at a time: the machine has two cores and every guest wants one.
    fileParallelism: false,
    reporters: ["default", ["json", { outputFile: ".vitest/results.json" }]],
  },
})
