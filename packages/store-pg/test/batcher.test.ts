// The group-commit batcher on its own (no database): what goes together, what goes apart,
// how many statements run at once, and that one bad item fails only itself.
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import * as Batcher from "../src/Batcher.js"
import { groupHoldBoundFor } from "../src/StorePg.js"

interface Item {
  readonly id: number
  readonly host: string
}

/** A batcher whose statements answer each item's id doubled, recording every statement. */
const recording = (options: { readonly failsWith?: number; readonly yields?: number } = {}) => {
  const statements: number[][] = []
  let inFlight = 0
  let maxInFlight = 0
  const write = Batcher.make<Item, number, string>({
    keysOf: (i) => [i.host],
    run: (items) =>
      Effect.gen(function* () {
        inFlight++
        maxInFlight = Math.max(maxInFlight, inFlight)
        statements.push(items.map((i) => i.id))
        for (let k = 0; k < (options.yields ?? 0); k++) yield* Effect.yieldNow
        inFlight--
        if (items.some((i) => i.id === options.failsWith)) return yield* Effect.fail(`bad item in ${items.length}`)
        return items.map((i) => i.id * 2)
      }),
    splitOn: (e) => e.startsWith("bad item"),
  })
  return { write, statements, maxInFlight: () => maxInFlight }
}

