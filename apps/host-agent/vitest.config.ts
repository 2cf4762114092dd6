import { base } from "@engram/vitest-config"
import { defineConfig } from "vitest/config"

/** The end-to-end files start a coordinator (PGlite) and agent processes. */
const timeouts = { testTimeout: 180_000, hookTimeout: 240_000 }
const realGuests = "test/qemu-e2e.test.ts"
const project = (name: string, include: string[], exclude: string[], groupOrder: number) => ({
  resolve: base.resolve,
  ssr: base.ssr,
  // As every package's (the base config's `isolate`): a project's files share one worker's modules.
  test: { ...timeouts, name, include, exclude, sequence: { groupOrder }, isolate: base.test.isolate },
})

export default defineConfig({
  resolve: base.resolve,
  ssr: base.ssr,
  test: {
    ...timeouts,
    reporters: base.test.reporters,
    // The real-guest file runs after the others, alone: its TCG guests would take the CPU
    // from the simulated end-to-end moves, which run in real time (two cores in CI).
    projects: [project("agent", [...base.test.include], [realGuests], 0), project("real-guests", [realGuests], [], 1)],
  },
})
