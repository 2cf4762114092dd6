// A vitest reporter that writes `.vitest/timings.json`: every finished test with its duration and
// the timeout it ran under, so the root `pnpm test` summary can name the tests that sit near their
// timeout (a test should take at most a third of it on a busy 2-core machine; one closer to it
// fails CI at random when the machine is loaded).
import { mkdirSync, writeFileSync } from "node:fs"
import { join, relative } from "node:path"

/** @param {{ defaultTimeoutMs: number }} options */
export default function timings(options) {
  /** @type {import("vitest/node").Vitest | undefined} */
  let ctx
  return {
    /** @param {import("vitest/node").Vitest} vitest */
    onInit(vitest) {
      ctx = vitest
    },
    /** @param {ReadonlyArray<import("vitest/node").TestModule>} modules */
    onTestRunEnd(modules) {
      const root = ctx?.config.root ?? process.cwd()
      const rows = []
      for (const module of modules)
        for (const test of module.children.allTests()) {
          const d = test.diagnostic()
          if (d === undefined) continue
          rows.push({
            file: relative(root, module.moduleId),
            name: test.fullName,
            state: test.result().state,
            durationMs: Math.round(d.duration),
            timeoutMs: test.options.timeout ?? ctx?.config.testTimeout ?? options.defaultTimeoutMs,
          })
        }
      mkdirSync(join(root, ".vitest"), { recursive: true })
      writeFileSync(join(root, ".vitest", "timings.json"), JSON.stringify(rows, null, 1))
    },
  }
}
