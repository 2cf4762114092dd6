import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  test: {
    // Real QEMU guests under TCG: a boot takes ~10 s on an idle machine, more on a busy one.
    testTimeout: 240_000,
    hookTimeout: 240_000,
    // One file at a time: the machine has two cores and every guest wants one.
    fileParallelism: false,
  },
}))
