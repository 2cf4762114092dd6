import { base } from "@engram/vitest-config"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(base, defineConfig({
  // Each case simulates a day or more. Under the whole `pnpm test` on a 2-core machine with one core
  // kept busy, a case that takes 2 s alone took 26-32 s, and 60 s with other work beside it; CI's
  // machine ran other CPU-bound tests 3-5x slower than here: the bound is 400 s.
  test: { testTimeout: 400_000 },
}))
