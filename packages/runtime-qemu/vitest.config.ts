import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  test: {
    // Real QEMU guests under TCG: a boot takes ~10 s on an idle machine, minutes on a busy one
    // (112 s of a test seen in a CI run): a test has 10 minutes, failing sooner on what it waits for.
    testTimeout: 600_000,
    hookTimeout: 600_000,
    // One file at a time: the machine has two cores and every guest wants one.
    fileParallelism: false,
  },
}))
