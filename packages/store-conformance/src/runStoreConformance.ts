/**
 * The entry point: registers every conformance case with vitest against one backend. Each
 * group is a `describe` block sharing one store built from the backend's Layer; every case
 * starts from an empty store (StoreTesting.reset with the case's limits) and a TestClock at 0.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import type { Layer } from "effect"
import type { Store, StoreTesting } from "@engram/store"
import { assignments } from "./cases/assignments.js"
import { cascades } from "./cases/cascades.js"
import { concurrency } from "./cases/concurrency.js"
import { fleet } from "./cases/fleet.js"
import { historyGroup } from "./cases/history.js"
import { images } from "./cases/images.js"
import { lifetimes } from "./cases/lifetimes.js"
import { hosts } from "./cases/hosts.js"
import { ledger } from "./cases/ledger.js"
import { guard } from "./cases/guard.js"
import { moves } from "./cases/moves.js"
import { pages } from "./cases/pages.js"
import { placement } from "./cases/placement.js"
import { properties } from "./cases/properties.js"
import { queue } from "./cases/queue.js"
import { retention } from "./cases/retention.js"
import { sessions } from "./cases/sessions.js"
import { templates } from "./cases/templates.js"
import { prelude } from "./Harness.js"
import type { Group } from "./Harness.js"

/** Options of {@link runStoreConformance}. */
export interface ConformanceOptions {
  /** Cases to switch off for this backend: case name → the reason, printed with the skipped case. */
  readonly skip?: Readonly<Record<string, string>> | undefined
  /** Timeout of each case in ms (default 30 000; property cases get 10× this). */
  readonly timeoutMs?: number | undefined
  /** Runs of each property case (default 50). */
  readonly numRuns?: number | undefined
  /** Operations per property run (default 30). */
  readonly stepsPerRun?: number | undefined
  /** A fast-check seed, to replay a failing property run. */
  readonly seed?: number | undefined
}

/** Every group of cases, in the order they run. */
export const groups = (options: ConformanceOptions = {}): readonly Group[] => [
  hosts,
  placement,
  queue,
  sessions,
  ledger,
  fleet,
  moves,
  assignments,
  guard,
  cascades,
  historyGroup,
  lifetimes,
  templates,
  images,
  retention,
  pages,
  concurrency,
  properties({
    numRuns: options.numRuns ?? 50,
    stepsPerRun: options.stepsPerRun ?? 30,
    ...(options.seed === undefined ? {} : { seed: options.seed }),
  }),
]

/** The name of every case, by group. */
export const caseNames = (): Readonly<Record<string, readonly string[]>> =>
  Object.fromEntries(groups().map((g) => [g.name, g.cases.map((c) => c.name)]))

/**
 * Registers the conformance suite of `@engram/store` for one backend. Call it at the top
 * level of a vitest test file: `runStoreConformance("my-store", MyStore.layerTesting)`.
 */
export const runStoreConformance = (
  name: string,
  storeLayer: Layer.Layer<Store | StoreTesting, unknown>,
  options: ConformanceOptions = {},
): void => {
  const skip = options.skip ?? {}
  const timeoutMs = options.timeoutMs ?? 30_000
  const all = groups(options)
  const known = new Set(all.flatMap((g) => g.cases.map((c) => c.name)))

  describe(`store conformance: ${name}`, () => {
    // A skip that names no case is a typo that would silently keep a case on: refuse it.
    it("every skipped case exists and states a reason", () => {
      for (const [caseName, reason] of Object.entries(skip)) {
        expect(known.has(caseName), `skip names an unknown case: "${caseName}"`).toBe(true)
        expect(reason.trim(), `skip of "${caseName}" states no reason`).not.toBe("")
      }
    })

    for (const group of all) {
      layer(storeLayer, { timeout: timeoutMs })(group.name, (it) => {
        for (const c of group.cases) {
          const reason = skip[c.name]
          const timeout = (group.name === "properties" ? timeoutMs * 10 : timeoutMs) * (c.timeoutFactor ?? 1)
          if (reason !== undefined) {
            it.skip(`${c.name} [skipped: ${reason}]`, () => {})
            continue
          }
          it.effect(c.name, () => Effect.andThen(prelude(c.limits), c.run), timeout)
        }
      })
    }
  })
}
