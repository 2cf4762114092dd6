import { base } from "@engram/vitest-config"
import { fileURLToPath } from "node:url"
import { defineConfig, mergeConfig } from "vitest/config"

export default mergeConfig(
  base,
  defineConfig({
    // The README's examples import the package by its name.
    resolve: { alias: { "@engram/client": fileURLToPath(new URL("./src/index.ts", import.meta.url)) } },
    test: { testTimeout: 60_000, hookTimeout: 120_000 },
  }),
)
