// The test setup of every @engram package: workspace packages resolve to their sources
// (the "@engram/source" export condition, so tests need no build), tests live in
// test/**/*.test.ts, and each run writes .vitest/results.json for the root `pnpm test` summary.
// A package's vitest.config.ts merges its own options over it (vitest's `mergeConfig`).
import timings from "./timings.js"

/** The shared vitest options. */
export const base = {
  resolve: { conditions: ["@engram/source"] },
  ssr: { resolve: { conditions: ["@engram/source"] } },
  test: {
    include: ["test/**/*.test.ts"],
    // CI machines have two cores shared by every package's tests: a property test or a real
    // server can take longer than vitest's 5 s default there (18 s of a 30 s bound seen in a CI
    // run). A package sets its own above this.
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // A worker runs file after file keeping the modules it loaded (effect, the packages'
    // sources; one worker per package on a 2-core machine): loading them again for every file
    // was a third of the tests' CPU (the coordinator's: 352 s isolated, 250 s not), and CI has
    // two cores for every package at once. A test file cleans up what it starts (servers,
    // stores, env).
    isolate: false,
    // `timings` writes each test's duration beside its timeout (.vitest/timings.json).
    reporters: ["default", ["json", { outputFile: ".vitest/results.json" }], timings({ defaultTimeoutMs: 60_000 })],
  },
}

export default base