describe("the batcher", () => {
  it.effect("a window given as a function is asked again for each batch", () =>
    Effect.gen(function* () {
      let asked = 0
      const statements: number[][] = []
      const write = Batcher.make<Item, number, string>({
        windowMs: () => {
          asked++
          return 0
        },
        keysOf: (i) => [i.host],
        run: (items) => Effect.sync(() => (statements.push(items.map((i) => i.id)), items.map((i) => i.id))),
      })
      yield* Effect.all([1, 2].map((id) => write({ id, host: `h${id}` })), { concurrency: "unbounded" })
      yield* write({ id: 3, host: "h3" })
      expect(statements).toEqual([[1, 2], [3]])
      expect(asked).toBe(2)
    }),
  )

  it.effect("with a timing hook installed, each statement's name, items and times reach it; without one, nothing does", () =>
    Effect.gen(function* () {
      const timings: Batcher.StatementTiming[] = []
      const global = globalThis as Record<symbol, unknown>
      const run = (items: readonly Item[]) => Effect.succeed(items.map((i) => i.id))
      global[Batcher.timingHook] = (t: Batcher.StatementTiming) => timings.push(t)
      const timed = Batcher.make<Item, number, string>({ name: "beats", keysOf: (i) => [i.host], run })
      delete global[Batcher.timingHook]
      const plain = Batcher.make<Item, number, string>({ keysOf: (i) => [i.host], run })
      // Two items of one host: two statements of one batch.
      yield* Effect.all([1, 2, 3].map((id) => timed({ id, host: id === 3 ? "h1" : `h${id}` })), { concurrency: "unbounded" })
      yield* Effect.all([1, 2].map((id) => plain({ id, host: `h${id}` })), { concurrency: "unbounded" })
      expect(timings.map((t) => [t.name, t.items])).toEqual([
        ["beats", 2],
        ["beats", 1],
      ])
      for (const t of timings) {
        expect(t.waitedMs).toBeGreaterThanOrEqual(0)
        expect(t.statementMs).toBeGreaterThanOrEqual(0)
      }
    }),
  )

  it.effect("a timing hook that throws does not fail the items its statement wrote", () =>
    Effect.gen(function* () {
      const global = globalThis as Record<symbol, unknown>
      const run = (items: readonly Item[]) => Effect.succeed(items.map((i) => i.id))
      global[Batcher.timingHook] = () => {
        throw new Error("the hook broke")
      }
      const timed = Batcher.make<Item, number, string>({ name: "beats", keysOf: (i) => [i.host], run })
      delete global[Batcher.timingHook]
      const answers = yield* Effect.all([1, 2].map((id) => timed({ id, host: `h${id}` })), { concurrency: "unbounded" })
      expect(answers).toEqual([1, 2])
    }),
  )

  it.effect("items asked for together are written by one statement, each with its own answer", () =>
    Effect.gen(function* () {
      const b = recording()
      const answers = yield* Effect.all(
        [1, 2, 3, 4].map((id) => b.write({ id, host: `h${id}` })),
        { concurrency: "unbounded" },
      )
      expect(answers).toStrictEqual([2, 4, 6, 8])
      expect(b.statements).toStrictEqual([[1, 2, 3, 4]])
    }),
  )

  it.effect("items that share a key go in a later statement of the same batch", () =>
    Effect.gen(function* () {
      const b = recording()
      const answers = yield* Effect.all(
        [
          { id: 1, host: "a" },
          { id: 2, host: "a" },
          { id: 3, host: "b" },
          { id: 4, host: "a" },
        ].map((i) => b.write(i)),
        { concurrency: "unbounded" },
      )
      expect(answers).toStrictEqual([2, 4, 6, 8])
      expect(b.statements).toStrictEqual([[1, 3], [2], [4]])
    }),
  )

  it.effect("one bad item fails only its own caller: the statement is split and the others are written", () =>
    Effect.gen(function* () {
      const b = recording({ failsWith: 2 })
      const exits = yield* Effect.all(
        [1, 2, 3].map((id) => Effect.exit(b.write({ id, host: `h${id}` }))),
        { concurrency: "unbounded" },
      )
      expect(exits.map((e) => (Exit.isSuccess(e) ? e.value : "failed"))).toStrictEqual([2, "failed", 6])
      expect(b.statements).toStrictEqual([[1, 2, 3], [1], [2], [3]])
    }),
  )

  it.effect("an item the database refuses (a defect) dies alone: the statement is split and the others are written", () =>
    Effect.gen(function* () {
      const statements: number[][] = []
      const write = Batcher.make<Item, number, string>({
        keysOf: (i) => [i.host],
        run: (items) =>
          Effect.suspend(() => {
            statements.push(items.map((i) => i.id))
            return items.some((i) => i.id === 2) ? Effect.die(new Error("22P05: unsupported Unicode escape sequence")) : Effect.succeed(items.map((i) => i.id * 2))
          }),
      })
      const exits = yield* Effect.all(
        [1, 2, 3].map((id) => Effect.exit(write({ id, host: `h${id}` }))),
        { concurrency: "unbounded" },
      )
      expect(exits.map((e) => (Exit.isSuccess(e) ? e.value : "died"))).toStrictEqual([2, "died", 6])
      expect(statements).toStrictEqual([[1, 2, 3], [1], [2], [3]])
    }),
  )

  it.effect("at most two statements run at once; items arriving meanwhile wait and go together", () =>
    Effect.gen(function* () {
      const b = recording({ yields: 5 })
      const fibers = []
      for (let id = 0; id < 40; id++) {
        fibers.push(yield* Effect.forkChild(b.write({ id, host: `h${id}` })))
        yield* Effect.yieldNow
      }
      const answers = yield* Fiber.joinAll(fibers)
      expect(answers).toStrictEqual(Array.from({ length: 40 }, (_, id) => id * 2))
      expect(b.maxInFlight()).toBeLessThanOrEqual(2)
      expect(b.statements.length).toBeLessThan(40)
      expect(b.statements.flat().sort((x, y) => x - y)).toStrictEqual(Array.from({ length: 40 }, (_, id) => id))
    }),
  )

  it.effect("an interrupted caller does not keep the others from their answers", () =>
    Effect.gen(function* () {
      const b = recording({ yields: 3 })
      const first = yield* Effect.forkChild(b.write({ id: 1, host: "a" }))
      const second = yield* Effect.forkChild(b.write({ id: 2, host: "b" }))
      yield* Fiber.interrupt(first)
      expect(yield* Fiber.join(second)).toBe(4)
    }),
  )

  // it.live: the bound is real time (the store's groups run beside a TestClock in other tests).
  it.live("a statement that never answers gives its slot back after its bound: its items answered Unavailable, the next group written, the stuck one interrupted", () =>
    Effect.gen(function* () {
      let runs = 0
      let interrupted = 0
      const write = Batcher.make<number, number, string>({
        maxInFlight: 1,
        holdBoundMs: 50,
        keysOf: () => [],
        run: (items) => {
          runs++
          return runs === 1 ? Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => void interrupted++))) : Effect.succeed(items.map((i) => i * 10))
        },
      })
      const stuck = yield* Effect.exit(write(1))
      expect(Exit.isFailure(stuck) && JSON.stringify(stuck.cause)).toContain("Unavailable")
      expect(yield* write(2)).toBe(20)
      // The interruption runs in the background: wait for it, by yielding turns.
      for (let i = 0; i < 1000 && interrupted === 0; i++) yield* Effect.yieldNow
      expect(interrupted).toBe(1)
    }),
  )

  it("a group's hold bound follows the server's statement bound (4×), unless set; none without either (the batcher's 60 s)", () => {
    expect(groupHoldBoundFor({ statementTimeoutMs: 15_000 })).toBe(60_000)
    expect(groupHoldBoundFor({ statementTimeoutMs: 1_000 })).toBe(4_000)
    expect(groupHoldBoundFor({ statementTimeoutMs: 1_000, groupHoldBoundMs: 250 })).toBe(250)
    expect(groupHoldBoundFor({ statementTimeoutMs: 0 })).toBeUndefined()
    expect(groupHoldBoundFor({})).toBeUndefined()
  })
})
